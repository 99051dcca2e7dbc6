#!/usr/bin/env bash
# One H200 call: the loop on llgemm (offline, visible panel, time-limited) from FROM (default v64),
# ITERS attempts (default 20), then its records back in $OUT.
source "$(dirname "$0")/device_env.sh" || exit 1
# PROBE=1: first, what each fresh evaluator process costs on this host (~20 s)
[ -z "$PROBE" ] || python3 "$(dirname "$0")/startup_probe.py" 2>&1 | tee $OUT/startup.txt
FROM=${FROM:-v64}
# STRESS=1: first, the family's GPU tests (tests/methods/test_llgemm.py, mark gpu: split plans 64 calls a regime);
# where they fail, the loop starts from STRESS_FALLBACK (default v62, whose split epilogue is the fenced one the
# stress test passed) instead of FROM
if [ -n "$STRESS" ]; then
  python3 -m pytest -q -m gpu tests/methods/test_llgemm.py > $OUT/stress.txt 2>&1 \
    || { FROM=${STRESS_FALLBACK:-v62}; echo "the family's GPU tests failed: the loop starts from $FROM" | tee -a $OUT/stress.txt; }
fi
# SWEEP="cg split" (sets of sweep_gemv.py): first, those informational sweeps (cg about 45 s, split about 20 s; give
# LOOP_S less)
for set in $SWEEP; do
  SET=$set BUDGET=${SWEEP_S:-90} python3 "$(dirname "$0")/sweep_gemv.py" > $OUT/sweep_$set.jsonl 2> $OUT/sweep_$set.err
done
start=$(date +%s)
timeout ${LOOP_S:-440} python3 -m agent run --task llgemm --iters ${ITERS:-20} --from $FROM --backend offline \
  --plain --time-limit ${LOOP_MIN:-6} 2>&1 | tee $OUT/run.log
echo "loop wall: $(( $(date +%s) - start )) s" | tee -a $OUT/run.log
tar czf $OUT/records.tgz tasks/llgemm/versions tasks/llgemm/experiment_log.md workspace/.runs reports 2>/dev/null
ls -la $OUT
