"""Worker supervision for `gieok serve --workers N`: uvicorn's supervisor, with one change.

uvicorn checks each worker every half second: is its process alive, and does it answer a ping
within `timeout_worker_healthcheck` (60 s here, so a worker busy loading a model is not killed
mid-request). A worker killed (kill -9, the OOM killer) while that ping was on its way never
answers, and uvicorn waited out the whole minute before it noticed the death and started a new
worker: measured 59 s (SIGSTOP, then kill -9) and three times in a row in `gieok bench chaos`,
where a second fault in that minute left no worker at all. `WorkerProcess` waits for the answer
in short steps and gives up as soon as the process is gone, so a dead worker is replaced within a
second; a live, busy one still has the whole timeout. Its server is `stopping.Server`, whose stop
ends the worker's open event streams at once."""

from __future__ import annotations

import pickle
import time

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import multiprocess

from .stopping import Server

__all__ = ["WorkerProcess", "install", "a_worker_failed_to_start"]

_STEP_SECONDS = 0.25


# Workers that exited as "failed to start" (their database or Redis stayed away): uvicorn's supervisor
# then stops the server and returns as from a normal stop, so `gieok serve` asks here to exit non-zero.
_failed_to_start: list[int] = []


def a_worker_failed_to_start() -> bool:
    return bool(_failed_to_start)


class WorkerProcess(multiprocess.Process):
    """uvicorn's worker process handle; its health check notices the process's death at once, and
    a worker that failed to start is remembered (`a_worker_failed_to_start`)."""

    def join(self) -> None:
        super().join()
        if self.exitcode == STARTUP_FAILURE and self.process.pid is not None:
            _failed_to_start.append(self.process.pid)

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = Server(config=self.config)
        return self._server  # type: ignore[return-value]

    def _healthcheck(self, timeout: float) -> bool | None:
        try:
            self.parent_conn.send(b"ping")
            deadline = time.monotonic() + timeout
            while True:
                if self.parent_conn.poll(min(_STEP_SECONDS, max(0.0, deadline - time.monotonic()))):
                    started: bool = self.parent_conn.recv()
                    return started
                if not self.process.is_alive() or time.monotonic() >= deadline:
                    return None
        except (OSError, EOFError, pickle.UnpicklingError):
            return None


def install() -> None:
    """Make uvicorn's supervisor start `WorkerProcess`es (it looks the class up at each start)."""
    multiprocess.Process = WorkerProcess  # type: ignore[misc]
