#!/usr/bin/env bash
# One H200 call (at most CALL_S seconds, default 570): the loop on llgemm (offline, visible panel, time-limited) from
# FROM (default v98), ITERS attempts (default 40), then its records back in $OUT.
began=$(date +%s)
source "$(dirname "$0")/device_env.sh" || exit 1
# PROBE=1: first, what each fresh evaluator process costs on this host (~20 s)
[ -z "$PROBE" ] || python3 "$(dirname "$0")/startup_probe.py" 2>&1 | tee $OUT/startup.txt
FROM=${FROM:-v98}
# STRESS=1 (the default; STRESS=0 skips it): first, the family's GPU tests (tests/methods/test_llgemm.py, mark gpu:
# the newest family's split plans, 64 calls a regime); where they fail or give no result in STRESS_S seconds (200), the
# loop starts from STRESS_FALLBACK (default v62, whose split epilogue, fenced in every thread, passed them) instead
if [ "${STRESS:-1}" != 0 ]; then
  timeout ${STRESS_S:-200} python3 -m pytest -q -m gpu tests/methods/test_llgemm.py > $OUT/stress.txt 2>&1
  rc=$?
  [ $rc = 0 ] || { FROM=${STRESS_FALLBACK:-v62}
                   echo "the family's GPU tests ended with status $rc: the loop starts from $FROM" | tee -a $OUT/stress.txt; }
fi
# SWEEP="pairs split" (sets of sweep_gemv.py: gemv, vec, cg, pairs, split): then those informational sweeps (pairs
# and cg about 45 s each, split about 60 s), each stopped between points past SWEEP_S seconds
for set in $SWEEP; do
  SET=$set BUDGET=${SWEEP_S:-90} python3 "$(dirname "$0")/sweep_gemv.py" > $OUT/sweep_$set.jsonl 2> $OUT/sweep_$set.err
done
# the loop gets what the call has left (less 30 s for the records), its time limit two minutes less for the run's
# closing merge
left=$(( ${CALL_S:-570} - ($(date +%s) - began) - 30 ))
loop_s=${LOOP_S:-$left}; [ $loop_s -le $left ] || loop_s=$left
loop_min=${LOOP_MIN:-$(awk "BEGIN { m = ($loop_s - 120) / 60; print (m < 1 ? 1 : m) }")}
start=$(date +%s)
if [ $loop_s -ge 150 ]; then
  echo "loop from $FROM: ${loop_s} s, time limit ${loop_min} min" | tee $OUT/run.log
  timeout $loop_s python3 -m agent run --task llgemm --iters ${ITERS:-40} --from $FROM --backend offline \
    --plain --time-limit $loop_min 2>&1 | tee -a $OUT/run.log
  echo "loop wall: $(( $(date +%s) - start )) s" | tee -a $OUT/run.log
else
  echo "no loop: ${loop_s} s left of the call" | tee $OUT/run.log
fi
tar czf $OUT/records.tgz tasks/llgemm/versions tasks/llgemm/experiment_log.md workspace/.runs reports 2>/dev/null
ls -la $OUT
