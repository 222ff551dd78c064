"""`gieok serve` in process: every route, roles, keys, bad input, the event stream, and two
tenants trying to reach each other's data through every route. Real SQLite files, the real
packaged embedder, the real FastAPI app (Starlette's httpx-based test client)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.responses import JSONResponse
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gieok.chat.conversation.recent import conversation_of
from gieok.coordination.events import REDACTED
from gieok.server import ServerState, create_app, tenant_path
from gieok.server.events import EventBus
from gieok.server.responses import json_response
from gieok.server.settings import ServerSettings
from gieok.server.warm import Readiness
from gieok.types import scope_key

MARKER = "ALPHA-SECRET-7731"  # every piece of tenant alpha's data carries it
ALPHA_CHANNEL = "alpha-cafe"
ALPHA_USER = "4242"
ALPHA_MESSAGE = "alpha-msg-1"  # a message id only alpha's conversation has


@dataclass
class Deployment:
    state: ServerState
    app: Any
    client: TestClient
    keys: dict[str, str]  # name -> key
    key_ids: dict[str, int]
    alpha_block: int  # a block only alpha has: beta's memory has fewer blocks
    alpha_fact: int = 0  # alpha's fact (a block index beta's memory also has: a block, not a fact, there)
    alpha_webhook: int = 0  # alpha's webhook endpoint (its URL holds the marker)

    def as_(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[name]}"}


def _seed_alpha(state: ServerState) -> int:
    """Alpha's memory holds the marker in every layer: blocks, L1, L2, L3, working memory, STM."""
    with state.tenants.use("alpha") as alpha:
        memory, conversation = alpha.memory, alpha.conversation
        memory.add_many([f"{MARKER} 잡담 {i}" for i in range(5)])
        cafe = conversation_of("g-alpha", ALPHA_CHANNEL)
        block = memory.remember(f"{MARKER} 민지는 고양이 나비를 키워",
                                scope={"guild": "g-alpha", "channel": ALPHA_CHANNEL, "user": ALPHA_USER},
                                speaker=ALPHA_USER)
        conversation.l1.append(cafe, role="user", content=f"{MARKER} 누리야 안녕", user_id=ALPHA_USER,
                               display_name="민지")
        conversation.tables.l1_append_once(scope_key(cafe), "user", f"{MARKER} 비밀 메시지", ALPHA_USER, "민지",
                                           1_790_000_000.0, False, False, ALPHA_MESSAGE, 50)
        conversation.summaries.update(cafe, {"topic": f"{MARKER} 고양이", "new_point": f"{MARKER} 나비"})
        fact = conversation.facts.add(f"<user:{ALPHA_USER}> has a cat named 나비 {MARKER}", fact_type="user_fact",
                                      guild="g-alpha", user_id=ALPHA_USER, topic="pet")
        memory.stm.add(cafe, f"{MARKER} short-term")
        assert fact.fact is not None
        return block.block_index, fact.fact.block_index


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db")))
    keys, ids = {}, {}
    for name, tenant, role in (("alpha", "alpha", "admin"), ("alpha_read", "alpha", "read"),
                               ("beta", "beta", "admin"), ("beta_write", "beta", "write"),
                               ("beta_read", "beta", "read")):
        key, row = state.keys.create(tenant, role, name)
        keys[name], ids[name] = key, row.key_id
    alpha_block, alpha_fact = _seed_alpha(state)
    webhook, _ = asyncio.run(state.webhooks.register("alpha", f"http://127.0.0.1:9/{MARKER}", None))
    app = create_app(state)
    with TestClient(app) as client:
        assert state.readiness.done.wait(120), "the start-up warming never finished"
        yield Deployment(state, app, client, keys, ids, alpha_block, alpha_fact, webhook.endpoint_id)


# -- the two-tenant matrix: every route, as beta, aimed at alpha's data ---------------------------

def _export_line() -> str:
    return json.dumps({"format": "gieok-blocks", "version": 1, "embedder": None, "blocks": 0}) + "\n"


