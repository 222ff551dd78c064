"""The deployment `gieok bench chaos` breaks: two bot processes (`bench.chaos_bot`) and one
`gieok serve --workers 2` on one PostgreSQL and one Redis, and the harness's supervision of them.

- `BotProcess`: one bot; its stdout lines go into the history as they come (a reader thread),
  messages reach its stdin through a queue (a writer thread), so a stopped or dead process never
  blocks the driver. When it exits — killed by a fault or on its own — it is started again, as a
  service manager would; exits nobody asked for are counted (`unexpected_exits`).
- `ServeWorkers`: `gieok serve --workers 2`: uvicorn's own supervisor restarts a killed worker;
  the harness watches the worker processes to know when both are serving again, and counts
  workers that died without being killed.

Every child listens on (or talks to) loopback only, and `close()` stops them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from benchmarks.chaos_bot import READY
from benchmarks.chaos_load import History
from benchmarks.children import stop_child
from benchmarks.server import ServeProcess

__all__ = ["BotProcess", "ServeWorkers", "BOT_START_SECONDS"]

BOT_START_SECONDS = 300.0  # loading the model and the classifiers on a busy two-core machine
RESTART_DELAY = 0.5  # a service manager's pause before it starts a dead process again


class BotProcess:
    """One supervised bot process (module docstring)."""

    def __init__(self, name: str, command: list[str], history: History, log: Path,
                 on_ready: Callable[[BotProcess], None] | None = None) -> None:
        self.name = name
        self.on_ready = on_ready  # called (in the reader thread) each time the process says it is ready
        self.command = command
        self.history = history
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.ready = threading.Event()
        self.starts = 0
        self.unexpected_exits = 0
        self.undelivered = 0
        self._expected_exit = False
        self._closing = False
        self._inbox: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self.start()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self.ready.clear()
            self._expected_exit = False
            self._inbox = queue.Queue()
            threads = os.environ.get("OMP_NUM_THREADS") or "1"  # two engines on two shared cores
            self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=self.log.open("a", encoding="utf-8"), text=True,
                                            encoding="utf-8", env={**os.environ, "OMP_NUM_THREADS": threads})
            self.starts += 1
            process, inbox = self.process, self._inbox
        threading.Thread(target=self._read, args=(process,), name=f"{self.name}-out", daemon=True).start()
        threading.Thread(target=self._write, args=(process, inbox), name=f"{self.name}-in", daemon=True).start()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["proc"] = self.name
            if event.get("ev") == READY:
                self.ready.set()
                if self.on_ready is not None:
                    self.on_ready(self)
            self.history.add("bot_events", event)
        code = process.wait()
        self.ready.clear()
        with self._lock:
            if process is not self.process:
                return
            expected = self._expected_exit or self._closing
            if not expected:
                self.unexpected_exits += 1
                self.history.add("bot_events", {"ev": "exit", "proc": self.name, "code": code, "t": time.time()})
            if self._closing:
                return
        time.sleep(RESTART_DELAY)
        with self._lock:
            if self._closing or process is not self.process:
                return
        self.start()

    def _write(self, process: subprocess.Popen[str], inbox: queue.Queue[str | None]) -> None:
        stdin: IO[str] | None = process.stdin
        assert stdin is not None
        while (line := inbox.get()) is not None:
            try:
                stdin.write(line)
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.undelivered += 1
        with contextlib.suppress(OSError):
            stdin.close()

    def deliver(self, item: dict[str, Any]) -> bool:
        """Queue a message for this process; False when it is not running (not started yet)."""
        if not self.ready.is_set() or not self.alive:
            return False
        self._inbox.put(json.dumps(item, ensure_ascii=False) + "\n")
        return True

    # -- faults ------------------------------------------------------------------------------
    def kill(self) -> None:
        """kill -9; the reader thread starts it again."""
        with self._lock:
            self._expected_exit = True
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def close(self, timeout: float = 120.0) -> int | None:
        """End of stdin (the core answers what it holds and shuts down gracefully), then SIGTERM,
        then SIGKILL. Returns the exit code."""
        with self._lock:
            self._closing = True
            process, inbox = self.process, self._inbox
        if process is None:
            return None
        process.send_signal(signal.SIGCONT)
        inbox.put(None)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_child(process)
            return process.returncode


def bot_command(db: str, redis: str, namespace: str, llm_url: str, lease_seconds: float) -> list[str]:
    return [sys.executable, "-m", "benchmarks.chaos_bot", "--db", db, "--redis", redis, "--namespace", namespace,
            "--llm-url", llm_url, "--lease-seconds", str(lease_seconds)]


class ServeWorkers:
    """`gieok serve --workers 2` (module docstring)."""

    def __init__(self, db: str, redis: str, namespace: str, log: Path, workers: int = 2) -> None:
        self.workers = workers
        self.serve = ServeProcess(db, log, workers=workers,
                                  extra_args=["--redis", redis],
                                  env={**os.environ, "GIEOK_REDIS_NAMESPACE": namespace,
                                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "1"})
        self.url = self.serve.url
        self.killed: set[int] = set()
        self.unexpected_exits = 0
        self._known: set[int] = set(self.worker_pids())
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_workers, name="chaos-serve-watch", daemon=True)
        self._watch.start()

    def worker_pids(self) -> list[int]:
        import psutil

        try:
            children = psutil.Process(self.serve.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        pids = []
        for child in children:
            try:  # uvicorn's supervisor also starts multiprocessing's resource tracker: workers run the app
                if child.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in " ".join(child.cmdline()):
                    continue
            except psutil.Error:  # gone meanwhile
                continue
            pids.append(child.pid)
        return pids

    def _watch_workers(self) -> None:
        while not self._stop.wait(0.5):
            now = set(self.worker_pids())
            gone = self._known - now
            self.unexpected_exits += len(gone - self.killed)
            self._known = now

    def serving(self) -> bool:
        """Every worker process is up and warm: uvicorn logs "Started server process [pid]" once the
        app factory returned (the memory and the key table are open), and gieok "ready — warm in …
        [process pid]" once the models and indexes are loaded. (A worker that answers only 503
        "warming" is not serving: killing its sibling then would leave no worker at all.)"""
        pids = self.worker_pids()
        if len(pids) < self.workers or self.serve.process.poll() is not None:
            return False
        try:
            log = self.serve.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return all(f"Started server process [{pid}]" in log and f"[process {pid}]" in log for pid in pids)

    def kill_one(self, choose: Any) -> int | None:
        pids = self.worker_pids()
        if not pids:
            return None
        pid = int(choose(sorted(pids)))
        self.killed.add(pid)
        os.kill(pid, signal.SIGKILL)
        return pid

    def close(self) -> int | None:
        self._stop.set()
        return self.serve.stop()
