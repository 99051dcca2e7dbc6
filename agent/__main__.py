""".venv/bin/python -m agent run|submit|status|report|promote|clean-workspace: the command line of the loop.

Bad input (a panel, a start, a backend or its endpoint, a run to resume) is refused before anything is written: one
line on stderr and exit 2, with no run state, worktree, branch, row or version left behind.
"""
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

try:
    from agent import ledger, report
    from agent.config import DEFAULT_TASK, RunConfig, Task, TaskError, from_dict
    from agent.display import Display, quiet_stdout, say
    from agent.exceptions import EndpointUnavailable
    from agent.ledger import fmt
    from agent.loop import PROG, Run, summary
    from agent.promote import promote
    from agent.proposers import Proposer, make_proposer
    from agent.runner import python_command, python_env, run_command
    from agent.workspace import (RunState, Workspace, all_runs, clean, default_panel, new_run_id, pid_alive,
                                 replace_solution, run_state_dir)
except ModuleNotFoundError as missing:  # a python outside the project's venv: say how to get one, not a traceback
    if (missing.name or "").split(".")[0] in ("agent", "evals"):
        raise
    sys.exit(f"agent: {sys.executable} has no module {missing.name!r}: run `make setup`, then use "
             f"`.venv/bin/python -m agent` (or the make targets)")

ROOT = Path(__file__).resolve().parent.parent


class Refused(Exception):
    """Bad input, found before anything is written: main prints it as one line and exits 2."""


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, where it has one (flags and unset options have none to show)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of attempts, at least 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def above_zero(unit: str):
    """An argparse type: a finite number above zero, in ``unit`` (a limit of 0 would stop the run before it starts)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of {unit} above 0; got {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a number of {unit} above 0 (leave it out for no limit); "
                                             f"got {text}")
        return value
    return parse


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


def resolve_panel(panel: str | None, cuda: bool) -> tuple[str, str | None]:
    """The panel a run uses (the default where none is given) and a note to print, if any."""
    if panel in (None, "visible", "smoke"):
        if panel == "visible" and not cuda:
            return "smoke", ("no CUDA GPU: using the smoke panel under the Triton interpreter; "
                             "timings are not GPU timings")
        return panel or default_panel(cuda), None
    path = Path(panel).resolve()
    if not path.is_file():
        raise Refused(f"no panel file at {panel}; give visible, smoke or a panel JSON path")
    return str(path), None if cuda else "no CUDA GPU: Triton interpreter; timings are not GPU timings"


def check_panel(task: Task, panel: str, cuda: bool) -> None:
    """The evaluator loads the task and lists the panel's cases: a task or a panel it cannot use is refused here, not
    recorded as attempts."""
    listed = run_command(python_command(task.cases_cmd, *task.task_arg, "--panel", panel), task.root,
                         task.eval_timeout_s, python_env(task.root, cuda))
    if listed["returncode"] != 0:
        lines = [line.strip() for line in listed["output"].splitlines() if line.strip()]
        raise Refused(f"the evaluator cannot use panel {panel}: "
                      + (lines[-1] if lines else f"{' '.join(task.cases_cmd)} exit {listed['returncode']}"))


def start_point(task: Task, start: str) -> Path:
    if start == "main":
        main = task.root / task.candidate_dir
        if not (main / "solution.py").is_file():
            raise Refused(f"task {task.name} has no {task.candidate_dir}/solution.py to start from: give --from vN, "
                          f"or put its first version (v0) there")
        return main
    if not re.fullmatch(r"v\d+", start) or not (task.versions / start / "solution.py").is_file():
        raise Refused(f"--from {start}: expected main or an existing version of task {task.name} "
                      f"(one with {task.versions_dir}/{start}/solution.py)")
    return task.versions / start


def cluster_workers(address: str, cuda: bool) -> int:
    """How many workers the Dask cluster at ``address`` has, each checked to be of this host's kind (a GPU run's with
    a CUDA GPU and a GPU resource to claim, a CPU run's without a GPU); Refused otherwise."""
    from agent.pool import connect, scheduler_workers, worker_facts

    try:
        client = connect(address)
    except ConnectionError as exc:
        raise Refused(str(exc)) from None
    try:
        workers = scheduler_workers(client)
        if not workers:
            raise Refused(f"the Dask cluster at {address} has no workers yet: start them (one per GPU), then run")
        facts = client.run(worker_facts, on_error="return")
    finally:
        client.close()
    broken = sorted(f"{name} ({type(fact).__name__}: {fact})" for name, fact in facts.items()
                    if isinstance(fact, BaseException))
    if broken:
        raise Refused(f"the cluster's worker(s) {', '.join(broken)} could not say whether they have a GPU: each needs "
                      "this project installed (`make setup`) and torch")
    kind = "a CUDA GPU" if cuda else "no GPU (this host has none: its run is a CPU run)"
    odd = sorted(name for name, fact in facts.items() if fact["cuda"] != cuda)
    if odd:
        raise Refused(f"the cluster's workers must be of this host's kind, {kind}; {', '.join(odd)} differ: run the "
                      "agent on a host like its workers")
    bare = sorted(name for name, info in workers.items() if cuda and not (info.get("resources") or {}).get("GPU"))
    if bare:
        raise Refused(f"worker(s) {', '.join(bare)} offer no GPU resource, so no GPU job would ever start there: "
                      "start each as CUDA_VISIBLE_DEVICES=i dask worker ADDRESS --nthreads 1 --resources GPU=1")
    return len(workers)