def beta_requests(d: Deployment) -> dict[tuple[str, str], dict[str, Any]]:
    """One request per route: beta's admin key, every id and name pointing at alpha's data."""
    target = str(d.alpha_block)
    a = {"channel": ALPHA_CHANNEL, "guild": "g-alpha"}
    return {
        ("GET", "/healthz"): {},
        ("GET", "/readyz"): {},
        ("POST", "/v1/memories"): {"json": {"text": "beta's own note", "scope": {"channel": ALPHA_CHANNEL}}},
        ("POST", "/v1/memories:batch"): {
            "json": {"items": [{"text": "beta batch", "scope": {"channel": ALPHA_CHANNEL}}]}},
        ("GET", "/v1/memories/{block_index}"): {"path": {"block_index": target}},
        ("GET", "/v1/memories"): {"params": {"channel": ALPHA_CHANNEL, "limit": 200}},
        ("DELETE", "/v1/memories/{block_index}"): {"path": {"block_index": target}},
        ("POST", "/v1/search"): {"json": {"query": "민지 고양이 나비 잡담 secret", "k": 20}},
        ("GET", "/v1/conversations"): {},
        ("GET", "/v1/conversations/messages"): {"params": a},
        ("DELETE", "/v1/conversations/messages/{message_id}"): {"path": {"message_id": ALPHA_MESSAGE}, "params": a},
        ("GET", "/v1/conversations/summary"): {"params": a},
        ("PUT", "/v1/conversations/summary/core"): {"json": {**a, "core": ["beta's rule"]}},
        ("POST", "/v1/conversations/messages"): {"json": {**a, "messages": [
            {"id": "beta-1", "role": "user", "user": ALPHA_USER, "name": "민지",
             "text": "누리야 내 고양이 이름이 뭐였지?"}]}},
        ("POST", "/v1/conversations/context"): {"json": {**a, "user": ALPHA_USER, "query": "민지 고양이 나비 이름",
                                                        "budget_tokens": 4000}},
        ("GET", "/v1/facts"): {"params": {"user": ALPHA_USER, "history": "true"}},
        ("DELETE", "/v1/facts/users/{user}"): {"path": {"user": ALPHA_USER}},
        ("POST", "/v1/facts"): {"json": {"text": f"<user:{ALPHA_USER}> likes tea.", "user": ALPHA_USER,
                                         "guild": "g-alpha"}},
        ("PATCH", "/v1/facts/{fact_id}"): {"path": {"fact_id": str(d.alpha_fact)}, "json": {"text": "beta's fix"}},
        ("DELETE", "/v1/facts/{fact_id}"): {"path": {"fact_id": str(d.alpha_fact)}},
        ("GET", "/v1/facts/{fact_id}/history"): {"path": {"fact_id": str(d.alpha_fact)}},
        ("GET", "/v1/users"): {},
        ("GET", "/v1/users/{user}"): {"path": {"user": ALPHA_USER}},
        ("DELETE", "/v1/users/{user}"): {"path": {"user": ALPHA_USER}},
        ("GET", "/v1/working-memory"): {"params": a},
        ("GET", "/v1/stm"): {"params": a},
        ("GET", "/v1/checkpoints"): {"params": a},
        ("GET", "/v1/layers"): {},
        ("GET", "/v1/stats"): {},
        ("GET", "/v1/verify"): {},
        ("GET", "/v1/export"): {},
        ("POST", "/v1/import"): {"content": _export_line()},
        ("GET", "/v1/health"): {},
        ("GET", "/v1/keys"): {},
        ("POST", "/v1/keys"): {"json": {"role": "read", "name": "beta's reader"}},
        ("DELETE", "/v1/keys/{key_id}"): {"path": {"key_id": str(d.key_ids["alpha"])}},
        ("GET", "/v1/webhooks"): {},
        ("POST", "/v1/webhooks"): {"json": {"url": "http://127.0.0.1:9/beta", "events": ["memory.added"]}},
        ("DELETE", "/v1/webhooks/{webhook_id}"): {"path": {"webhook_id": str(d.alpha_webhook)}},
        ("POST", "/v1/webhooks/{webhook_id}/rotate"): {"path": {"webhook_id": str(d.alpha_webhook)}},
        ("GET", "/v1/webhooks/{webhook_id}/deliveries"): {"path": {"webhook_id": str(d.alpha_webhook)}},
    }


def _http_routes(app: Any) -> set[tuple[str, str]]:
    """Every HTTP route the app documents (the event stream is tested on its own)."""
    return {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item
            if path != "/v1/events"}


def _alpha_intact(d: Deployment) -> None:
    response = d.client.post("/v1/search", json={"query": f"{MARKER} 민지 고양이", "k": 10}, headers=d.as_("alpha"))
    assert MARKER in response.text
    block = d.client.get(f"/v1/memories/{d.alpha_block}", headers=d.as_("alpha")).json()
    assert MARKER in block["text"] and not block["forgotten"]
    facts = d.client.get("/v1/facts", headers=d.as_("alpha")).json()["facts"]
    assert facts and MARKER in facts[0]["text"]
    summary = d.client.get("/v1/conversations/summary", params={"channel": ALPHA_CHANNEL, "guild": "g-alpha"},
                           headers=d.as_("alpha")).json()
    assert MARKER in summary["topic"] and summary["core"] == []
    recent = d.client.get("/v1/conversations/messages", params={"channel": ALPHA_CHANNEL, "guild": "g-alpha"},
                          headers=d.as_("alpha")).json()["messages"]
    assert any(m["external_id"] == ALPHA_MESSAGE for m in recent), "alpha's message is still there"
    assert d.client.get("/v1/keys", headers=d.as_("alpha")).status_code == 200  # alpha's admin key still works
    hooks = d.client.get("/v1/webhooks", headers=d.as_("alpha")).json()["webhooks"]
    assert [h["id"] for h in hooks] == [d.alpha_webhook] and MARKER in hooks[0]["url"]  # not deleted by beta
    assert d.client.get("/v1/verify", headers=d.as_("alpha")).json()["ok"]


def test_beta_reaches_nothing_of_alpha_through_any_route(deployment: Deployment) -> None:
    d = deployment
    cases = beta_requests(d)
    assert set(cases) == _http_routes(d.app), "every route must be in the isolation matrix"
    for (method, path), spec in cases.items():
        url = path.format(**spec.get("path", {}))
        response = d.client.request(method, url, headers=d.as_("beta"), params=spec.get("params"),
                                    json=spec.get("json"), content=spec.get("content"))
        assert response.status_code < 500, (method, path, response.text)
        assert MARKER not in response.text, f"{method} {path} leaked alpha's data: {response.text[:300]}"
        assert response.headers["content-type"].startswith(("application/json", "application/x-ndjson"))
        if any(name in path for name in ("{block_index}", "{key_id}", "{message_id}", "{fact_id}", "{webhook_id}")):
            assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    _alpha_intact(d)
    assert tenant_path(d.state.tenants.home, "beta") != tenant_path(d.state.tenants.home, "alpha")


