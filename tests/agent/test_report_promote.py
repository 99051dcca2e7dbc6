"""Reports at the end of a run, their HTML in a real headless browser, and promotion by hand."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from agent import ledger
from agent.config import Task
from agent.promote import current_label
from tests.agent.conftest import agent_command, agent_env, index, ledger_rows, run_agent, runs


def promotion_rows(project: Path) -> list[str]:
    return [line for line in (project / "methods" / "experiment_log.md").read_text().splitlines()
            if line.startswith("| promote v")]


def tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != ".lock"):
        digest.update(path.relative_to(directory).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def finished_run(project: Path, panel: Path) -> str:
    run_agent(project, "run", "--iters", "2", "--backend", "offline", "--panel", str(panel))
    (state,) = runs(project)
    return state["run_id"]


def test_a_run_ends_with_a_report_and_an_index(project: Path, finished_run: str):
    out = project / "reports" / finished_run
    markdown = (out / "report.md").read_text()
    for heading in ("## Run", "## Outcome", "## Score per iteration", "## Per case", "## Ledger rows of this run"):
        assert heading in markdown
    assert "Triton interpreter" in markdown and "not GPU timings" in markdown
    assert "| status | finished, 2 of 2 attempts (2 of 2 iterations done) |" in markdown  # why it stopped
    assert "19x256x256-silu" in markdown and markdown.count(f"| {finished_run} |") == 2
    assert (out / "score.png").read_bytes().startswith(b"\x89PNG")
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and 'src="http' not in page and "<link" not in page
    assert "| task | w4a16 (tasks/w4a16) |" in markdown
    # nothing is kept on interpreter timings: the outcome says so and names the valid candidates
    valid = [e["version"] for e in index(project) if e["verdict"]["valid"]]
    assert not any(e["keep"] for e in index(project)) and "0 kept" in markdown
    assert (f"nothing was kept: without a GPU the interpreter's wall times rank nothing; {len(valid)} valid "
            f"candidate(s) ({', '.join(valid) or 'none'}) can be measured on a GPU machine (`make promote V=N` there "
            "measures one first), or promoted here with FORCE=1") in markdown
    # the index: a section per task, each run with where it was timed
    listing = (project / "reports" / "index.md").read_text().splitlines()
    assert listing[:3] == ["# kloop runs", "", "## task w4a16"]
    assert listing[4] == "| run | status | attempts | backend | best | score | timing | report |"
    assert listing[6].startswith(f"| {finished_run} | finished | 2 | offline | ")
    assert listing[6].endswith(f"| CPU (interpreter) | [report]({finished_run}/report.md) |")

    (out / "report.md").unlink()
    run_agent(project, "report", finished_run)
    assert (out / "report.md").is_file()
    missing = subprocess.run(agent_command("report", "no-such-run"), cwd=project, env=agent_env(), capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "no run no-such-run" in missing.stderr


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_html_report_renders_in_headless_chromium(project: Path, finished_run: str, tmp_path: Path):
    import matplotlib.image

    shot = tmp_path / "report.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,1600",
                    (project / "reports" / finished_run / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = matplotlib.image.imread(str(shot))
    assert pixels.std() > 0.05, "the screenshot is blank"


def test_promote_checks_copies_records_and_leaves_versions_alone(project: Path, panel: Path, finished_run: str):
    versions = project / "methods" / "versions"
    main = project / "methods" / "main" / "solution.py"
    before = tree_digest(versions)
    rows_before = ledger_rows(project)

    task = Task.load(project)
    attempts_before = ledger.rows(task)
    # v1's numbers come from this machine: interpreter timings without CUDA, which a promotion takes only with --force
    interpreted = not torch.cuda.is_available()
    done = run_agent(project, "promote", "v1", "--panel", str(panel), *(["--force"] if interpreted else []),
                     timeout=400)
    assert "promoted v1" in done.stdout and "task w4a16, v1 (methods/versions/v1): its own row: " in done.stdout
    assert main.read_text() == (versions / "v1" / "solution.py").read_text()
    row = promotion_rows(project)[-1]
    decision = "| promoted (forced) |" if interpreted else "| promoted |"
    assert row.startswith("| promote v1 |") and "| promotion |" in row and decision in row
    assert ("forced past interpreter-only numbers" in row) == interpreted
    # its identity (all its files), and its stable cell: nothing claimed on interpreter timings
    sha = ledger.solution_sha256(versions / "v1")
    assert sha != ledger.legacy_sha256((versions / "v1" / "solution.py").read_bytes())
    assert row.endswith(f"| {sha} | - |") if interpreted else f"| {sha} | " in row
    # a promotion is not an attempt: the attempt rows stay as they were, and methods/main is known as v1 by its sha
    assert ledger_rows(project) == rows_before and ledger.rows(task) == attempts_before
    assert current_label(task) == "v1"
    status = run_agent(project, "status")
    assert "promote v1" not in status.stdout, "status lists attempts only"

    broken = versions / "v9"
    broken.mkdir()
    (broken / "solution.py").write_text("def build(qweight, scales, bias, epilogue):\n"
                                        "    raise RuntimeError('broken')\n")
    refused = subprocess.run(agent_command("promote", "v9", "--panel", str(panel)), cwd=project, env=agent_env(),
                             capture_output=True, text=True, timeout=400)
    assert refused.returncode == 1 and "refused" in refused.stdout
    assert main.read_text() == (versions / "v1" / "solution.py").read_text()
    # the refusal is recorded (its checks ran), as a promotion row that changed nothing
    row = promotion_rows(project)[-1]
    assert row.startswith("| promote v9 |") and "| refused (" in row and "methods/main unchanged" in row, row
    assert "| v1 |" in row, "its parent cell names what main still is"
    assert ledger_rows(project) == rows_before and current_label(task) == "v1"

    forced = run_agent(project, "promote", "v9", "--panel", str(panel), "--force", "--note", "a test | of the note",
                       timeout=400)
    assert "forcing past" in forced.stdout and main.read_text() == (broken / "solution.py").read_text()
    assert (promotion_rows(project)[-1].startswith("| promote v9 |")
            and "promoted (forced)" in promotion_rows(project)[-1])
    assert "; why: a test / of the note |" in promotion_rows(project)[-1]  # the reason, in a cell of its own row
    assert ledger_rows(project) == rows_before
    shutil.rmtree(broken)
    assert tree_digest(versions) == before, "promotion changed methods/versions"

    missing = subprocess.run(agent_command("promote", "v99"), cwd=project, env=agent_env(), capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "promote: task w4a16 has no version v99" in missing.stdout

    # the verifier's timing gates need a GPU: refused before any check, nothing changes
    if not torch.cuda.is_available():
        rows, main_text = promotion_rows(project), main.read_text()
        unverified = subprocess.run(agent_command("promote", "v1", "--verify", "--panel", str(panel)), cwd=project,
                                    env=agent_env(), capture_output=True, text=True, timeout=60)
        assert unverified.returncode == 2 and "--verify needs a CUDA GPU" in unverified.stdout
        assert promotion_rows(project) == rows and main.read_text() == main_text


def test_a_verifier_refusal_is_a_row_and_leaves_main_alone(project: Path, monkeypatch):
    """The verifier runs only on a GPU, so its verdict is given here; the promotion's own handling of it is real."""
    from agent.evaluate import Evaluator, Stage
    from agent.promote import promote

    versions, main = project / "methods" / "versions", project / "methods" / "main" / "solution.py"
    (versions / "v1").mkdir()
    (versions / "v1" / "solution.py").write_text(main.read_text().replace('"BLOCK_SIZE_N": 64', '"BLOCK_SIZE_N": 32'))
    main_before, attempts_before = main.read_text(), ledger_rows(project)
    checked = {"stages": [], "valid": True, "failed_stage": None, "note": "ok", "correct": True, "raised": False,
               "residency": "ok", "strata": {"balanced": 3.0, "expert-batch": 2.0}, "score": 2.4, "stable": "yes",
               "stability_note": ""}
    # the whole note of a real refusal: which role's dispersion failed is at its end
    note = ("not valid: 18x8192x8192-silu: dispersion: baseline_before max/min 1.225, candidate max/min 1.022, "
            "baseline_after max/min 1.093; over 1.15 or missing: baseline_before")
    monkeypatch.setattr(Evaluator, "evaluate", lambda self, source, baseline, best_is_baseline: checked)
    monkeypatch.setattr(Evaluator, "verify", lambda self, source: Stage("verifier", False, 1, 400.0, note, {}))
    said = []
    code = promote(Task.load(project), "v1", cuda=True, panel="visible", log=said.append, verify=True, note="a try")
    assert code == 1 and any("refused: v1 fails the verifier" in line for line in said)
    assert main.read_text() == main_before and ledger_rows(project) == attempts_before
    row = promotion_rows(project)[-1]
    assert row.startswith("| promote v1 |") and "| refused (verifier) |" in row and "| v0 |" in row, row
    assert note in row and "methods/main unchanged; reports in workspace/.promotions/v1-" in row
    assert "; why: a try |" in row and "| 2.400 |" in row


