"""Schemathesis generates requests from the server's own OpenAPI schema (valid and invalid ones):
no request may get a 5xx, and every error is the JSON error body. Bounded: a few dozen examples
per operation."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from gieok.server import ServerState, create_app
from gieok.server.settings import ServerSettings

pytestmark = pytest.mark.slow  # schemathesis sends a few hundred generated requests

_WORKDIR = Path(tempfile.mkdtemp(prefix="gieok-fuzz-"))
_STATE = ServerState.open(ServerSettings.load(db=str(_WORKDIR / "home.db"), cache_size=0))
_KEY, _ = _STATE.keys.create("fuzz", "admin", "schemathesis")
_APP = create_app(_STATE, owns_state=False)
with _STATE.tenants.use("fuzz") as _tenant:  # something to find, page through and forget
    _tenant.memory.add_many(["민지는 고양이 나비를 키워", "Alex got the offer from Nuvola Labs",
                             "준호는 등산을 좋아해"])

schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)
# The event stream never ends by design; it has tests of its own (test_server.py, test_server_process.py).
schema = schema.exclude(path="/v1/events")


@pytest.fixture(scope="module", autouse=True)
def _close_state() -> Any:
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
