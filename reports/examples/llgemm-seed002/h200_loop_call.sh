#!/usr/bin/env bash
# One H200 call: the loop on llgemm (offline, visible panel, time-limited) from FROM (default v63),
# ITERS attempts (default 20), then its records back in $OUT.
source "$(dirname "$0")/device_env.sh" || exit 1
# PROBE=1: first, what each fresh evaluator process costs on this host (~20 s)
[ -z "$PROBE" ] || python3 "$(dirname "$0")/startup_probe.py" 2>&1 | tee $OUT/startup.txt
# SWEEP=cg (or vec, gemv): first, that informational sweep of sweep_gemv.py (SET=cg: about 45 s; give LOOP_S less)
[ -z "$SWEEP" ] || SET=$SWEEP BUDGET=${SWEEP_S:-90} python3 "$(dirname "$0")/sweep_gemv.py" > $OUT/sweep_$SWEEP.jsonl \
  2> $OUT/sweep_$SWEEP.err
start=$(date +%s)
timeout ${LOOP_S:-440} python3 -m agent run --task llgemm --iters ${ITERS:-20} --from ${FROM:-v63} --backend offline \
  --plain --time-limit ${LOOP_MIN:-6} 2>&1 | tee $OUT/run.log
echo "loop wall: $(( $(date +%s) - start )) s" | tee -a $OUT/run.log
tar czf $OUT/records.tgz tasks/llgemm/versions tasks/llgemm/experiment_log.md workspace/.runs reports 2>/dev/null
ls -la $OUT
