"""python -m agent run|submit|status|report|promote|clean-workspace: the command line of the loop."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from agent import ledger, report
from agent.config import RunConfig, Task, from_dict
from agent.display import Display
from agent.loop import Run, fmt, summary
from agent.promote import promote
from agent.proposers import make_proposer
from agent.workspace import RunState, Workspace, all_runs, clean, new_run_id, pid_alive, replace_solution

ROOT = Path(__file__).resolve().parent.parent


def has_cuda() -> bool:
    """A GPU the evaluator can use; asked in a subprocess so that the agent never imports torch."""
    if shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        return False
    try:
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return probe.stdout.strip() == "True"


def resolve_backend(name: str) -> str:
    if name != "auto":
        return name
    return "openai" if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY") else "offline"


def resolve_panel(panel: str, cuda: bool) -> tuple[str, str | None]:
    if panel in ("visible", "smoke"):
        if panel == "visible" and not cuda:
            return "smoke", ("no CUDA GPU: using the smoke panel under the Triton interpreter; "
                             "timings are not GPU timings")
        return panel, None
    path = Path(panel).resolve()
    if not path.is_file():
        raise SystemExit(f"agent: no panel file at {panel}; give visible, smoke or a panel JSON path")
    return str(path), None if cuda else "no CUDA GPU: Triton interpreter; timings are not GPU timings"


def start_point(task: Task, start: str) -> Path:
    if start == "main":
        return task.root / task.candidate_dir
    if not re.fullmatch(r"v\d+", start) or not (task.versions / start / "solution.py").is_file():
        raise SystemExit(f"agent: --from {start}: expected main or an existing version such as v0")
    return task.versions / start


def new_run(task: Task, args: argparse.Namespace) -> tuple[RunConfig, RunState, Workspace]:
    cuda = has_cuda()
    panel, note = resolve_panel(args.panel, cuda)
    config = RunConfig(iters=args.iters, backend=resolve_backend(args.backend), model=args.model or "", panel=panel,
                       start_from=args.start_from, time_limit_min=args.time_limit, cost_limit_usd=args.cost_limit,
                       script=str(Path(args.script).resolve()) if args.script else None, cuda=cuda,
                       task_file=str(Path(args.task).resolve()) if args.task else None, full_check=args.full_check)
    if note:
        print(f"note: {note}", flush=True)
    run_id = new_run_id()
    workspace = Workspace(task.root, run_id, task.candidate_dir)
    start = start_point(task, config.start_from)
    workspace.create(start)
    shutil.copytree(start, workspace.state_dir / "start",
                    ignore=shutil.ignore_patterns("*.patch", "*.json", "__pycache__"))
    # the run's first best is the start; name it by the version it equals so that rows and patches point at it
    sha = ledger.solution_sha256(start)
    same = [e["version"] for e in ledger.index_entries(task) if e.get("sha256") == sha]
    same += [r["version"] for r in map(ledger.parse_row, ledger.rows(task)) if r.get("sha256") == sha]
    label = config.start_from if config.start_from != "main" else (same[0] if same else "main")
    baseline_sha = ledger.solution_sha256(task.versions / task.baseline_version)
    state = RunState(run_id=run_id, config=asdict(config), pid=os.getpid(),
                     started=run_id[:15], start_label=label, best_label=label, best_is_baseline=sha == baseline_sha)
    return config, state, workspace


def measure_start(run: Run) -> None:
    """The start's own selfcheck: its score is the first best and its report the first profile."""
    run.display.line(f"measuring the start ({run.state.best_label}) on panel {Path(run.config.panel).name}")
    stage = run.evaluator_tools.selfcheck(run.tools.candidate)
    if stage.report and "cases" in stage.report:
        run.state.best_score = stage.report.get("score")
        for name in ("best_selfcheck.json", "start_selfcheck.json"):  # the start's stays for the report
            (run.workspace.state_dir / name).write_text(json.dumps(stage.report))
    run.display.line(f"start: score {fmt(run.state.best_score)} ({stage.note})")
    run.state.save(run.workspace.state_dir)


