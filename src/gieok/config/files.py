"""Text files a setting names (persona, permanent core, lore), read with errors that say which
setting's file failed and why."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError

__all__ = ["read_text_file"]


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