def test_beta_events_carry_nothing_of_alpha(deployment: Deployment) -> None:
    d = deployment
    with d.client.websocket_connect("/v1/events/ws?since=0", headers=d.as_("beta")) as beta_socket:
        d.client.post("/v1/memories", json={"text": f"{MARKER} live"}, headers=d.as_("alpha"))
        d.client.post("/v1/search", json={"query": MARKER}, headers=d.as_("alpha"))
        d.client.post("/v1/memories", json={"text": "beta's own"}, headers=d.as_("beta"))
        first = json.loads(beta_socket.receive_text())
    assert first["type"] == "memory.added" and first["seq"] == 1
    assert first["data"]["blocks"][0]["text"] == "beta's own"
    with d.client.websocket_connect("/v1/events/ws?since=0", headers=d.as_("alpha_read")) as alpha_socket:
        seen = [json.loads(alpha_socket.receive_text()) for _ in range(4)]
    assert any(MARKER in json.dumps(e) for e in seen) and all("beta's own" not in json.dumps(e) for e in seen)


# -- keys and roles --------------------------------------------------------------------------------

READS_BY_POST = ("/v1/search", "/v1/conversations/context")  # POST for a body, but they change nothing
ADMIN_READS = (("GET", "/v1/users/{user}"),)  # everything held about one person: an access request, an admin's


def test_every_route_gets_its_role_gate_from_its_router(deployment: Deployment) -> None:
    """One gate per REST route and per dashboard page, declared by the router it is in: a route
    cannot forget one. Changing routes need write (admin for keys); a search is a read. Every
    route the app serves is in one of these routers."""
    from fastapi.routing import APIRoute

    from gieok.server.deps import admin, reader, writer
    from gieok.server.routes import ROUTERS as REST
    from gieok.server.routes.system import public
    from gieok.server.web.routes import ROUTERS as PAGES
    from gieok.server.web.routes import editor, viewer
    from gieok.server.web.routes import router as sign_in

    gates = {reader: "read", writer: "write", admin: "admin", viewer: "page", editor: "form"}
    gated = 0
    for router in [*REST, *PAGES]:
        found = [gates[d.dependency] for d in router.dependencies if d.dependency in gates]
        routes = [r for r in router.routes if isinstance(r, APIRoute)]
        if not routes:
            continue  # the event WebSocket: accepted, then its key checked in the handler (4401 / 4403)
        if router in (public, sign_in):
            public_paths = {"/healthz", "/readyz", "/login", "/logout", "/docs"}  # /docs: the API reference page
            assert not found and {r.path for r in routes} <= public_paths
            continue
        assert len(found) == 1, f"a router with gates {found}: {[r.path for r in routes]}"
        for route in routes:
            own = [gates[d.dependency] for d in route.dependencies if d.dependency in gates]
            assert own == found, f"{route.path} has gates {own} beside its router's"  # the router's, and only it
            method = next(iter(route.methods))
            if route.path.startswith("/v1/"):
                admin = route.path.startswith(("/v1/keys", "/v1/webhooks")) or (method, route.path) in ADMIN_READS
                expected = ("admin" if admin else "read" if method == "GET" or route.path in READS_BY_POST
                            else "write")
            else:
                expected = "page" if method == "GET" else "form"
            assert found == [expected], f"{method} {route.path}: {found[0]}, expected {expected}"
            gated += 1
    served = {(next(iter(r.methods)), re.sub(r":\w+}", "}", r.path))  # {id:path}: the docs say {id}
              for router in [*REST, *PAGES] for r in router.routes if isinstance(r, APIRoute)}
    assert {(m.upper(), path) for path, item in deployment.app.openapi()["paths"].items() for m in item} <= served
    assert gated >= 30


