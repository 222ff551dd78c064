"""Settings: read from defaults < gieok.toml < GIEOK_* < arguments, parsed and checked once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gieok.config import ChainEntry, Settings, load_settings
from gieok.errors import ConfigError


def test_multi_valued_settings_are_parsed_once_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIEOK_CALL_NAMES", " 하늘 , Haneul,,")
    monkeypatch.setenv("GIEOK_SELF_CORRECTIONS", "저는 AI 어시스턴트=>나는 하늘; Nuri=>하늘")
    monkeypatch.setenv("GIEOK_GEMINI_API_KEY", "first")
    monkeypatch.setenv("GIEOK_GEMINI_API_KEYS", "second\nfirst, third")
    monkeypatch.setenv("GIEOK_DISCORD_OWNER_IDS", "123, 456")
    monkeypatch.setenv("GIEOK_LLM_CHAIN", "gemini:gemini-2.5-flash, openai:qwen2.5:7b@http://127.0.0.1:8080/v1")
    s = load_settings()
    assert s.call_names == ("하늘", "Haneul")
    assert s.self_corrections == (("저는 AI 어시스턴트", "나는 하늘"), ("Nuri", "하늘"))
    assert s.gemini_api_keys == ("second", "first", "third")
    assert s.gemini_keys == ("first", "second", "third")
    assert s.discord_owner_ids == (123, 456)
    assert s.llm_chain == (ChainEntry("gemini", "gemini-2.5-flash"),
                           ChainEntry("openai", "qwen2.5:7b", "http://127.0.0.1:8080/v1"))


def test_toml_lists_and_strings_both_work(tmp_path: Path) -> None:
    config = tmp_path / "gieok.toml"
    config.write_text('[gieok]\ncall_names = ["누리", "Nuri"]\nopenai_api_keys = "a,b"\nrecall_k = 7\n',
                      encoding="utf-8")
    s = load_settings(config)
    assert s.call_names == ("누리", "Nuri") and s.openai_keys == ("a", "b") and s.recall_k == 7


def test_with_overrides_parses_and_checks_again() -> None:
    s = load_settings().with_overrides(call_names="별,Star", llm_chain="")
    assert s.call_names == ("별", "Star") and s.llm_chain == ()
    with pytest.raises(ConfigError, match="call_names must not be empty"):
        s.with_overrides(call_names=" , ")


def test_direct_construction_is_checked_too() -> None:
    assert Settings(call_names="a,b").call_names == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ann_backend must be one of"):
        Settings(ann_backend="annoy")


@pytest.mark.parametrize("name, value, message", [
    ("discord_owner_ids", "123,abc", "numeric ids"),
    ("self_corrections", "no arrow here", "wrong=>right"),
    ("llm_chain", "gpt:4", "llm_chain entry"),
    ("reply_max_chars", "50", "reply_max_chars must be within 100..4000"),
    ("timezone", "Mars/Olympus", "IANA time zone"),
    ("github_api_url", "ftp://x", "http(s) URL"),
    ("fusion", "max", "fusion must be one of"),
    ("recall_k", "many", "must be int"),
    ("layers", "maybe", "must be bool"),
    ("gatekeeper_threshold", "1.5", "must be in (0, 1]"),
])
def test_bad_values_name_the_setting_and_its_source(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                   message: str) -> None:
    monkeypatch.setenv(f"GIEOK_{name.upper()}", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert message in str(info.value) and name in str(info.value)


def test_unknown_settings_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "gieok.toml"
    config.write_text("recal_k = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown setting 'recal_k'"):
        load_settings(config)
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings().with_overrides(not_a_setting=1)
