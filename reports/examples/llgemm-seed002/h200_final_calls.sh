#!/usr/bin/env bash
# The H200 calls after the loop has settled the tables (issue 38's last steps), each under 9 minutes, logs in $OUT:
#   PART=promote V=N bash reports/examples/llgemm-seed002/h200_final_calls.sh
#       make promote TASK=llgemm V=N VERIFY=1 (the full verifier on the visible panel), then main's selfcheck on the
#       visible panel and table.py on it (the side-by-side table; RUNS="id ..." counts those runs' attempts)
#   PART=sealed SEED=S bash reports/examples/llgemm-seed002/h200_final_calls.sh
#       a sealed panel drawn with seed S outside the repository, the verifier of main on it, make bench TASK=llgemm
#   PART=bench [PANEL=FILE] bash reports/examples/llgemm-seed002/h200_final_calls.sh
#       make bench TASK=llgemm alone (v0, main and F.linear on the visible panel: about 4.5 minutes on an H200; the
#       make variable PANEL comes from the environment, e.g. bench_rest_points.json, the six the first call missed)
#   PART=profile bash reports/examples/llgemm-seed002/h200_final_calls.sh
#       make profile NCU=1 of main on the points where it falls short of the seed (short_points_v137.json)
#   PART=testgpu [K=EXPR] bash reports/examples/llgemm-seed002/h200_final_calls.sh
#       make test-gpu (up to 10 minutes on an H100: K='not red_team', then K=red_team, splits it across two calls)
# The records (ledger, main, promotion reports, reports) come back in $OUT/records.tgz; unpack and commit the promote
# call's before the sealed one, which judges the main it is given.
set -o pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
HERE=reports/examples/llgemm-seed002
case "${PART:?PART=promote, sealed, bench, profile or testgpu}" in
  promote)
    make promote TASK=llgemm V=${V:?V=N, the version to promote} VERIFY=1 2>&1 | tee $OUT/promote.txt \
      || { tar czf $OUT/records.tgz tasks/llgemm/experiment_log.md $(ls -d workspace/.promotions 2>/dev/null); exit 1; }
    make selfcheck TASK=llgemm PANEL=visible JSON=$OUT/selfcheck-main.json 2>&1 | tee $OUT/selfcheck-main.txt
    python3 $HERE/table.py $OUT/selfcheck-main.json --ledger tasks/llgemm/experiment_log.md \
      $(for run in $RUNS; do echo --run $run; done) 2>&1 | tee $OUT/table.md ;;
  sealed)
    make sealed-panel TASK=llgemm SEED=${SEED:?SEED=S, a seed not drawn before} FILE=/tmp/sealed-$SEED.json \
      2>&1 | tee $OUT/sealed.txt || exit 1
    make verify TASK=llgemm PANEL=/tmp/sealed-$SEED.json JSON=$OUT/verifier-sealed-$SEED.json \
      2>&1 | tee $OUT/verifier-sealed-$SEED.txt  # an invalid verdict still goes on to bench
    cp /tmp/sealed-$SEED.json $OUT/  # the panel, once it has been run
    make bench TASK=llgemm JSON=$OUT/bench.json 2>&1 | tee $OUT/bench.txt ;;
  bench)
    make bench TASK=llgemm JSON=$OUT/bench.json 2>&1 | tee $OUT/bench.txt ;;
  profile)
    make profile TASK=llgemm PANEL=$HERE/short_points_v137.json NCU=1 JSON=$OUT/profile.json 2>&1 \
      | tee $OUT/profile.txt ;;
  testgpu)
    make test-gpu K="$K" 2>&1 | tee $OUT/testgpu.txt ;;
  *) echo "PART must be promote, sealed, bench, profile or testgpu" >&2; exit 2 ;;
esac
rc=$?  # the part's last command (pipefail: its make, not tee); the call ends with it
tar czf $OUT/records.tgz tasks/llgemm/main tasks/llgemm/experiment_log.md tasks/llgemm/versions/index*.jsonl reports \
  $(ls -d workspace/.promotions 2>/dev/null)
ls -la $OUT
exit $rc