# what baseline_noise_only reads of verifier reports from H200 promotions (reports/examples/h200-weight-stream)
REAL_VERDICTS = Path(__file__).resolve().parent / "data"


def test_baseline_noise_only_reads_real_verifier_reports():
    """Verifier reports from H200 promotions: refused only on v0's own groups, refused with the candidate's groups
    over the limit too, and valid."""
    import json

    from agent.evaluate import baseline_noise_only

    def report(name: str) -> dict:
        return json.loads((REAL_VERDICTS / name).read_text())

    v0_only = report("verifier-visible-v96-refused.json")  # v0 "after" 1.223 on 18x8192x8192; the candidate 1.016
    assert baseline_noise_only(v0_only)
    assert not baseline_noise_only(report("verifier-visible-v95-refused.json"))  # the candidate's 1.158 as well
    assert not baseline_noise_only(report("verifier-visible-v94-refused.json"))  # the candidate's 1.550 as well
    assert not baseline_noise_only(report("verifier-visible-v96.json"))  # valid: nothing to retry
    failed = next(c for c in v0_only["cases"] if c["failed"])
    failed["roles"]["baseline_after"]["error"] = "exit 1"  # a baseline role that broke is not noise
    assert not baseline_noise_only(v0_only)
    failed["roles"]["baseline_after"]["error"] = None
    assert baseline_noise_only(v0_only)
    failed["roles"]["baseline_after"]["gates"]["residency"]["status"] = "fail"  # nor is one that failed a gate
    assert not baseline_noise_only(v0_only)
    failed["roles"]["baseline_after"]["gates"]["residency"]["status"] = "pass"
    assert not baseline_noise_only(dict(v0_only, partial=True))  # a verifier cut off judged only some cases
    failed["failed"].append("numerics_normal")  # nor is a failed correctness gate beside it
    assert not baseline_noise_only(v0_only)


