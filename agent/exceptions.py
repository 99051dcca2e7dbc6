"""Control flow of the loop, as in mini-swe-agent: each exception carries the message that explains it."""
from __future__ import annotations


class InterruptAgentFlow(Exception):
    """Ends the current iteration of a proposer."""


class Submitted(InterruptAgentFlow):
    def __init__(self, summary: str, hypothesis: str):
        super().__init__(f"submitted: {summary}")
        self.summary, self.hypothesis = summary, hypothesis


class FormatError(InterruptAgentFlow):
    """A tool call that cannot be executed as given (unknown tool, malformed arguments); answered, never fatal."""


class LimitsExceeded(Exception):
    """A run limit (iterations, time, cost) or an exhausted search: the run stops after recording what it has."""


class EndpointUnavailable(Exception):
    """The model's endpoint does not answer (the probe before a run, or every retry of a request), or refuses what the
    proposer asks of it and nothing was edited: nothing was proposed, so nothing is evaluated; a new run is refused, a
    running one stops and says why. Not a ProposerError after an edit, which costs one recorded attempt."""


class ProposerError(Exception):
    """The proposer could not produce anything this iteration (endpoint down after retries, bad script)."""
