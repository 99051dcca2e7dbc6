#!/usr/bin/env bash
# One H200 call (about 9 minutes): the family's GPU tests on the draft, where each W4A16 call's host time goes
# (main v99, v100 and the draft on the same host), and the floor plans qualified: FLOOR_GRID 1 (a stream-K grid sized
# to the floor) against 0 (whole splits) on the visible expert-batch cases and on those of a sealed panel drawn here.
# Every log lands in $OUT. Run: bash reports/examples/h200-host-path/h200_call.sh (carry .whl for the loop's wheels).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1
git log --oneline -1 >> "$OUT/env.txt" 2>&1
# the family's GPU tests, then its CPU tests that run on CUDA here: the floor's stream-K plans, the variants, identity
timeout 120 python3 -m pytest -q -m gpu tests/methods/test_w4a16.py > "$OUT/test-gpu-family.txt" 2>&1
timeout 90 python3 -m pytest -q tests/methods/test_w4a16.py -k "floor or variants or identity or forced" \
  >> "$OUT/test-gpu-family.txt" 2>&1
timeout 120 python3 reports/examples/h200-host-path/host_breakdown.py \
  --solutions methods/main methods/versions/v100 methods/drafts/w4a16 \
  --json "$OUT/host-breakdown.json" > "$OUT/host-breakdown.txt" 2>&1
# the expert-batch cases of the visible panel and of a sealed panel drawn outside the repository
SEED=${SEED:-9101}
python3 -m evals.verifier make-panel --seed "$SEED" --per-stratum 5 --out /tmp/sealed.json > /dev/null \
  || { echo "make-panel failed" > "$OUT/panels.txt"; exit 1; }
python3 - "$SEED" <<'PY' > "$OUT/panels.txt"
import json, sys
visible = json.load(open("tasks/w4a16/panels/visible.json"))["cases"]
sealed = json.load(open("/tmp/sealed.json"))["cases"]
cases = [c for c in visible + sealed if c["stratum"] == "expert-batch"]
json.dump({"note": f"expert-batch cases: visible and sealed seed {sys.argv[1]}", "cases": cases},
          open("/tmp/expert.json", "w"))
print(json.dumps(cases, indent=1))
PY
# the floor's stream-K grid on its default loop, the same grid on the leaner loop, and v100's whole splits
echo '[{}, {"DEQUANT": 3, "MAXNREG": 96}, {"FLOOR_GRID": 0}]' > /tmp/floor-grid.json
timeout 180 python3 -m evals.qualify --solution methods/drafts/w4a16 --panel /tmp/expert.json \
  --grid /tmp/floor-grid.json --repeats 2 --schedules spec --json "$OUT/qualify-floor-grid.json" \
  > "$OUT/qualify-floor-grid.txt" 2>&1
ls -la "$OUT"
