"""Prompt files, one per purpose and language (ko, en). `$name` placeholders
(string.Template) so JSON examples inside the prompts need no escaping."""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template

from ....errors import ConfigError

__all__ = ["LANGUAGES", "prompt"]

LANGUAGES = ("ko", "en")
NAMES = ("persona", "post_instruction", "decision", "extraction", "repair")


@cache
def prompt(name: str, language: str) -> Template:
    if language not in LANGUAGES:
        raise ConfigError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    if name not in NAMES:
        raise ValueError(f"no prompt named {name!r}")
    text = resources.files(__name__).joinpath(language, f"{name}.md").read_text(encoding="utf-8")
    return Template(text.strip())
