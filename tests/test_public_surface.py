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


def test_every_exception_the_client_raises_is_importable_from_it() -> None:
    """`from gieok.client import AuthenticationError`: each engine exception the client's modules
    import (to raise, or to map a server's answer to) is exported by `gieok.client`, as the
    engine's own class, so `except` clauses match whichever module it was imported from."""
    import gieok.client
    import gieok.errors

    raised = set()
    for path in (SOURCE / "client").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "errors" and node.level == 2:
                raised |= {alias.name for alias in node.names if alias.name.endswith("Error")}
    assert {"AuthenticationError", "ServerUnavailableError", "BlockNotFoundError"} <= raised
    assert raised <= set(gieok.client.__all__), f"missing from gieok.client: {raised - set(gieok.client.__all__)}"
    for name in raised:
        assert getattr(gieok.client, name) is getattr(gieok.errors, name)


def test_the_client_reads_its_server_and_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gieok.client import AsyncClient, Client

    monkeypatch.delenv("GIEOK_URL", raising=False)
    monkeypatch.setenv("GIEOK_API_KEY", "gk_00000000_" + "k" * 43)
    with Client() as default:
        assert default.base_url == "http://127.0.0.1:8420"
    monkeypatch.setenv("GIEOK_URL", "http://memory.internal:9000/")
    with Client() as from_env, Client("http://127.0.0.1:1") as given:
        assert from_env.base_url == "http://memory.internal:9000" and given.base_url == "http://127.0.0.1:1"
        assert from_env._api.connection.api_key == "gk_00000000_" + "k" * 43
    assert AsyncClient().base_url == "http://memory.internal:9000"
    monkeypatch.setenv("GIEOK_URL", "memory.internal:9000")  # no scheme: refused by name, as a base_url is
    with pytest.raises(gieok.errors.InvalidInputError, match="base_url"):
        Client()


def test_gieok_version_prints_the_package_version() -> None:
    from cli_runner import gieok as run_gieok

    done = run_gieok("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"gieok {gieok.__version__}", done
