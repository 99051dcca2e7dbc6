#!/usr/bin/env bash
# One H200 call (at most ~9 minutes): `python3 -m evals.e2e` (what `make e2e` runs) on the full Llama-3-8B shape,
# every backend at batches 1, 8, 16, 24, 32, then the e2e GPU test. Every log, the JSON, the table and the plot go to
# $OUT. Run from the repository root: OUT=<folder> bash reports/examples/e2e-decode/h200_call.sh
# W4A16_DIRS: the W4A16 folders served (v0 takes only the contract's epilogues: its row says it is not servable;
# main holds the identity epilogue; add methods/drafts/w4a16 while a draft exists).
set -u
: "${OUT:?set OUT to the folder that receives the results}"
export PYTHONUNBUFFERED=1
W4A16_DIRS=${W4A16_DIRS:-"methods/versions/v0 methods/main"}
{
  nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  git log --oneline -1 && git status --short | head -20
} >"$OUT/env.txt" 2>&1
start=$(date +%s)
# the JSON, table and plot are rewritten after every backend: a run cut short by the timeout keeps what it measured
timeout "${E2E_S:-430}" python3 -m evals.e2e --w4a16 $W4A16_DIRS --out "$OUT" 2>&1 | tee "$OUT/e2e.log"
echo "e2e: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/e2e.log"
start=$(date +%s)
timeout "${TEST_S:-90}" python3 -m pytest -q -m gpu tests/evals/test_e2e.py 2>&1 | tee "$OUT/test-gpu-e2e.log"
echo "test: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/test-gpu-e2e.log"
ls -la "$OUT"
