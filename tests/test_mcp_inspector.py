"""The official MCP Inspector (its 2.x command line) against a real gieok, as docs/server.md tells a
person to run it: over HTTP against `gieok serve`'s /mcp with a bearer key, and over stdio against
`gieok mcp`. tools/list, tools/call add_messages and get_context (Korean and English), and a wrong
key, which must come back as an error the Inspector shows — not an OAuth flow it cannot finish.

The Inspector is found through npx from the npm cache only (`--offline`: nothing is downloaded),
once: npx's `-c` gives the Inspector's command and the PATH it runs it with (Node 22 first), and
each call runs that command on that PATH, which is what npx runs without its ~0.7 CPU-s of
resolving the packages again for each of the nine calls. The
stdio run is inside a network namespace of its own when the machine allows one (`unshare -n`), so
it is shown to work with no network at all. Without npx, or without the package in the cache, the
tests skip and say how to fetch it once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from live_server import LiveServer, clean_env, create_key

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"  # the Inspector's 2.x needs Node >= 22.19: npm's node@22 brings it
NPX = shutil.which("npx")
TOOLS = {"remember", "search_memory", "get_memory", "forget_memory", "list_facts", "conversation_summary",
         "add_messages", "get_context", "remember_fact", "correct_fact", "forget_fact"}
WRONG_KEY = "gk_00000000_" + "x" * 43
RUN_SECONDS = 60  # one Inspector call: ~1.5 s over HTTP, ~4 s over stdio (gieok mcp starts and warms)

Inspector = Callable[..., list[subprocess.CompletedProcess[str]]]


def _inspector_env(home: Path) -> dict[str, str]:
    """No GIEOK_* of the developer; the Inspector's own files (catalog, OAuth state) in the test's
    folder, its secrets in memory only."""
    state = home / "inspector"
    state.mkdir(exist_ok=True)
    return {**clean_env(), "MCP_INSPECTOR_SECRET_STORE": "memory", "MCP_STORAGE_DIR": str(state),
            "MCP_INSPECTOR_OAUTH_STATE_PATH": str(state / "oauth.json"),
            "MCP_CLIENT_CONFIG_PATH": str(state / "client.json"), "MCP_CATALOG_PATH": str(state / "mcp.json"),
            "npm_config_update_notifier": "false", "NO_UPDATE_NOTIFIER": "1"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inspector")


@pytest.fixture(scope="module")
def inspector(home: Path) -> Inspector:
    """Runs `mcp-inspector --cli ARGS` as `npx --offline … mcp-inspector` would (stdin closed, as in
    CI); skips the module when the Inspector cannot run here."""
    if NPX is None:
        pytest.skip("npx (Node.js) is not installed: the MCP Inspector runs through it")
    npx = [NPX, "--offline", "-y", "-p", "node@22", "-p", INSPECTOR]
    env = _inspector_env(home)
    try:
        where = 'command -v mcp-inspector && printf "%s\\n" "$PATH" && mcp-inspector --version'
        probe = subprocess.run([*npx, "-c", where], capture_output=True, text=True, env=env, timeout=RUN_SECONDS,
                               stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{INSPECTOR} did not start within {RUN_SECONDS} s")
    said = probe.stdout.splitlines()
    if probe.returncode != 0 or len(said) < 3 or INSPECTOR.rsplit("@", 1)[1] not in said[2]:
        pytest.skip(f"{INSPECTOR} is not in the npm cache (this test never downloads); fetch it once with "
                    f"`npx -y -p node@22 -p {INSPECTOR} mcp-inspector --version`: {probe.stderr.strip()[-300:]}")
    command, env["PATH"] = said[0], said[1]  # what npx runs, on the PATH npx gives it (its Node 22 first)

    def run(*calls: list[str], offline: bool = False) -> list[subprocess.CompletedProcess[str]]:
        """Each call's ARGS, all at once (independent calls: the test's wall time is the slowest)."""
        fence = ["unshare", "-n", "--"] if offline else []
        started = [subprocess.Popen([*fence, command, "--cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env, stdin=subprocess.DEVNULL, cwd=home) for args in calls]
        done = []
        for process, args in zip(started, calls, strict=True):
            try:
                out, err = process.communicate(timeout=RUN_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            done.append(subprocess.CompletedProcess(args, process.returncode, out, err))
        return done

    return run


@pytest.fixture(scope="module")
def served(home: Path, inspector: Inspector) -> Iterator[tuple[LiveServer, str]]:
    server = LiveServer(home / "chat.db")
    try:
        yield server, create_key(server.db, "default", "write")
    finally:
        server.stop()


def _result(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, f"the Inspector failed ({done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}"
    found = json.loads(done.stdout)["result"]  # --format json: {"result": <the MCP result>}
    assert isinstance(found, dict)
    return found


def _structured(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    result = _result(done)
    assert result.get("isError") is False, result
    content = result["structuredContent"]
    assert isinstance(content, dict)
    return content


MESSAGES = [{"id": "insp-1", "role": "user", "user": "u-minji", "name": "민지",
             "text": "고양이 입양했어! 이름은 보리야"},
            {"id": "insp-2", "role": "user", "user": "u-alex", "name": "Alex",
             "text": "I got the offer from Nuvola Labs"}]


def test_inspector_over_http(served: tuple[LiveServer, str], inspector: Inspector) -> None:
    server, key = served
    url = f"{server.url}/mcp"
    http = [url, "--transport", "http", "--header", f"Authorization: Bearer {key}", "--format", "json"]
    listed, added, refused = inspector(
        [*http, "--method", "tools/list"],
        [*http, "--method", "tools/call", "--tool-name", "add_messages", "--tool-args-json",
         json.dumps({"channel": "cafe", "guild": "g1", "messages": MESSAGES}, ensure_ascii=False)],
        [url, "--transport", "http", "--header", f"Authorization: Bearer {WRONG_KEY}", "--method", "tools/list"])

    assert {tool["name"] for tool in _result(listed)["tools"]} == TOOLS  # type: ignore[attr-defined]
    stored = _structured(added)
    assert stored["stored"] == 2 and stored["duplicates"] == []
    # a wrong key: the server's reason, shown as an error — no OAuth flow (which needs a browser and a TTY)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert "invalid or revoked API key" in said and '"status":403' in said, said
    assert "OAuth requires" not in said and "Authorization complete" not in said, said

    [context] = inspector([*http, "--method", "tools/call", "--tool-name", "get_context", "--tool-arg", "channel=cafe",
                           "--tool-arg", "guild=g1", "--tool-arg", "user=u-minji"])
    text = str(_structured(context)["text"])
    assert "보리야" in text and "Nuvola Labs" in text


def test_inspector_over_stdio_with_no_network(served: tuple[LiveServer, str], inspector: Inspector) -> None:
    """`gieok mcp` on the memory the server writes, started by the Inspector inside a network
    namespace: it reads what the HTTP test stored (one memory, two transports)."""
    server, key = served
    offline = shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    gieok_mcp = ["--", sys.executable, "-m", "gieok.cli", "mcp", "--db", str(server.db)]
    env_of = ["-e", "OMP_WAIT_POLICY=PASSIVE", "-e", f"PATH={os.environ.get('PATH', '')}"]
    context, refused = inspector(
        ["-e", f"GIEOK_API_KEY={key}", *env_of, "--format", "json", "--method", "tools/call", "--tool-name",
         "get_context", "--tool-arg", "channel=cafe", "--tool-arg", "guild=g1", "--tool-arg", "query=민지 고양이 이름",
         *gieok_mcp],
        ["-e", f"GIEOK_API_KEY={WRONG_KEY}", *env_of, "--method", "tools/list", *gieok_mcp], offline=offline)

    assert "보리야" in str(_structured(context)["text"])
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "error: invalid or revoked API key" in said, said


def test_inspector_through_the_relay(served: tuple[LiveServer, str], inspector: Inspector) -> None:
    """`gieok mcp --server URL` spawned by the Inspector (after `--`: the Inspector has a `--server`
    option of its own): the server's memory, what the HTTP test stored; a refused key is exit 1."""
    server, key = served
    relay = ["--", sys.executable, "-m", "gieok.cli", "mcp", "--server", server.url]
    env_of = ["-e", "OMP_WAIT_POLICY=PASSIVE", "-e", f"PATH={os.environ.get('PATH', '')}"]
    context, refused = inspector(
        ["-e", f"GIEOK_API_KEY={key}", *env_of, "--format", "json", "--method", "tools/call", "--tool-name",
         "get_context", "--tool-arg", "channel=cafe", "--tool-arg", "guild=g1", "--tool-arg", "user=u-alex",
         "--tool-arg", "query=Nuvola offer", *relay],
        ["-e", f"GIEOK_API_KEY={WRONG_KEY}", *env_of, "--method", "tools/list", *relay])

    assert "Nuvola Labs" in str(_structured(context)["text"])
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "refused the key" in said, said
