"""Schemathesis generates requests from the server's own OpenAPI schema (valid and invalid ones):
no request may get a 5xx, and every error is the JSON error body. Then the cases of the hardening
review (issue 23), generated the same way:

- negative: every operation that needs a key refuses a missing, a malformed and a revoked key with
  401 JSON, whatever else the request holds;
- stateful: sequences that follow the document's links (write → read, forget; key → revoke) with
  an `Idempotency-Key` on every write, each write sent twice (same answer, nothing written the
  second time), every revoked key refused at once, and nothing of another tenant ever in an answer.
  Every sequence opens with a write and a new key (so both links can be followed from its first
  step) and ends by revoking, through the API, each key it made and still holds: every sequence
  revokes a key and uses it, however many routes the document has.

Bounded: a few dozen examples per operation, a few dozen short sequences."""

from __future__ import annotations

import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import initialize
from schemathesis import GenerationMode
from schemathesis.generation.stateful.state_machine import StepInput

from gieok.server import ServerState, create_app
from gieok.server.settings import ServerSettings

pytestmark = pytest.mark.slow  # schemathesis sends a few hundred generated requests

_WORKDIR = Path(tempfile.mkdtemp(prefix="gieok-fuzz-"))
_STATE = ServerState.open(ServerSettings.load(db=str(_WORKDIR / "home.db"), cache_size=0))
_KEY, _ = _STATE.keys.create("fuzz", "admin", "schemathesis")
_REVOKED_KEY, _revoked = _STATE.keys.create("fuzz", "admin", "revoked")
assert _STATE.keys.revoke(_revoked.key_id)
_OTHER_MARKER = "OTHERTENANT7731"  # in the other tenant's memory only: no answer to a fuzz key may hold it
_OTHER_KEY, _ = _STATE.keys.create("other", "admin", "another tenant")
_APP = create_app(_STATE, owns_state=False)

schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)
# The event stream never ends by design; it has tests of its own (test_server.py, test_server_process.py).
schema = schema.exclude(path="/v1/events")
_PUBLIC = {"/healthz", "/readyz"}
_WRITES = {("POST", "/v1/memories"), ("POST", "/v1/memories:batch"), ("POST", "/v1/import"),
           ("POST", "/v1/conversations/messages")}  # the routes that take an Idempotency-Key


