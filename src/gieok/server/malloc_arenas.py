"""How many allocator arenas a server process uses (glibc's `MALLOC_ARENA_MAX`), issue 43.

glibc gives each thread that allocates its own arena, up to eight per core, and keeps what is
freed in an arena for that arena's next use. A serve worker runs requests on a pool of threads,
each embedding, ranking and reading rows with buffers of every size, so each arena grows to the
largest mix it ever held: a worker's resident memory climbed with its arenas' peaks while the
bot processes, with few threads, stayed flat (docs/scale-out.md, the soak). Two arenas hold the
same work with a fraction of that growth; threads then share them, which costs little on a machine
of a few cores, where the work (numpy, onnxruntime, the database driver) runs a few threads at a time.

The limit is a default: a `MALLOC_ARENA_MAX` already in the environment is the operator's choice
and is kept. It is set in the environment too, so worker processes started from here (`gieok
serve --workers N`) have it from their start.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["SERVER_MALLOC_ARENAS", "limit_malloc_arenas"]

SERVER_MALLOC_ARENAS = 2
_VARIABLE = "MALLOC_ARENA_MAX"
_M_ARENA_MAX = -8  # mallopt's parameter number in glibc's malloc.h


def limit_malloc_arenas(arenas: int = SERVER_MALLOC_ARENAS) -> bool:
    """Cap this process's glibc arenas at `arenas` (or at `MALLOC_ARENA_MAX` when it is set) for
    the arenas still to be made, and pass the cap on to child processes. True when glibc took it;
    False elsewhere (not Linux, another C library, a value that is not a number)."""
    chosen = os.environ.setdefault(_VARIABLE, str(arenas))
    if not sys.platform.startswith("linux"):
        return False
    try:
        limit = int(chosen)
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (ValueError, OSError, AttributeError):  # not a number; musl and others have no mallopt
        return False
    if limit < 1:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, limit))
