"""The tools on a real worktree-shaped directory: what may be read and written, and patches that apply or say where
they do not."""
from __future__ import annotations

import dataclasses
import difflib
import os
import subprocess
from pathlib import Path

import pytest

from agent.config import Task
from agent.evaluate import Evaluator
from agent.exceptions import FormatError, Submitted
from agent.prompts import render
from agent.tools import SPEC_NAMES, Tools, openai_tools, specs


@pytest.fixture
def tools(project: Path, tmp_path: Path) -> Tools:
    worktree = tmp_path / "worktree"
    (worktree / "methods" / "main").mkdir(parents=True)
    (worktree / "methods" / "main" / "solution.py").write_text(
        (project / "methods" / "main" / "solution.py").read_text())
    subprocess.run(["git", "init", "-q"], cwd=worktree, check=True)
    task = Task.load(project)
    return Tools(task, worktree, Evaluator(task, "smoke", False, tmp_path / "eval"))


def test_read_file_allows_spec_ledger_and_methods_only(tools: Tools):
    spec = (tools.task.root / "tasks" / "w4a16" / "spec.md").read_text()
    assert "W4A16" in spec and SPEC_NAMES == ("spec", "spec.md")
    for name in ("spec", "spec.md", " spec ", "tasks/w4a16/spec.md"):  # the spec by either name, or its path
        assert tools.read_file(name) == {"output": spec, "returncode": 0}, name
    assert "| v0 |" in tools.read_file("methods/experiment_log.md")["output"]
    assert "def get_config" in tools.read_file("methods/main/solution.py")["output"]
    assert "def build" in tools.read_file("methods/versions/v0/solution.py")["output"]
    # the manifest's readable folders (W4A16: methods/) are read from the worktree
    (tools.worktree / "methods" / "notes").mkdir()
    (tools.worktree / "methods" / "notes" / "idea.md").write_text("try a wider tile\n")
    assert tools.read_file("methods/notes/idea.md") == {"output": "try a wider tile\n", "returncode": 0}
    # never the evaluator, the task's adapter or its panels, nor the other prompts
    for path in ("evals/selfcheck.py", "evals/problems/visible_cases.json", "methods/../evals/policy.py",
                 "/etc/passwd", "../kloop/evals/verifier.py", "prompts/system.md", "tasks/w4a16/adapter.py",
                 "tasks/w4a16/panels/visible.json", "tasks/w4a16/task.json", "methods/../tasks/w4a16/adapter.py",
                 "methods/versions/../../tasks/w4a16/panels/smoke.json"):
        denied = tools.read_file(path)
        assert denied["returncode"] == 1 and ("refused" in denied["output"] or "relative" in denied["output"]), path
    refused = tools.read_file("tasks/w4a16/adapter.py")["output"]
    assert ("only the spec ('spec'), methods/experiment_log.md and methods/main/, methods/versions/, methods/ may be "
            "read (never the evaluator, the task's adapter or its panels)") in refused, refused


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


def test_search_replace_takes_a_path_line_only_when_it_names_a_py_file(tools: Tools):
    fenced = '```python\n<<<<<<< SEARCH\n"BLOCK_SIZE_N": 64\n=======\n"BLOCK_SIZE_N": 128\n>>>>>>> REPLACE\n```\n'
    applied = tools.apply_patch(fenced)
    assert applied["returncode"] == 0, applied["output"]
    assert '"BLOCK_SIZE_N": 128' in (tools.candidate / "solution.py").read_text()


def test_search_replace_blocks_see_the_edits_of_earlier_blocks_even_an_emptied_file(tools: Tools):
    (tools.candidate / "helper.py").write_text("X = 1")
    patch = ("helper.py\n<<<<<<< SEARCH\nX = 1\n=======\n>>>>>>> REPLACE\n"
             "helper.py\n<<<<<<< SEARCH\n=======\nY = 2\n>>>>>>> REPLACE\n")
    applied = tools.apply_patch(patch)
    assert applied["returncode"] == 0, applied["output"]
    assert (tools.candidate / "helper.py").read_text() == "Y = 2"


def candidate_listing(tools: Tools) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(tools.candidate.iterdir())}


def test_patches_that_symlink_copy_rename_or_change_modes_are_refused(tools: Tools):
    secret = tools.worktree / "evals" / "verifier.py"
    secret.parent.mkdir()
    secret.write_text("SEALED = 'the evaluator source'\n")
    before = candidate_listing(tools)
    symlink = ("diff --git methods/main/leak.py methods/main/leak.py\nnew file mode 120000\n--- /dev/null\n"
               f"+++ methods/main/leak.py\n@@ -0,0 +1 @@\n+{secret}\n\\ No newline at end of file\n")
    copy = ("diff --git a/evals/verifier.py b/methods/main/v.py\nsimilarity index 100%\ncopy from evals/verifier.py\n"
            "copy to methods/main/v.py\n--- a/methods/main/v.py\n+++ b/methods/main/v.py\n")
    rename = copy.replace("copy ", "rename ")
    modes = ("diff --git a/methods/main/solution.py b/methods/main/solution.py\nold mode 100644\nnew mode 100755\n"
             "--- a/methods/main/solution.py\n+++ b/methods/main/solution.py\n")
    binary = ("diff --git a/methods/main/x.py b/methods/main/x.py\nnew file mode 100644\n--- /dev/null\n"
              "+++ b/methods/main/x.py\nGIT binary patch\nliteral 1\nIcmZpc000310RR91\n\nliteral 0\nHcmV?d00001\n")
    for name, patch in (("symlink", symlink), ("copy", copy), ("rename", rename), ("modes", modes), ("binary", binary)):
        refused = tools.apply_patch(patch)
        assert refused["returncode"] == 1 and "refused" in refused["output"], (name, refused["output"])
        assert "Nothing was changed" in refused["output"], name
        assert candidate_listing(tools) == before, name
        assert not os.path.lexists(tools.candidate / "leak.py") and not (tools.worktree / "b").exists(), name


