"""Signed webhooks (server/webhooks.py): a real `gieok serve` subprocess posting to real HTTP
receivers on loopback (threads of this process) that answer 500, hang past the time limit, say 410
Gone, go away and come back; every signature checked with the Standard Webhooks library
(`standardwebhooks.Webhook.verify`); two tenants that never see each other's endpoints or events;
the queue surviving a restart of the server; the address rules at registration and before every
attempt (a name that resolves elsewhere later); the tables on SQLite and PostgreSQL; the docs'
receiver run as written. Retries are fast here (gieok.toml beside the server's database)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from gieok.coordination.events import USER_ERASED
from gieok.errors import InvalidInputError
from gieok.server.events import EventBus
from gieok.server.settings import ServerSettings
from gieok.server.webhook_addresses import AddressRefusedError, check_address
from gieok.server.webhook_delivery import WebhookDeliverer, _Clients, retry_delay
from gieok.server.webhooks import Webhooks
from gieok.store.factory import open_store
from live_server import LiveServer, create_key, free_port
from store_backends import Backend
from test_store_contract import new_block, unit_vectors

ROOT = Path(__file__).resolve().parent.parent
FAST = {"webhook_retry_seconds": 0.2, "webhook_retry_max_seconds": 0.4, "webhook_timeout_seconds": 0.5,
        "webhook_poll_seconds": 0.1}  # seconds, not the production minutes


# -- a receiver: a real HTTP server on loopback ---------------------------------------------------

@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """Answers 204 unless told otherwise: `plan` holds the next answers (a status, or "hang" to
    answer only after the sender's time limit). `down()` closes the port (refused connections);
    `up()` opens it again."""

    port: int = field(default_factory=free_port)
    plan: list[int | str] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.got.append(Received({k.lower(): v for k, v in self.headers.items()}, body, time.time()))
                answer = receiver.plan.pop(0) if receiver.plan else 204
                if answer == "hang":
                    time.sleep(1.0)  # past the sender's 0.5 s limit
                    answer = 204
                self.send_response(int(answer))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def texts(self) -> list[str]:
        return [json.dumps(r.event(), ensure_ascii=False) for r in self.got]


def until(check: Callable[[], Any], seconds: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what or check}")
        time.sleep(0.05)


def verified(secret: str, received: Received) -> dict[str, Any]:
    """The event, checked the way a receiver checks it: the spec's library, the raw body and headers."""
    return dict(Webhook(secret).verify(received.body, received.headers))


# -- one real server for the module ---------------------------------------------------------------

@dataclass
class Deployment:
    db: Path
    server: LiveServer
    keys: dict[str, str]

    def as_(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[name]}"}

    def call(self, method: str, path: str, name: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.server.url + path, headers=self.as_(name), timeout=30, **kwargs)

    def register(self, name: str, url: str, events: list[str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"url": url} if events is None else {"url": url, "events": events}
        answer = self.call("POST", "/v1/webhooks", name, json=body)
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    def deliveries(self, name: str, endpoint: int) -> list[dict[str, Any]]:
        answer = self.call("GET", f"/v1/webhooks/{endpoint}/deliveries", name)
        assert answer.status_code == 200, answer.text
        return list(answer.json()["deliveries"])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    home = tmp_path_factory.mktemp("webhooks")
    (home / "gieok.toml").write_text("[server]\n" + "".join(f"{k} = {v}\n" for k, v in FAST.items()),
                                     encoding="utf-8")  # read by the server: its working directory is here
    db = home / "home.db"
    keys = {name: create_key(db, tenant, role) for name, tenant, role in (
        ("alpha", "alpha", "admin"), ("alpha_write", "alpha", "write"), ("beta", "beta", "admin"))}
    deployment = Deployment(db, LiveServer(db), keys)
    try:
        yield deployment
    finally:
        deployment.server.stop()  # the one running now: a test restarts it
        assert "Traceback" not in deployment.server.log, deployment.server.log[-3000:]


# -- registering -----------------------------------------------------------------------------------

def test_an_admin_registers_lists_and_deletes_endpoints_and_sees_secrets_once(deployment: Deployment) -> None:
    d = deployment
    made = d.register("alpha", "http://127.0.0.1:9/알림?token=x", ["memory.added", "fact.*"])
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", made["secret"]), made  # base64 of 32 random bytes
    assert made["events"] == ["memory.added", "fact.*"] and made["disabled_at"] is None
    listed = d.call("GET", "/v1/webhooks", "alpha").json()["webhooks"]
    assert [w["id"] for w in listed] == [made["id"]] and "secret" not in json.dumps(listed)
    assert d.call("POST", "/v1/webhooks", "alpha_write", json={"url": "http://127.0.0.1:9/"}).status_code == 403
    assert d.call("GET", "/v1/webhooks", "alpha_write").status_code == 403  # a read of an admin's thing
    assert d.call("DELETE", f"/v1/webhooks/{made['id']}", "alpha").json() == {"deleted": made["id"]}
    assert d.call("GET", "/v1/webhooks", "alpha").json()["webhooks"] == []
    assert d.call("DELETE", f"/v1/webhooks/{made['id']}", "alpha").status_code == 404


@pytest.mark.parametrize("body, status, words", [
    ({"url": "http://169.254.169.254/latest/meta-data/"}, 400, "metadata"),
    ({"url": "http://metadata.google.internal/computeMetadata/v1/"}, 400, "metadata"),
    ({"url": "http://[fd00:ec2::254]/"}, 400, "metadata"),
    ({"url": "http://169.254.10.20:8080/"}, 400, "link-local"),
    ({"url": "http://[fe80::1]/"}, 400, "link-local"),
    ({"url": "http://[::ffff:169.254.169.254]/"}, 400, "metadata"),
    ({"url": "http://0.0.0.0:8420/"}, 400, "not a host"),
    ({"url": "ftp://127.0.0.1/"}, 400, "http"),
    ({"url": "http://user:pw@127.0.0.1/"}, 400, "credentials"),
    ({"url": "http://no-such-host.invalid/"}, 400, "does not resolve"),
    ({"url": "http://127.0.0.1/", "events": ["memory added!"]}, 400, "event type"),
    ({"url": "http://127.0.0.1/", "events": ["nonsense.event"]}, 400, "fact.*"),  # no such family: never matches
    ({"url": "http://127.0.0.1/", "events": ["memory"]}, 400, "event type"),
    ({"url": "http://127.0.0.1/", "tenant": "beta"}, 422, "tenant"),  # the tenant is the key's, never the body's
    ({"url": 5}, 422, "url"),
])
def test_bad_endpoints_are_refused_with_a_json_error(deployment: Deployment, body: dict[str, Any], status: int,
                                                     words: str) -> None:
    answer = deployment.call("POST", "/v1/webhooks", "alpha", json=body)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"], answer.text
    assert deployment.call("GET", "/v1/webhooks", "alpha").json()["webhooks"] == []


# -- delivering ------------------------------------------------------------------------------------

def test_events_arrive_signed_and_only_at_their_own_tenants_endpoints(deployment: Deployment) -> None:
    d = deployment
    alpha_hook, beta_hook = Receiver(), Receiver()
    alpha = d.register("alpha", alpha_hook.url)  # every event
    beta = d.register("beta", beta_hook.url, ["memory.*"])
    d.call("POST", "/v1/memories", "alpha", json={"text": "민지: 고양이 이름은 보리야"})
    d.call("POST", "/v1/memories", "beta", json={"text": "Alex: I got the offer from Nuvola Labs"})
    until(lambda: alpha_hook.got and beta_hook.got, what="both receivers got their event")
    arrived = next(r for r in alpha_hook.got if r.event()["type"] == "memory.added")
    first = verified(alpha["secret"], arrived)
    assert first["data"]["blocks"][0]["text"] == "민지: 고양이 이름은 보리야"
    assert str(first["seq"]) == arrived.id and re.fullmatch(r"\d+", arrived.headers["webhook-timestamp"])
    assert arrived.headers["content-type"] == "application/json"
    assert verified(beta["secret"], beta_hook.got[0])["data"]["blocks"][0]["text"].startswith("Alex")
    with pytest.raises(WebhookVerificationError):  # another endpoint's secret does not verify it
        verified(beta["secret"], arrived)
    time.sleep(0.3)
    assert "Nuvola" not in "".join(alpha_hook.texts()) and "보리야" not in "".join(beta_hook.texts())
    # beta reaches nothing of alpha's: not its endpoint, its deliveries, its secret
    assert [w["id"] for w in d.call("GET", "/v1/webhooks", "beta").json()["webhooks"]] == [beta["id"]]
    for method, path in (("GET", f"/v1/webhooks/{alpha['id']}/deliveries"), ("DELETE", f"/v1/webhooks/{alpha['id']}"),
                         ("POST", f"/v1/webhooks/{alpha['id']}/rotate")):
        refused = d.call(method, path, "beta")
        assert refused.status_code == 404 and refused.json()["error"]["type"] == "not_found", (method, path)
    assert d.deliveries("alpha", alpha["id"])[0]["status"] == "delivered"
    # a rotated secret: the next delivery is signed with the new one and, for a day, the old one too
    rotated = d.call("POST", f"/v1/webhooks/{alpha['id']}/rotate", "alpha").json()
    assert rotated["secret"] != alpha["secret"] and rotated["previous_secret_valid_until"] > time.time()
    seen = len(alpha_hook.got)
    d.call("POST", "/v1/memories", "alpha", json={"text": "지우: 다음 주에 부산 가"})
    until(lambda: len(alpha_hook.got) > seen, what="the delivery after the rotation")
    latest = alpha_hook.got[-1]
    assert verified(rotated["secret"], latest) == verified(alpha["secret"], latest)
    assert len(latest.headers["webhook-signature"].split(" ")) == 2
    for name, endpoint in (("alpha", alpha), ("beta", beta)):
        d.call("DELETE", f"/v1/webhooks/{endpoint['id']}", name)
    alpha_hook.down()
    beta_hook.down()


def test_a_receiver_that_fails_and_hangs_is_retried_until_it_answers(deployment: Deployment) -> None:
    d = deployment
    hook = Receiver(plan=[500, "hang", 503])
    made = d.register("alpha", hook.url, ["memory.added"])
    d.call("POST", "/v1/memories", "alpha", json={"text": "서연은 다음 달에 부산으로 이사 가"})
    done = until(lambda: [x for x in d.deliveries("alpha", made["id"]) if x["status"] == "delivered"], 15,
                 "delivered after 500, a timeout and 503")
    assert done[0]["attempts"] == 4 and done[0]["last_status"] == 204 and done[0]["last_error"] is None
    assert len({r.id for r in hook.got}) == 1 and len(hook.got) == 4  # the same event each time
    stamps = [int(r.headers["webhook-timestamp"]) for r in hook.got]
    assert stamps == sorted(stamps)  # signed anew for each attempt
    assert all(verified(made["secret"], r)["data"]["blocks"][0]["text"].startswith("서연") for r in hook.got)
    d.call("DELETE", f"/v1/webhooks/{made['id']}", "alpha")
    hook.down()


def test_410_gone_disables_the_endpoint(deployment: Deployment) -> None:
    d = deployment
    hook = Receiver(plan=[410])
    made = d.register("alpha", hook.url, ["memory.added"])
    d.call("POST", "/v1/memories", "alpha", json={"text": "준호는 주말마다 북한산에 가"})
    failed = until(lambda: [x for x in d.deliveries("alpha", made["id"]) if x["status"] == "failed"],
                   what="the delivery failed by a 410")
    assert "410" in failed[0]["last_error"]
    assert failed[0]["attempts"] == 1 and failed[0]["last_status"] == 410 and failed[0]["last_try_at"], failed[0]
    listed = next(w for w in d.call("GET", "/v1/webhooks", "alpha").json()["webhooks"] if w["id"] == made["id"])
    assert listed["disabled_at"] is not None and "410" in listed["disabled_reason"]
    d.call("POST", "/v1/memories", "alpha", json={"text": "after the 410"})
    time.sleep(0.3)
    assert len(hook.got) == 1 and len(d.deliveries("alpha", made["id"])) == 1  # nothing more is queued or sent
    d.call("DELETE", f"/v1/webhooks/{made['id']}", "alpha")
    hook.down()


def test_the_docs_receiver_runs_as_written(deployment: Deployment, tmp_path: Path) -> None:
    """docs/server.md's Python receiver, verbatim, in its own process, with its secret and port
    from the environment: it verifies what the server sends and prints each event once."""
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    section = text[text.index("## Webhooks"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "docs/server.md's Webhooks section has a Python receiver"
    script = tmp_path / "receiver.py"
    script.write_text(code.group(1), encoding="utf-8")
    port = free_port()
    made = deployment.register("alpha", f"http://127.0.0.1:{port}/hooks", ["memory.added"])
    env = {**os.environ, "WEBHOOK_SECRET": made["secret"], "PORT": str(port)}
    process = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        until(lambda: _listening(port), what="the docs receiver listens")
        deployment.call("POST", "/v1/memories", "alpha", json={"text": "민지: 보리는 츄르를 좋아해"})
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline() if process.stdout else ""),
                                  daemon=True)
        reader.start()
        reader.join(15)
        line = lines[0] if lines else ""
    finally:
        process.terminate()
        process.wait(timeout=10)
        deployment.call("DELETE", f"/v1/webhooks/{made['id']}", "alpha")
    assert line.startswith("memory.added ") and "보리는 츄르를 좋아해" in line, line


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_queue_survives_a_restart_of_the_server(deployment: Deployment) -> None:
    """Last in the module: it restarts the module's server."""
    d = deployment
    hook = Receiver()
    made = d.register("alpha", hook.url, ["memory.added"])
    hook.down()  # the receiver is away: the event waits in the queue
    d.call("POST", "/v1/memories", "alpha", json={"text": "재시작 뒤에도 보내줘 — deliver me after a restart"})
    waiting = until(lambda: [x for x in d.deliveries("alpha", made["id"]) if x["attempts"] >= 1],
                    what="a failed attempt")
    assert waiting[0]["status"] == "pending" and waiting[0]["next_try_at"] and waiting[0]["last_error"]
    assert d.server.stop() in (0, -15) and "Traceback" not in d.server.log
    hook.up()
    d.server = LiveServer(d.db)  # the same database: the queue is in it
    until(lambda: hook.got, 15, "delivered by the restarted server")
    event = verified(made["secret"], hook.got[0])
    assert event["data"]["blocks"][0]["text"].startswith("재시작") and hook.got[0].id == str(event["seq"])
    assert d.deliveries("alpha", made["id"])[0]["status"] == "delivered"
    hook.down()


# -- in process: the address rules before each attempt, the outbox, erasure -----------------------

@pytest.mark.parametrize("address, public_only, allowed", [
    ("127.0.0.1", False, True), ("::1", False, True), ("10.1.2.3", False, True), ("192.168.0.7", False, True),
    ("127.0.0.1", True, False), ("10.1.2.3", True, False), ("172.16.5.4", True, False), ("fd12::1", True, False),
    ("100.64.0.1", True, False), ("93.184.216.34", True, True), ("2606:2800:220:1::1", True, True),
    ("169.254.169.254", False, False), ("169.254.1.1", False, False), ("fe80::1", False, False),
    ("fd00:ec2::254", False, False), ("100.100.100.200", False, False), ("::ffff:169.254.169.254", False, False),
    ("64:ff9b::a9fe:a9fe", False, False), ("2002:a9fe:a9fe::1", False, False), ("0.0.0.0", False, False),
    ("224.0.0.1", False, False), ("255.255.255.255", False, False),
])
def test_the_address_rules(address: str, public_only: bool, allowed: bool) -> None:
    if allowed:
        assert str(check_address(address, public_only=public_only)) == address
    else:
        with pytest.raises(AddressRefusedError):
            check_address(address, public_only=public_only)


def test_public_only_refuses_loopback_and_private_endpoints(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "home.db"))
    webhooks = Webhooks(store.webhooks, ServerSettings.load(db=str(tmp_path / "home.db"), webhook_public_only=True))
    try:
        for url in ("http://127.0.0.1:8000/", "http://localhost/", "http://10.0.0.5/", "http://[::1]/"):
            with pytest.raises(InvalidInputError, match="not a public address"):
                asyncio.run(webhooks.register("acme", url, None))
        row, secret = asyncio.run(webhooks.register("acme", "https://93.184.216.34/hooks", None))
        assert row.tenant == "acme" and secret.startswith("whsec_")
    finally:
        store.close()


class Names:
    """A resolver whose answers the test changes: what a DNS name served by an attacker does."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def __call__(self, host: str, port: int) -> list[str]:
        assert host == "hooks.example"
        return [self.address]


def test_a_name_that_later_resolves_to_a_forbidden_address_is_not_called(tmp_path: Path) -> None:
    """Checked at registration, checked again before each attempt, and the attempt connects to the
    address checked (Host and the URL keep the name): rebinding the name cannot reach metadata."""
    hook = Receiver()
    names = Names("127.0.0.1")
    store = open_store(str(tmp_path / "home.db"))
    settings = ServerSettings.load(db=str(tmp_path / "home.db"), **FAST)
    webhooks = Webhooks(store.webhooks, settings, resolver=names)
    bus = EventBus()
    publish = webhooks.listener(bus)("acme")
    try:
        row, secret = asyncio.run(webhooks.register("acme", f"http://hooks.example:{hook.port}/in", None))
        names.address = "169.254.169.254"  # rebound after the check
        publish("memory.added", {"blocks": [{"text": "첫 번째"}]})
        asyncio.run(_deliver_for(webhooks, 0.4))
        assert hook.got == []
        refused = store.webhooks.deliveries(row.endpoint_id)[0]
        assert refused.status == "pending" and "169.254.169.254" in (refused.last_error or "")
        names.address = "127.0.0.1"
        asyncio.run(_deliver_for(webhooks, 1.0, until_got=hook))
        assert hook.got[0].headers["host"] == f"hooks.example:{hook.port}"
        assert verified(secret, hook.got[0])["data"] == {"blocks": [{"text": "첫 번째"}]}
    finally:
        store.close()
        hook.down()


async def _deliver_for(webhooks: Webhooks, seconds: float, until_got: Receiver | None = None) -> None:
    task = webhooks.start()
    assert task is not None
    deadline = time.monotonic() + seconds + (5 if until_got else 0)
    while time.monotonic() < deadline and not (until_got and until_got.got):
        await asyncio.sleep(0.05)
    await webhooks.stop()


def test_a_server_without_deliveries_makes_no_http_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An httpx client loads the system's certificates when it is made (~0.2 s here): the delivery
    loop makes one when a delivery needs it, not when every server starts."""
    made: list[httpx.AsyncClient] = []
    real = httpx.AsyncClient

    def counted(*args: Any, **kwargs: Any) -> httpx.AsyncClient:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(httpx, "AsyncClient", counted)
    hook = Receiver()
    store = open_store(str(tmp_path / "home.db"))
    webhooks = Webhooks(store.webhooks, ServerSettings.load(db=str(tmp_path / "home.db"), **FAST))
    try:
        asyncio.run(_deliver_for(webhooks, 0.3))
        assert made == []
        asyncio.run(webhooks.register("acme", f"http://127.0.0.1:{hook.port}/in", None))
        webhooks.listener(EventBus())("acme")("memory.added", {"blocks": [{"text": "첫 번째"}]})
        asyncio.run(_deliver_for(webhooks, 1.0, until_got=hook))
        assert len(hook.got) == 1 and len(made) == 1 and made[0].is_closed
    finally:
        store.close()
        hook.down()


def test_an_erased_users_queued_events_go_out_redacted(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "home.db"))
    webhooks = Webhooks(store.webhooks, ServerSettings.load(db=str(tmp_path / "home.db")))
    publish = webhooks.listener(EventBus())("acme")
    try:
        row, _ = asyncio.run(webhooks.register("acme", "http://127.0.0.1:9/", None))
        publish("memory.added", {"blocks": [{"block_index": 7, "text": "<user:42> 민지는 고양이를 키워"}]})
        publish("memory.added", {"blocks": [{"block_index": 8, "text": "someone else's"}]})
        publish(USER_ERASED, {"user": "42", "blocks": [7]})
        bodies = dict(store.webhooks.pending_bodies("acme"))
        texts = [json.loads(body) for _, body in sorted(bodies.items())]
        assert texts[0]["data"] == {"redacted": "this event held data that was erased"}
        assert texts[1]["data"]["blocks"][0]["text"] == "someone else's"
        assert texts[2]["type"] == USER_ERASED and texts[2]["data"] == {"blocks": 1}  # counts only
        assert "민지" not in json.dumps(texts, ensure_ascii=False) and len(texts) == 3
        assert [d.event_id for d in store.webhooks.deliveries(row.endpoint_id)] == [3, 2, 1]
    finally:
        store.close()


