"""Proposers plug in by name (duck-typed, no base class): each edits the candidate through the tools and ends an
iteration by calling ``submit``, which raises ``Submitted``."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Protocol

from agent.tools import Tools


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class IterationContext:
    """What a proposer knows at the start of an iteration; ``usage`` is filled in by the proposer."""

    iteration: int
    prompts: dict[str, str]
    """Rendered system, task and iteration prompts."""
    profile: dict | None
    """The best's last selfcheck report (per-case latency, GB/s, roofline fraction, speedups; on a GPU per-case host
    and GPU time per call and whether the case is ``stable``), if any."""
    last_verdict: dict | None = None
    """The run's last attempt as its state keeps it (decision inputs: failed stage, note, strata, score, ``stable``
    and the ``unstable`` cases with their strata), if any."""
    usage: Usage = field(default_factory=Usage)
    iters: int | None = None
    """The run's iteration limit (``iteration`` of ``iters``), when it has one."""
    last: bool = False
    """Whether this is, by estimate, the run's last iteration: the ``iters``-th, or one after which the time limit
    leaves less than a typical attempt of the run (``agent.loop.last_iteration``)."""
    best: str | None = None
    """The run's best version (``vN``), whose files the candidate holds at the iteration's start."""
    pending: list[str] = field(default_factory=list)
    """In a parallel run's batch, the identities (``ledger.identity``) of the candidates proposed before this one
    and not yet recorded: the offline search treats them as tried (a model sees their summaries in its prompt)."""
    pending_sources: list[str] = field(default_factory=list)
    """Their solution.py sources."""
    gpu: bool | None = None
    """Whether the run evaluates on a GPU (None: not said, as a proposer driven by hand may leave it)."""


class Proposer(Protocol):
    label: str
    """backend/model as the ledger shows it."""

    def iterate(self, context: IterationContext, tools: Tools) -> None:
        """Edit the candidate through ``tools`` and call submit; raises Submitted, LimitsExceeded or ProposerError."""


# name -> "module:Class"; imported on demand so that an offline run never needs the openai SDK
BACKENDS = {"offline": "agent.proposers.offline:OfflineProposer",
            "openai": "agent.proposers.openai_chat:OpenAIProposer",
            "scripted": "agent.proposers.scripted:ScriptedProposer"}


def make_proposer(backend: str, model: str, script: str | None) -> Proposer:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)} (or auto)")
    module, name = BACKENDS[backend].split(":")
    cls = getattr(importlib.import_module(module), name)
    if backend == "openai":
        return cls.from_env(model)
    if backend == "scripted":
        if not script:
            raise ValueError("the scripted backend needs --script FILE (a JSON list of tool calls)")
        return cls.from_file(script)
    return cls()
