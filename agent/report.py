"""Run reports: reports/<run-id>/report.md and a self-contained report.html (plots embedded), and reports/index.md.

Everything comes from what the run recorded: its state (workspace/.runs/<run-id>/), its index lines and ledger rows,
and the evaluator's JSON of the start and of every attempt. Nothing here measures or imports the evaluator.
"""
from __future__ import annotations

import base64
import html
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from agent import ledger
from agent.config import DEFAULT_TASK, MANIFEST, Task
from agent.ledger import fmt
from agent.loop import gpu_timing_note, make_hint
from agent.workspace import RunState, all_runs, run_state_dir

STYLE = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
         "th{background:#eee}td:first-child{text-align:left}img{max-width:100%}code{background:#f4f4f4}")


@dataclass
class RunData:
    state: RunState
    entries: list[dict]  # index lines of this run, in version order
    rows: list[str]  # ledger rows of this run
    start: dict | None  # the start's selfcheck report
    environment: dict


CHECKOUT = "checkout.json"  # in the run's state directory: the commit and dirty flag as the run found them


def _ask(root: Path, args: list[str]) -> str:
    try:
        done = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=120)
        return done.stdout.strip() if done.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def checkout(root: Path) -> dict:
    """Git commit and dirty flag; a run reads them when it starts, before its own rows change the ledger."""
    return {"commit": _ask(root, ["git", "rev-parse", "--short", "HEAD"]) or "unknown",
            "dirty": bool(_ask(root, ["git", "status", "--porcelain", "--untracked-files=no"]))}