def test_a_new_file_diff_with_b_prefixes_lands_in_the_candidate(tools: Tools):
    created = tools.apply_patch("--- /dev/null\n+++ b/methods/main/helper.py\n@@ -0,0 +1 @@\n+X = 1\n")
    assert created["returncode"] == 0, created["output"]
    assert (tools.candidate / "helper.py").read_text() == "X = 1\n" and not (tools.worktree / "b").exists()
    bare = tools.apply_patch("--- /dev/null\n+++ other.py\n@@ -0,0 +1 @@\n+Y = 2\n")  # relative to the candidate
    assert bare["returncode"] == 0 and (tools.candidate / "other.py").read_text() == "Y = 2\n", bare["output"]
    outside = tools.apply_patch("--- /dev/null\n+++ b/evals/new.py\n@@ -0,0 +1 @@\n+Z = 3\n")
    assert outside["returncode"] == 1 and "refused" in outside["output"]
    assert not (tools.worktree / "evals").exists() and not (tools.candidate / "evals").exists()


def test_a_tool_that_fails_on_its_input_answers_instead_of_ending_the_run(tools: Tools):
    source = (tools.candidate / "solution.py").read_text()
    failed = tools.call("write_file", {"path": "methods/main/solution.py", "content": "X = '\ud800'\n"})
    assert failed["returncode"] == 1 and failed["output"].startswith("write_file failed: UnicodeEncodeError"), failed
    assert (tools.candidate / "solution.py").read_text() == source, "a failed write left the file as it was"
    failed = tools.call("apply_patch",
                        {"patch": "<<<<<<< SEARCH\nimport torch\n=======\nX = '\ud800'\n>>>>>>> REPLACE"})
    assert failed["returncode"] == 1 and "UnicodeEncodeError" in failed["output"], failed
    assert (tools.candidate / "solution.py").read_text() == source


PASS = "import json, sys; json.dump({'ok': True, 'cases': []}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))"
# a stand-in check: it logs its arguments and fails one case, as a memory guard's report lists them
FAIL = """
import json, sys
from pathlib import Path
args = sys.argv[1:]
print('checked', ' '.join(args))
case = {'case': {'name': 'c1'}, 'ok': False, 'checks': {'alive': {'ok': False, 'message': '3 buffers kept'}}}
Path(args[args.index('--json') + 1]).write_text(json.dumps({'ok': False, 'cases': [case]}))
sys.exit(1)
"""


def test_the_tools_are_the_tasks_and_its_declared_checks_dispatch_to_their_stage(project: Path, tmp_path: Path,
                                                                                  tools: Tools):
    task = tools.task
    names = [s["name"] for s in tools.specs]
    assert names == ["read_file", "write_file", "apply_patch", "run_selfcheck", "run_residency_guard", "run_profile",
                     "submit"]
    assert tools.specs == specs(task)
    guard = next(s for s in tools.specs if s["name"] == "run_residency_guard")
    assert guard == {"name": "run_residency_guard", "parameters": {},
                     "description": "Check what the candidate keeps alive against the memory contract."}
    read = next(s for s in tools.specs if s["name"] == "read_file")["description"]
    assert "methods/experiment_log.md (the ledger)" in read and "methods/versions/vN/*" in read
    assert "speedup over v0" in next(s for s in tools.specs if s["name"] == "run_selfcheck")["description"]
    assert [t["function"]["name"] for t in openai_tools(tools.specs)] == names
    assert openai_tools(tools.specs)[0]["function"]["parameters"] == {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    # a task that declares another check: its tool, not the residency guard, and the call runs the stage's command
    other = dataclasses.replace(task, stages=("policy", "selfcheck", "memory", "gates"), columns=("memory", "balanced"),
                                commands={"memory": ("-c", FAIL)}, gates_cmd=("-c", PASS),
                                tools={"run_memory_check": {"stage": "memory", "description": "Count the buffers."}})
    checked = Tools(other, tools.worktree, Evaluator(other, "smoke", False, tmp_path / "eval2"))
    assert [s["name"] for s in checked.specs] == ["read_file", "write_file", "apply_patch", "run_selfcheck",
                                                  "run_memory_check", "run_profile", "submit"]
    with pytest.raises(FormatError, match="unknown tool 'run_residency_guard'"):
        checked.call("run_residency_guard", {})
    answer = checked.call("run_memory_check", {})
    assert answer["returncode"] == 1, answer
    assert answer["output"].startswith(f"checked --task {project / 'tasks' / 'w4a16'} --solution {checked.candidate} "
                                       "--panel smoke --json ")
    assert answer["output"].endswith("\nmemory: c1: alive: 3 buffers kept")
    values = checked.prompt_values()
    assert values == {"main": "methods/main", "ledger": "methods/experiment_log.md", "versions": "methods/versions",
                      "check_tools": "run_memory_check(), ", "checks": "memory, gates", "speed": values["speed"]}
    # what speed counts follows the task's timing protocol: the host-bound rule for eager groups, both regimes of a
    # graph-paired task
    assert not checked.task.graph_paired and "host_us, gpu_us and stable" in values["speed"]
    paired = Tools(dataclasses.replace(other, timing="graph-paired"), tools.worktree, checked.evaluator)
    assert "hot_x and flush_x" in paired.prompt_values()["speed"] and "host_us" not in paired.prompt_values()["speed"]
    system = render("system", **paired.prompt_values())
    assert "$" not in system and "L2-flushed" in system and "1.3x its host cost" not in system