def test_a_forgotten_blocks_queued_events_go_out_redacted(tmp_path: Path) -> None:
    """A deleted message's turn (`memory.forgotten`): the queued events that carried it are sent
    redacted; the others as they were."""
    store = open_store(str(tmp_path / "home.db"))
    webhooks = Webhooks(store.webhooks, ServerSettings.load(db=str(tmp_path / "home.db")))
    publish = webhooks.listener(EventBus())("acme")
    try:
        asyncio.run(webhooks.register("acme", "http://127.0.0.1:9/", None))
        publish("search.answered", {"hits": [{"block_index": 7, "text": "7788"}]})
        with store.transaction() as tx:  # type: ignore[attr-defined]  # as queued before deliveries named blocks
            tx.execute("UPDATE webhook_deliveries SET marks = NULL")
        publish("memory.added", {"blocks": [{"block_index": 7, "text": "민지: 사물함 비밀번호는 7788"}]})
        publish("memory.added", {"blocks": [{"block_index": 8, "text": "준호: 점심 뭐 먹지"}]})
        publish("memory.added", {"blocks": [{"block_index": 17, "text": "지수: 17번 버스 타"}]})
        assert [d for d, _ in store.webhooks.pending_bodies("acme", naming=["b7"])] == [1, 2], "found by the block"
        publish("memory.forgotten", {"block_indices": [7]})
        bodies = [json.loads(body) for _, body in sorted(dict(store.webhooks.pending_bodies("acme")).items())]
        assert [body["data"] for body in bodies] == [
            {"redacted": "this event held data that was erased"},
            {"redacted": "this event held data that was erased"},
            {"blocks": [{"block_index": 8, "text": "준호: 점심 뭐 먹지"}]},
            {"blocks": [{"block_index": 17, "text": "지수: 17번 버스 타"}]},
            {"block_indices": [7]}]
        with pytest.raises(InvalidInputError):
            store.webhooks.pending_bodies("acme", naming=[f"b{n}" for n in range(51)])
    finally:
        store.close()


