"""Bad candidates cost one attempt each, never the run: they are recorded (row, version, verdict) and the run goes
on."""
from __future__ import annotations

import json
from pathlib import Path

from tests.agent.conftest import add_task, index, ledger_rows, manifest, run_agent, runs

RAISES = "    raise RuntimeError('candidate broke on purpose')\n"
HANGS = "    while True:\n        pass\n"
KILLS_ITSELF = "    os.kill(os.getpid(), 9)\n"
# each evaluation stage's limit: it kills the hanging candidate, and the valid one's gates finish well within it on a
# loaded 2-core machine (they run beside the residency guard)
LIMIT_S = 20


def candidate(project: Path, body: str, header: str = "") -> str:
    """methods/main/solution.py with ``body`` run first thing in build."""
    source = (project / "methods" / "main" / "solution.py").read_text()
    source = source.replace('    """Check the weights once and return ``fn(x, residual) -> out``."""\n',
                            '    """Check the weights once and return ``fn(x, residual) -> out``."""\n' + body, 1)
    return header + source


def script(path: Path, *sources: tuple[str, str], main: str = "methods/main") -> Path:
    calls = []
    for summary, source in sources:
        calls += [{"tool": "write_file", "args": {"path": f"{main}/solution.py", "content": source}},
                  {"tool": "submit", "args": {"summary": summary, "hypothesis": "the run records it and goes on"}}]
    path.write_text(json.dumps(calls))
    return path


def test_raising_and_hanging_and_forbidden_candidates_are_recorded(project: Path, panel: Path):
    valid = (project / "methods" / "main" / "solution.py").read_text().replace('"BLOCK_SIZE_N": 64',
                                                                              '"BLOCK_SIZE_N": 128')
    calls = script(project.parent / "script.json", ("raises", candidate(project, RAISES)),
                   ("hangs", candidate(project, HANGS)),
                   ("kills itself", candidate(project, KILLS_ITSELF, "import os\n")), ("valid", valid))
    run_agent(project, "run", "--iters", "4", "--backend", "scripted", "--script", str(calls), "--panel", str(panel),
              KLOOP_EVAL_TIMEOUT=str(LIMIT_S))
    rows = ledger_rows(project)[1:]
    assert len(rows) == 4 and all(" | scripted | " in row for row in rows)
    verdicts = {e["summary"]: e["verdict"] for e in index(project)}
    # the verifier's gates (when present) or else the selfcheck is the first stage that runs candidate code
    assert verdicts["raises"]["failed_stage"] in ("gates", "selfcheck")
    assert "candidate broke on purpose" in verdicts["raises"]["note"]
    assert verdicts["hangs"]["failed_stage"] in ("gates", "selfcheck")
    assert f"timed out after {LIMIT_S} s" in verdicts["hangs"]["note"]
    assert verdicts["kills itself"]["failed_stage"] == "policy"  # the source policy stops it before it runs
    assert verdicts["valid"]["valid"] and verdicts["valid"]["correct"]
    assert all("revert" in row for row in rows[:3])
    # the ledger tells a candidate that raised from one that computed a wrong result
    raised = next(row for row in rows if "| raises" in row)
    assert " | error | " in raised and " | no | " not in raised
    # the row says that a time limit killed the attempt, and the whole reason
    assert f"timed out after {LIMIT_S} s, the task's limit" in next(row for row in rows if "| hangs" in row)
    assert "candidate broke on purpose" in raised
    (state,) = runs(project)
    assert state["status"] == "finished" and state["attempts"] == 4


