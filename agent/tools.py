"""The tools, one implementation each, shared by every proposer, the CLI and the tests.

Each returns ``{"output": str, "returncode": int}``; ``submit`` raises ``Submitted`` to end the iteration.
The agent may read only its candidate, the task's ledger, versions and spec, and the folders the task's manifest
names ``readable``; it may write only the candidate solution directory. Evaluator internals, the task's adapter and
its panels are out of reach.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from agent.config import Task
from agent.evaluate import Evaluator
from agent.exceptions import FormatError, Submitted
from agent.ledger import fmt, solution_files
from agent.prompts import render

SPEC_NAMES = ("spec", "spec.md")
# An optional line naming the file (it must end in .py, so a ``` fence line is never taken for one), then the block.
BLOCK = re.compile(r"(?:^[ \t]*(?P<path>[^\s<>=`]+\.py)[ \t]*\n)?<<<<<<< SEARCH\n(?P<search>.*?)\n?=======\n"
                   r"(?P<replace>.*?)\n?>>>>>>> REPLACE", re.S | re.M)
# git diff headers that copy, rename, re-mode, symlink or binary-patch a file: each could bring in or point at a file
# from outside the candidate (evaluator source, a sealed panel), so a patch carrying one is refused whole.
REFUSED_HEADERS = re.compile(r"^(copy from|copy to|rename from|rename to|old mode|new mode|new file mode 120000|"
                             r"deleted file mode 120000|GIT binary patch|Binary files)", re.M)
# What a tool implementation may raise on bad input (a lone surrogate, git apply timing out): answered, never fatal.
TOOL_ERRORS = (OSError, ValueError, UnicodeError, subprocess.SubprocessError)



def specs(task: Task) -> list[dict]:
    """The tools as the task names them: its paths, its baseline, and a tool for each check it declares in its
    manifest's ``tools`` (``{"run_NAME": {"stage": STAGE, "description": "..."}}``)."""
    main, extra = task.candidate_dir, "".join(f", {folder}/*" for folder in task.readable)
    declared = [{"name": name, "description": tool["description"], "parameters": {}}
                for name, tool in task.tools.items()]
    return [
        {"name": "read_file", "description": f"Read a file: the task spec ('spec'), {task.ledger} (the ledger), "
         f"{main}/*.py (your candidate) or {task.versions_dir}/vN/* (earlier attempts){extra}.",
         "parameters": {"path": {"type": "string"}}},
        {"name": "write_file", "description": f"Replace a .py file of the candidate solution directory ({main}/).",
         "parameters": {"path": {"type": "string"}, "content": {"type": "string"}}},
        {"name": "apply_patch", "description": "Edit the candidate with a unified diff of file contents (no renames, "
         "copies, mode changes, symlinks or binary patches), or with search/replace blocks: "
         "'<<<<<<< SEARCH\\n<exact old text>\\n=======\\n<new text>\\n>>>>>>> REPLACE' (optionally preceded by a "
         "line naming the file; default solution.py).", "parameters": {"patch": {"type": "string"}}},
        {"name": "run_selfcheck", "description": "Correctness (every input regime of the task), latency and speedup "
         f"over {task.baseline_label} of the current candidate.", "parameters": {}},
        *declared,
        {"name": "run_profile", "description": "Profiler summary per case: median us, GB/s and fraction of copy "
         "bandwidth, host vs GPU time per call, kernels with grids, registers and spills, and a bottleneck label with "
         "its evidence.", "parameters": {}},
        {"name": "submit", "description": "End this iteration: the candidate is evaluated and recorded.",
         "parameters": {"summary": {"type": "string"}, "hypothesis": {"type": "string"}}},
    ]


def openai_tools(tool_specs: list[dict]) -> list[dict]:
    return [{"type": "function", "function": {"name": s["name"], "description": s["description"], "parameters": {
        "type": "object", "properties": s["parameters"], "required": list(s["parameters"])}}} for s in tool_specs]


def result(output: str, returncode: int = 0) -> dict:
    return {"output": output, "returncode": returncode}


