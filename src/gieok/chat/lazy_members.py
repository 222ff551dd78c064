"""A package's members loaded when first asked for (PEP 562 `__getattr__`), for the chat ring's
packages: importing one module of a package — `gieok.chat.settings`, which every `gieok` command
reads through the server's settings — must not run the package's `__init__` imports of the whole
bot (the pipeline, its classifiers' code, the model clients: ~0.25 s of every command's start)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_members"]


def lazy_members(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: a name of `homes` is imported from its module (relative to
    the package) the first time it is asked for, then kept as the package's attribute."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
