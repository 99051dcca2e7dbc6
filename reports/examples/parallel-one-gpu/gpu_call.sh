#!/usr/bin/env bash
# Parallel candidates on a one-GPU machine, every log in $OUT. Run from the repository root, carrying .whl (the loop's
# wheels; .whl/cluster holds distributed, dask and what they need, 5.3 MB):
#   OUT=<folder> [ITER=4] bash reports/examples/parallel-one-gpu/gpu_call.sh shared cluster tests plain
# The parts, in the order named (all four take about 8 minutes: at most ~9 in one call):
#   shared   a run of ITER attempts by two workers sharing the GPU (WORKERS=2)
#   cluster  a Dask scheduler and two workers on the GPU, a run of 4 attempts, the second worker killed once the
#            second batch starts
#   tests    the parallel GPU tests
#   plain    a run of ITER attempts one at a time, for the wall time beside the shared run's
# Each run starts from v0 on the visible panel with the offline search; check_records.py checks its records after it.
# (8 files come back: the reports, the run states, the index, the scheduler's and workers' logs are in runs.tar.gz.)
set -u
: "${OUT:?set OUT to the folder that receives the results}"
[ $# -gt 0 ] || { echo "name the parts: shared, cluster, tests, plain" >&2; exit 2; }
ITER=${ITER:-4}
source reports/examples/llgemm-seed002/device_env.sh || exit 1
{
  nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  nproc
} >>"$OUT/env.txt" 2>&1
mkdir -p /tmp/extra && touch /tmp/extra/start  # the versions newer than it are this call's
step() {  # step NAME SECONDS COMMAND...: the command under a timeout, its output in $OUT/NAME.log with exit and wall
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: exit $?, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/$name.log"
}
checked() {  # checked NAME BEFORE: check the run that started since BEFORE (the list of runs), then pack the results
  local run
  run=$(ls workspace/.runs 2>/dev/null | grep -vxF -e "$2" | head -1)
  if [ -z "$run" ]; then
    echo "$1: no run started" >>"$OUT/check.log"
  else
    echo "$1:" >>"$OUT/check.log"
    timeout 60 python3 reports/examples/parallel-one-gpu/check_records.py "$run" >>"$OUT/check.log" 2>&1
    echo "check exit $?" >>"$OUT/check.log"
  fi
  tar -czf "$OUT/runs.tar.gz" reports/*/report.md workspace/.runs/*/state.json methods/experiment_log.md \
    methods/versions/index*.jsonl $(find methods/versions -name verdict.json -newer /tmp/extra/start) \
    /tmp/extra 2>/dev/null
}
runs_now() { ls workspace/.runs 2>/dev/null || echo -; }

shared() {
  local before
  before=$(runs_now)
  step workers-2 170 make agent-run ITER="$ITER" FROM=v0 BACKEND=offline WORKERS=2
  checked shared "$before"
}

plain() {
  local before
  before=$(runs_now)
  step workers-1 170 make agent-run ITER="$ITER" FROM=v0 BACKEND=offline
  checked plain "$before"
}

tests() {
  step test-parallel-gpu 240 python3 -m pytest -q -m gpu tests/agent/test_parallel.py -rfE --durations=5
}

cluster() {
  local before address=tcp://127.0.0.1:8786 scheduler agent i
  local -a workers=()
  # the wheels the image lacks; dask and distributed together, so that the two are of one release
  python3 - >/tmp/extra/cluster-wheels.txt 2>&1 <<'EOF'
import importlib.metadata as metadata, pathlib, subprocess, sys
wanted = []
for wheel in sorted(pathlib.Path(".whl/cluster").glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        found = None
    take = found is None or (name in ("dask", "distributed") and found != version)
    print(name, "image:", found, "->", "installing " + wheel.name if take else "kept")
    if take:
        wanted.append(str(wheel))
if wanted:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", *wanted], check=True)
EOF
  python3 -m distributed.cli.dask_scheduler --port 8786 --no-dashboard >/tmp/extra/scheduler.log 2>&1 &
  scheduler=$!
  for i in 1 2; do
    CUDA_VISIBLE_DEVICES=0 python3 -m distributed.cli.dask_worker "$address" --nworkers 1 --nthreads 1 \
      --resources GPU=1 --no-dashboard --name "gpu0-$i" >"/tmp/extra/worker-$i.log" 2>&1 &
    workers+=($!)
  done
  if ! python3 -c "from distributed import Client; Client('$address', timeout=60).wait_for_workers(2, timeout=60)" \
      >>/tmp/extra/scheduler.log 2>&1; then
    echo "cluster: the scheduler or its two workers did not come up (runs.tar.gz: tmp/extra)" >>"$OUT/check.log"
    kill "${workers[@]}" "$scheduler" 2>/dev/null
    return
  fi
  before=$(runs_now)
  step cluster 170 make agent-run ITER=4 FROM=v0 BACKEND=offline CLUSTER="$address" &
  agent=$!
  # once the second batch has run 5 s, the second worker's nanny and its worker process die at once: its job may
  # cost its attempt and nothing more, and the run goes on with one worker
  for _ in $(seq 340); do
    grep -q "batch of 2: iterations 3-4" "$OUT/cluster.log" 2>/dev/null || ! kill -0 "$agent" 2>/dev/null && break
    sleep 0.5
  done
  sleep 5
  kill -9 "${workers[1]}" $(pgrep -P "${workers[1]}")
  echo "killed the second worker at $(date +%T)" >>"$OUT/env.txt"
  wait "$agent"
  checked cluster "$before"
  kill "${workers[0]}" "$scheduler" 2>/dev/null
}

for part in "$@"; do
  case $part in
    shared | cluster | tests | plain) "$part" ;;
    *) echo "unknown part $part: shared, cluster, tests or plain" >&2 ;;
  esac
done
tail -n 3 "$OUT"/*.log
