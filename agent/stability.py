"""Stability: whether the verifier could time a candidate at all.

The verifier fails a case when any role's 11 timed group times spread over max/min 1.15, and one failed case makes
the whole verdict invalid (scored zero). A candidate whose GPU time per call does not clear its host cost per call by
a margin is host-bound: on a noisy host its groups spread over that limit. Two evaluator reports say so, both only on
a GPU: the selfcheck's host-bound probe per case (cheap, every attempt: ``stable``, ``gpu_us``, ``host_us``) and the
qualification under the verifier's own candidate schedule (timed, only for a candidate about to be kept).

Pure functions of those JSON reports (agent/ never imports evals/), so the rule is testable without a GPU.
"""
from __future__ import annotations

LEGACY_LIMIT = 1.15
"""The verifier's max/min limit as reports written before they carried their own ("limit") were judged by; every
report the evaluator writes says it (evals/stability.py's DISPERSION_LIMIT is the one source)."""


def limit_of(report: dict | None) -> float:
    """The max/min limit a report judged by: its own "limit" (a selfcheck's under "stability"), else LEGACY_LIMIT."""
    report = report or {}
    return report.get("limit") or (report.get("stability") or {}).get("limit") or LEGACY_LIMIT
# A flagged case whose GPU time per call is at least (1 - this) x the best's there does not block a keep: the
# probe's run-to-run spread of one plan's GPU time. The host cost is not compared: one plan's drifts between processes
# (main's on 18x8192x8192: 10.1 and 17.5 us in two verifier runs on one H200), so the candidate's own host work is
# left to the qualification, which times both together.
GPU_TOLERANCE = 0.03


def _num(value: object, fmt: str) -> str:
    return "?" if not isinstance(value, (int, float)) else format(value, fmt)


def _is_num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _flagged(selfcheck: dict | None, reference: dict | None = None) -> tuple[list[dict], list[dict]]:
    """The selfcheck's cases measured unstable (``stable`` False, or named in ``stability.unstable_cases``), split in
    two: those that block a keep, and those left to the qualification, which times the candidate under the verifier's
    own schedule and so decides a would-be keeper (each such entry's ``defer`` says why):

    - ``"as best"``: the case's GPU time per call is at least (1 - GPU_TOLERANCE) x ``reference``'s there (the best's
      own selfcheck): it does as much GPU work per call as the best's plan, which sits as near the ratio;
    - ``"near"``: its GPU time per call clears its host cost, short of the ratio only. The ratio leaves a margin for
      a host cost measured once in the evaluator's process, which moves (9.9 to 16.7 us per call for one plan,
      seconds apart in one qualification run on an H200); the qualification measures the groups' spread itself.

    A case whose GPU time is below its host cost (host-bound outright), or that was not measured, blocks."""
    report = selfcheck or {}
    cases = report.get("cases") or []
    named = set((report.get("stability") or {}).get("unstable_cases") or [])
    ratio = (report.get("stability") or {}).get("ratio_min")
    best_gpu = {(c.get("case") or {}).get("name"): c.get("gpu_us") for c in (reference or {}).get("cases") or []}
    blocking, deferred = [], []
    for case in cases:
        name = (case.get("case") or {}).get("name")
        if case.get("stable") is False or name in named:
            gpu, host, theirs = case.get("gpu_us"), case.get("host_us"), best_gpu.get(name)
            measured = all(_is_num(v) for v in (gpu, host, ratio))
            why = (f"GPU {gpu:.1f} us below {ratio:.2f}x host {host:.1f} us" if measured
                   else case.get("stable_note") or "host-bound")
            entry = {"case": name, "stratum": (case.get("case") or {}).get("stratum"), "why": why,
                     "note": case.get("stable_note") or why}
            if measured and _is_num(theirs) and gpu >= (1 - GPU_TOLERANCE) * theirs:
                deferred.append(entry | {"why": f"{why}; the best's {theirs:.1f} us", "defer": "as best"})
            elif measured and gpu >= host:
                deferred.append(entry | {"defer": "near"})
            else:
                blocking.append(entry)
    return blocking, deferred


def _host_bound(selfcheck: dict | None, reference: dict | None = None) -> list[dict]:
    """The selfcheck's host-bound cases that block a keep (``_flagged``)."""
    return _flagged(selfcheck, reference)[0]


def shared_cases(selfcheck: dict | None, reference: dict | None) -> list[dict]:
    """The selfcheck's unstable cases that do not block a keep (``_flagged``: at the best's own GPU time, or near
    host-bound): the qualification decides a would-be keeper."""
    return _flagged(selfcheck, reference)[1]


def _over_limit(qualify: dict | None) -> list[dict]:
    """The qualification's cases with a vector over the limit, each with its worst vector's schedule."""
    limit = limit_of(qualify)
    found = []
    for row in (qualify or {}).get("rows") or []:
        vectors = [v for v in row.get("vectors") or [] if isinstance(v.get("max_min"), (int, float))]
        worst = max(vectors, key=lambda v: v["max_min"], default=None)
        if worst is None or worst["max_min"] <= limit:
            continue
        why = f"{worst.get('schedule', '?')} max/min {worst['max_min']:.3f} > {limit:.2f}"
        found.append({"case": row.get("case"), "stratum": row.get("stratum"), "why": why,
                      "note": f"under the verifier's schedule: {why}"})
    return found


