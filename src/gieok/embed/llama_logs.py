"""llama.cpp's own log lines, sent to Python logging (`gieok.llama_cpp`) instead of stderr:
shared by the GGUF embedder here and the chat's llama.cpp model provider."""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

__all__ = ["route_llama_logs"]

log = logging.getLogger("gieok.llama_cpp")

# ggml's `enum ggml_log_level`: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (a continuation).
_GGML_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
_log_callback: Any = None  # kept referenced: llama.cpp calls it for as long as the process runs
_log_lock = threading.Lock()  # two models loading at once must not install two callbacks


def route_llama_logs() -> None:
    """Send llama.cpp's log lines to `log` instead of stderr (process-wide, set once)."""
    global _log_callback
    import llama_cpp  # importing it installs llama-cpp-python's own callback, which this replaces

    with _log_lock:
        if _log_callback is not None:
            return

        @llama_cpp.llama_log_callback
        def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            try:
                message = text.decode("utf-8", "replace").rstrip()
                if message:
                    log.log(_GGML_LOG_LEVELS.get(level, logging.DEBUG), "llama.cpp: %s", message)
            except Exception:  # an exception must not cross back into C
                pass

        _log_callback = callback
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