def test_a_refusal_on_v0s_timing_alone_says_run_it_again(project: Path, monkeypatch):
    """The promotion reads the verifier's own report: a refusal where only v0's groups failed says to run it again,
    on the console and in the ledger row; one where the candidate's failed too does not."""
    import json

    from agent.evaluate import Evaluator, Stage
    from agent.promote import promote

    versions, main = project / "methods" / "versions", project / "methods" / "main" / "solution.py"
    (versions / "v1").mkdir()
    (versions / "v1" / "solution.py").write_text(main.read_text().replace('"BLOCK_SIZE_N": 64', '"BLOCK_SIZE_N": 32'))
    checked = {"stages": [], "valid": True, "failed_stage": None, "note": "ok", "correct": True, "raised": False,
               "residency": "ok", "strata": {"balanced": 3.0, "expert-batch": 2.0}, "score": 2.4, "stable": "yes",
               "stability_note": ""}
    monkeypatch.setattr(Evaluator, "evaluate", lambda self, source, baseline, best_is_baseline: checked)
    for name, retry in (("verifier-visible-v96-refused.json", True), ("verifier-visible-v95-refused.json", False)):
        report = json.loads((REAL_VERDICTS / name).read_text())
        monkeypatch.setattr(Evaluator, "verify",
                            lambda self, source, report=report: Stage("verifier", False, 1, 400.0, "not valid", report))
        said = []
        code = promote(Task.load(project), "v1", cuda=True, panel="visible", log=said.append, verify=True)
        hint = "only the baseline's (v0's) own timing failed, v1's groups were within the limit: run the same promotion"
        assert code == 1 and main.read_text() != (versions / "v1" / "solution.py").read_text()
        assert any(hint in line for line in said) == retry, said
        assert (hint in promotion_rows(project)[-1]) == retry