def unstable_cases(selfcheck: dict | None, qualify: dict | None, reference: dict | None = None) -> list[dict]:
    """Each case a report measured unstable, as ``{"case", "stratum", "why", "note"}``: ``why`` is short (a ledger
    decision quotes it), ``note`` the evaluator's own words. The selfcheck's host-bound cases that block a keep when
    it found any (the qualification does not run then), else the qualification's cases over the limit."""
    return _host_bound(selfcheck, reference) or _over_limit(qualify)


def stability_block(selfcheck: dict | None, qualify: dict | None,
                    reference: dict | None = None) -> tuple[bool, str, str]:
    """Whether a candidate may be kept as far as stability goes, its ledger cell and the reason: ``(ok, cell, note)``.

    ``selfcheck`` is a GPU selfcheck report (per case ``stable``, ``gpu_us``, ``host_us``, ``stable_note``; top-level
    ``stability``); ``qualify`` the qualification report, None when it did not run (a candidate that would not be
    kept), ``{"measured": False, "note": ...}`` when it ran and measured nothing; ``reference`` the best's selfcheck
    report, whose GPU times make a host-bound case the best shares not block (``shared_cases``). Call it only for GPU
    runs: under the interpreter nothing is measured and the cell is "-".

    - a case the selfcheck found host-bound that ``_flagged`` does not leave to the qualification (or a top-level
      "unstable" naming a case it does not list): ``(False, "no (host-bound: CASE)", "host-bound on the GPU, ...:
      CASE: its stable_note")``;
    - a qualification vector over the limit: ``(False, "no (CASE SCHEDULE max/min X)", "unstable under the
      verifier's schedule: CASE SCHEDULE max/min X > 1.15")``;
    - a qualification that measured nothing, or failed with no vector over the limit (a child that crashed):
      ``(False, "-", "not qualified: ...")`` (a keep needs its pass);
    - a qualification that passed, or no qualification and a selfcheck that found every case stable: ``(True, "yes",
      "")``; no qualification and only cases shared with the best flagged: ``(True, "as best (host-bound: CASE)",
      "")``, or near host-bound ones among them: ``(True, "near host-bound, not qualified: CASE", "")``; nothing
      measured: ``(True, "-", "")``.
    """
    stability = (selfcheck or {}).get("stability") or {}
    host_bound, shared = _flagged(selfcheck, reference)
    unlisted = set(stability.get("unstable_cases") or []) - {u["case"] for u in host_bound + shared}
    if host_bound or (stability.get("stable") is False and (not shared or unlisted)):
        named = host_bound[0]["case"] if len(host_bound) == 1 else f"{len(host_bound)} cases"
        why = "; ".join(f"{u['case']}: {u['note']}" for u in host_bound) or stability.get("note") or "no case named"
        return (False, f"no (host-bound: {named})" if host_bound else "no (host-bound)",
                f"host-bound on the GPU, which the verifier's max/min {limit_of(selfcheck)} gate fails on a noisy "
                f"host: {why}")
    if qualify is not None:
        if not qualify.get("measured"):
            return False, "-", "not qualified: " + (qualify.get("note") or "the qualification measured nothing")
        if qualification_failed(qualify):
            worst = qualify.get("worst") or {}
            spread = _num(worst.get("max_min"), ".3f")
            where = f"{worst.get('case', '?')} {worst.get('schedule', '?')}"
            return (False, f"no ({where} max/min {spread})",
                    f"unstable under the verifier's schedule: {where} max/min {spread} > "
                    f"{limit_of(qualify):.2f}")
        if not qualify.get("passed"):
            errors = list(qualify.get("failures") or []) + [e for r in qualify.get("rows") or []
                                                            for e in r.get("errors") or []]
            return False, "-", "not qualified: " + ("; ".join(errors)[:600] or "it did not pass, and no vector is over "
                                                    "the limit")
        return True, "yes", ""
    if shared:
        def named(entries: list[dict]) -> str:
            return entries[0]["case"] if len(entries) == 1 else f"{len(entries)} cases"
        near = [u for u in shared if u["defer"] == "near"]  # the cell names those, not the ones at the best's time
        cell = f"near host-bound, not qualified: {named(near)}" if near else f"as best (host-bound: {named(shared)})"
        return True, cell, ""
    return True, "yes" if stability.get("stable") is True else "-", ""


def qualification_failed(report: dict | None) -> bool:
    """Whether a qualification report measured the candidate and found a vector over the limit: an answer about the
    candidate (it cannot be kept), not a stage that failed to run (a child that crashed times nothing)."""
    return bool(report and report.get("measured") and report.get("passed") is False and _over_limit(report))
