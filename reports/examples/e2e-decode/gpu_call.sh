#!/usr/bin/env bash
# One GPU call (at most ~9 minutes): `python3 -m evals.e2e` (what `make e2e` runs) on the full Llama-3-8B shape,
# every backend at batches 1, 8, 16, 24, 32 with the compiled glue, batch 24 profiled; bf16 and LL-GEMM at batch 8
# profiled (where LL-GEMM runs its own kernel); the e2e GPU test; the eager glue for bf16, tinygemm and the W4A16 main
# at batches 1 and 24 (what fusing the glue is worth). The board's power and SM clock are sampled every 500 ms
# throughout. Every log, the JSON, the table, the profile and the plot go to $OUT (the LL-GEMM and eager runs and the
# power samples as extra.tar). Run from the repository root:
#   OUT=<folder> bash reports/examples/e2e-decode/gpu_call.sh
# W4A16_DIRS: the W4A16 folders served (v0 takes only the contract's epilogues: its row says it is not servable;
# main holds the identity epilogue; add methods/drafts/w4a16 while a draft exists).
set -u
: "${OUT:?set OUT to the folder that receives the results}"
export PYTHONUNBUFFERED=1
W4A16_DIRS=${W4A16_DIRS:-"methods/versions/v0 methods/main"}
# each W4A16 folder is served as built and again with these overrides: no device-bound floor, which holds a call's
# GPU time up to its host cost where the contract times calls one by one (a graph replay has no host cost a call)
W4A16_CONFIG=${W4A16_CONFIG:-'{"DEVICE_BOUND_US": 0}'}
{
  nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  git log --oneline -1 && git status --short | head -20
} >"$OUT/env.txt" 2>&1
mkdir -p /tmp/extra
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu --format=csv -lms 500 >/tmp/extra/power.csv &
sampler=$!
step() {  # step NAME SECONDS COMMAND...: the command under a timeout, its output in $OUT/NAME.log with exit and wall
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "$name: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/$name.log"
}
# the JSON, table and plot are rewritten after every backend: a run cut short by the timeout keeps what it measured
step e2e "${E2E_S:-300}" python3 -m evals.e2e --w4a16 $W4A16_DIRS --w4a16-config "$W4A16_CONFIG" --profile 24 \
  --out "$OUT"
step llgemm "${LLGEMM_S:-60}" python3 -m evals.e2e --backends bf16,llgemm --batches 8 --profile 8 \
  --out /tmp/extra/llgemm
step test-gpu-e2e "${TEST_S:-90}" python3 -m pytest -q -m gpu tests/evals/test_e2e.py
step eager "${EAGER_S:-90}" python3 -m evals.e2e --glue eager --backends bf16,tinygemm,w4a16 --w4a16 methods/main \
  --batches 1,24 --steps 100 --out /tmp/extra/eager
kill "$sampler"
mv "$OUT/llgemm.log" "$OUT/eager.log" /tmp/extra/  # beside the runs' folders, whichever of them exist
tar -C /tmp -cf "$OUT/extra.tar" extra
ls -la "$OUT"