def test_no_key_wrong_key_and_revoked_key_get_401(deployment: Deployment) -> None:
    d = deployment
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"},
                    {"Authorization": "Bearer gk_00000000_" + "x" * 43}):
        response = d.client.get("/v1/stats", headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "unauthenticated"
    assert d.client.get("/v1/stats", headers=d.as_("beta_read")).status_code == 200
    assert d.state.keys.revoke(d.key_ids["beta_read"])
    assert d.client.get("/v1/stats", headers=d.as_("beta_read")).status_code == 401  # at once


def test_roles(deployment: Deployment) -> None:
    d = deployment
    read = d.as_("beta_read")
    for method, url, body in (("POST", "/v1/memories", {"text": "x"}), ("DELETE", "/v1/memories/1", None),
                              ("POST", "/v1/memories:batch", {"items": [{"text": "x"}]}),
                              ("PUT", "/v1/conversations/summary/core", {"channel": "c", "core": []}),
                              ("DELETE", "/v1/facts/users/1", None)):
        response = d.client.request(method, url, json=body, headers=read)
        assert response.status_code == 403 and response.json()["error"]["type"] == "forbidden", url
    assert d.client.get("/v1/keys", headers=d.as_("beta_write")).status_code == 403
    assert d.client.post("/v1/memories", json={"text": "쓰기 키로 저장"},
                         headers=d.as_("beta_write")).status_code == 201


def test_an_admin_manages_only_its_own_tenants_keys(deployment: Deployment) -> None:
    d = deployment
    listed = d.client.get("/v1/keys", headers=d.as_("beta")).json()["keys"]
    assert {k["tenant"] for k in listed} == {"beta"} and all("key_hash" not in k for k in listed)
    created = d.client.post("/v1/keys", json={"role": "read", "name": "대시보드"}, headers=d.as_("beta")).json()
    assert created["tenant"] == "beta" and created["key"].startswith("gk_")
    new = {"Authorization": f"Bearer {created['key']}"}
    assert d.client.get("/v1/stats", headers=new).status_code == 200
    assert d.client.delete(f"/v1/keys/{created['id']}", headers=d.as_("beta")).status_code == 200
    assert d.client.get("/v1/stats", headers=new).status_code == 401
    for bad in ({"role": "root"}, {"role": "read", "tenant": "alpha"}):
        assert d.client.post("/v1/keys", json=bad, headers=d.as_("beta")).status_code == 422


# -- the routes themselves ----------------------------------------------------------------------

def test_remember_search_list_forget_korean_and_english(deployment: Deployment) -> None:
    d, w = deployment, deployment.as_("beta_write")
    first = d.client.post("/v1/memories", json={
        "text": "서연은 다음 달에 부산으로 이사 가", "scope": {"guild": "g1", "channel": "general", "user": "7"},
        "speaker": "서연", "importance": 0.8, "event_time": "2026-11-01T10:00:00Z", "tags": ["move"],
        "metadata": {"source": "api"}}, headers=w)
    assert first.status_code == 201
    block = first.json()
    assert block["scope"] == {"guild": "g1", "channel": "general", "user": "7"} and block["tags"] == ["move"]
    batch = d.client.post("/v1/memories:batch", json={"items": [
        {"text": "Alex got the offer from Nuvola Labs", "scope": {"channel": "general"}},
        {"text": "준호는 주말마다 북한산에 가", "scope": {"channel": "general"}, "kind": "note"}]}, headers=w)
    assert batch.status_code == 201 and len(batch.json()["blocks"]) == 2
    found = d.client.post("/v1/search", json={"query": "서연이 이사 가는 곳", "k": 3,
                                              "scope": {"channel": "general"}}, headers=w).json()
    assert found["hits"][0]["block"]["block_index"] == block["block_index"]
    assert {"bm25", "vector", "neighbour", "final"} <= set(found["hits"][0]["breakdown"])
    assert found["source"] in {"full", "cache", "working_memory", "checkpoint"} and found["search_time_ms"] > 0
    english = d.client.post("/v1/search", json={"query": "which company made Alex an offer", "k": 1}, headers=w).json()
    assert "Nuvola" in english["hits"][0]["block"]["text"]
    notes = d.client.get("/v1/memories", params={"kind": "note"}, headers=w).json()
    assert [b["text"] for b in notes["items"]] == ["준호는 주말마다 북한산에 가"]
    forgotten = d.client.delete(f"/v1/memories/{block['block_index']}", headers=w).json()
    assert forgotten == {"forgotten": [block["block_index"]], "already_forgotten": False}
    again = d.client.get(f"/v1/memories/{block['block_index']}", headers=w).json()
    assert again["forgotten"] and again["text"] == ""
    assert d.client.get("/v1/verify", headers=w).json()["ok"]


def test_list_pages_with_a_cursor(deployment: Deployment) -> None:
    d, w = deployment, deployment.as_("beta_write")
    d.client.post("/v1/memories:batch", json={"items": [{"text": f"메시지 {i}"} for i in range(7)]}, headers=w)
    seen, cursor = [], None
    while True:
        page = d.client.get("/v1/memories", params={"limit": 3, **({"cursor": cursor} if cursor else {})},
                            headers=w).json()
        seen += [b["block_index"] for b in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(range(7, 0, -1))
    assert d.client.get("/v1/memories", params={"cursor": "garbage!"}, headers=w).status_code == 400


def test_export_then_import_into_another_tenant_keeps_the_chain(deployment: Deployment) -> None:
    d = deployment
    exported = d.client.get("/v1/export", headers=d.as_("alpha"))
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-ndjson")
    lines = exported.text.splitlines()
    # header + 9 blocks: the 7 seeded and the turns the server's start made of the L1 messages the seed left
    # without one (a crash's leftovers, recovered when warming builds the tenant's pipeline)
    assert json.loads(lines[0])["format"] == "gieok-blocks" and len(lines) == 10
    key, _ = d.state.keys.create("gamma", "write")
    gamma = {"Authorization": f"Bearer {key}"}
    imported = d.client.post("/v1/import", content=exported.text.encode(), headers=gamma)
    assert imported.json() == {"imported": 9}
    assert d.client.get("/v1/verify", headers=gamma).json() == {**d.client.get("/v1/verify",
                                                                                 headers=d.as_("alpha")).json()}
    bad = d.client.post("/v1/import", content=exported.text.replace(MARKER, "TAMPERED", 1).encode(),
                        headers=d.as_("beta_write"))
    assert bad.status_code == 400 and d.client.get("/v1/stats", headers=d.as_("beta")).json()["blocks"] == 0


def test_conversation_routes(deployment: Deployment) -> None:
    d, a = deployment, deployment.as_("alpha")
    params = {"channel": ALPHA_CHANNEL, "guild": "g-alpha"}
    channels = d.client.get("/v1/conversations", headers=a).json()["conversations"]
    assert channels[0]["conversation"] == {"guild": "g-alpha", "channel": ALPHA_CHANNEL, "user": None}
    messages = d.client.get("/v1/conversations/messages", params=params, headers=a).json()["messages"]
    assert messages[0]["display_name"] == "민지" and messages[0]["role"] == "user"
    core = d.client.put("/v1/conversations/summary/core", json={**params, "core": ["이 채널은 고양이 이야기 전용"]},
                        headers=a).json()
    assert core["core"] == ["이 채널은 고양이 이야기 전용"] and "Permanent core" in core["markdown"]
    slots = d.client.get("/v1/working-memory", params=params, headers=a).json()
    assert slots["slots"][0]["priority_parts"].keys() == {"importance", "time", "usage", "relevance"}
    entries = d.client.get("/v1/stm", headers=a).json()["entries"]
    assert entries and entries[0]["expires_in_seconds"] > 0
    assert "layers" in d.client.get("/v1/layers", headers=a).json()
    history = d.client.get("/v1/facts", params={"history": "true"}, headers=a).json()["facts"]
    assert history[0]["valid_to"] is None and history[0]["user_id"] == ALPHA_USER
    erased = d.client.delete(f"/v1/facts/users/{ALPHA_USER}", headers=a).json()["erased"]
    assert erased["facts"] == 1 and d.client.get("/v1/facts", headers=a).json()["facts"] == []


def test_a_conversations_messages_by_default_are_all_the_list_counts(deployment: Deployment) -> None:
    """`GET /v1/conversations/messages` without `limit` returns every message L1 holds for it — the
    `messages` count `GET /v1/conversations` shows — not a page of it (it used to stop at 50)."""
    d, b = deployment, deployment.as_("beta_read")
    room = conversation_of("g-beta", "lounge")
    with d.state.tenants.use("beta") as beta:
        for i in range(80):  # more than l1_size (50): L1 may hold more while turns are being written
            beta.conversation.tables.l1_append_once(scope_key(room), "user", f"민지: 메시지 {i} / message {i}",
                                                    "u-minji", "민지", 1_790_000_000.0 + i, False, False, f"m-{i}", 80)
    [listed] = [c for c in d.client.get("/v1/conversations", headers=b).json()["conversations"]
                if c["conversation"]["channel"] == "lounge"]
    params = {"channel": "lounge", "guild": "g-beta"}
    every = d.client.get("/v1/conversations/messages", params=params, headers=b).json()["messages"]
    assert listed["messages"] == len(every) == 80 and every[-1]["content"].endswith("message 79")
    page = d.client.get("/v1/conversations/messages", params={**params, "limit": 10}, headers=b).json()["messages"]
    assert [m["content"] for m in page] == [m["content"] for m in every[-10:]]  # the newest, oldest first
    too_many = d.client.get("/v1/conversations/messages", params={**params, "limit": 501}, headers=b)
    assert too_many.status_code == 422


@pytest.mark.parametrize("body, status", [
    (b'{"text": ', 422),                                   # malformed JSON
    (b'{"text": 5}', 422),                                 # wrong type
    (b'{"text": "x", "colour": "red"}', 422),              # unknown field
    (b'{"text": "a\\u0000b"}', 400),                       # NUL byte
    (b'{"text": "\xff\xfe"}', 422),                        # invalid UTF-8: not JSON, as malformed JSON
    (b'{"text": "   "}', 400),                             # empty
    (b'{"text": "x", "importance": 7}', 422),              # out of range
    (b'{"text": "x", "scope": {"planet": "mars"}}', 422),  # unknown scope key
    (b'[1, 2, 3]', 422),                                   # not an object
])
def test_bad_input_gets_a_4xx_json_error_and_writes_nothing(deployment: Deployment, body: bytes, status: int) -> None:
    d = deployment
    response = d.client.post("/v1/memories", content=body, headers={**d.as_("beta_write"),
                                                                     "content-type": "application/json"})
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) >= {"type", "message"}
    assert d.client.get("/v1/stats", headers=d.as_("beta")).json()["blocks"] == 0


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_body_sent_with_a_key_is_json_whatever_its_content_type(deployment: Deployment,
                                                                   content_type: str | None) -> None:
    """`curl -d '{...}'` says application/x-www-form-urlencoded: with a key, the body is read as JSON."""
    d, w = deployment, deployment.as_("beta_write")
    headers = {**w, "content-type": content_type} if content_type else w
    added = d.client.post("/v1/memories", content='{"text": "민지: 고양이 이름은 보리야"}'.encode(), headers=headers)
    assert added.status_code == 201, added.text
    found = d.client.post("/v1/search", content='{"query": "민지 고양이 이름"}'.encode(), headers=headers)
    assert found.status_code == 200 and "보리야" in found.json()["hits"][0]["block"]["text"]
    core = d.client.put("/v1/conversations/summary/core", content=b'{"channel": "general", "core": ["cats"]}',
                        headers=headers)
    assert core.status_code == 200 and core.json()["core"] == ["cats"]


@pytest.mark.parametrize("body, kind, words", [
    (b"query=x", "invalid_json", ("not valid JSON", "application/x-www-form-urlencoded")),
    (b'{"query": ', "invalid_json", ("not valid JSON", "character 10")),
    (b'["x"]', "validation_error", ("JSON object", "an array")),
    (b"", "validation_error", ("body is empty",)),
])
def test_a_body_that_is_not_a_json_object_says_what_is_wrong(deployment: Deployment, body: bytes, kind: str,
                                                              words: tuple[str, ...]) -> None:
    d = deployment
    response = d.client.post("/v1/search", content=body, headers={**d.as_("beta_write"),
                                                                   "content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == kind and all(word in error["message"] for word in words), error
    assert "valid dictionary" not in error["message"]


def test_without_a_key_a_body_must_say_it_is_json(tmp_path: Path) -> None:
    """No Authorization header (`--no-auth`, or the dashboard's cookie): a page on another site
    could post a form here without asking, so FastAPI's strict Content-Type stays, with a 415 that
    says why; /mcp and the import route are not JSON routes and keep their own rules."""
    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "open.db")), auth=False)
    with TestClient(create_app(state), base_url="http://127.0.0.1") as client:  # keyless: loopback Host names only
        assert state.readiness.done.wait(120)  # a warming server answers the API 503 after a short wait
        for content_type in ("application/x-www-form-urlencoded", "text/plain"):
            refused = client.post("/v1/memories", content=b'{"text": "from another site"}',
                                  headers={"content-type": content_type})
            assert refused.status_code == 415, refused.text
            assert content_type in refused.json()["error"]["message"]
            assert refused.json()["error"]["type"] == "unsupported_media_type"
        assert client.get("/v1/stats").json()["blocks"] == 0
        assert client.post("/v1/memories", json={"text": "sent as JSON"}).status_code == 201