def resolve_workers(gpus: str | None, workers: int | None, cluster: str | None, cuda: bool = False) -> list[str]:
    """A parallel run's workers, each the GPU it is pinned to ("" for the environment's own); [] for a plain run.
    With --cluster the workers are the cluster's, pinned where they were started: --gpus is refused there."""
    if cluster:
        if gpus:
            raise Refused("--gpus pins local workers; a cluster's workers are pinned where they start "
                          "(CUDA_VISIBLE_DEVICES=i dask worker ADDRESS --resources GPU=1): leave --gpus out")
        found = cluster_workers(cluster, cuda)
        if workers and workers > found:
            raise Refused(f"--workers {workers}: the cluster at {cluster} has {found} worker(s), one evaluation each "
                          "at a time; give at most that many, or start more workers")
        return [""] * (workers or found)
    ids = all_gpus() if gpus == "all" else [g.strip() for g in gpus.split(",")] if gpus else []
    bad = [g for g in ids if not re.fullmatch(r"\d+|(GPU|MIG)-[\w-]+", g)]
    if bad or (gpus is not None and not ids):
        raise Refused(f"--gpus {gpus}: expected all or comma-separated CUDA device ids (0,1,...) or UUIDs")
    if workers is None:
        return ids
    if ids:
        return [ids[i % len(ids)] for i in range(workers)]
    return [""] * workers if workers > 1 else []


def all_gpus() -> list[str]:
    """The ids of the GPUs nvidia-smi lists; Refused where there are none."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60) \
            if shutil.which("nvidia-smi") else None
    except subprocess.TimeoutExpired:
        raise Refused("--gpus all: nvidia-smi gave no list within 60 s; give the device ids") from None
    text = listed.stdout if listed and not listed.returncode else ""
    ids = [m.group(1) for line in text.splitlines() if (m := re.match(r"GPU (\d+):", line))]  # MIG lines are not
    if not ids:
        raise Refused("--gpus all: nvidia-smi lists no GPU here; give device ids, or --workers N to share this "
                      "machine")
    return ids


def load_task(task: str | None) -> Task:
    try:
        return Task.load(ROOT, task)
    except TaskError as exc:  # no such task, a manifest that is not JSON or lacks a field
        raise Refused(str(exc)) from None


def ready_proposer(config: RunConfig) -> Proposer:
    """The backend, built and (where it has an endpoint) probed once, before anything is written."""
    try:
        proposer = make_proposer(config.backend, config.model, config.script)
    except ModuleNotFoundError as exc:
        raise Refused(f"the {config.backend} backend needs the {exc.name!r} package: run `make setup`") from None
    except (OSError, ValueError) as exc:  # no --script, a script that is not JSON, a malformed price
        raise Refused(f"backend {config.backend}: {exc}") from None
    probe = getattr(proposer, "probe", None)
    if probe is not None:
        try:
            probe()
        except EndpointUnavailable as exc:
            raise Refused(str(exc)) from None
    return proposer


def planned_run(task: Task, args: argparse.Namespace) -> tuple[RunConfig, Path]:
    """A new run's config and start point, every input checked; nothing is written yet."""
    cuda = has_cuda()
    panel, note = resolve_panel(args.panel, cuda)
    check_panel(task, panel, cuda)
    cluster = getattr(args, "cluster", None)
    workers = resolve_workers(getattr(args, "gpus", None), getattr(args, "workers", None), cluster, cuda)
    config = RunConfig(iters=args.iters, backend=resolve_backend(args.backend), model=args.model or "", panel=panel,
                       start_from=args.start_from, time_limit_min=args.time_limit, cost_limit_usd=args.cost_limit,
                       script=str(Path(args.script).resolve()) if args.script else None, cuda=cuda,
                       task=str(task.root / task.folder), full_check=args.full_check, workers=workers,
                       cluster=cluster)
    start = start_point(task, config.start_from)
    if note:
        say(f"note: {note}")
    return config, start


