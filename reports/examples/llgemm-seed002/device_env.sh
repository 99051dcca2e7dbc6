# Sourced by this folder's H200 call scripts, run from the repository root with $OUT set: the carried wheels (.whl/)
# installed into the interpreter's own environment (a package it has at another version is replaced by the
# wheel's), so that subprocesses started without PYTHONPATH (the agent's GPU test) import them too; a git repository
# for the loop's worktrees (the device's copy of the tree may have none); the host in $OUT/env.txt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
  && python3 -c "import git, openai" && export PYTHONPATH=$PWD || return 1
export PYTHONUNBUFFERED=1
git rev-parse --is-inside-work-tree >$OUT/env.txt 2>&1 \
  || { git init -q && git add -A && git -c user.name=kloop -c user.email=kloop@localhost commit -qm device; }
git log --oneline -1 >>$OUT/env.txt 2>&1
nvidia-smi --query-gpu=name,power.limit --format=csv >>$OUT/env.txt
