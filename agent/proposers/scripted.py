"""Replays a fixed list of tool calls, so tests run the real loop with no model and no mocks.

The script is a JSON list of ``{"tool": name, "args": {...}}``; each ``submit`` ends an iteration. An entry
``{"raw": ...}`` is passed to the dispatcher as given, so a malformed call can be scripted too. The script may also be
``{"label": name, "calls": [...]}``: the label is the ledger's backend column (``hand`` for
`.venv/bin/python -m agent submit`).
"""
from __future__ import annotations

import json
from pathlib import Path

from agent.exceptions import FormatError, LimitsExceeded
from agent.proposers import IterationContext
from agent.tools import Tools


class ScriptedProposer:
    label = "scripted"

    def __init__(self, calls: list[dict], label: str = "scripted"):
        self.calls = list(calls)
        self.label = label
        self.position = 0
        self.transcript: list[tuple[str, dict]] = []  # (tool, result) for tests to assert on

    @classmethod
    def from_file(cls, path: str) -> "ScriptedProposer":
        script = json.loads(Path(path).read_text())
        if isinstance(script, dict):
            return cls(script.get("calls", []), str(script.get("label") or "scripted"))
        return cls(script)

    def iterate(self, context: IterationContext, tools: Tools) -> None:
        while self.position < len(self.calls):
            call = self.calls[self.position]
            self.position += 1
            try:
                outcome = tools.call(call.get("tool", ""), call.get("args", call.get("raw")))
            except FormatError as exc:
                outcome = {"output": f"format error: {exc}", "returncode": 2}
            self.transcript.append((call.get("tool", ""), outcome))
        raise LimitsExceeded("the script has no more tool calls")
