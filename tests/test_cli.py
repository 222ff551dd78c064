"""The `gieok` command line: exit codes, one-line errors, output. Run in process through the
real entry point (`gieok.cli.main`, see cli_runner.py); one test runs the installed console
script as its own process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import gieok


@pytest.mark.slow
def test_the_console_script_runs_and_exits_1_with_one_line_on_an_error(tmp_path: Path) -> None:
    """The `gieok` executable pip installed, as a shell runs it: help, exit 0; an error, exit 1."""
    script = shutil.which("gieok", path=str(Path(sys.executable).parent))
    assert script is not None, "the gieok console script is not installed next to this Python"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}, "COLUMNS": "200"}
    shown = subprocess.run([script, "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0 and "search" in shown.stdout and "Example: gieok demo" in shown.stdout
    failed = subprocess.run([script, "get", "99", "--db", str(tmp_path / "e.db")], capture_output=True, text=True,
                            env=env, timeout=300)
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("error:") and failed.stderr.count("\n") == 1 and "no block" in failed.stderr


def test_help_has_examples():
    result = gieok("--help")
    assert result.returncode == 0
    for command in ("add", "search", "stats", "verify", "forget", "export", "import", "reindex", "demo", "bench"):
        assert command in result.stdout
    search_help = gieok("search", "--help")
    assert "Example:" in search_help.stdout


def test_add_search_stats_verify_forget_roundtrip(tmp_path):
    db = tmp_path / "cli.db"
    added = gieok("add", "민지: 우리 고양이 이름은 보리야", "--channel", "general", "--speaker", "민지", "--json",
                  env_db=db)
    assert added.returncode == 0, added.stderr
    block = json.loads(added.stdout)
    assert block["block_index"] == 1 and block["scope"]["channel"] == "general"
    assert gieok("add", "Alex: I got the job offer today", "--channel", "general", "--db", str(db)).returncode == 0

    found = gieok("search", "민지 고양이 이름", "--channel", "general", "--json", "--db", str(db))
    assert found.returncode == 0, found.stderr
    payload = json.loads(found.stdout)
    assert payload["source"] in ("full", "cache", "checkpoint", "working_memory") and payload["result_count"] >= 1
    assert payload["hits"][0]["block"]["text"].startswith("민지")
    assert set(payload["hits"][0]["breakdown"]) >= {"bm25", "vector", "fused", "neighbour", "final"}

    table = gieok("search", "job offer", "--db", str(db))
    assert "layer: full" in table.stdout and "ms" in table.stdout

    stats = json.loads(gieok("stats", "--json", "--db", str(db)).stdout)
    assert stats["blocks"] == 2 and stats["live_blocks"] == 2 and stats["dimension"] == 384

    refused = gieok("forget", "1", "--db", str(db), stdin="")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    assert gieok("forget", "1", "--yes", "--db", str(db)).returncode == 0
    verified = gieok("verify", "--json", "--db", str(db))
    assert verified.returncode == 0 and json.loads(verified.stdout)["forgotten"] == 1


def test_export_import_via_cli(tmp_path):
    db, restored, dump = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "dump.jsonl"
    for text in ("지훈: 4월 18일에 부산 가", "Emily: my birthday is May 9"):
        assert gieok("add", text, "--channel", "c1", "--db", str(db)).returncode == 0
    assert gieok("export", str(dump), "--db", str(db)).returncode == 0
    result = gieok("import", str(dump), "--db", str(restored))
    assert result.returncode == 0, result.stderr
    dump2 = tmp_path / "dump2.jsonl"
    assert gieok("export", str(dump2), "--db", str(restored)).returncode == 0
    assert dump.read_bytes() == dump2.read_bytes()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("add", "   "), "empty"),
        (("add", "x", "--importance", "3"), "importance"),
        (("add", "x", "--kind", "poem"), "unknown kind"),
        (("search", "cat", "-k", "0"), "k must be"),
        (("get", "99"), "no block"),
        (("get", "9" * 30), "no block"),
        (("bench", "locomo", "--data", "/nonexistent.json"), "not found"),
    ],
)
def test_errors_are_one_readable_line(tmp_path, args, fragment):
    db = tmp_path / "e.db"
    result = gieok(*args, "--db", str(db))
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_corrupt_and_unwritable_databases(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(os.urandom(4096))
    result = gieok("stats", "--db", str(corrupt))
    assert result.returncode == 1 and "error:" in result.stderr and "Traceback" not in result.stderr
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    result = gieok("add", "hello", "--db", str(blocker / "m.db"))
    assert result.returncode == 1 and "error:" in result.stderr
    assert corrupt.read_bytes() != b"" and blocker.read_text() == "not a directory"


@pytest.mark.slow
def test_demo_refuses_foreign_files(tmp_path):
    """(The demo's own run, through this same entry point: tests/test_demo.py.)"""
    other = tmp_path / "mine.db"
    assert gieok("add", "keep me", "--db", str(other)).returncode == 0
    refused = gieok("demo", "--db", str(other))
    assert refused.returncode == 1 and "not a gieok demo database" in refused.stderr
    assert json.loads(gieok("stats", "--json", "--db", str(other)).stdout)["blocks"] == 1


def test_reindex_command(tmp_path):
    db = tmp_path / "r.db"
    assert gieok("add", "민지: 고양이 이름은 보리야", "--channel", "c", "--db", str(db)).returncode == 0
    result = gieok("reindex", "--embedder", "use", "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert "re-embedded 1 blocks" in result.stdout
    assert json.loads(gieok("stats", "--json", "--db", str(db)).stdout)["dimension"] == 512
    missing = gieok("reindex", "--db", str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert not (tmp_path / "nope.db").exists()


def test_keys_create_names_the_memory_that_holds_the_key(tmp_path):
    """A key is only good for a server on the same --db: the command says which memory it wrote
    to, on stderr (stdout stays the key alone, for `export GIEOK_KEY="$(gieok keys create …)"`)
    and in --json; list and revoke name it too."""
    db = tmp_path / "chat.db"
    made = gieok("keys", "create", "--tenant", "default", "--role", "write", "--db", str(db))
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().startswith("gk_") and len(made.stdout.strip().splitlines()) == 1
    assert str(db.resolve()) in made.stderr and f"gieok serve --db {db.resolve()}" in made.stderr
    as_json = json.loads(gieok("keys", "create", "--tenant", "acme", "--db", str(db), "--json").stdout)
    assert as_json["db"] == str(db.resolve()) and as_json["tenant"] == "acme"
    assert str(db.resolve()) in gieok("keys", "list", "--db", str(db)).stdout
    revoked = gieok("keys", "revoke", str(as_json["id"]), "--db", str(db))
    assert revoked.returncode == 0 and f"revoked key {as_json['id']} in {db.resolve()}" in revoked.stdout