def test_a_candidate_that_kills_its_process_is_recorded(project: Path, panel: Path):
    # The policy (run by the policy stage, inside the verifier's gates and by the evaluator's loader before any
    # candidate code) would stop this candidate before it runs. A task whose policy stand-in passes everything (and
    # prints 5000 characters, more than a verdict keeps) and whose selfcheck is the real one with the loader's policy
    # check off (an argument of evals.selfcheck.main that the command line does not offer) lets the crash reach the
    # selfcheck process: it dies of SIGKILL before any gate runs. The task is W4A16's with those two commands and
    # records of its own.
    clean = ("import json, sys; print('p' * 4999 + 'P'); "
             "json.dump({'clean': True, 'files': {}}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))")
    selfcheck = "import sys, evals.selfcheck as s; sys.exit(s.main(sys.argv[1:], enforce_policy=False))"
    add_task(project, "crashy",
             commands=manifest(project)["commands"] | {"policy": ["-c", clean], "selfcheck": ["-c", selfcheck]})
    calls = script(project.parent / "script.json", ("kills itself", candidate(project, KILLS_ITSELF, "import os\n")),
                   ("raises", candidate(project, RAISES)), main="tasks/crashy/main")
    run_agent(project, "run", "--iters", "2", "--backend", "scripted", "--script", str(calls), "--panel", str(panel),
              "--task", "crashy")
    assert not index(project) and len(ledger_rows(project)) == 1, "W4A16's records stay as they were"
    entries = index(project, "crashy")
    assert [(e["version"], e["task"]) for e in entries] == [("v1", "crashy"), ("v2", "crashy")]
    verdicts = {e["summary"]: e["verdict"] for e in entries}
    killed = verdicts["kills itself"]
    # the note names the signal and the stage's last output: the case it was checking when it died
    assert killed["failed_stage"] == "selfcheck"
    assert killed["note"].startswith("selfcheck: crashed: killed by signal 9; its last output: "), killed["note"]
    assert "checking 19x256x256-silu" in killed["note"]
    assert verdicts["raises"]["failed_stage"] == "selfcheck", "the run went on after the crash"
    row = ledger_rows(project, "crashy")[0]
    assert row.startswith("| v1 |") and "| revert: selfcheck crashed: killed by signal 9; its last output: " in row
    assert "checking 19x256x256-silu" in row.split(" | ")[-3], row  # in the decision cell
    # the index keeps a line small: no stage's output; the snapshot's verdict.json keeps each stage's last 3000
    # characters
    assert all("output" not in stage for e in entries for stage in e["verdict"]["stages"])
    kept = json.loads((project / "tasks" / "crashy" / "versions" / "v1" / "verdict.json").read_text())
    policy, check = kept["stages"]
    assert policy["name"] == "policy" and policy["output"] == "p" * 2998 + "P\n"
    assert check["name"] == "selfcheck" and check["returncode"] == -9 and check["note"] in killed["note"]
    assert "checking 19x256x256-silu" in check["output"] and len(check["output"]) <= 3000


def test_a_scored_candidate_that_fails_a_check_is_not_listed_as_valid(project: Path, panel: Path):
    """With --full-check on the CPU every correct candidate gets the task's checks: one that fails its memory check has
    a score but is not valid, and the closing summary and the report list only the valid one for measuring on a GPU.
    The task is W4A16's with a stand-in residency check (it fails a candidate of 32-column tiles) and stand-in gates."""
    residency = ("import json, sys; from pathlib import Path; args = sys.argv[1:]; "
                 "source = (Path(args[args.index('--solution') + 1]) / 'solution.py').read_text(); "
                 "bad = '\"BLOCK_SIZE_N\": 32' in source; "
                 "case = {'case': {'name': 'c1'}, 'ok': not bad, 'checks': {'alive': {'ok': not bad, 'message': "
                 "'3 buffers kept'}}}; json.dump({'ok': not bad, 'cases': [case]}, "
                 "open(args[args.index('--json') + 1], 'w')); sys.exit(1 if bad else 0)")
    gates = "import json, sys; json.dump({'ok': True}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))"
    add_task(project, "checked",
             commands=manifest(project)["commands"] | {"residency": ["-c", residency], "gates": ["-c", gates]})
    main = (project / "tasks" / "checked" / "main" / "solution.py").read_text()
    wide, narrow = (main.replace('"BLOCK_SIZE_N": 64', f'"BLOCK_SIZE_N": {n}') for n in (128, 32))
    calls = script(project.parent / "script.json", ("wide", wide), ("narrow", narrow), main="tasks/checked/main")
    done = run_agent(project, "run", "--iters", "2", "--backend", "scripted", "--script", str(calls), "--panel",
                     str(panel), "--task", "checked", "--full-check")
    verdicts = {e["summary"]: e["verdict"] for e in index(project, "checked")}
    assert verdicts["wide"]["valid"] and verdicts["wide"]["residency"] == "ok" and not verdicts["wide"]["keep"]
    narrow = verdicts["narrow"]
    assert narrow["score"] is not None and narrow["failed_stage"] == "residency" and not narrow["valid"]
    assert narrow["residency"] == "FAIL" and "residency: c1: alive: 3 buffers kept" in narrow["note"]
    wide_row, narrow_row = ledger_rows(project, "checked")
    assert "| revert (no GPU: nothing is kept on interpreter timings" in wide_row and "| ok |" in wide_row
    assert "| revert: residency: c1: alive: 3 buffers kept |" in narrow_row and "| FAIL |" in narrow_row
    assert "1 valid candidate(s) recorded (v1). Measure them on a GPU" in done.stdout, done.stdout
    (state,) = runs(project)
    report = (project / "reports" / state["run_id"] / "report.md").read_text()
    assert "1 valid candidate(s) (v1) can be measured on a GPU machine" in report
