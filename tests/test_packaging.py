"""What `pip install gieok` gets: the engine and its command line, with nothing of the chat's or the
server's libraries unless an extra asks for them; and a wheel that carries no benchmark code and
no evaluation data (those stay in a source checkout's `benchmarks/`)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXTRAS = ("server", "discord", "gemini", "postgres", "redis")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` install, following each one's own requirements."""
    seen: set[str] = set()
    todo = [r for r in requirements if "extra ==" not in r]
    while todo:
        name = _requirement_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        with contextlib.suppress(metadata.PackageNotFoundError):
            todo += [r for r in metadata.requires(name) or [] if "extra ==" not in r]
    return seen


@cache
def extra_only_modules() -> tuple[str, ...]:
    """Every top-level module that only an extra installs, read from pyproject.toml and the installed
    distributions' metadata, so a core import of an extra-only library (tenacity once) is caught."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = _closure(project["dependencies"])
    extras = _closure([r for extra in EXTRAS for r in project["optional-dependencies"][extra]])
    only = extras - core
    blocked: set[str] = set()
    for module, dists in metadata.packages_distributions().items():
        names = {d.lower().replace("_", "-") for d in dists}
        if module.startswith("_") or not names & only:
            continue
        if not names - only:
            blocked.add(module)
            continue
        # A namespace package shared with a core library (`google`: protobuf, which onnx needs, beside
        # google-genai): block the extra-only distributions' own subpackages, not the namespace.
        for dist in names & only:
            for file in metadata.distribution(dist).files or ():
                parts = file.parts
                if len(parts) > 2 and parts[0] == module:
                    blocked.add(f"{module}.{parts[1]}")
    return tuple(sorted(blocked))


def _python(code: str, *, blocked: tuple[str, ...] = (), timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter where the `blocked` packages cannot be imported, as on a
    machine that installed gieok without the extras that bring them."""
    block = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_engine_imports_no_chat_server_or_model_library(tmp_path: Path) -> None:
    code = f"""
import sys, json, gieok, gieok.client
with gieok.Memory.open({str(tmp_path / "m.db")!r}) as memory:
    memory.add("민지: 고양이 이름은 보리야", scope={{"channel": "general"}})
    hits = memory.search("민지 고양이 이름", k=1, scope={{"channel": "general"}}).hits
loaded = sorted(name for name in sys.modules
                if name.split(".")[0] in {{"fastapi", "starlette", "uvicorn", "mcp", "jinja2", "discord"}}
                or (name + ".").startswith(("google.genai.", "gieok.chat.", "gieok.server.", "gieok.cli.")))
print(json.dumps({{"loaded": loaded, "hits": len(hits)}}))
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"loaded": [], "hits": 1}


def test_the_extra_only_libraries_are_known() -> None:
    assert {"fastapi", "starlette", "uvicorn", "mcp", "jinja2", "discord", "google.genai", "websockets", "psycopg",
            "redis"} <= set(extra_only_modules())
    assert not {"numpy", "httpx", "typer", "rich", "tenacity", "gieok", "google", "onnx", "onnxruntime"} & set(
        extra_only_modules())  # google: protobuf (onnx needs it) lives there too


@pytest.mark.slow
def test_the_command_line_works_without_the_extras_and_names_the_one_a_command_needs(tmp_path: Path) -> None:
    db = str(tmp_path / "plain.db")
    commands = [["--help"],
                ["add", "민지: 고양이 이름은 보리야", "--channel", "general", "--db", db],
                ["search", "민지 고양이 이름", "--channel", "general", "--db", db, "--json"],
                ["keys", "create", "--tenant", "default", "--role", "read", "--db", db, "--json"],
                ["serve", "--db", db], ["mcp", "--db", db], ["bot", "--db", db]]
    # One interpreter without the extras runs the commands one after another through the entry
    # point (a process each would only load the embedding model seven times), each with stdout
    # and stderr of its own and its exit code.
    code = f"""
import contextlib, io, json
from gieok.cli import main
ran = []
for argv in {commands!r}:
    sys.argv = ["gieok", *argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    ran.append({{"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}})
print(json.dumps(ran))
"""
    done = _python(code, blocked=extra_only_modules())
    assert done.returncode == 0, done.stderr
    shown, added, found, key, *refusals = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["returncode"] == 0 and "search" in shown["stdout"]
    assert added["returncode"] == 0, added["stderr"]
    assert found["returncode"] == 0 and "보리" in found["stdout"], found["stderr"]
    assert key["returncode"] == 0 and "gk_" in key["stdout"], key["stderr"]
    for refused, (command, extra) in zip(refusals, (("serve", "server"), ("mcp", "server"), ("bot", "discord"))):
        assert refused["returncode"] == 1, (command, refused)
        assert f"needs the {extra} extra" in refused["stderr"]
        assert f"pip install 'gieok[{extra}]'" in refused["stderr"]
        assert "Traceback" not in refused["stderr"]


def test_a_gemini_model_without_its_extra_is_one_clear_error() -> None:
    done = _python("""
from gieok.chat.llm import create_llm
from gieok.chat.settings import ChatSettings
from gieok.errors import MissingExtraError
try:
    create_llm(ChatSettings(gemini_api_key="k", llm_chain="gemini:gemini-2.5-flash"))
except MissingExtraError as exc:
    print(exc)
""", blocked=("google", "google.genai"))
    assert done.returncode == 0, done.stderr
    assert "needs the gemini extra" in done.stdout and "pip install 'gieok[gemini]'" in done.stdout


def test_gieok_bench_outside_a_source_checkout_says_how_to_get_it() -> None:
    done = _python("sys.argv = ['gieok', 'bench', 'locomo', '--help']\nfrom gieok.cli import main\nmain()",
                   blocked=("benchmarks",))
    assert done.returncode == 1
    assert "not part of the installed package" in done.stderr and "requirements-dev.lock" in done.stderr


@pytest.mark.slow
def test_the_wheel_holds_no_benchmark_code_and_no_evaluation_data(tmp_path: Path) -> None:
    # with the test environment's pinned setuptools (requirements-dev.lock), not a fresh isolated one
    # fetched from the registry at every run (5.6 s against 1.9 s here)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(tmp_path.glob("gieok-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name == "gieok/memory/facade.py" for name in names)
    assert any(name == "gieok/chat/data/guard_train.jsonl" for name in names)  # training data the chat needs
    assert any(name == "gieok/data/ranker.npz" for name in names)
    for served in ("templates/docs.html", "static/docs.js", "static/vendor/swagger-ui-dist-5.35.0/swagger-ui-bundle.js",
                   "static/vendor/swagger-ui-dist-5.35.0/swagger-ui.css",
                   "static/vendor/swagger-ui-dist-5.35.0/LICENSE"):  # /docs from the package, no CDN
        assert f"gieok/server/web/{served}" in names, served
    held_out = ("benchmarks/", "gieok/bench/", "locomo", "heldout", "fact_pairs", "fact_answers", "guard_corpus",
                "gatekeeper.jsonl")
    leaked = [name for name in names if any(part in name for part in held_out)]
    assert not leaked, f"the wheel carries benchmark code or evaluation data: {leaked}"
    metadata_file = next(name for name in names if name.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata_file).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    plain = [line for line in requires if "extra ==" not in line]
    for library in ("fastapi", "uvicorn", "mcp", "discord", "google-genai", "jinja2", "psycopg", "redis"):
        assert not any(library in line.lower() for line in plain), f"{library} is a dependency without an extra"
        assert any(library in line.lower() for line in requires), f"no extra installs {library}"
