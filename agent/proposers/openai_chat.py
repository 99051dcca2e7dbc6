"""The LLM proposer: chat completions with function calling against any OpenAI-compatible endpoint.

One request before the first attempt (``probe``) finds an endpoint that nobody answers at, so that the run is refused
before anything is written. Retries with exponential backoff on 429, 5xx, timeouts, connection errors and responses
the SDK passes through unchecked (no choices, a body that is not a completion), one line on stderr per retry; when
they run out the run stops (EndpointUnavailable) rather than evaluating a candidate nobody proposed; a malformed or
unknown tool call is answered with the format-error prompt and the conversation goes on; the conversation is
trimmed to a context budget.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

import openai
from openai.types.chat import ChatCompletion

from agent.exceptions import EndpointUnavailable, FormatError, ProposerError
from agent.prompts import render
from agent.proposers import IterationContext
from agent.tools import Tools, openai_tools

# USD per million (prompt, completion) tokens; KLOOP_PRICE_PER_MTOK="in,out" overrides (local servers: "0,0").
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.5, 10.0), "gpt-4o-mini": (0.15, 0.6), "gpt-4.1": (2.0, 8.0), "gpt-4.1-mini": (0.4, 1.6),
    "o4-mini": (1.1, 4.4), "gpt-5": (1.25, 10.0), "gpt-5-mini": (0.25, 2.0), "default": (2.0, 8.0),
}


class BadResponse(Exception):
    """A 2xx reply that is not a usable chat completion."""


def price(model: str) -> tuple[float, float]:
    """USD per million (prompt, completion) tokens: KLOOP_PRICE_PER_MTOK when set, else the table's."""
    override = os.environ.get("KLOOP_PRICE_PER_MTOK", "").strip()
    if not override:
        return PRICES.get(model, PRICES["default"])
    try:
        prompt, completion = (float(part) for part in override.split(","))
        valid = prompt >= 0 and completion >= 0  # False for nan too
    except ValueError:  # not two numbers
        valid = False
    if not valid:
        raise ValueError(f"KLOOP_PRICE_PER_MTOK={override!r}: expected 'in,out', two non-negative USD prices per "
                         "million prompt and completion tokens, such as '2.5,10' (or '0,0' for a local server)")
    return prompt, completion


@dataclass
class OpenAIConfig:
    model: str = "gpt-4o-mini"
    """Any model the endpoint serves."""
    base_url: str | None = None
    """OPENAI_BASE_URL; None means api.openai.com."""
    api_key: str = "none"
    """OPENAI_API_KEY; local servers accept any value."""
    max_steps: int = 24
    """Model replies (one tool call each, as the prompt asks) per iteration; when they run out without a submit, the
    iteration ends with ProposerError and the loop evaluates and records the candidate as a "no submit" attempt."""
    context_budget_tokens: int = 48_000
    """Estimated tokens (characters / 4) the conversation may hold; older tool exchanges are dropped beyond it."""
    retries: int = 6
    backoff_s: float = field(default_factory=lambda: float(os.environ.get("KLOOP_RETRY_BASE_S", "2.0")))
    """First retry delay; doubles each retry, capped at 60 s."""
    request_timeout_s: float = 300.0
    tool_output_chars: int = 8_000