def test_integers_beyond_64_bits_in_metadata_are_stored_and_read_back_by_every_route(deployment: Deployment) -> None:
    """JSON allows any integer; orjson, which writes the answers, refuses those beyond 64 bits. A
    block holding one in its metadata was stored, then its own 201 and every later list holding it
    was a 500 (the fuzzer found it): now each answer writes the number as sent."""
    d, w = deployment, deployment.as_("beta_write")
    metadata = {"big": 2**70, "small": -(2**65), "nested": {"ids": [2**64, 1, 1.5]}, "ok": 7}
    added = d.client.post("/v1/memories", json={"text": "지수의 회원 번호는 아주 길어", "metadata": metadata},
                          headers=w)
    assert added.status_code == 201, added.text
    assert json.loads(added.content)["metadata"] == metadata  # the exact integers, not floats
    index = added.json()["block_index"]
    for answer in (d.client.get(f"/v1/memories/{index}", headers=w),
                   d.client.get("/v1/memories", headers=w),
                   d.client.post("/v1/search", json={"query": "지수 회원 번호", "k": 3}, headers=w)):
        assert answer.status_code == 200, answer.text
        assert str(2**70) in answer.text and str(-(2**65)) in answer.text
    exported = d.client.get("/v1/export", headers=w)
    assert exported.status_code == 200 and str(2**70) in exported.text