def test_retries_double_with_jitter_up_to_the_most() -> None:
    delays = [retry_delay(n, 5.0, 3600.0) for n in range(1, 14)]
    for n, delay in enumerate(delays, start=1):
        full = min(5.0 * 2 ** (n - 1), 3600.0)
        assert full / 2 <= delay <= full
    assert WebhookDeliverer.__doc__


# -- the tables, on every backend ------------------------------------------------------------------

def test_claims_are_exclusive_across_processes_and_lapse_when_a_process_dies(backend: Backend) -> None:
    a, b = backend.open(), backend.open()  # two processes of one deployment
    endpoint = a.webhooks.add_endpoint("acme", "http://127.0.0.1:9/", [], "whsec_AAAA", 100.0)
    for seq in range(1, 41):
        a.webhooks.enqueue([endpoint], seq, "memory.added", f'{{"seq":{seq}}}', 100.0)
    assert a.webhooks.enqueue([endpoint], 1, "memory.added", "again", 100.0) == 0  # once per event
    claims: dict[str, list[int]] = {}

    def take(name: str, store: Any) -> None:
        claims[name] = [c.event_id for c in store.webhooks.claim(name, 101.0, 30.0, 25)]

    threads = [threading.Thread(target=take, args=(name, store)) for name, store in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not set(claims["a"]) & set(claims["b"]) and len(claims["a"]) + len(claims["b"]) == 40
    assert not b.webhooks.has_due(102.0)  # all claimed
    assert b.webhooks.has_due(140.0)  # a's and b's claims lapse (dead processes): claimable again
    taken = b.webhooks.claim("c", 140.0, 30.0, 100)
    assert len(taken) == 40 and not a.webhooks.delivered(taken[0].delivery_id, "a", 141.0, 204)  # a's lapsed
    assert b.webhooks.delivered(taken[0].delivery_id, "c", 141.0, 204)
    for claimed in taken[1:]:  # the receiver is down: each tried once, due again at 145
        assert b.webhooks.retry(claimed.delivery_id, "c", 141.0, 145.0, None, "ConnectError")
    assert b.webhooks.rest_endpoint(endpoint.endpoint_id, 142.0, 200.0) == 1
    assert b.webhooks.rest_endpoint(endpoint.endpoint_id, 143.0, 900.0) == 0  # resting already: not longer
    a.webhooks.enqueue([endpoint], 41, "memory.added", "{}", 150.0)
    fresh = a.webhooks.claim("a", 150.0, 30.0, 100)  # resting: only the event never tried
    assert [c.event_id for c in fresh] == [41]
    a.webhooks.release([fresh[0].delivery_id], "a")
    after = a.webhooks.claim("a", 201.0, 30.0, 100)  # the rest is over: everything due, oldest first
    assert [c.event_id for c in after] == list(range(2, 42)) and after[0].attempts == 1
    assert a.webhooks.deliveries(endpoint.endpoint_id, limit=1)[0].event_id == 41
    a.webhooks.wake_endpoint(endpoint.endpoint_id)
    assert a.webhooks.endpoint(endpoint.endpoint_id, "acme").failures == 0  # type: ignore[union-attr]
    assert a.webhooks.endpoint(endpoint.endpoint_id, "other") is None  # another tenant's: not found


def test_no_event_is_kept_for_an_endpoint_another_process_deleted(backend: Backend) -> None:
    """A worker lists a tenant's endpoints at most every couple of seconds: one that another worker
    deleted meanwhile got the events queued after it — bodies (what was said) that no endpoint would
    send and no erasure looked at (it reads the queue by the tenant's endpoints), claimed again
    every lease forever; and on SQLite, which gives a deleted row's id to the next endpoint, sent
    to that one, maybe another tenant's. Such an event is not queued; one queued before this was
    is dropped, and a new endpoint starts with an empty queue."""
    a, b = backend.open(), backend.open()
    endpoint = a.webhooks.add_endpoint("acme", "http://127.0.0.1:9/", [], "whsec_AAAA", 100.0)
    assert b.webhooks.delete_endpoint(endpoint.endpoint_id, "acme")
    assert a.webhooks.enqueue([endpoint], 1, "message.stored", '{"text": "비밀번호 4821"}', 101.0) == 0
    assert not a.webhooks.has_due(102.0) and a.webhooks.deliveries(endpoint.endpoint_id) == []

    def queued_by_an_older_process(event_id: int) -> None:  # without the check
        with a.transaction() as tx:  # type: ignore[attr-defined]
            tx.execute("INSERT INTO webhook_deliveries(endpoint_id, event_id, event_type, body, status, attempts, "
                       "created_at, next_try_at) VALUES (?, ?, 'message.stored', '비밀번호 4821', 'pending', 0, "
                       "101, 101)", (endpoint.endpoint_id, event_id))

    queued_by_an_older_process(2)
    assert b.webhooks.drop_orphans(endpoint.endpoint_id) == 1 and not a.webhooks.has_due(102.0)
    queued_by_an_older_process(3)
    other = a.webhooks.add_endpoint("globex", "http://127.0.0.1:9/g", [], "whsec_BBBB", 103.0)
    assert a.webhooks.deliveries(other.endpoint_id) == []  # SQLite: its id is the deleted one's
    b.webhooks.drop_orphans(endpoint.endpoint_id)  # PostgreSQL: another id; the delivery loop drops them
    assert not a.webhooks.has_due(104.0)
    assert a.webhooks.enqueue([endpoint], 4, "message.stored", "{}", 104.0) == 0, "its id may be another's now"
    assert a.webhooks.enqueue([other], 5, "message.stored", "{}", 104.0) == 1
    assert [(c.endpoint_id, c.event_id) for c in a.webhooks.claim("a", 105.0, 30.0, 10)] == [(other.endpoint_id, 5)]


def test_the_delivery_loop_drops_what_was_queued_for_an_endpoint_that_is_gone(tmp_path: Path) -> None:
    """A delivery whose endpoint no longer exists (queued beside its delete by a process without
    the check above) is removed with its body when the loop claims it — not claimed every lease."""
    store = open_store(str(tmp_path / "hooks.db"))
    with store.transaction() as tx:  # type: ignore[attr-defined]
        tx.execute("INSERT INTO webhook_deliveries(endpoint_id, event_id, event_type, body, status, attempts, "
                   "created_at, next_try_at) VALUES (99, 1, 'message.stored', '비밀번호 4821', 'pending', 0, 1, 1)")
    deliverer = WebhookDeliverer(store.webhooks, ServerSettings(db=str(tmp_path / "hooks.db")), clock=lambda: 10.0)

    async def one_round() -> int:
        clients = _Clients(1.0)
        try:
            claimed = await deliverer.round(clients)
            await asyncio.gather(*list(deliverer._posting.values()))
            return claimed
        finally:
            await clients.aclose()

    assert asyncio.run(one_round()) == 1
    assert store.webhooks.deliveries(99) == [] and not store.webhooks.has_due(20.0)
    store.close()


def test_the_migration_adds_the_tables_to_an_older_store(backend: Backend) -> None:
    """A store at the version before webhooks (SQLite 15, PostgreSQL 17) with keys in it gets the
    tables on its next open, and keeps its keys; the blocks its kept answers stored are indexed by
    block by a later migration (SQLite 19, PostgreSQL 21), from the keys' `written`."""
    store = backend.open()
    key = store.keys.insert("abcd1234", "0" * 64, "acme", "admin", "old key", 1.0)
    assert store.idempotency.claim("k", "fp", "w", 1.0, expire_before=0.0, stale_before=0.0) is None
    written = store.append([new_block("사물함 비밀번호 7788")], unit_vectors(1), 1.0,
                           within=store.idempotency.written_hook("k", "w"))
    store.idempotency.finish("k", "w", 201, '{"text": "사물함 비밀번호 7788"}')
    before = 15 if backend.name == "sqlite" else 17
    with store.transaction() as tx:  # type: ignore[attr-defined]  # back to the version before
        tx.execute("DROP TABLE idempotency_blocks")  # the migrations after webhooks' (19 / 21)
        tx.execute("DROP TABLE vector_changes")  # (18 / 20)
        tx.execute("DROP TABLE event_relay")  # (17 / 19)
        tx.execute("DROP TABLE webhook_deliveries")
        tx.execute("DROP TABLE webhook_endpoints")
        if backend.name == "sqlite":
            tx.execute(f"PRAGMA user_version = {before}")
        else:
            tx.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(before),))
    store.close()
    again = backend.open()
    assert again.schema_version() == before + 5 and again.keys.by_id(key.key_id) is not None
    assert again.idempotency.redact_written([written[0].block_index]) == 1
    endpoint = again.webhooks.add_endpoint("acme", "http://127.0.0.1:9/", ["fact.*"], "whsec_AAAA", 1.0)
    assert again.webhooks.endpoints("acme") == [endpoint] and endpoint.wants("fact.added")
    assert not endpoint.wants("memory.added")
