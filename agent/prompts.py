"""The prompt templates in prompts/, rendered with string.Template.substitute: a missing value is an error."""
from __future__ import annotations

from pathlib import Path
from string import Template

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


def render(name: str, **values: object) -> str:
    """prompts/<name>.md with its placeholders filled (the file's final newline dropped); a missing value is a
    KeyError, never an empty string."""
    return Template((PROMPTS / f"{name}.md").read_text()).substitute(values).rstrip("\n")