class Tools:
    def __init__(self, task: Task, worktree: Path, evaluator: Evaluator):
        self.task, self.worktree, self.evaluator = task, worktree, evaluator
        self.candidate = worktree / task.candidate_dir
        self.specs = specs(task)

    def prompt_values(self) -> dict[str, str]:
        """What the system prompt names: the candidate's folder, the ledger, the versions, the check tools and what
        speed counts under the task's timing protocol."""
        checks = "".join(f"{name}(), " for name in self.task.tools)
        speed = render("speed_graph" if self.task.graph_paired else "speed_eager")
        return {"main": self.task.candidate_dir, "ledger": self.task.ledger, "versions": self.task.versions_dir,
                "check_tools": checks, "checks": ", ".join(self.task.checks) or "none", "speed": speed}

    def call(self, name: str, arguments: Any) -> dict:
        """Dispatch a tool call by name; an unknown tool or wrong arguments is a FormatError. A tool that fails on its
        input (a write that cannot be encoded, git apply timing out) answers with returncode 1 and never ends the
        run."""
        spec = next((s for s in self.specs if s["name"] == name), None)
        if spec is None:
            raise FormatError(f"unknown tool {name!r}; the tools are {', '.join(s['name'] for s in self.specs)}")
        if not isinstance(arguments, dict) or set(arguments) != set(spec["parameters"]) or \
                not all(isinstance(v, str) for v in arguments.values()):
            raise FormatError(f"{name} takes string arguments {sorted(spec['parameters'])}; got {arguments!r}"[:500])
        try:
            if name in self.task.tools:
                return self.run_check(self.task.tools[name]["stage"])
            return getattr(self, name)(**arguments)
        except TOOL_ERRORS as exc:
            return result(f"{name} failed: {type(exc).__name__}: {exc}", 1)

    def _readable(self, path: str) -> Path:
        if path.strip() in SPEC_NAMES or path.strip() == self.task.spec:
            return self.task.root / self.task.spec
        relative = Path(path.strip())
        task = self.task
        if relative.is_absolute():
            raise PermissionError(f"give a path relative to the project, such as {task.candidate_dir}/solution.py or "
                                  "spec")
        versions = Path(task.versions_dir).parts
        if relative.as_posix() == task.ledger:  # the live record is in the main checkout
            return (task.root / relative).resolve()
        if relative.parts[:len(versions)] == versions:
            base, allowed = task.root, [task.versions_dir]
        else:
            base, allowed = self.worktree, [task.candidate_dir, *task.readable]
        resolved = (base / relative).resolve()
        if not any(resolved.is_relative_to((base / folder).resolve()) for folder in allowed):
            folders = ", ".join(f"{f}/" for f in (task.candidate_dir, task.versions_dir, *task.readable))
            raise PermissionError(f"read_file({path!r}) refused: only the spec ('spec'), {task.ledger} and {folders} "
                                  "may be read (never the evaluator, the task's adapter or its panels)")
        return resolved

    def read_file(self, path: str) -> dict:
        try:
            target = self._readable(path)
        except PermissionError as exc:
            return result(str(exc), 1)
        if target.is_dir():
            return result("\n".join(sorted(p.name for p in target.iterdir())))
        if not target.is_file():
            return result(f"read_file({path!r}): no such file", 1)
        return result(target.read_text(errors="replace"))

    def _writable(self, path: str) -> Path:
        relative = Path(path.strip())
        if relative.parts[: len(Path(self.task.candidate_dir).parts)] == Path(self.task.candidate_dir).parts:
            relative = relative.relative_to(self.task.candidate_dir)
        target = (self.candidate / relative).resolve()
        if target.parent != self.candidate.resolve() or target.suffix != ".py":
            raise PermissionError(f"write refused for {path!r}: only .py files directly in {self.task.candidate_dir}/ "
                                  "(the candidate solution) may be written")
        return target

    def write_file(self, path: str, content: str) -> dict:
        try:
            target = self._writable(path)
        except PermissionError as exc:
            return result(str(exc), 1)
        target.write_bytes(content.encode())  # encoded first: content that cannot be written leaves the file as it was
        return result(f"wrote {len(content)} characters to {self.task.candidate_dir}/{target.name}")

    def apply_patch(self, patch: str) -> dict:
        try:
            return self._search_replace(patch) if "<<<<<<< SEARCH" in patch else self._git_apply(patch)
        except PermissionError as exc:
            return result(str(exc), 1)

    def _search_replace(self, patch: str) -> dict:
        blocks = list(BLOCK.finditer(patch))
        if not blocks:
            return result("no complete block: write <<<<<<< SEARCH, the old text, =======, the new text, "
                          ">>>>>>> REPLACE", 1)
        edits: dict[Path, str] = {}
        for number, block in enumerate(blocks, 1):
            target = self._writable(block["path"] or "solution.py")
            text = edits[target] if target in edits else (target.read_text() if target.is_file() else "")
            count = text.count(block["search"])
            if count != 1:
                first = block["search"].strip().splitlines()[0] if block["search"].strip() else "(empty)"
                where = "not found" if count == 0 else f"found {count} times (add context to make it unique)"
                return result(f"block {number} ({target.name}): search text {where}; it begins {first!r}. "
                              "Nothing was changed.", 1)
            edits[target] = text.replace(block["search"], block["replace"], 1)
        encoded = {target: text.encode() for target, text in edits.items()}  # all or nothing
        for target, data in encoded.items():
            target.write_bytes(data)
        return result(f"applied {len(blocks)} block(s) to {', '.join(sorted(t.name for t in edits))}")

    def _git_apply(self, patch: str) -> dict:
        """Apply a unified diff with git, only after every path it would write is a .py file of the candidate."""
        names = [line.split("\t")[0].strip() for line in re.findall(r"^(?:\+\+\+|---) (.+)$", patch, re.M)]
        names = [n for n in names if n != "/dev/null"]
        if not names:
            return result("not a unified diff (no ---/+++ headers) and no search/replace blocks", 1)
        refused = sorted({m.group(1) for m in REFUSED_HEADERS.finditer(patch)})
        if refused:
            return result(f"patch refused: it has {', '.join(repr(h) for h in refused)} header(s); copies, renames, "
                          "mode changes, symlinks and binary patches are not allowed. Edit file contents only. "
                          "Nothing was changed.", 1)
        prefixed = [n.startswith(("a/", "b/")) for n in names]
        if any(prefixed) and not all(prefixed):
            return result("patch refused: its ---/+++ paths mix a/ and b/ prefixes with bare paths; use a/ and b/ on "
                          "all of them or on none. Nothing was changed.", 1)
        strip = 1 if all(prefixed) else 0
        inside = all(n.split("/", strip)[-1].startswith(self.task.candidate_dir + "/") for n in names)
        args = (["git", "apply", "--recount", f"-p{strip}"]
                + ([] if inside else [f"--directory={self.task.candidate_dir}"]))
        text = patch if patch.endswith("\n") else patch + "\n"
        listed = subprocess.run(args + ["--numstat", "-z"], cwd=self.worktree, input=text, capture_output=True,
                                text=True, timeout=60)
        if listed.returncode:
            return result(listed.stderr.strip() or "git apply could not read the patch", listed.returncode)
        for entry in filter(None, listed.stdout.split("\0")):
            self._patch_target(entry.split("\t", 2)[-1])
        before = {p.name for p in self.candidate.iterdir()}
        saved = {p.name: p.read_bytes() for p in solution_files(self.candidate)}
        done = subprocess.run(args + ["--verbose"], cwd=self.worktree, input=text, capture_output=True, text=True,
                              timeout=60)
        stray = [p.name for p in self.candidate.iterdir()
                 if p.is_symlink() or (p.name not in before and not (p.is_file() and p.suffix == ".py"))]
        if stray:
            self._restore(before, saved)
            return result(f"patch refused: it made {', '.join(sorted(stray))} in {self.task.candidate_dir}/, which "
                          "may hold only .py files (no symlinks). Nothing was changed.", 1)
        return result((done.stdout + done.stderr).strip() or "applied", done.returncode)

    def _patch_target(self, path: str) -> Path:
        """A path as git apply would write it (relative to the worktree): a .py file directly in the candidate."""
        if not path or Path(path).parent != Path(self.task.candidate_dir):
            raise PermissionError(f"patch refused: it would write {path or '(a renamed file)'!r}; only .py files "
                                  f"directly in {self.task.candidate_dir}/ (the candidate solution) may be written. "
                                  "Nothing was changed.")
        return self._writable(path)

    def _restore(self, names: set[str], saved: dict[str, bytes]) -> None:
        """Put the candidate back as it was before a refused patch: new entries removed, .py contents restored."""
        for path in self.candidate.iterdir():
            if path.is_dir() and not path.is_symlink() and path.name not in names:
                shutil.rmtree(path)
            elif path.is_symlink() or path.name not in names:
                path.unlink()
        for name, data in saved.items():
            (self.candidate / name).write_bytes(data)

    def run_selfcheck(self) -> dict:
        stage = self.evaluator.selfcheck(self.candidate)
        return result(stage.output + ("" if stage.ok else f"\n{stage.note}"), 0 if stage.ok else 1)

    def run_check(self, stage_name: str) -> dict:
        """One of the task's checks (a tool its manifest declares) on the candidate."""
        stage = self.evaluator.check(stage_name, self.candidate)
        return result(stage.output + ("" if stage.ok else f"\n{stage.note}"), 0 if stage.ok else 1)

    def run_profile(self) -> dict:
        """The profiler's summary: latency, GB/s and fraction of copy bandwidth, FLOP rate, host vs GPU time per call,
        kernels and grids, registers and spills, and a bottleneck label per case (evals/profile.py)."""
        stage = self.evaluator.profile(self.candidate)
        return result(stage.output + ("" if stage.ok else f"\n{stage.note}"), 0 if stage.ok else 1)

    def submit(self, summary: str, hypothesis: str) -> dict:
        raise Submitted(summary, hypothesis)


