"""The end-to-end run's report: tokens/s ratios against bf16 and tinygemm per batch, the table, the summary lines and
the plot (``python -m evals.e2e`` writes them; evals/e2e.py says how each number is measured)."""
from __future__ import annotations

import json
from pathlib import Path

from evals import kernel_harness as kh

SCORED_BATCHES = (18, 32)  # the W4A16 task's scored M range


def add_ratios(rows: list[dict]) -> None:
    """Each timed row's tokens/s over bf16's and over tinygemm's at the same batch."""
    speed = {(r["backend"], r["batch"]): r["tokens_per_s"] for r in rows}
    for r in rows:
        if r["tokens_per_s"]:
            for key, base in (("vs_bf16", "bf16"), ("vs_tinygemm", "tinygemm")):
                other = speed.get((base, r["batch"]))
                r[key] = r["tokens_per_s"] / other if other else None


NAME = 30  # the backend column: "w4a16 main DEVICE_BOUND_US=0" fits
HEADER = (f"{'backend':<{NAME}} {'batch':>5} {'tok/s':>9} {'TPOT_ms':>8} {'lin_ms':>7} {'lin%':>5} {'weight_GB':>9} "
          f"{'GB/s':>6} {'floor_ms':>8} {'x_floor':>7} {'max|err|':>9} {'bound':>9} {'ok':>3} {'greedy':>7} "
          f"{'x_bf16':>6} {'x_tiny':>6}  note")


def format_row(r: dict) -> str:
    if r["batch"] is None:
        return f"{r['backend']:<{NAME}} {'-':>5}  " + (f"error {r['error']}" if r["error"] else r["note"])
    num = kh.cell
    ok = "-" if r["correct"] is None else ("yes" if r["correct"] else "NO")
    note = "; ".join(x for x in (r["note"], r["error"] and f"error {r['error']}") if x)
    greedy = "-" if r["tokens_checked"] is None else f"{r['tokens_agree']}/{r['tokens_checked']}"
    return (f"{r['backend']:<{NAME}} {r['batch']:>5} {num(r['tokens_per_s'], '.1f'):>9} {num(r['tpot_ms'], '.3f'):>8} "
            f"{num(r['linear_ms'], '.3f'):>7} {num(r['linear_share'] and 100 * r['linear_share'], '.0f'):>5} "
            f"{num(r['weight_gb'], '.4g'):>9} {num(r['gbps'], '.0f'):>6} {num(r['floor_ms'], '.3f'):>8} "
            f"{num(r['x_floor']):>7} {num(r['max_abs_err'], '.3g'):>9} "
            f"{num(r['bound'], '.3g'):>9} {ok:>3} {greedy:>7} {num(r['vs_bf16']):>6} {num(r['vs_tinygemm']):>6}  "
            f"{note}").rstrip()


def summary(report: dict) -> list[str]:
    """Per timed backend: its tokens/s over bf16 and tinygemm across the batches, and within the W4A16 task's scored
    M range where the run has such batches."""
    lines = []
    if report.get("read_gbps"):
        lines.append(f"glue {report['glue']}; the weights' bandwidth limit (floor_ms) at {report['read_gbps']:.0f} "
                     "GB/s, a read-only pass's")
    for name in dict.fromkeys(r["backend"] for r in report["rows"] if r["vs_bf16"] or r["vs_tinygemm"]):
        rows = [r for r in report["rows"] if r["backend"] == name and r["tokens_per_s"]]
        for label_, chosen in (("every batch", rows),
                               (f"batches {SCORED_BATCHES[0]}-{SCORED_BATCHES[1]}",
                                [r for r in rows if SCORED_BATCHES[0] <= r["batch"] <= SCORED_BATCHES[1]])):
            if chosen:
                parts = [f"{span([r[key] for r in chosen])}x {base}"
                         for key, base in (("vs_bf16", "bf16"), ("vs_tinygemm", "tinygemm"))
                         if all(r[key] for r in chosen)]
                lines.append(f"{name}, {label_} ({', '.join(str(r['batch']) for r in chosen)}): "
                             + ("; ".join(parts) or "no baseline row"))
    return lines


def span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if abs(high - low) < 0.005 else f"{low:.2f}-{high:.2f}"


def plot(report: dict, path: Path) -> bool:
    """tokens/s against batch, a line per timed backend; False where nothing was timed or matplotlib is missing."""
    series = {}
    for r in report["rows"]:
        if r["tokens_per_s"]:
            series.setdefault(r["backend"], []).append((r["batch"], r["tokens_per_s"]))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for name, points in series.items():
        ax.plot(*zip(*points), marker="o", label=name)
    ax.set_xlabel("batch (sequences, one token each per step)")
    ax.set_ylabel("decode tokens/s")
    model = report["model"]
    ax.set_title(f"{report['config']} ({model['layers']} layers), {report['device']}", fontsize=10)
    ax.set_xticks(report["batches"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def profile_lines(report: dict) -> list[str]:
    """``--profile``: per backend, its projections alone against their weights' bandwidth limit, and the step's
    kernels by time (evals/e2e.py, ``profiled``)."""
    lines = []
    for r in report["rows"]:
        p = r.get("profile")
        if not p:
            continue
        lines += ["", f"{r['backend']}, batch {p['batch']}: TPOT {r['tpot_ms']:.3f} ms, linear layers "
                      f"{r['linear_ms']:.3f} ms, the rest of the step {r['tpot_ms'] - r['linear_ms']:.3f} ms",
                  f"  {'projection':<10} {'K':>6} {'N':>6} {'ms/step':>8} {'us/call':>8} {'floor_ms':>8} "
                  f"{'x_floor':>7}"]
        lines += [f"  {name:<10} {q['k']:>6} {q['n']:>6} {q['ms']:>8.3f} {q['us_per_call']:>8.2f} "
                  f"{q['floor_ms']:>8.3f} {q['x_floor']:>7.2f}" for name, q in p["projections"].items()]
        lines += [f"  kernels ({p['source']}): {p['total_us'] / 1e3:.3f} ms a step in all; the longest:",
                  f"  {'us/step':>8} {'calls':>6}  name"]
        lines += [f"  {k['us']:>8.1f} {k['calls']:>6.0f}  {k['name'][:110]}" for k in p["kernels"]]
    return lines


def write(report: dict, json_path: Path | None, out: Path | None) -> None:
    """The JSON at ``json_path`` (``--json``), and under ``out`` (``--out``): e2e.json, table.txt and tokens_per_s.png
    (timed rows only), and profile.txt where a row holds a profile."""
    text = json.dumps(report, indent=2)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "e2e.json").write_text(text)
        table = [HEADER, *map(format_row, report["rows"]), *summary(report)]
        (out / "table.txt").write_text("\n".join(table) + "\n")
        plot(report, out / "tokens_per_s.png")
        profile = profile_lines(report)
        if profile:
            (out / "profile.txt").write_text("\n".join(profile[1:]) + "\n")