def environment(root: Path) -> dict:
    """Git commit and dirty flag, GPU, driver, torch and triton, asked of subprocesses (the agent never imports
    torch)."""
    gpu = _ask(root, ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    versions = _ask(root, [sys.executable, "-c",
                           "import torch, triton; print(torch.__version__, triton.__version__)"]).split()
    return {**checkout(root),
            "gpu": gpu[0].split(", ")[0] if gpu else "none (CPU, Triton interpreter)",
            "driver": gpu[0].split(", ")[1] if gpu and ", " in gpu[0] else "-",
            "torch": versions[0] if versions else "?", "triton": versions[1] if len(versions) > 1 else "?"}


def collect(task: Task, run_id: str) -> RunData:
    state_dir = run_state_dir(task.root, run_id)
    state = RunState.load(state_dir)
    entries = [e for e in ledger.index_entries(task) if e.get("run") == run_id]
    rows = [r for r in ledger.rows(task) if ledger.parse_row(r, task).get("run") == run_id]
    start_path = state_dir / "start_selfcheck.json"
    start = json.loads(start_path.read_text()) if start_path.is_file() else None
    found = state_dir / CHECKOUT  # runs before it was recorded fall back to the checkout as it is now
    at_start = json.loads(found.read_text()) if found.is_file() else {}
    return RunData(state, entries, rows, start, environment(task.root) | at_start)


def _cases(report_or_verdict: dict | None) -> dict[str, dict]:
    """Per case name: median_us, roofline_fraction and the baseline's median, from a selfcheck report or a verdict."""
    cases = (report_or_verdict or {}).get("cases", [])
    return {c.get("name") or c["case"]["name"]: c for c in cases}


def case_table(data: RunData) -> list[list[str]]:
    """Per-case latency and fraction of copy bandwidth for the baseline, the start and the best."""
    start = _cases(data.start)
    best_entry = next((e for e in data.entries if e["version"] == data.state.best_label), None)
    best = _cases(best_entry["verdict"]) if best_entry else start
    names = list(start or best)
    table = []
    for name in names:
        s, b = start.get(name, {}), best.get(name, {})
        base_us = s.get("baseline_median_us") or b.get("baseline_median_us")
        base_frac = (s.get("roofline_fraction") * s["median_us"] / base_us if s.get("roofline_fraction") and base_us
                     else None)
        speedup = b.get("speedup")
        table.append([name, _num(base_us), _pct(base_frac), _num(s.get("median_us")), _pct(s.get("roofline_fraction")),
                      _num(b.get("median_us")), _pct(b.get("roofline_fraction")),
                      fmt(speedup, ".3f") + ("x" if speedup else "")])
    return table


def _num(value, spec: str = ".2f") -> str:
    return fmt(value, spec)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def score_plot(data: RunData, baseline: str) -> bytes | None:
    """Score per iteration, kept, reverted and failed attempts marked; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=110)
    if data.start and data.start.get("score"):
        ax.axhline(data.start["score"], color="#999", linestyle="--", linewidth=1,
                   label=f"start ({data.state.start_label})")
    marks = {"kept": ("o", "#2a9d3a"), "reverted": ("x", "#d08c00"), "failed": ("v", "#c0392b")}
    for kind, (marker, color) in marks.items():
        points = [(e["iteration"], e["verdict"].get("score") or 0.0) for e in data.entries if _kind(e) == kind]
        if points:
            ax.scatter(*zip(*points), marker=marker, color=color, label=kind, zorder=3)
    best, line = None, []
    for e in data.entries:
        if e.get("keep"):
            best = e["verdict"]["score"]
        line.append((e["iteration"], best if best is not None else (data.start or {}).get("score")))
    if any(y is not None for _, y in line):
        ax.step(*zip(*[(x, y) for x, y in line if y is not None]), where="post", color="#2a9d3a", linewidth=1,
                alpha=0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"score (speedup over {baseline})")
    ax.set_title(f"run {data.state.run_id}")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _kind(entry: dict) -> str:
    if entry.get("keep"):
        return "kept"
    return "reverted" if entry["verdict"].get("valid") else "failed"


def wall_rows(state, entries: list[dict]) -> list[list[str]]:
    """The run's wall time (proposing and evaluating, attempt after attempt); a parallel run's batches count once
    each (their proposals, then their evaluations side by side), beside the workers' summed time and the pace."""
    batches = {tuple(e["batch"]): e for e in entries if e.get("batch")}
    if not batches:
        return [["wall time", f"{state.wall_s / 60:.1f} min"]]
    elapsed = sum(e["wall_s"] for e in entries if not e.get("batch"))
    for span, last in batches.items():
        members = [e for e in entries if tuple(e.get("batch") or ()) == span]
        elapsed += sum(e["propose_s"] for e in members) + last.get("batch_eval_s", 0.0)
    workers = len(state.config.get("workers") or []) or "-"
    pace = f"{60 * len(entries) / elapsed:.1f}" if elapsed else "-"
    return [["wall time", f"{elapsed / 60:.1f} min ({workers} workers side by side; "
                          f"{state.wall_s / 60:.1f} min of work summed over them)"],
            ["attempts per minute", pace]]


def sections(task: Task, data: RunData) -> list[tuple[str, object]]:
    """The report as (heading, body) pairs; a body is text or a table (list of rows, the first the header)."""
    s, env = data.state, data.environment
    best = s.best_label
    header = [["commit", f"{env['commit']}{' (dirty)' if env['dirty'] else ''}"], ["GPU", env["gpu"]],
              ["driver", env["driver"]], ["torch / triton", f"{env['torch']} / {env['triton']}"],
              ["backend / model", f"{s.config.get('backend')} / {s.config.get('model') or '-'}"],
              ["panel", str(s.config.get("panel"))],
              ["status", f"{s.status}, {s.attempts} of {s.config.get('iters')} attempts"
                         + (f" ({s.stop_reason})" if s.stop_reason else "")],
              ["tokens / cost", f"{s.tokens} / ${s.cost_usd:.4f}"], *wall_rows(s, data.entries),
              ["timing", gpu_timing_note(task) if s.config.get("cuda")
                         else "Triton interpreter wall times on CPU: not GPU timings"]]
    counts = {kind: sum(_kind(e) == kind for e in data.entries) for kind in ("kept", "reverted", "failed")}
    if not s.config.get("cuda"):
        valid = [e["version"] for e in data.entries if e["verdict"].get("valid")]
        promote = (f"nothing was kept: without a GPU the interpreter's wall times rank nothing; {len(valid)} valid "
                   f"candidate(s) ({', '.join(valid[:8]) or 'none'}) can be measured on a GPU machine "
                   f"(`{make_hint(task, 'promote', V='N')}` there measures one first), or promoted here with FORCE=1")
    elif best.startswith("v") and best != s.start_label:
        promote = f"`{make_hint(task, 'promote', V=best.removeprefix('v'))}`"
    else:
        promote = f"nothing to promote: no attempt beat the start ({s.start_label})"
    base = task.baseline_label
    return [
        ("Run", [["field", "value"], ["task", f"{task.name} ({task.folder})"]] + header),
        ("Outcome", f"best {best}, score {_num(s.best_score, '.3f')} (start {s.start_label}, "
                    f"{_num((data.start or {}).get('score'), '.3f')}); {counts['kept']} kept, "
                    f"{counts['reverted']} reverted, {counts['failed']} failed. To promote: {promote}."),
        ("Score per iteration", "plot"),
        ("Per case: latency (us) and fraction of copy bandwidth",
         [["case", f"{base} us", f"{base} %copy", "start us", "start %copy", "best us", "best %copy",
           f"best vs {base}"]] + case_table(data)),
        ("Ledger rows of this run", [list(ledger.columns(task))]
         + [list(ledger.parse_row(r, task).values()) for r in data.rows]),
    ]


def _md_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows[1:]])


