"""The benchmarks' helper processes (the loopback provider, a throwaway Redis): stopped politely,
then forcibly, so that a run never leaves one behind."""

from __future__ import annotations

import subprocess

__all__ = ["stop_child"]


def stop_child(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout` seconds, then SIGKILL."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