def new_run(task: Task, config: RunConfig, start: Path) -> tuple[RunState, Workspace]:
    checkout = report.checkout(task.root)  # before the run's own rows make the checkout look dirty
    run_id = new_run_id()
    workspace = Workspace(task.root, run_id, task.candidate_dir)
    workspace.create(start)
    workspace.state_dir.mkdir(parents=True, exist_ok=True)
    (workspace.state_dir / report.CHECKOUT).write_text(json.dumps(checkout) + "\n")
    shutil.copytree(start, workspace.state_dir / "start",
                    ignore=shutil.ignore_patterns("*.patch", "*.json", "__pycache__"))
    # the run's first best is the start; name it by the version it equals so that rows and patches point at it
    same = ledger.same_version(task, start)
    label = config.start_from if config.start_from != "main" else (same or "main")
    baseline = task.baseline_version
    is_baseline = baseline is not None and (task.versions / baseline / "solution.py").is_file() and \
        ledger.solution_sha256(start) == ledger.solution_sha256(task.versions / baseline)
    state = RunState(run_id=run_id, config=asdict(config), pid=os.getpid(),
                     started=run_id[:15], start_label=label, best_label=label, best_is_baseline=is_baseline)
    return state, workspace


def resumed_run(args: argparse.Namespace) -> tuple[Task, RunConfig, RunState, Workspace]:
    """A stopped or killed run's task, config, state and worktree, checked; nothing is written yet."""
    state_dir = run_state_dir(ROOT, args.resume)
    if not (state_dir / "state.json").is_file():
        raise Refused(f"no run {args.resume} to resume; `{PROG} status` lists the runs")
    state = RunState.load(state_dir)
    legacy = state.config.pop("task_file", None)  # a run of an older kloop, whose task was a file of fields
    if legacy:
        raise Refused(f"run {args.resume} was started with a task file ({legacy}) of an older kloop; start a new run")
    task = load_task(state.config.get("task"))
    if args.task and load_task(args.task).name != task.name:
        raise Refused(f"run {args.resume} is a run of task {task.name}, not {args.task}; leave --task out to resume it")
    given = [flag for flag, value in (("--gpus", args.gpus), ("--workers", args.workers), ("--cluster", args.cluster))
             if value is not None]
    if given:
        raise Refused(f"{', '.join(given)}: a resumed run keeps its own workers; leave {given[0]} out")
    state.config["task"] = str(task.root / task.folder)
    workspace = Workspace(ROOT, args.resume, task.candidate_dir)
    if state.status == "running" and state.pid != os.getpid() and pid_alive(state.pid):
        raise Refused(f"run {args.resume} is still running (pid {state.pid})")
    if not workspace.path.is_dir():
        raise Refused(f"the worktree of {args.resume} is gone ({workspace.path}); it cannot be resumed: start a new "
                      "run (--from vN starts from any version)")
    config = from_dict(RunConfig, state.config)
    if args.iters is not None:
        if args.iters <= state.attempts:
            raise Refused(f"run {args.resume} has made {state.attempts} attempt(s) and --iters is the new total: "
                          f"give more than {state.attempts}")
        config.iters = args.iters
        state.config["iters"] = args.iters
    return task, config, state, workspace


def write_report(task: Task, run_id: str) -> None:
    try:
        written = report.write(task, run_id)
    except Exception as exc:  # the run's record is the ledger; a report that fails must not hide the run's own error
        print(f"warning: the report of {run_id} could not be written ({type(exc).__name__}: {exc}); "
              f"retry with `{PROG} report {run_id}`", file=sys.stderr, flush=True)
    else:
        say(f"report: {written.relative_to(ROOT)}/report.md")


