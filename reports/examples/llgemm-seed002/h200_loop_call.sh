#!/usr/bin/env bash
# One H200 call: the loop on llgemm (offline, visible panel, time-limited) from FROM (default v10: the fenced split-K,
# the GEMV path and its jumps), ITERS attempts (default 20), then its records back in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
git rev-parse --is-inside-work-tree >$OUT/env.txt 2>&1 \
  || { git init -q && git add -A && git -c user.name=kloop -c user.email=kloop@localhost commit -qm device; }
git log --oneline -1 >>$OUT/env.txt 2>&1
nvidia-smi --query-gpu=name,power.limit --format=csv >>$OUT/env.txt
start=$(date +%s)
timeout ${LOOP_S:-440} python3 -m agent run --task llgemm --iters ${ITERS:-20} --from ${FROM:-v10} --backend offline \
  --plain --time-limit ${LOOP_MIN:-6} 2>&1 | tee $OUT/run.log
echo "loop wall: $(( $(date +%s) - start )) s" | tee -a $OUT/run.log
tar czf $OUT/records.tgz tasks/llgemm/versions tasks/llgemm/experiment_log.md workspace/.runs reports 2>/dev/null
ls -la $OUT