def test_the_fallback_encoder_writes_what_orjson_writes() -> None:
    """Where orjson refuses (an integer beyond 64 bits), the standard library writes the answer:
    everything else in it comes out as orjson would have written it."""
    from datetime import datetime

    import numpy as np
    import orjson

    from gieok.server.responses import _OPTIONS, FastJSONResponse

    content = {"hits": [{"score": np.float32(0.5), "vector": np.array([1, 2]), "nan": float("nan"), "t": (1, 2)}],
               "at": datetime(2026, 11, 30, 7, 0), 3: "three", None: "none", True: "yes", "말": "한국어"}
    rendered = FastJSONResponse(None).render({**content, "big": 2**70, 2**65: "key"})
    expected = orjson.dumps(content, option=_OPTIONS)[:-1] + f',"big":{2**70},"{2**65}":"key"}}'.encode()
    assert rendered == expected


def test_huge_bodies_huge_k_and_fts_syntax(deployment: Deployment) -> None:
    d, w = deployment, deployment.as_("beta_write")
    huge = d.client.post("/v1/memories", content=b'{"text": "' + b"x" * 2_000_000 + b'"}',
                         headers={**w, "content-type": "application/json"})
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "payload_too_large"
    too_long = d.client.post("/v1/memories", json={"text": "가" * 100_001}, headers=w)
    assert too_long.status_code == 400 and "limit" in too_long.json()["error"]["message"]
    assert d.client.post("/v1/search", json={"query": "x", "k": 10**9}, headers=w).status_code == 422
    d.client.post("/v1/memories", json={"text": "foo AND bar"}, headers=w)
    for query in ('"foo AND (', "NEAR(a b)", "* OR -", "tokens : x"):
        response = d.client.post("/v1/search", json={"query": query}, headers=w)
        assert response.status_code == 200, query
    assert d.client.get("/v1/memories/0", headers=w).status_code == 422
    assert d.client.get("/v1/nowhere", headers=w).json()["error"]["type"] == "not_found"
    assert d.client.patch("/v1/memories/1", headers=w).status_code == 405