def run_session(args: argparse.Namespace) -> RunState:
    """A new or resumed run, to its end. Every input is checked first: bad input raises Refused before anything is
    written. An endpoint that fails mid-run raises EndpointUnavailable after the run state and report say so."""
    fresh = not args.resume
    if fresh:
        if args.iters is None:
            raise Refused("run needs --iters N (or --resume RUN_ID)")
        task = load_task(args.task)
        config, start = planned_run(task, args)
        if getattr(args, "hand_script", None):  # submit's calls, written once its inputs have passed
            Path(config.script).parent.mkdir(parents=True, exist_ok=True)
            Path(config.script).write_text(json.dumps(args.hand_script))
        proposer = ready_proposer(config)
        state, workspace = new_run(task, config, start)
    else:
        task, config, state, workspace = resumed_run(args)
        proposer = ready_proposer(config)
        state.status, state.pid, state.stop_reason = "running", os.getpid(), ""
    state.save(workspace.state_dir)
    try:
        run = Run(task, config, state, workspace, proposer, Display(config.iters, state.attempts, args.plain))
    except ConnectionError as exc:  # the run's Dask cluster is gone: stopped, resumable once it is back
        state.status, state.stop_reason = "stopped", str(exc)
        state.save(workspace.state_dir)
        raise Refused(f"{exc}; resume with `{PROG} run --resume {state.run_id}` once it answers") from None
    if not fresh:  # a killed attempt may have left an unrecorded edit: resume from the best
        replace_solution(run.tools.candidate, run.best_dir)
    run.display.line(f"run {state.run_id}: backend {proposer.label}, panel {Path(config.panel).name}, "
                     f"{'GPU' if config.cuda else 'CPU (interpreter; timings are not GPU timings)'}, "
                     f"worktree {workspace.path.relative_to(ROOT)}, branch {workspace.branch}")
    # a run stopped before its start was measured (before any attempt: its best is still the start) measures it now
    if fresh or (state.attempts == 0 and not (workspace.state_dir / "start_selfcheck.json").is_file()):
        run.measure_best(start=True)
    else:
        run.remeasure = config.cuda
    try:
        run.run()
    finally:  # a report and the summary on every ending, Ctrl-C and failures included
        write_report(task, state.run_id)
        say(summary(task, run.state))
    return run.state


def cmd_run(args: argparse.Namespace) -> int:
    try:
        run_session(args)
    except EndpointUnavailable:  # the run stopped and said why (its state, its report, the lines above)
        return 1
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """A hand-written candidate through the loop as one attempt: the same checks, version, row and commit as any."""
    source = Path(args.solution)
    files = sorted(source.glob("*.py")) if source.is_dir() else [source]
    if not files or not all(f.is_file() and f.suffix == ".py" for f in files):
        raise Refused(f"submit needs a solution.py or a folder holding one; got {args.solution}")
    if "solution.py" not in {f.name for f in files}:
        raise Refused(f"{args.solution} has no solution.py (the entry point build() lives there)")
    task = load_task(args.task)
    calls = [{"tool": "write_file", "args": {"path": f"{task.candidate_dir}/{f.name}", "content": f.read_text()}}
             for f in files]
    calls.append({"tool": "submit", "args": {"summary": args.summary, "hypothesis": args.hypothesis or ""}})
    args.hand_script = {"label": "hand", "calls": calls}
    args.script = str(ROOT / "workspace" / ".hand" / f"{new_run_id()}.json")
    args.backend, args.iters, args.resume, args.model = "scripted", 1, None, None
    args.time_limit = args.cost_limit = None
    state = run_session(args)
    verdict = state.last_verdict or {"failed_stage": "(no attempt was recorded)"}
    if not verdict.get("failed_stage"):  # valid: kept, or reverted as no faster, is the evaluator's answer, not a no
        return 0
    decision = state.history[-1]["decision"] if state.history else verdict["failed_stage"]
    say(f"{verdict.get('version', 'the candidate')} was rejected: {decision}")
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    task = load_task(args.task)
    runs = all_runs(ROOT)
    by_task: dict[str, list[RunState]] = {}
    for state in runs:
        by_task.setdefault(report.task_of(state), []).append(state)
    print(f"{len(runs)} run(s)" + (f" of {len(by_task)} tasks" if len(by_task) > 1 else ""))
    for name in sorted(by_task, key=lambda n: (n != task.name, n)):
        print(f"task {name}: {len(by_task[name])} run(s)")
        for state in by_task[name]:
            status = state.status if state.status != "running" or pid_alive(state.pid) else "killed (resumable)"
            print(f"  {state.run_id}  {status:<18} {state.attempts}/{state.config.get('iters')} attempts  "
                  f"best {state.best_label} ({fmt(state.best_score)})  {state.config.get('backend')}"
                  + ("" if state.config.get("cuda") else "  CPU: nothing kept on interpreter timings"))
    print(f"task {task.name} ({task.ledger}):")
    rows = [ledger.parse_row(line, task) for line in ledger.rows(task)]
    kept = [r for r in rows if r.get("score", "-") not in ("-", "") and r.get("decision", "").startswith("keep")]
    verdicts = {e.get("version"): e.get("verdict") or {} for e in ledger.index_entries(task)}
    by_source: dict[str, list[dict]] = {}
    unranked = []
    for row in sorted(kept, key=lambda r: float(r["score"]), reverse=True):
        verdict = verdicts.get(row["version"], {})
        if verdict.get("gpu_timing") is False:  # interpreter wall times rank nothing
            unranked.append(row["version"])
            continue
        by_source.setdefault(measured_on(verdict), []).append(row)
    print("  best kept versions, by where they were measured (scores compare only within one line):"
          + ("" if by_source else " (none)"))
    for source, best in by_source.items():
        print(f"    {source}: " + ", ".join(f"{r['version']} {r['score']}" for r in best[:5]))
    if unranked:
        print(f"  kept on interpreter timings, which rank nothing (not listed as best): {', '.join(unranked[:10])}"
              + (f" and {len(unranked) - 10} more" if len(unranked) > 10 else ""))
    print("  last rows:")
    for line in ledger.rows(task)[-args.rows:] if args.rows > 0 else []:
        print("    " + line)
    return 0


