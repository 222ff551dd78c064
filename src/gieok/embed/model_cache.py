"""The user's model cache (`~/.cache/gieok/models/`): what is built or loaded once on this machine
and read back at later starts — the e5 graph (e5_onnx.py), the USE encoder (use.py), classifiers
trained on first use (chat/agent/bundled.py). Nothing in it is downloaded; each file is named by
what it was made from, so a changed input names another file."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["model_cache_dir", "keep_cached"]

log = logging.getLogger(__name__)


def model_cache_dir() -> Path:
    """Where models built or trained on first use are kept (per user, never downloaded)."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("gieok", appauthor=False)) / "models"


def keep_cached(target: Path, write: Callable[[BinaryIO], object], *, stale: str, current: str, what: str) -> None:
    """Write `target` with `write` whole or not at all (a reader never sees half a file), after
    removing the files of its directory that match `stale` but whose names do not start with
    `current` (made from other inputs: never read again). A read-only or full cache is logged, not
    raised: the thing is built again next time."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for old in target.parent.glob(stale):
            if not old.name.startswith(current):
                old.unlink(missing_ok=True)
        with partial.open("wb") as file:
            write(file)
        partial.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):  # the folder may not be one (a file where it should be)
            partial.unlink(missing_ok=True)
        log.info("the %s was not cached in %s: %s", what, target.parent, exc)
