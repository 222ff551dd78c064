"""Settings: one section per ring (engine `Settings`, `ChatSettings`, `ServerSettings`), read from
defaults < gieok.toml < GIEOK_* < arguments by `load()` only, parsed and checked once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gieok.chat.settings import ChainEntry, ChatSettings
from gieok.config import Settings, load_settings
from gieok.errors import ConfigError
from gieok.server.settings import ServerSettings


def test_multi_valued_settings_are_parsed_once_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIEOK_CALL_NAMES", " 하늘 , Haneul,,")
    monkeypatch.setenv("GIEOK_SELF_CORRECTIONS", "저는 AI 어시스턴트=>나는 하늘; Nuri=>하늘")
    monkeypatch.setenv("GIEOK_GEMINI_API_KEY", "first")
    monkeypatch.setenv("GIEOK_GEMINI_API_KEYS", "second\nfirst, third")
    monkeypatch.setenv("GIEOK_DISCORD_OWNER_IDS", "123, 456")
    monkeypatch.setenv("GIEOK_LLM_CHAIN", "gemini:gemini-2.5-flash, openai:qwen2.5:7b@http://127.0.0.1:8080/v1")
    s = ChatSettings.load()
    assert s.call_names == ("하늘", "Haneul")
    assert s.self_corrections == (("저는 AI 어시스턴트", "나는 하늘"), ("Nuri", "하늘"))
    assert s.gemini_api_keys == ("second", "first", "third")
    assert s.gemini_keys == ("first", "second", "third")
    assert s.discord_owner_ids == (123, 456)
    assert s.llm_chain == (ChainEntry("gemini", "gemini-2.5-flash"),
                           ChainEntry("openai", "qwen2.5:7b", "http://127.0.0.1:8080/v1"))


def test_each_ring_declares_its_own_fields_and_contains_the_inner_ones() -> None:
    engine, chat, server = Settings(), ChatSettings(), ServerSettings()
    assert not hasattr(engine, "bot_name") and not hasattr(engine, "server_port")
    assert not hasattr(chat, "server_port") and chat.bot_name == "누리"
    assert server.server_port == 8420 and server.bot_name == "누리" and server.wm_slots == 4
    assert isinstance(server, ChatSettings) and isinstance(chat, Settings)
    assert ChatSettings.over(Settings(wm_slots=2)).wm_slots == 2  # the chat's settings on an engine's values


def test_toml_sections_and_the_flat_form(tmp_path: Path) -> None:
    config = tmp_path / "gieok.toml"
    config.write_text('[engine]\nwm_slots = 3\n[chat]\ncall_names = ["누리", "Nuri"]\nopenai_api_keys = "a,b"\n'
                      '[server]\nserver_port = 9001\n[tool.other]\nanything = 1\n', encoding="utf-8")
    s = ServerSettings.load(config)
    assert s.call_names == ("누리", "Nuri") and s.openai_keys == ("a", "b") and s.wm_slots == 3
    assert s.server_port == 9001
    engine = load_settings(config)  # the engine reads its own table and leaves the others to their rings
    assert engine.wm_slots == 3 and type(engine) is Settings
    flat = tmp_path / "flat.toml"
    flat.write_text('[gieok]\ncall_names = ["누리", "Nuri"]\nrecall_k = 7\nwm_slots = 2\n', encoding="utf-8")
    assert ChatSettings.load(flat).recall_k == 7 and load_settings(flat).wm_slots == 2


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "gieok.toml"
    config.write_bytes("[engine]\nwm_slots = 3 # 세 칸\n".encode("cp949"))  # saved by an editor in the Korean code page
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(config)


def test_a_key_under_the_wrong_section_says_where_it_belongs(tmp_path: Path) -> None:
    config = tmp_path / "gieok.toml"
    config.write_text("[engine]\nbot_name = \"별\"\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown setting 'bot_name' under \[engine\].*belongs under \[chat\]"):
        ServerSettings.load(config)


def test_with_overrides_parses_and_checks_again() -> None:
    s = ChatSettings.load().with_overrides(call_names="별,Star", llm_chain="")
    assert s.call_names == ("별", "Star") and s.llm_chain == () and type(s) is ChatSettings
    with pytest.raises(ConfigError, match="call_names must not be empty"):
        s.with_overrides(call_names=" , ")


def test_direct_construction_is_checked_too() -> None:
    assert ChatSettings(call_names="a,b").call_names == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ann_backend must be one of"):
        Settings(ann_backend="annoy")
    with pytest.raises(ConfigError, match="guard_second_low must not exceed guard_second_high"):
        ServerSettings(guard_second_low=0.9, guard_second_high=0.5)


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
    ("server_port", "0", "server_port must be within 1..65535"),
])
def test_bad_values_name_the_setting_and_its_source(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                   message: str) -> None:
    monkeypatch.setenv(f"GIEOK_{name.upper()}", value)
    with pytest.raises(ConfigError) as info:
        ServerSettings.load()
    assert message in str(info.value) and name in str(info.value)


def test_unknown_settings_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "gieok.toml"
    config.write_text("recal_k = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown setting 'recal_k'"):
        ServerSettings.load(config)
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings().with_overrides(not_a_setting=1)
    with pytest.raises(ConfigError, match="unknown setting 'bot_name'"):
        Settings().with_overrides(bot_name="별")  # a chat setting is not the engine's


def test_secrets_stay_out_of_the_repr() -> None:
    s = ServerSettings(gemini_api_key="AIzaSECRET1", openai_api_key="sk-SECRET2", gemini_api_keys="k-SECRET3",
                       discord_token="SECRET4.token", api_key="gk_abcdef01_SECRET5", github_token="ghp_SECRET6",
                       db="postgresql://gieok:SECRET7@db.example/gieok", redis="redis://:SECRET8@cache:6379/0")
    shown = repr(s) + str(s)
    assert "SECRET" not in shown, shown
    assert "postgresql://gieok:***@db.example/gieok" in shown and "redis://:***@cache:6379/0" in shown
    assert s.gemini_api_key == "AIzaSECRET1"  # only hidden, never lost
