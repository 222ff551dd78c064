"""Issue 43: a serve process caps glibc's allocator arenas (server/malloc_arenas.py).

Each case is a fresh Python process (the cap holds for arenas still to be made): eight threads
allocate at once, then glibc's `malloc_stats` lists the arenas it made.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

PROBE = """
import ctypes, os, sys, threading
if sys.argv[1] == "limit":
    from gieok.server.malloc_arenas import limit_malloc_arenas
    print("took", limit_malloc_arenas(), os.environ["MALLOC_ARENA_MAX"], file=sys.stderr)
together = threading.Barrier(8)
kept = []
def allocate():
    together.wait()
    kept.append([bytearray(100_000) for _ in range(20)])  # above pymalloc's sizes: glibc's malloc
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
"""


def _arenas(mode: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env={**clean, **env}, capture_output=True,
                          text=True, timeout=60, check=True)
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines()), done.stderr


def test_the_cap_holds_where_threads_would_each_take_an_arena() -> None:
    uncapped, _ = _arenas("none")
    capped, said = _arenas("limit")
    assert uncapped > 2  # without it, eight threads allocating at once get arenas of their own
    assert capped == 2
    assert "took True 2" in said  # …and passed on in the environment to the workers started after


def test_an_operators_own_setting_is_kept() -> None:
    capped, said = _arenas("limit", MALLOC_ARENA_MAX="4")
    assert capped == 4
    assert "took True 4" in said


def test_a_value_that_is_not_a_number_is_left_to_glibc() -> None:
    _, said = _arenas("limit", MALLOC_ARENA_MAX="many")
    assert "took False many" in said