@pytest.fixture(scope="module", autouse=True)
def _seeded_state() -> Any:
    """The memories written when this module's tests start, not when it is imported: every xdist
    worker imports it to collect, and the writes (the model and the Korean analyser loaded) cost
    each of them ~1.5 CPU-s."""
    with _STATE.tenants.use("fuzz") as tenant:  # something to find, page through and forget
        tenant.memory.add_many(["민지는 고양이 나비를 키워", "Alex got the offer from Nuvola Labs",
                                "준호는 등산을 좋아해"])
    with _STATE.tenants.use("other") as tenant:
        tenant.memory.add_many([f"{_OTHER_MARKER} 다른 테넌트의 비밀", f"{_OTHER_MARKER} another tenant's secret"])
    yield
    _STATE.close()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case: Any) -> None:
    response = case.call(headers={"Authorization": f"Bearer {_KEY}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    if response.status_code >= 400:
        body = response.json()
        assert set(body["error"]) >= {"type", "message"}, body


def test_the_fuzzer_got_past_authentication() -> None:
    """The generated requests reached the handlers (a fuzzer stuck at 401 would prove nothing)."""
    with _STATE.tenants.use("fuzz") as tenant:
        assert len(tenant.memory) > 3


def _blocks(tenant: str) -> int:
    with _STATE.tenants.use(tenant) as t:
        return len(t.memory)


def _is_error_body(response: Any) -> bool:
    try:
        return set(response.json()["error"]) >= {"type", "message"}
    except (ValueError, KeyError, TypeError):
        return False


# -- negative: keys ---------------------------------------------------------------------------------

def _keyless(mode: GenerationMode) -> Any:
    """The schema again, generating `mode` cases only, without schemathesis' coverage phase: its
    boundary cases are for the keyed test above (a refused key is refused before the body is read),
    and here they were two thirds of these tests' time."""
    loaded = schemathesis.openapi.from_asgi("/openapi.json", _APP).exclude(path="/v1/events")
    loaded.config.generation.update(modes=[mode])
    loaded.config.phases.coverage.enabled = False
    return loaded


_WRONG_KEYS = (None, "Bearer gk_00000000_" + "x" * 43, "Bearer not-a-key", f"Bearer {_REVOKED_KEY}")


def _without_key(case: Any) -> bool:
    """Strip any credentials the generator put in; False for a case that needs none."""
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() not in ("authorization", "cookie")}
    return case.path not in _PUBLIC and case.method.upper() == case.operation.method.upper()


@_keyless(GenerationMode.POSITIVE).parametrize()
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation_refuses_a_missing_a_malformed_and_a_revoked_key(case: Any) -> None:
    if not _without_key(case):
        return
    blocks = _blocks("fuzz")
    for authorization in _WRONG_KEYS:
        response = case.call(headers={"Authorization": authorization} if authorization else {})
        assert response.status_code == 401, f"{case.method} {case.formatted_path} with {authorization!r}: " \
                                            f"{response.status_code} {response.text[:300]}"
        assert _is_error_body(response) and response.json()["error"]["type"] == "unauthenticated", response.text
    assert _blocks("fuzz") == blocks  # nothing written by a refused request


@_keyless(GenerationMode.NEGATIVE).parametrize()
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_an_invalid_request_without_a_valid_key_is_a_json_4xx_and_writes_nothing(case: Any) -> None:
    """A body that is not even JSON may be refused for that first (422 invalid_json): either way 4xx."""
    if not _without_key(case):
        return
    blocks = _blocks("fuzz")
    for authorization in _WRONG_KEYS:
        response = case.call(headers={"Authorization": authorization} if authorization else {})
        assert 400 <= response.status_code < 500 and _is_error_body(response), \
            f"{case.method} {case.formatted_path} with {authorization!r}: {response.status_code} {response.text[:300]}"
    assert _blocks("fuzz") == blocks


# -- stateful: links, idempotent writes, revocation, two tenants -----------------------------------------

_SEEN: Counter[str] = Counter()  # what the sequences got to do (a machine stuck at 401 or 422 proves nothing)
_WORKFLOW = schema.as_state_machine()
_ADD = schema["/v1/memories"]["POST"]
_LIST = schema["/v1/memories"]["GET"]
_MAKE_KEY = schema["/v1/keys"]["POST"]
_REVOKE_KEY = schema["/v1/keys/{key_id}"]["DELETE"]


def _bearer(key: str) -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {key}"}}


class GieokWorkflow(_WORKFLOW):  # type: ignore[misc,valid-type]
    """Sequences of calls that follow the OpenAPI links, with the review's properties checked after
    every step (module docstring)."""

    key = ""  # the sequences' own admin key, made just before they run (the stateless fuzzer revokes ids at random)
    key_id = 0

    def setup(self) -> None:
        self.created: dict[int, str] = {}  # key id -> the key, for keys this sequence made
        self.other_blocks = _blocks("other")

    def _own_step(self, case: Any) -> Any:
        """One call the sequence makes itself, checked like every generated one."""
        self.recorder.record_case(case=case)
        return self.step(StepInput.initial(case))

    @initialize(target=_WORKFLOW.bundles["POST /v1/memories -> 201"])
    def a_block_to_follow(self) -> Any:
        """A write (replayed in `validate_response`) whose links the sequence can follow at once."""
        output = self._own_step(_ADD.Case(body={"text": "민지는 고양이 나비를 키워", "kind": "note"}))
        assert output.response.status_code == 201, output.response.text
        return output

    @initialize(target=_WORKFLOW.bundles["POST /v1/keys -> 201"])
    def a_key_to_revoke(self) -> Any:
        """A key of the sequence's own: revoked by the `RevokeKey` link if the sequence follows it, else
        in `teardown` — either way refused at once after."""
        output = self._own_step(_MAKE_KEY.Case(body={"role": "read", "name": "stateful, revoked"}))
        assert output.response.status_code == 201 and int(output.response.json()["id"]) in self.created, \
            output.response.text
        return output

    def before_call(self, case: Any) -> None:
        if case.method == "DELETE" and case.path == "/v1/keys/{key_id}":
            key_id = (case.path_parameters or {}).get("key_id")
            if key_id == self.key_id:
                case.path_parameters["key_id"] = 2**62  # revoking its own key would end the sequence early
            elif key_id in self.created:  # a key about to be revoked works until then
                accepted = _LIST.Case().call(**_bearer(self.created[key_id]))
                assert accepted.status_code == 200, f"key {key_id} refused before its revocation: {accepted.text}"
        if (case.method, case.path) in _WRITES:
            case.headers = {**(case.headers or {}), "Idempotency-Key": f"fuzz-{uuid.uuid4()}"}

    def get_call_kwargs(self, case: Any) -> dict[str, Any]:
        return _bearer(self.key)

    def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
        where = f"{case.method} {case.formatted_path}"
        _SEEN[f"{case.method} {case.path} {response.status_code // 100}xx"] += 1
        assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
        if response.status_code >= 400:
            assert _is_error_body(response), f"{where}: {response.status_code} {response.text[:500]}"
        assert _OTHER_MARKER not in response.text, f"{where} answered another tenant's data"
        if (case.method, case.path) in _WRITES and response.status_code < 300:  # the same write again
            blocks = _blocks("fuzz")
            again = case.call(**self.get_call_kwargs(case))
            assert (again.status_code, again.json()) == (response.status_code, response.json()), where
            assert _blocks("fuzz") == blocks, f"{where}: the retry with the same Idempotency-Key wrote again"
            _SEEN["replayed"] += 1
        if case.method == "POST" and case.path == "/v1/keys" and response.status_code == 201:
            made = response.json()
            self.created[int(made["id"])] = made["key"]
        if case.method == "DELETE" and case.path == "/v1/keys/{key_id}" and response.status_code == 200:
            key = self.created.pop(int(case.path_parameters["key_id"]), None)
            if key is not None:  # revoked: refused at once, on every route, and writes nothing
                blocks = _blocks("fuzz")
                for attempt in (case, _LIST.Case(), _ADD.Case(body={"text": "written with a revoked key"},
                                                              headers={"Idempotency-Key": f"fuzz-{uuid.uuid4()}"})):
                    refused = attempt.call(**_bearer(key))
                    assert refused.status_code == 401 and _is_error_body(refused), \
                        f"{attempt.method} {attempt.formatted_path} with a revoked key: {refused.text[:300]}"
                assert _blocks("fuzz") == blocks, f"{where}: a revoked key wrote"
                _SEEN["revoked and refused"] += 1

    def teardown(self) -> None:
        try:  # every key the sequence made and still holds: revoked now, through the API, and refused at once
            for key_id in list(self.created):
                output = self._own_step(_REVOKE_KEY.Case(path_parameters={"key_id": key_id}))
                assert output.response.status_code == 200 and key_id not in self.created, output.response.text
                _SEEN["revoked at the end"] += 1  # the rest were revoked by the sequence itself, following the link
        finally:
            assert _blocks("other") == self.other_blocks  # nothing reached the other tenant


def test_stateful_sequences_keep_writes_idempotent_revocation_immediate_and_tenants_apart() -> None:
    GieokWorkflow.key, row = _STATE.keys.create("fuzz", "admin", "stateful")
    GieokWorkflow.key_id = row.key_id
    GieokWorkflow.run(settings=settings(max_examples=40, stateful_step_count=8, deadline=None,
                                        suppress_health_check=list(HealthCheck), derandomize=True))
    print(dict(_SEEN))
    assert _SEEN["replayed"] >= 5 and _SEEN["revoked and refused"] >= 1, dict(_SEEN)
    assert _SEEN["GET /v1/memories/{block_index} 2xx"] >= 1, dict(_SEEN)  # a link followed to what was written