def write_report(task: Task, run_id: str) -> None:
    try:
        print(f"report: {report.write(task, run_id).relative_to(ROOT)}/report.md", flush=True)
    except Exception as exc:  # the run's record is the ledger; a report that fails must not hide the run's own error
        print(f"warning: the report of {run_id} could not be written ({type(exc).__name__}: {exc}); "
              f"retry with `python -m agent report {run_id}`", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    if args.resume:
        state = RunState.load(ROOT / "workspace" / ".runs" / args.resume)
        task = Task.load(ROOT, state.config.get("task_file"))
        workspace = Workspace(ROOT, args.resume, task.candidate_dir)
        if state.status == "running" and state.pid != os.getpid() and pid_alive(state.pid):
            raise SystemExit(f"agent: run {args.resume} is still running (pid {state.pid})")
        if not workspace.path.is_dir():
            raise SystemExit(f"agent: the worktree of {args.resume} is gone ({workspace.path}); it cannot be resumed")
        config = from_dict(RunConfig, state.config)
        if args.iters is not None:
            config.iters = args.iters
            state.config["iters"] = args.iters
        state.status, state.pid, state.stop_reason = "running", os.getpid(), ""
        fresh = False
    else:
        if args.iters is None:
            raise SystemExit("agent: run needs --iters N (or --resume RUN_ID)")
        task = Task.load(ROOT, args.task)
        config, state, workspace = new_run(task, args)
        fresh = True
    state.save(workspace.state_dir)
    proposer = make_proposer(config.backend, config.model, config.script)
    run = Run(task, config, state, workspace, proposer, Display(config.iters, state.attempts, args.plain))
    if not fresh:  # a killed attempt may have left an unrecorded edit: resume from the best
        replace_solution(run.tools.candidate, run.best_dir)
    run.display.line(f"run {state.run_id}: backend {proposer.label}, panel {Path(config.panel).name}, "
                     f"{'GPU' if config.cuda else 'CPU (interpreter; timings are not GPU timings)'}, "
                     f"worktree {workspace.path.relative_to(ROOT)}, branch {workspace.branch}")
    if fresh:
        measure_start(run)
    try:
        run.run()
    finally:  # a report on every ending, Ctrl-C and failures included
        write_report(task, state.run_id)
    print(summary(task, run.state), flush=True)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """A hand-written candidate through the loop as one attempt: the same checks, version, row and commit as any."""
    source = Path(args.solution)
    files = sorted(source.glob("*.py")) if source.is_dir() else [source]
    if not files or not all(f.is_file() and f.suffix == ".py" for f in files):
        raise SystemExit(f"agent: submit needs a solution.py or a folder holding one; got {args.solution}")
    if "solution.py" not in {f.name for f in files}:
        raise SystemExit(f"agent: {args.solution} has no solution.py (the entry point build() lives there)")
    task = Task.load(ROOT, args.task)
    calls = [{"tool": "write_file", "args": {"path": f"{task.candidate_dir}/{f.name}", "content": f.read_text()}}
             for f in files]
    calls.append({"tool": "submit", "args": {"summary": args.summary, "hypothesis": args.hypothesis or ""}})
    scripts = ROOT / "workspace" / ".hand"
    scripts.mkdir(parents=True, exist_ok=True)
    script = scripts / f"{new_run_id()}.json"
    script.write_text(json.dumps({"label": "hand", "calls": calls}))
    args.script, args.backend, args.iters, args.resume, args.model = str(script), "scripted", 1, None, None
    args.time_limit = args.cost_limit = None
    return cmd_run(args)


def cmd_status(args: argparse.Namespace) -> int:
    task = Task(root=ROOT)
    runs = all_runs(ROOT)
    print(f"{len(runs)} run(s)")
    for state in runs:
        status = state.status if state.status != "running" or pid_alive(state.pid) else "killed (resumable)"
        print(f"  {state.run_id}  {status:<18} {state.attempts}/{state.config.get('iters')} attempts  "
              f"best {state.best_label} ({fmt(state.best_score)})  {state.config.get('backend')}")
    scored = [r for r in map(ledger.parse_row, ledger.rows(task)) if r.get("score", "-") not in ("-", "")
              and r.get("decision", "").startswith("keep")]
    best = sorted(scored, key=lambda r: float(r["score"]), reverse=True)[:5]
    print("best kept versions: " + (", ".join(f"{r['version']} {r['score']}" for r in best) or "(none)"))
    print("last rows:")
    for line in ledger.rows(task)[-args.rows:]:
        print("  " + line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    task = Task(root=ROOT)
    if not report.known_run(task, args.run_id):
        raise SystemExit(f"agent: no run {args.run_id}; `python -m agent status` lists the runs")
    print(f"{report.write(task, args.run_id).relative_to(ROOT)}/report.md and report.html written")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    panel = str(Path(args.panel).resolve()) if args.panel and args.panel not in ("visible", "smoke") else args.panel
    return promote(Task(root=ROOT), args.version, has_cuda(), args.force, panel, note=" ".join(args.note.split()),
                   verify=args.verify)


def cmd_clean(args: argparse.Namespace) -> int:
    removed = clean(ROOT)
    print(f"removed {len(removed)} finished worktree(s)" + (": " + ", ".join(removed) if removed else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent",
                                     description="kloop: the agent-driven kernel optimization loop")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the loop")
    run.add_argument("--iters", type=int, help="attempts to make (with --resume: the new total)")
    run.add_argument("--backend", default="auto", choices=["auto", "offline", "openai", "scripted"])
    run.add_argument("--model", help="model name for the openai backend")
    run.add_argument("--panel", default="visible", help="visible, smoke or a panel JSON file")
    run.add_argument("--from", dest="start_from", default="main", help="main or vN: where the candidate starts")
    run.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted run")
    run.add_argument("--time-limit", type=float, metavar="MIN", help="stop starting iterations after MIN minutes")
    run.add_argument("--cost-limit", type=float, metavar="USD", help="stop when the model cost reaches USD")
    run.add_argument("--script", help="the scripted backend's JSON list of tool calls")
    run.add_argument("--task", help="a JSON file of task fields replacing the defaults (evaluator commands, timeout)")
    run.add_argument("--full-check", action="store_true",
                     help="residency guard and gates on every correct candidate, not only on those that would be kept")
    run.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    submit = commands.add_parser("submit", help="evaluate and record a hand-written candidate as one attempt")
    submit.add_argument("solution", help="a solution.py, or a folder whose *.py files (solution.py among them) "
                                         "replace the candidate's")
    submit.add_argument("--summary", required=True, help="what changed (the ledger row's summary)")
    submit.add_argument("--hypothesis", help="why it should be faster")
    submit.add_argument("--panel", default="visible", help="visible, smoke or a panel JSON file")
    submit.add_argument("--from", dest="start_from", default="main", help="main or vN: the parent it is compared with")
    submit.add_argument("--task", help=argparse.SUPPRESS)
    submit.add_argument("--full-check", action="store_true", help="residency guard and gates even if it is not faster")
    submit.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    status = commands.add_parser("status", help="runs, best versions, last ledger rows")
    status.add_argument("--rows", type=int, default=5)
    commands.add_parser("clean-workspace", help="remove the worktrees of finished runs")
    report_cmd = commands.add_parser("report", help="(re)write reports/<run-id>/report.md and report.html")
    report_cmd.add_argument("run_id")
    promote_cmd = commands.add_parser("promote", help="check vN again and copy it into methods/main/")
    promote_cmd.add_argument("version", help="vN")
    promote_cmd.add_argument("--force", action="store_true",
                             help="promote even if a check fails (recorded in the ledger)")
    promote_cmd.add_argument("--panel",
                             help="visible, smoke or a panel JSON file (default visible, smoke without CUDA)")
    promote_cmd.add_argument("--note", default="", help="why, written into the promotion's ledger row")
    promote_cmd.add_argument("--verify", action="store_true",
                             help="also run the full verifier (timing gates included; a GPU, minutes) before promoting")
    args = parser.parse_args(argv)
    commands_by_name = {"run": cmd_run, "submit": cmd_submit, "status": cmd_status, "clean-workspace": cmd_clean,
                        "report": cmd_report, "promote": cmd_promote}
    return commands_by_name[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