class OpenAIProposer:
    def __init__(self, config: OpenAIConfig):
        self.config = config
        self.label = f"openai/{config.model}"
        self.max_steps = config.max_steps
        self.prices = price(config.model)  # read once: a malformed KLOOP_PRICE_PER_MTOK fails here, not mid-run
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0,
                                    timeout=config.request_timeout_s)

    @classmethod
    def from_env(cls, model: str) -> "OpenAIProposer":
        return cls(OpenAIConfig(model=model or os.environ.get("OPENAI_MODEL") or "gpt-4o-mini",
                                base_url=os.environ.get("OPENAI_BASE_URL") or None,
                                api_key=os.environ.get("OPENAI_API_KEY") or "none"))

    @property
    def where(self) -> str:
        return self.config.base_url or "https://api.openai.com/v1 (OPENAI_BASE_URL is not set)"

    def probe(self) -> None:
        """One request, no retries, before anything is written: raises EndpointUnavailable when nothing answers or
        the key is refused. A server that answers at all passes, whether or not it lists its models."""
        try:
            self.client.with_options(timeout=min(30.0, self.config.request_timeout_s)).models.list()
        except openai.APIConnectionError as exc:  # refused, unresolvable, timed out
            raise EndpointUnavailable(f"no OpenAI-compatible endpoint answers at {self.where} ({exc}): start the "
                                      "server, set OPENAI_BASE_URL to where it listens, or use --backend offline"
                                      ) from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise EndpointUnavailable(f"the endpoint at {self.where} refused the key ({exc.status_code}): set "
                                      "OPENAI_API_KEY, or use --backend offline") from None
        except (openai.APIError, ValueError):
            pass

    def iterate(self, context: IterationContext, tools: Tools) -> None:
        messages: list[dict] = [{"role": "system", "content": context.prompts["system"]},
                                {"role": "user",
                                 "content": context.prompts["task"] + "\n\n" + context.prompts["iteration"]}]
        for _ in range(self.config.max_steps):
            message = self._complete(trim(messages, self.config.context_budget_tokens), context, tools)
            calls = message.tool_calls or []
            messages.append({"role": "assistant", "content": message.content or "",
                             **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
            if not calls:
                messages.append({"role": "user", "content": format_error("the message called no tool", tools)})
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": self._execute(tools, call.function.name, call.function.arguments)})
        raise ProposerError(f"no submit within {self.config.max_steps} tool calls")

    def _execute(self, tools: Tools, name: str, arguments: str) -> str:
        try:
            parsed = json.loads(arguments or "{}")
            outcome = tools.call(name, parsed)  # submit raises Submitted, which ends the iteration
        except json.JSONDecodeError as exc:
            return format_error(f"the arguments of {name} are not JSON ({exc})", tools)
        except FormatError as exc:
            return format_error(str(exc), tools)
        output = outcome["output"]
        if len(output) > self.config.tool_output_chars:
            output = (output[: self.config.tool_output_chars // 2] + "\n[...]\n"
                      + output[-self.config.tool_output_chars // 2:])
        return f"returncode {outcome['returncode']}\n{output}"

    def _complete(self, messages: list[dict], context: IterationContext, tools: Tools):
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                response = self.client.chat.completions.create(model=self.config.model, messages=messages,
                                                               tools=openai_tools(tools.specs), tool_choice="auto")
                if not isinstance(response, ChatCompletion) or not response.choices or \
                        response.choices[0].message is None:
                    raise BadResponse(f"not a chat completion with choices: {str(response)[:200]!r}")
                break
            except (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError,
                    openai.APIConnectionError, openai.APIResponseValidationError, BadResponse, ValueError) as exc:
                error: Exception = exc
            except openai.APIStatusError as exc:
                if exc.status_code < 500 and exc.status_code not in (408, 409):
                    raise ProposerError(f"the endpoint refused the request: {exc}") from exc
                error = exc
            if attempt < self.config.retries:
                print(f"endpoint {self.where}: {type(error).__name__}: {str(error)[:160]}; retrying in "
                      f"{min(delay, 60.0):.1f} s ({attempt + 1} of {self.config.retries})", file=sys.stderr,
                      flush=True)
                time.sleep(min(delay, 60.0))
                delay *= 2
        else:
            raise EndpointUnavailable(f"the endpoint at {self.where} failed {self.config.retries + 1} times in a row; "
                                      f"last error: {error}; resume once it answers")
        if response.usage:
            prompt_price, completion_price = self.prices
            context.usage.prompt_tokens += response.usage.prompt_tokens or 0
            context.usage.completion_tokens += response.usage.completion_tokens or 0
            context.usage.cost_usd += ((response.usage.prompt_tokens or 0) * prompt_price
                                       + (response.usage.completion_tokens or 0) * completion_price) / 1e6
        return response.choices[0].message


def format_error(error: str, tools: Tools) -> str:
    return render("format_error", error=error, tools=", ".join(s["name"] for s in tools.specs))


def trim(messages: list[dict], budget_tokens: int) -> list[dict]:
    """Drop the oldest assistant turns (each with its tool replies, so every tool reply keeps its call) until the
    estimate fits; the system and first user message always stay."""
    def size(items: list[dict]) -> int:
        return len(json.dumps(items)) // 4

    head, turns = messages[:2], []
    for message in messages[2:]:
        if message["role"] == "assistant" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    dropped = 0
    while len(turns) > 1 and size(head + [m for t in turns for m in t]) > budget_tokens:
        turns.pop(0)
        dropped += 1
    note = [{"role": "user", "content": render("trimmed", dropped=dropped)}] if dropped else []
    return head + note + [m for t in turns for m in t]
