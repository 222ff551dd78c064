"""Is a language model configured? The front-ends (`gieok chat`, the Discord bot) ask before
opening anything.

`create_llm` never refuses an empty configuration: with no chain and no key it points at a local
Ollama on the default port, which suits a library but not a command someone just typed — it
would open the memory, load the embedder and only then fail on the first message with a
connection error that does not say what to set. So the commands check first, and say in one line
which variable (or gieok.toml key) makes it work.

Configured means any of: `llm_chain` is set (whatever it names, including a local
`openai:<model>` at `openai_base_url` or a `llamacpp:` GGUF file), a Gemini key
(`gemini_api_key` / `gemini_api_keys`), or an OpenAI-compatible key (`openai_api_key` /
`openai_api_keys`, used with the default chain at `openai_base_url`).
"""

from __future__ import annotations

from ...errors import ConfigError
from ..settings import ChatSettings

__all__ = ["LLMNotConfiguredError", "llm_configured", "require_llm", "NOT_CONFIGURED_MESSAGE"]

NOT_CONFIGURED_MESSAGE = ("no language model configured: set GIEOK_GEMINI_API_KEY (Gemini) or "
                          "GIEOK_LLM_CHAIN=openai:<model> with GIEOK_OPENAI_BASE_URL (Ollama, llama.cpp …), "
                          "in the environment or in gieok.toml")


class LLMNotConfiguredError(ConfigError):
    """No provider is configured; the message names the settings that would configure one."""


def llm_configured(settings: ChatSettings) -> bool:
    """Whether the settings name a language model (see the module docstring for the rule)."""
    return bool(settings.llm_chain or settings.gemini_keys or settings.openai_keys)


def require_llm(settings: ChatSettings) -> None:
    """Raise `LLMNotConfiguredError` (one line, printed by `gieok`'s error handler) unless a
    language model is configured. Cheap: reads the settings only, opens nothing."""
    if not llm_configured(settings):
        raise LLMNotConfiguredError(NOT_CONFIGURED_MESSAGE)