def _html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def write(task: Task, run_id: str) -> Path:
    """Write reports/<run-id>/ (report.md, score.png, report.html) and refresh reports/index.md."""
    data = collect(task, run_id)
    out = task.root / "reports" / run_id
    out.mkdir(parents=True, exist_ok=True)
    png = score_plot(data, task.baseline_label)
    if png:
        (out / "score.png").write_bytes(png)
    md, page = [f"# kloop run {run_id}", f"_generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC_"], []
    for heading, body in sections(task, data):
        md.append(f"## {heading}")
        page.append(f"<h2>{html.escape(heading)}</h2>")
        if body == "plot":
            md.append("![score per iteration](score.png)" if png else "(matplotlib is not installed: no plot)")
            page.append(f'<img alt="score per iteration" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                        if png else "<p>no plot</p>")
        elif isinstance(body, list):
            md.append(_md_table(body))
            page.append(_html_table(body))
        else:
            md.append(body)
            page.append(f"<p>{html.escape(body)}</p>")
    (out / "report.md").write_text("\n\n".join(md) + "\n")
    (out / "report.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>kloop run {run_id}</title>"
        f"<style>{STYLE}</style></head><body><h1>kloop run {html.escape(run_id)}</h1>{''.join(page)}</body></html>\n")
    write_index(task)
    return out


def write_index(task: Task) -> None:
    """reports/index.md: every run, grouped by the task it served."""
    groups: dict[str, list[list[str]]] = {}
    for s in all_runs(task.root):
        link = f"[report]({s.run_id}/report.md)" if (task.root / "reports" / s.run_id / "report.md").is_file() else "-"
        groups.setdefault(task_of(s), []).append([s.run_id, s.status, str(s.attempts), str(s.config.get("backend")),
                                                  s.best_label, _num(s.best_score, ".3f"),
                                                  "GPU" if s.config.get("cuda") else "CPU (interpreter)", link])
    lines = ["# kloop runs", ""]
    for name in sorted(groups):
        lines += [f"## task {name}", "",
                  _md_table([["run", "status", "attempts", "backend", "best", "score", "timing", "report"]]
                            + groups[name]), ""]
    (task.root / "reports").mkdir(exist_ok=True)
    (task.root / "reports" / "index.md").write_text("\n".join(lines))


def task_of(state: RunState) -> str:
    """The name of the task a run served, as its state records it (the default task for runs from before that)."""
    folder = state.config.get("task")
    if not folder:
        return DEFAULT_TASK
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())["name"]
    except (OSError, ValueError, KeyError):  # a task folder since removed: its folder's name
        return Path(folder).name