def test_healthz_needs_no_key_and_tells_nothing(deployment: Deployment) -> None:
    assert deployment.client.get("/healthz").json() == {"status": "ok"}
    health = deployment.client.get("/v1/health", headers=deployment.as_("beta_read")).json()
    assert health["status"] == "ok" and health["embedder"]["dimension"] in (0, 384)
    if health["embedder"]["dimension"]:  # which engines run the model's work
        assert health["embedder"]["engines"] == {"query": "onnx", "bulk": "onnx"}


def test_readyz_answers_200_only_once_warm(deployment: Deployment) -> None:
    """/healthz is liveness; /readyz says whether the model, the analyser and the tenants' indexes
    are loaded: 503 with Retry-After while warming, 200 after (no key, nothing about a tenant)."""
    state = deployment.state
    assert state.readiness.done.wait(120), "the start-up warming never finished"
    ready = deployment.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["tenants_warmed"] >= 3  # default, alpha, beta: the tenants with live keys
    assert "alpha" not in ready.text and "beta" not in ready.text
    state.readiness = Readiness()  # as a fresh server is while it warms
    warming = deployment.client.get("/readyz")
    assert warming.status_code == 503 and warming.headers["Retry-After"] == "1"
    assert warming.json()["status"] == "warming" and deployment.client.get("/healthz").status_code == 200
    state.readiness.finish("the embedding model could not be loaded")
    failed = deployment.client.get("/readyz")
    assert failed.status_code == 503 and failed.json()["status"] == "failed" and "Retry-After" not in failed.headers


