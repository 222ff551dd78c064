"""Prompt files, one per purpose and language (ko, en). `$name` placeholders
(string.Template) so JSON examples inside the prompts need no escaping."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from string import Template

from ...errors import ConfigError

__all__ = ["LANGUAGES", "prompt", "read_text_file"]

LANGUAGES = ("ko", "en")
NAMES = ("persona", "post_instruction", "decision", "extraction", "repair")


@lru_cache(maxsize=None)
def prompt(name: str, language: str) -> Template:
    if language not in LANGUAGES:
        raise ConfigError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    if name not in NAMES:
        raise ValueError(f"no prompt named {name!r}")
    text = resources.files(__name__).joinpath(language, f"{name}.md").read_text(encoding="utf-8")
    return Template(text.strip())


def read_text_file(path: str | Path, what: str) -> str:
    """A user-supplied prompt-like file (persona, core, lore), with a clear error."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {path}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror}") from None
    if not text.strip():
        raise ConfigError(f"{what} file {path} is empty")
    return text.strip()
