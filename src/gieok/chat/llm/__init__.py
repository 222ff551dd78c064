"""Language models behind one protocol (`LLM`); providers live one per module.

`create_llm(settings)` is the one way the runtime gets a model: it reads `llm_chain` and the
keys from the settings and returns an `LLMRouter` (itself an `LLM`) that rotates keys, cools
rate-limited ones, retries transient errors and falls back along the chain; each client gets
`llm_connect_timeout_seconds`, `llm_first_token_seconds` and `llm_timeout_seconds`, so a provider
that does not answer hands over to the next one within seconds. Provider modules
are imported only when the chain names them (google-genai is slow to import; llama-cpp-python
is an optional extra).
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, MissingExtraError
from ..settings import ChainEntry, ChatSettings, parse_chain
from .base import LLM, ChatMessage, ChatResponse, Role, ToolCall, ToolSpec
from .configured import LLMNotConfiguredError, llm_configured, require_llm
from .failures import LLMTimeoutError
from .router import LLMHealth, LLMRouter, ProviderHealth, Route
from .scripted import ScriptedLLM

__all__ = ["LLM", "ChatMessage", "ChatResponse", "Role", "ToolCall", "ToolSpec", "ScriptedLLM",
           "LLMRouter", "Route", "ChainEntry", "LLMHealth", "ProviderHealth", "parse_chain",
           "create_llm", "DEFAULT_GEMINI_MODEL", "DEFAULT_LOCAL_MODEL",
           "LLMNotConfiguredError", "llm_configured", "require_llm", "LLMTimeoutError"]

DEFAULT_GEMINI_MODEL = "gemini-2.5-flash"
DEFAULT_LOCAL_MODEL = "qwen2.5:7b"  # served by Ollama at openai_base_url's default


def _key_label(index: int, key: str) -> str:
    # Enough to tell keys apart in logs and health, never enough to leak one.
    return f"key {index + 1} (…{key[-4:]})" if len(key) >= 12 else f"key {index + 1}"


def _route(entry: ChainEntry, settings: ChatSettings) -> Route:
    if entry.provider == "gemini":
        gemini_keys = settings.gemini_keys
        if not gemini_keys:
            raise ConfigError(f"llm_chain entry {entry.label!r} needs a Gemini API key: "
                              "set GIEOK_GEMINI_API_KEYS (comma-separated) or GIEOK_GEMINI_API_KEY")
        try:  # google-genai (the gemini extra) takes ~1 s to import: only when the chain names gemini
            from .gemini import GeminiLLM
        except ImportError as exc:
            raise MissingExtraError(f"llm_chain entry {entry.label!r}", "gemini", exc.name) from None

        clients: list[LLM] = [GeminiLLM(entry.model, key, base_url=settings.gemini_base_url or None,
                                        timeout=settings.llm_timeout_seconds,
                                        connect_timeout=settings.llm_connect_timeout_seconds,
                                        first_token_timeout=settings.llm_first_token_seconds)
                              for key in gemini_keys]
        return Route(entry.label, clients, [_key_label(i, k) for i, k in enumerate(gemini_keys)])
    if entry.provider == "openai":
        # loaded with the chain that names it, like its siblings
        from .openai_compat import OpenAICompatLLM

        keys = settings.openai_keys or ("",)  # local servers (Ollama, llama.cpp) take no key
        base_url = entry.base_url or settings.openai_base_url
        clients = [OpenAICompatLLM(entry.model, base_url, key, timeout=settings.llm_timeout_seconds,
                                   connect_timeout=settings.llm_connect_timeout_seconds,
                                   first_token_timeout=settings.llm_first_token_seconds,
                                   json_mode=settings.openai_json_mode)  # type: ignore[arg-type]
                   for key in keys]
        return Route(entry.label, clients, [_key_label(i, k) if k else "no key" for i, k in enumerate(keys)])
    from .llamacpp import LlamaCppLLM  # llama-cpp-python is an optional extra

    return Route(entry.label, [LlamaCppLLM(entry.model, n_ctx=settings.llamacpp_n_ctx,
                                           chat_format=settings.llamacpp_chat_format or None)], ["local"])


def create_llm(settings: ChatSettings | None = None, *, chain: str | None = None, **router_options: Any) -> LLMRouter:
    """The router for `settings.llm_chain` (or `chain`); `router_options` go to `LLMRouter`
    (e.g. `clock=`, `sleep=` in tests). An empty chain means `gemini:gemini-2.5-flash` when a
    Gemini key is set, else `openai:qwen2.5:7b` at `openai_base_url` (a local Ollama)."""
    if settings is None:
        settings = ChatSettings()
    entries = settings.llm_chain if chain is None else parse_chain(chain)
    if not entries:
        entries = parse_chain(f"gemini:{DEFAULT_GEMINI_MODEL}" if settings.gemini_keys
                              else f"openai:{DEFAULT_LOCAL_MODEL}")
    routes = [_route(entry, settings) for entry in entries]
    options: dict[str, Any] = {
        "max_retries": settings.llm_max_retries,
        "backoff_seconds": settings.llm_backoff_seconds,
        "cooldown_seconds": settings.llm_cooldown_seconds,
        "auth_cooldown_seconds": settings.llm_auth_cooldown_seconds,
    }
    options.update(router_options)
    return LLMRouter(routes, **options)