def test_a_warming_server_asks_api_clients_to_come_back(deployment: Deployment,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker started again (`--workers N`: one was killed) is handed requests while it loads
    its models: an API request waits a moment, then gets 503 + Retry-After rather than hanging;
    once warm, it is answered. Liveness and the dashboard are not held."""
    import gieok.server.warm as warm

    monkeypatch.setattr(warm, "WARM_WAIT_S", 0.3)
    state = deployment.state
    assert state.readiness.done.wait(120)
    state.readiness = Readiness()  # warming again
    answer = deployment.client.post("/v1/search", json={"query": "고양이"}, headers=deployment.as_("alpha"))
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    assert answer.json()["error"]["type"] == "warming"
    assert deployment.client.get("/healthz").status_code == 200
    state.readiness.finish()
    assert deployment.client.post("/v1/search", json={"query": "고양이"},
                                  headers=deployment.as_("alpha")).status_code == 200


def test_openapi_and_docs(deployment: Deployment) -> None:
    spec = deployment.client.get("/openapi.json").json()
    assert "/v1/search" in spec["paths"] and spec["info"]["title"] == "gieok"
    assert deployment.client.get("/docs").status_code == 200


# -- the event stream ---------------------------------------------------------------------------

def test_websocket_events_and_resume(deployment: Deployment) -> None:
    d, w = deployment, deployment.as_("beta_write")
    with d.client.websocket_connect("/v1/events/ws", headers=w) as socket:
        d.client.post("/v1/memories", json={"text": "첫 번째"}, headers=w)
        added = json.loads(socket.receive_text())
        d.client.post("/v1/search", json={"query": "첫 번째"}, headers=w)
        searched = json.loads(socket.receive_text())
    assert added["type"] == "memory.added" and added["data"]["blocks"][0]["text"] == "첫 번째"
    assert searched["type"] == "search.answered" and searched["data"]["hits"][0]["text"] == "첫 번째"
    assert {"bm25", "vector", "final"} <= set(searched["data"]["hits"][0]["breakdown"])
    d.client.delete("/v1/memories/1", headers=w)  # happens while nobody listens
    with d.client.websocket_connect(f"/v1/events/ws?since={searched['seq']}", headers=w) as socket:
        missed = json.loads(socket.receive_text())
    assert missed["type"] == "memory.forgotten" and missed["seq"] == searched["seq"] + 1
    with d.client.websocket_connect("/v1/events/ws?since=0", headers=w) as socket:
        replay = [json.loads(socket.receive_text()) for _ in range(3)]
    assert [event["seq"] for event in replay] == [1, 2, 3]
    # the events that carried the forgotten block's text are kept redacted: a replay does not bring it back
    assert [event["data"] for event in replay[:2]] == [{"redacted": "this event held data that was erased"}] * 2
    assert "첫 번째" not in json.dumps(replay, ensure_ascii=False)


def test_a_deleted_or_edited_message_leaves_no_event_that_carried_its_words(deployment: Deployment) -> None:
    """An agent's message stored as a turn is in the stream (`memory.added` with its text, a
    `search.answered` that showed it). A `DELETE` of the message, or an edit that replaces its text,
    erases the turn — and the buffered events that held it, as a user's erasure does: a client
    replaying the stream from the start gets them redacted (whole: the batch's other turns with
    them, which the memory still holds), and the events that did not hold it as they were."""
    d, w = deployment, deployment.as_("beta_write")
    room = {"guild": "g-beta", "channel": "lobby"}
    said = [{"id": "b-1", "role": "user", "user": "7", "name": "지수", "text": "지수: 내 사물함 비밀번호는 7788이야"},
            {"id": "b-2", "role": "user", "user": "8", "name": "준호", "text": "준호: 오늘 점심 뭐 먹지"},
            {"id": "b-3", "role": "user", "user": "7", "name": "지수", "text": "지수: 우리 집 강아지 이름은 콩이야"}]
    assert d.client.post("/v1/conversations/messages", json={**room, "messages": said}, headers=w).status_code == 202
    searched = d.client.post("/v1/search", json={"query": "사물함 비밀번호 강아지 이름", "k": 5}, headers=w)
    assert searched.status_code == 200
    edited = {**said[2], "text": "지수: 우리 집 고양이 이름은 콩이야"}
    assert d.client.post("/v1/conversations/messages", json={**room, "messages": [edited]},
                         headers=w).status_code == 202
    assert d.client.delete("/v1/conversations/messages/b-1", params=room, headers=w).status_code == 200
    last = d.state.bus.last_seq("beta")
    with d.client.websocket_connect("/v1/events/ws?since=0", headers=w) as socket:
        replay = [json.loads(socket.receive_text()) for _ in range(last)]
    text = json.dumps(replay, ensure_ascii=False)
    assert "7788" not in text and "강아지" not in text, text
    assert [event["type"] for event in replay if event["data"] == REDACTED] == ["memory.added", "search.answered"]
    new_turn = next(event for event in replay if event["type"] == "memory.added" and event["data"] != REDACTED)
    assert new_turn["data"]["blocks"][0]["text"] == edited["text"], "the edit's new text stays in the stream"
    assert [event["data"]["block_indices"] for event in replay if event["type"] == "memory.forgotten"] == [[3], [1]]


def test_the_buffer_finds_a_forgotten_blocks_events_by_block_and_forgets_what_it_no_longer_holds() -> None:
    """The in-process buffer indexes its events by the blocks they name: a `memory.forgotten`
    redacts exactly the events of its blocks still held (as reading every event would), and the
    index keeps nothing of events the buffer has let go."""
    bus = EventBus(5)
    for block in range(40):
        bus.publish("acme", "memory.added", {"blocks": [{"block_index": block, "text": f"turn {block}"}]})
        bus.publish("acme", "search.answered", {"hits": [{"block_index": block, "text": f"turn {block}"}]})
    log = bus._logs["acme"]
    assert len(log.named) <= 4 * 5 and "b0" not in log.named, "the index lets go of events the buffer let go"
    bus.publish("acme", "memory.forgotten", {"block_indices": [38, 39, 3]})
    held = bus.recent("acme", n=10)
    assert [e.data for e in held] == [REDACTED] * 4 + [{"block_indices": [38, 39, 3]}], "38's and 39's, oldest first"
    bus.publish("acme", "memory.added", {"blocks": [{"block_index": 40, "text": "turn 40"}]})
    bus.publish("acme", "memory.forgotten", {"block_indices": [37]})  # gone from the buffer already
    assert [e.type for e in bus.recent("acme", n=10)][-2:] == ["memory.added", "memory.forgotten"]
    for block in range(100, 130):  # events of more marks than 4 a slot: the index is not rebuilt at every add
        bus.publish("acme", "search.answered", {"hits": [{"block_index": block * 10 + n} for n in range(6)]})
    assert log.prune_at >= 2 * 5 * 6 and len(log.named) <= max(log.prune_at, 4 * 5)


def test_websocket_says_when_the_buffer_no_longer_reaches_back(tmp_path: Path) -> None:
    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db"), event_buffer=2))
    key, _ = state.keys.create("default", "write")
    headers = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(state)) as client:
        assert state.readiness.done.wait(120)
        for i in range(4):
            client.post("/v1/memories", json={"text": f"이벤트 {i}"}, headers=headers)
        with client.websocket_connect("/v1/events/ws?since=0", headers=headers) as socket:
            gap = json.loads(socket.receive_text())
            kept = json.loads(socket.receive_text())
    assert gap["type"] == "stream.gap" and gap["data"]["oldest_available"] == 3 and gap["data"]["missed"] == 2
    assert kept["seq"] == 3


def test_websocket_without_a_key_is_closed(deployment: Deployment) -> None:
    with pytest.raises(WebSocketDisconnect) as closed, \
            deployment.client.websocket_connect("/v1/events/ws") as socket:
        socket.receive_text()
    assert closed.value.code == 4401


def test_answers_are_the_bytes_the_standard_library_would_write() -> None:
    """The API's JSON (orjson) is byte for byte Starlette's standard-library encoding — compact,
    UTF-8 Korean unescaped, int keys as strings — and also writes numpy numbers, which it cannot."""
    payload = {"text": "누리야, 민지는 고양이 \"나비\"를 키워 \U0001f431\n", "k": 3, "score": 0.8125, "none": None,
               "hits": [{"block_index": 7, "tags": ["고양이", "pet"], "ok": True}], 1000: {"recall": 0.916}}
    assert json_response(payload).body == JSONResponse(payload).body
    mixed = json_response({"scores": np.array([0.5, 0.25], dtype=np.float32), "n": np.int64(4),
                           "mean": np.float64(0.75)}, status=202, headers={"X-Test": "1"})
    assert json.loads(mixed.body) == {"scores": [0.5, 0.25], "n": 4, "mean": 0.75}
    assert mixed.status_code == 202 and mixed.headers["x-test"] == "1"
    assert mixed.headers["content-type"] == "application/json"
