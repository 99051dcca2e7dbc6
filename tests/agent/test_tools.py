"""The tools on a real worktree-shaped directory: what may be read and written, and patches that apply or say where
they do not."""
from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

import pytest

from agent.config import Task
from agent.evaluate import Evaluator
from agent.exceptions import FormatError, Submitted
from agent.tools import Tools


@pytest.fixture
def tools(project: Path, tmp_path: Path) -> Tools:
    worktree = tmp_path / "worktree"
    (worktree / "methods" / "main").mkdir(parents=True)
    (worktree / "methods" / "main" / "solution.py").write_text((project / "methods" / "main" / "solution.py").read_text())
    subprocess.run(["git", "init", "-q"], cwd=worktree, check=True)
    task = Task(root=project)
    return Tools(task, worktree, Evaluator(task, "smoke", False, tmp_path / "eval"))


def test_read_file_allows_spec_ledger_and_methods_only(tools: Tools):
    assert "W4A16" in tools.read_file("spec")["output"]
    assert "| v0 |" in tools.read_file("methods/experiment_log.md")["output"]
    assert "def get_config" in tools.read_file("methods/main/solution.py")["output"]
    assert "def build" in tools.read_file("methods/versions/v0/solution.py")["output"]
    for path in ("evals/selfcheck.py", "evals/problems/visible_cases.json", "methods/../evals/policy.py",
                 "/etc/passwd", "../kloop/evals/verifier.py", "prompts/system.md"):
        denied = tools.read_file(path)
        assert denied["returncode"] == 1 and ("refused" in denied["output"] or "relative" in denied["output"]), path


def test_write_file_only_inside_the_candidate(tools: Tools):
    assert tools.write_file("methods/main/helper.py", "X = 1\n")["returncode"] == 0
    assert (tools.candidate / "helper.py").read_text() == "X = 1\n"
    for path in ("methods/versions/v0/solution.py", "methods/main/../../evals/selfcheck.py", "methods/main/notes.txt",
                 "../outside.py"):
        assert tools.write_file(path, "x")["returncode"] == 1, path


def test_search_replace_blocks_apply_or_say_where(tools: Tools):
    patch = '<<<<<<< SEARCH\n"BLOCK_SIZE_N": 64\n=======\n"BLOCK_SIZE_N": 128\n>>>>>>> REPLACE\n'
    assert tools.apply_patch(patch)["returncode"] == 0
    assert '"BLOCK_SIZE_N": 128' in (tools.candidate / "solution.py").read_text()
    missing = tools.apply_patch(patch)  # the old text is gone now
    assert missing["returncode"] == 1 and "block 1 (solution.py): search text not found" in missing["output"]
    twice = tools.apply_patch("<<<<<<< SEARCH\nimport\n=======\nimport\n>>>>>>> REPLACE")
    assert twice["returncode"] == 1 and "found 3 times" in twice["output"]


def test_unified_diff_applies_or_reports_the_failing_hunk(tools: Tools):
    source = (tools.candidate / "solution.py").read_text()
    changed = source.replace('"BLOCK_SIZE_N": 64', '"BLOCK_SIZE_N": 256')
    diff = "".join(difflib.unified_diff(source.splitlines(keepends=True), changed.splitlines(keepends=True),
                                        "a/methods/main/solution.py", "b/methods/main/solution.py"))
    applied = tools.apply_patch(diff)
    assert applied["returncode"] == 0, applied["output"]
    assert '"BLOCK_SIZE_N": 256' in (tools.candidate / "solution.py").read_text()
    failed = tools.apply_patch(diff)
    assert failed["returncode"] != 0 and "solution.py" in failed["output"] and "patch failed" in failed["output"]
    outside = tools.apply_patch(diff.replace("methods/main/solution.py", "evals/selfcheck.py"))
    assert outside["returncode"] == 1 and "refused" in outside["output"]


def test_dispatch_rejects_unknown_tools_and_bad_arguments_and_submit_ends(tools: Tools):
    with pytest.raises(FormatError, match="unknown tool"):
        tools.call("rm", {})
    with pytest.raises(FormatError, match="takes string arguments"):
        tools.call("read_file", {"file": "spec"})
    with pytest.raises(Submitted) as submitted:
        tools.call("submit", {"summary": "s", "hypothesis": "h"})
    assert submitted.value.hypothesis == "h"
