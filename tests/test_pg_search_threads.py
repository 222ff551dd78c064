"""The threads a database-mode search asks its second question on (store/postgres/search_index.py)
are one pool per process; a forked child (a server forking workers after warming up) must not
reuse the parent's pool, whose threads did not come along — its work would wait forever."""

from __future__ import annotations

import os

import pytest

from gieok.store.postgres import search_index

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_a_forked_child_makes_its_own_threads_and_they_run() -> None:
    parent_pool = search_index._second_connection()
    assert parent_pool.submit(lambda: "parent").result(timeout=5) == "parent"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        try:
            pool = search_index._second_connection()
            answer = pool.submit(lambda: "child").result(timeout=5)
            os.write(write, f"{pool is not parent_pool} {answer}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "True child"
    assert status == 0
    assert search_index._second_connection() is parent_pool  # the parent keeps its own
