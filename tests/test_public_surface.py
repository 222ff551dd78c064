"""The public surface is deliberate: every name a module exports exists, every class and
function a package exports says what it is for, types ship with the package, and product
code never imports the benchmarks."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from importlib import resources
from pathlib import Path

import pytest

import gieok

SOURCE = Path(gieok.__file__).parent
MODULES = sorted(m.name for m in pkgutil.walk_packages(gieok.__path__, "gieok."))
PACKAGES = ["gieok", *sorted(m.name for m in pkgutil.walk_packages(gieok.__path__, "gieok.") if m.ispkg)]


@pytest.mark.parametrize("name", MODULES)
def test_every_exported_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None or name.endswith("__main__"), f"{name} has no __all__"
    missing = [item for item in exported or () if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    assert len(set(exported or ())) == len(exported or ()), f"{name}.__all__ names something twice"


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_export_is_documented(name: str) -> None:
    package = importlib.import_module(name)
    assert inspect.getdoc(package), f"{name} has no docstring"
    undocumented = [item for item in getattr(package, "__all__", ())
                    if (inspect.isclass(obj := getattr(package, item)) or inspect.isfunction(obj))
                    and not inspect.getdoc(obj)]
    assert not undocumented, f"{name} exports without a docstring: {undocumented}"


def test_the_bot_core_and_the_conversation_memory_are_public() -> None:
    from gieok.chat import Bot, ChatSettings, ConversationMemory, build_bot, build_pipeline
    from gieok.chat.runtime import BotCore, InboundMessage, Outbox

    assert BotCore.__module__ == "gieok.chat.runtime.core" and InboundMessage and Outbox and ConversationMemory
    assert Bot and ChatSettings and build_bot.__module__ == build_pipeline.__module__ == "gieok.chat.compose"


def test_types_ship_with_the_package() -> None:
    assert resources.files("gieok").joinpath("py.typed").is_file()


def test_product_code_never_imports_the_benchmarks() -> None:
    """The benchmarks are not in the package: only the command line's `gieok bench` reaches for them,
    inside the function that mounts them, so loading the CLI without them still works."""
    offenders = []
    for path in SOURCE.rglob("*.py"):
        relative = path.relative_to(SOURCE)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(name.split(".")[0] == "benchmarks" for name in names):
                    offenders.append((str(relative), node.lineno, node.col_offset))
    assert [o for o in offenders if o[0] != "cli/__init__.py"] == []
    assert all(column > 0 for _, _, column in offenders), "gieok.cli imports the benchmarks at module level"
