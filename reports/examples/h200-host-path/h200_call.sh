#!/usr/bin/env bash
# One H200 call (about 9 minutes): the floor plans qualified (FLOOR_GRID 1, a stream-K grid sized to the floor,
# against 0, whole splits) on the visible expert-batch cases and on those of a sealed panel drawn here; where each
# W4A16 call's host time goes (main and v99, or SOLUTIONS, on the same host); the family's GPU tests. The floor
# plans are qualified on FAMILY (the draft while one exists, else main); the tests pick it the same way (conftest).
# PARTS picks among "qualify breakdown tests" (all by default); GRID the qualified plans; SEED the sealed panel.
# Every log lands in $OUT. Run: bash reports/examples/h200-host-path/h200_call.sh (carry .whl for the loop's wheels).
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the folder that receives the results}"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1
git log --oneline -1 >> "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl >> "$OUT/env.txt" 2>&1 \
  || echo "the carried wheels (.whl) did not install: see above" >> "$OUT/env.txt"
SOLUTIONS=${SOLUTIONS:-"methods/main methods/versions/v99"}  # main first: the others are compared with it
FAMILY=${FAMILY:-$( [ -d methods/drafts/w4a16 ] && echo methods/drafts/w4a16 || echo methods/main )}
PARTS=${PARTS:-"qualify breakdown tests"}
# the default grid: the floor's stream-K grid on its default loop, on the leaner loop, and v100's whole splits
GRID=${GRID:-'[{}, {"DEQUANT": 3, "MAXNREG": 96}, {"FLOOR_GRID": 0}]'}
SEED=${SEED:-9101}
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if part qualify; then
  # the expert-batch cases of the visible panel and of a sealed panel drawn outside the repository
  rm -f /tmp/expert.json
  python3 -m evals.verifier make-panel --seed "$SEED" --per-stratum 5 --out /tmp/sealed.json > "$OUT/panels.txt" 2>&1 \
    && python3 - "$SEED" > "$OUT/panels.txt" 2>&1 <<'PY'
import json, sys
visible = json.load(open("tasks/w4a16/panels/visible.json"))["cases"]
sealed = json.load(open("/tmp/sealed.json"))["cases"]
cases = [c for c in visible + sealed if c["stratum"] == "expert-batch"]
json.dump({"note": f"expert-batch cases: visible and sealed seed {sys.argv[1]}", "cases": cases},
          open("/tmp/expert.json", "w"))
print(json.dumps(cases, indent=1))
PY
  echo "$GRID" > /tmp/floor-grid.json
  if [ -s /tmp/expert.json ]; then  # else panels.txt says why; the other parts still run
    timeout "${QUALIFY_S:-200}" python3 -m evals.qualify --solution "$FAMILY" --panel /tmp/expert.json \
      --grid /tmp/floor-grid.json --repeats 2 --schedules spec --json "$OUT/qualify-floor-grid.json" \
      > "$OUT/qualify-floor-grid.txt" 2>&1
    echo "qualify rc=$?" >> "$OUT/qualify-floor-grid.txt"
  fi
fi
if part breakdown; then
  timeout "${BREAKDOWN_S:-150}" python3 reports/examples/h200-host-path/host_breakdown.py --solutions $SOLUTIONS \
    --json "$OUT/host-breakdown.json" > "$OUT/host-breakdown.txt" 2>&1
  echo "breakdown rc=$?" >> "$OUT/host-breakdown.txt"
fi
if part tests; then
  # the family's GPU tests, then its CPU tests that run on CUDA here: floor plans, variants, identity epilogue
  timeout "${TESTS_S:-120}" python3 -m pytest -q -m gpu tests/methods/test_w4a16.py > "$OUT/test-gpu-family.txt" 2>&1
  echo "gpu tests rc=$?" >> "$OUT/test-gpu-family.txt"
  timeout 90 python3 -m pytest -q tests/methods/test_w4a16.py -k "floor or variants or identity or forced" \
    >> "$OUT/test-gpu-family.txt" 2>&1
  echo "cpu tests on cuda rc=$?" >> "$OUT/test-gpu-family.txt"
fi
ls -la "$OUT"