def profile_text(report: dict) -> str:
    """The roofline summary of a selfcheck report: per case latency, GB/s, fraction of copy bandwidth, and (measured
    on a GPU only) host and GPU time per call and whether the verifier could time the case (``stable``). A
    graph-paired task's report (cases with ``hot`` and ``flushed`` records) shows each regime's time a call and its
    ratio to the baseline instead of the host and GPU times, which that timing leaves out."""
    cases = report.get("cases", [])
    timing = report.get("timing")
    paired = isinstance(timing, dict) and timing.get("protocol") == "graph-paired" \
        or any(isinstance(case.get("hot"), dict) for case in cases)
    lines = [f"{'case':<26} {'stratum':<12} {'median_us':>10} "
             + (f"{'flush_us':>9} " if paired else "")
             + f"{'GB/s':>8} {'%copy':>6} {'speedup':>8} "
             + (f"{'hot_x':>8} {'flush_x':>8}" if paired else f"{'host_us':>8} {'gpu_us':>8}")
             + f" {'stable':>6}"]
    def num(record: dict | None, key: str, spec: str, scale: float = 1.0) -> str:
        value = (record or {}).get(key)
        return fmt(None if value is None else value * scale, spec)

    for case in cases:
        stable = {True: "yes", False: "NO"}.get(case.get("stable"), "-")
        hot, flushed = case.get("hot"), case.get("flushed")
        lines.append(f"{case['case']['name']:<26} {case['case']['stratum']:<12} {num(case, 'median_us', '.2f'):>10} "
                     + (f"{num(flushed, 'candidate_us', '.2f'):>9} " if paired else "")
                     + f"{num(case, 'gbps', '.1f'):>8} {num(case, 'roofline_fraction', '.1f', 100):>6} "
                     + f"{num(case, 'speedup', '.3f'):>8} "
                     + (f"{num(hot, 'ratio', '.3f'):>8} {num(flushed, 'ratio', '.3f'):>8}" if paired
                        else f"{num(case, 'host_us', '.1f'):>8} {num(case, 'gpu_us', '.1f'):>8}")
                     + f" {stable:>6}")
    if paired and not report.get("interpreted"):
        lines.append("graph-paired timing: median_us is the hot replays' time a call, flush_us the L2-flushed ones'; "
                     "hot_x and flush_x are the baseline's time over the candidate's in each (paired in one "
                     "process); speedup is the smaller of the two; GB/s and %copy are the flushed time's")
    strata = ", ".join(f"{k} {fmt(v)}" for k, v in report.get("strata", {}).items())
    lines.append(f"speedup over the baseline by stratum: {strata}; copy bandwidth {report.get('copy_gbps') or '-'} "
                 "GB/s")
    unstable = [f"{c['case']['name']}: {c.get('stable_note') or 'unstable'}" for c in report.get("cases", [])
                if c.get("stable") is False]
    if unstable:
        lines.append("host-bound (the verifier's dispersion gate can fail them; a candidate is not kept with one "
                     "whose GPU time is below its host cost and more than 3% below the best's there; the timing "
                     "under the verifier's schedule decides the others): "
                     + "; ".join(unstable))
    if report.get("interpreted"):
        lines.append("note: no GPU: these are Triton-interpreter wall times, not GPU timings")
    return "\n".join(lines)