def measured_on(verdict: dict) -> str:
    """The panel and device a version's numbers come from, as its verdict records them."""
    if "panel" not in verdict:
        return "panel and device not recorded"
    return f"{Path(verdict['panel']).name} panel, {'GPU' if verdict.get('gpu_timing') else 'CPU interpreter'}"


def run_task(run_id: str, given: str | None) -> Task:
    """The task a recorded run served; a --task that names another is refused."""
    state_dir = run_state_dir(ROOT, run_id)
    if not (state_dir / "state.json").is_file():
        raise Refused(f"no run {run_id}; `{PROG} status` lists the runs")
    task = load_task(RunState.load(state_dir).config.get("task"))
    if given and load_task(given).name != task.name:
        raise Refused(f"run {run_id} is a run of task {task.name}, not {given}")
    return task


def cmd_report(args: argparse.Namespace) -> int:
    task = run_task(args.run_id, args.task)
    print(f"{report.write(task, args.run_id).relative_to(ROOT)}/report.md and report.html written (task {task.name})")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    task = load_task(args.task)
    panel = str(Path(args.panel).resolve()) if args.panel and args.panel not in ("visible", "smoke") else args.panel
    return promote(task, args.version, has_cuda(), args.force, panel, note=" ".join(args.note.split()),
                   verify=args.verify)


