"""The TypeScript client (clients/typescript, the npm package `gieok`) and its Vercel AI SDK
middleware (`gieok/ai-sdk`), tested by Node's own test runner (`node --test`) against a real
`gieok serve` on loopback with keys of two tenants; then the examples of docs/typescript.md and
docs/integrations/vercel-ai-sdk.md, run as written against the same server and a loopback
OpenAI-compatible model.

Every node process here runs with test/loopback-only.mjs preloaded: a connection to anything but
this machine throws, so a pass proves nothing (the AI SDK, its provider, the client) went online.
`npm ci` runs only when node_modules is missing or package-lock.json changed since it last ran."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gieok.client import Client
from live_server import LiveServer, clean_env, create_key
from llm_servers import LLMServer, Received, Reply, openai_chunks, openai_completion, serve

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"
DOCS = ROOT / "docs"
NODE, NPM = shutil.which("node"), shutil.which("npm")
LOCK_STAMP = PACKAGE / "node_modules" / ".gieok-package-lock.sha256"  # the lock npm ci last installed
ANSWER = "보리는 츄르를 제일 좋아한다고 했지요. Bori loves churu treats."  # what the loopback model says
EXAMPLE = re.compile(r"^```js\n(.*?)^```", re.S | re.M)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (NODE and NPM), reason="node and npm are not installed: the TypeScript client's "
                                 "tests need them (.ci/run installs Debian's nodejs and npm)")]


def _run(*command: str, env: dict[str, str] | None = None, cwd: Path = PACKAGE, timeout: float = 120,
         ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        pytest.fail(f"{' '.join(command)} did not finish in {timeout:g} s:\n{output[-20000:]}")


def _npm_env() -> dict[str, str]:
    return {**clean_env(), "npm_config_update_notifier": "false", "npm_config_fund": "false",
            "npm_config_audit": "false"}


def _install_and_build() -> None:
    """`npm ci` when the lock changed (or nothing is installed), then `npm run build` (tsc → dist/)."""
    lock = hashlib.sha256((PACKAGE / "package-lock.json").read_bytes()).hexdigest()
    if not LOCK_STAMP.is_file() or LOCK_STAMP.read_text().strip() != lock:
        done = _run("npm", "ci", env=_npm_env(), timeout=600)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout[-5000:]}\n{done.stderr[-5000:]}"
        LOCK_STAMP.write_text(lock + "\n")
    done = _run("npm", "run", "build", env=_npm_env())
    assert done.returncode == 0, f"npm run build failed:\n{done.stdout[-10000:]}\n{done.stderr[-5000:]}"


@dataclass
class Served:
    server: LiveServer
    write: str  # tenant default
    read: str  # tenant default
    admin: str  # tenant default
    other: str  # tenant acme

    def env(self, **extra: str) -> dict[str, str]:
        """A node process's environment: the server, its keys, no proxy, and loopback only."""
        preload = (PACKAGE / "test" / "loopback-only.mjs").as_uri()
        return {**clean_env(), "GIEOK_URL": self.server.url, "GIEOK_API_KEY": self.write, "GIEOK_READ_KEY": self.read,
                "GIEOK_ADMIN_KEY": self.admin, "GIEOK_OTHER_TENANT_KEY": self.other,
                "NODE_OPTIONS": f"--import={preload}", "NO_PROXY": "127.0.0.1,localhost", **extra}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The package installed and built while the server warms (the two take seconds each), and the server."""
    db = tmp_path_factory.mktemp("typescript-client") / "chat.db"
    keys = [create_key(db, "default", role) for role in ("write", "read", "admin")] + [create_key(db, "acme", "write")]
    failures: list[BaseException] = []

    def build() -> None:
        try:
            _install_and_build()
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    builder = threading.Thread(target=build)
    builder.start()
    server = LiveServer(db)
    try:
        builder.join()
        if failures:
            raise failures[0]
        yield Served(server, *keys)
    finally:
        builder.join()
        server.stop()


def test_node_tests_pass_against_a_real_server(served: Served) -> None:
    files = sorted(str(path.relative_to(PACKAGE)) for path in (PACKAGE / "test").glob("*.test.mjs"))
    assert {f"test/{name}.test.mjs" for name in ("client", "retries", "events", "ai-sdk")} <= set(files), files
    done = _run("node", "--test", "--test-reporter=tap", *files, env=served.env(), timeout=180)
    output = done.stdout + done.stderr
    failed = "\n".join(line for line in output.splitlines() if line.startswith("not ok"))
    assert done.returncode == 0, f"node --test failed:\n{failed}\n\n{output[-30000:]}"
    counts = {name: int(n) for name, n in re.findall(r"^# (tests|pass|fail) (\d+)$", output, re.M)}
    assert counts.get("fail") == 0 and counts.get("pass") == counts.get("tests") >= 25, counts


# -- the docs' examples, as written ------------------------------------------------------------

@pytest.fixture
def model() -> Iterator[LLMServer]:
    """A loopback OpenAI-compatible model: a plain answer, or a stream when asked for one."""

    def answer(received: Received) -> Reply:
        if received.body.get("stream"):
            return Reply(events=openai_chunks([ANSWER[:10], ANSWER[10:]]))
        return Reply(body=openai_completion(ANSWER))

    with serve() as server:
        server.respond = answer
        yield server


def _examples(page: Path) -> list[str]:
    blocks = EXAMPLE.findall(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.relative_to(ROOT)} has no ```js example"
    return blocks


def _run_example(code: str, tmp_path: Path, env: dict[str, str], name: str) -> str:
    """`code` as an .mjs file in a folder where `gieok` is the built package and the package's
    installed dependencies (`ai`, `@ai-sdk/openai-compatible`) resolve, as in an app that installed them."""
    app = tmp_path / "app"
    modules = app / "node_modules"
    if not modules.exists():
        modules.mkdir(parents=True)
        (modules / "gieok").symlink_to(PACKAGE, target_is_directory=True)
        for entry in (PACKAGE / "node_modules").iterdir():
            if not entry.name.startswith("."):
                (modules / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    script = app / f"{name}.mjs"
    script.write_text(code, encoding="utf-8")
    done = _run("node", script.name, env=env, cwd=app, timeout=60)
    assert done.returncode == 0, f"{name} failed:\n{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout


def _system_prompts(model: LLMServer) -> list[str]:
    return [" ".join(str(m["content"]) for m in r.body["messages"] if m["role"] == "system") for r in model.requests]


def test_typescript_docs_examples_run_as_written(served: Served, model: LLMServer, tmp_path: Path) -> None:
    env = served.env(OPENAI_BASE_URL=f"{model.url}/v1", OPENAI_API_KEY="not-needed")
    loop, errors, events = _examples(DOCS / "typescript.md")
    printed = _run_example(loop, tmp_path, env, "agent-loop")
    assert printed.count(f"bot> {ANSWER}") == 2, printed
    prompts = _system_prompts(model)
    assert len(prompts) == 2 and all(p.startswith("You are a friendly assistant.") for p in prompts), prompts
    assert "츄르를 제일 좋아해" in prompts[1]  # the second turn's prompt holds what the first turn said

    with Client(served.server.url, served.write) as memory:
        recent = memory.context("cafe", include=["recent"]).parts.recent
    assert [(m.role, m.text) for m in recent] == [
        ("user", "우리 고양이 보리는 츄르를 제일 좋아해"), ("assistant", ANSWER),
        ("user", "What does my cat like to eat?"), ("assistant", ANSWER)]

    printed = _run_example(errors, tmp_path, env, "errors")
    assert printed.splitlines() == [
        "InvalidInputError 422 body.budget_tokens: Input should be greater than or equal to 100",
        "AuthenticationError 401 unauthenticated"], printed

    printed = _run_example(events, tmp_path, env, "events")
    assert re.search(r"^\d+ memory\.added turn 우리 고양이 보리는 츄르를 제일 좋아해$", printed, re.M), printed


def test_vercel_ai_sdk_docs_example_runs_as_written(served: Served, model: LLMServer, tmp_path: Path) -> None:
    env = served.env(OPENAI_BASE_URL=f"{model.url}/v1", OPENAI_API_KEY="not-needed")
    [example] = _examples(DOCS / "integrations" / "vercel-ai-sdk.md")
    printed = _run_example(example, tmp_path, env, "vercel-ai-sdk")
    assert printed.count(ANSWER) == 2, printed
    first, second = model.requests
    assert first.body.get("stream") is not True and second.body["stream"] is True
    assert "부산으로 이사" in _system_prompts(model)[1]  # the first exchange, recorded, came back as context

    with Client(served.server.url, served.write) as memory:
        recent = memory.context("dm-minji", include=["recent"]).parts.recent
    assert [m.role for m in recent] == ["user", "assistant", "user", "assistant"]
    assert recent[0].text == "나 다음 달에 부산으로 이사 가" and recent[0].user == "u-minji"


def test_the_package_is_ready_to_publish(served: Served) -> None:
    """What `npm publish` would ship: the built ESM and its type declarations, no sources or tests,
    no runtime dependencies; `ai` an optional peer."""
    manifest = json.loads((PACKAGE / "package.json").read_text(encoding="utf-8"))
    assert manifest["name"] == "gieok" and manifest["version"] == "0.1.0" and manifest["type"] == "module"
    assert "dependencies" not in manifest
    assert manifest["peerDependenciesMeta"]["ai"]["optional"] is True
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in manifest["devDependencies"].values()), "pin exact versions"
    done = _run("npm", "pack", "--dry-run", "--json", "--ignore-scripts", env=_npm_env())
    assert done.returncode == 0, done.stderr
    shipped = {entry["path"] for entry in json.loads(done.stdout)[0]["files"]}
    built = {"dist/index.js", "dist/index.d.ts", "dist/ai-sdk.js", "dist/ai-sdk.d.ts"}
    assert {"package.json", "README.md", *built} <= shipped
    assert not [path for path in shipped if path.startswith(("src/", "test/", "node_modules/"))], sorted(shipped)
    compiled = (PACKAGE / "dist" / "ai-sdk.js").read_text(encoding="utf-8")
    assert not re.search(r'^import .* from "ai";', compiled, re.M)  # `ai` is a type there, not an import