def cmd_clean(args: argparse.Namespace) -> int:
    task = load_task(args.task)
    removed = clean(ROOT, lambda state: report.task_of(state) == task.name)
    print(f"removed {len(removed)} finished worktree(s) of task {task.name}"
          + (": " + ", ".join(removed) if removed else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="kloop: the agent-driven kernel optimization loop")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=text, description=text, formatter_class=DefaultsFormatter)

    run = command("run", "run the loop")
    run.add_argument("--iters", type=at_least_one, metavar="N",
                     help="attempts to make, at least 1 (with --resume: the new total, more than the attempts made)")
    run.add_argument("--backend", default="auto", choices=["auto", "offline", "openai", "scripted"],
                     help="who proposes: offline is the built-in search (no network); openai is any OpenAI-compatible "
                          "endpoint (OPENAI_BASE_URL, OPENAI_API_KEY); scripted replays --script; auto is openai when "
                          "either variable is set, else offline")
    run.add_argument("--model", help="model name for the openai backend (default: OPENAI_MODEL, else gpt-4o-mini)")
    run.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible on a GPU, else smoke)")
    run.add_argument("--from", dest="start_from", default="main", metavar="main|vN",
                     help="where the candidate starts: the task's main or a version")
    run.add_argument("--resume", metavar="RUN_ID", help="continue a stopped or killed run (`status` lists them)")
    run.add_argument("--time-limit", type=above_zero("minutes"), metavar="MIN",
                     help="stop starting iterations after MIN minutes")
    run.add_argument("--cost-limit", type=above_zero("dollars"), metavar="USD",
                     help="stop when the model cost reaches USD")
    run.add_argument("--script", metavar="FILE", help="the scripted backend's JSON list of tool calls")
    run.add_argument("--task", metavar="NAME|DIR",
                     help=f"the task: a name under tasks/ or a folder holding task.json (default {DEFAULT_TASK}; "
                          "with --resume, the run's own)")
    run.add_argument("--full-check", action="store_true",
                     help="the task's checks on every correct candidate, not only on those that would be kept")
    run.add_argument("--gpus", metavar="LIST|all",
                     help="parallel candidates: one worker per GPU (comma-separated CUDA device ids, or all); a batch "
                          "of that many candidates is evaluated at once, each pinned to its GPU")
    run.add_argument("--workers", type=at_least_one, metavar="N",
                     help="workers in a batch (default: one per GPU of --gpus, or per worker of --cluster); more "
                          "workers than GPUs share them, and their timings are marked shared")
    run.add_argument("--cluster", metavar="ADDRESS",
                     help="a Dask scheduler (tcp://HOST:8786) whose workers, one per GPU, evaluate the candidates")
    run.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    submit = command("submit", "evaluate and record a hand-written candidate as one attempt (exit 1 if it fails "
                               "a check)")
    submit.add_argument("solution", help="a solution.py, or a folder whose *.py files (solution.py among them) "
                                         "replace the candidate's")
    submit.add_argument("--summary", required=True, help="what changed (the ledger row's summary)")
    submit.add_argument("--hypothesis", help="why it should be faster")
    submit.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible on a GPU, else smoke)")
    submit.add_argument("--from", dest="start_from", default="main", metavar="main|vN",
                        help="the parent it is compared with: the task's main or a version")
    submit.add_argument("--task", metavar="NAME|DIR", help=f"the task (default {DEFAULT_TASK})")
    submit.add_argument("--full-check", action="store_true", help="the task's checks even if it is not faster")
    submit.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    status = command("status", "runs by task, the task's best kept versions and last ledger rows")
    status.add_argument("--rows", type=int, default=5, help="ledger rows to show")
    status.add_argument("--task", metavar="NAME|DIR", help=f"whose versions and rows to show (default {DEFAULT_TASK})")
    clean_cmd = command("clean-workspace", "remove the worktrees of the task's finished runs")
    clean_cmd.add_argument("--task", metavar="NAME|DIR", help=f"the task (default {DEFAULT_TASK})")
    report_cmd = command("report", "(re)write reports/<run-id>/report.md and report.html")
    report_cmd.add_argument("run_id", help="a run id, as `status` lists them")
    report_cmd.add_argument("--task", metavar="NAME|DIR", help="the run's task (checked; the run records it)")
    promote_cmd = command("promote", "check vN of the task again and copy it into the task's main")
    promote_cmd.add_argument("version", help="vN")
    promote_cmd.add_argument("--task", metavar="NAME|DIR", help=f"the task whose vN it is (default {DEFAULT_TASK})")
    promote_cmd.add_argument("--force", action="store_true",
                             help="promote even if a check fails or the numbers are interpreter timings (recorded in "
                                  "the ledger)")
    promote_cmd.add_argument("--panel",
                             help="visible, smoke or a panel JSON file (default: visible, smoke without CUDA)")
    promote_cmd.add_argument("--note", default="", help="why, written into the promotion's ledger row")
    promote_cmd.add_argument("--verify", action="store_true",
                             help="also run the full verifier (timing gates included; a GPU, minutes) before promoting")
    args = parser.parse_args(argv)
    commands_by_name = {"run": cmd_run, "submit": cmd_submit, "status": cmd_status, "clean-workspace": cmd_clean,
                        "report": cmd_report, "promote": cmd_promote}
    try:
        code = commands_by_name[args.command](args)
        sys.stdout.flush()  # small outputs wait in the buffer: a closed pipe must show here, not at exit
        return code
    except Refused as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of the output has gone (`| head`): there is no one left to tell
        quiet_stdout()
        return 0


if __name__ == "__main__":
    sys.exit(main())
