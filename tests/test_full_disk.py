"""A SQLite memory on a filesystem that fills (issue 43 item 4), on a real small filesystem: a
tmpfs of a few MiB mounted by the test (a loop-mounted ext4 image where tmpfs is refused), filled
by a filler file until ENOSPC. A write then fails with `StorageFullError` (HTTP 507 with the JSON
envelope, one line and exit 1 in the CLI), nothing acknowledged before is lost, reads and
searches keep working, and writes resume once the filler is deleted — same process, same
`Memory`, same server — with the hash chain verifying."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli_runner import gieok
from gieok import Memory, StorageFullError
from gieok.client import Client
from gieok.client import StorageFullError as ClientStorageFullError
from gieok.store.full import is_storage_full
from live_server import LiveServer, create_key

SIZE = "4m"  # room for a fresh tenant's schema (its first WAL is ~1.3 MiB) and the blocks written before the fill
TENANT = "fulldisk"
SCOPE = {"guild": "g1", "channel": "cafe", "user": "minji"}
BEFORE_FILL = [f"민지의 메모 {i}: 나비는 고양이야 / note {i}: the cat is called Nabi" for i in range(24)]
REFUSED = "거절된기록 zebrafullword: this write must never be stored"  # words no acknowledged block has


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@contextlib.contextmanager
def small_filesystem(where: Path, size: str = SIZE) -> Iterator[Path]:
    """A filesystem of `size` mounted at `where`: tmpfs, else an ext4 image on a loop device; the
    test is skipped, saying why, when neither can be mounted (not root, no mount permission)."""
    where.mkdir(parents=True, exist_ok=True)
    tried = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)) \
        if shutil.which("mount") else None
    if tried is None or tried.returncode != 0:
        reason = tried.stderr.strip() if tried is not None else "no mount command"
        image = where.with_name(where.name + ".img")
        if not shutil.which("mkfs.ext4"):
            pytest.skip(f"cannot mount a small filesystem: tmpfs refused ({reason}) and there is no mkfs.ext4")
        _run("truncate", "-s", size.upper(), str(image))
        made = _run("mkfs.ext4", "-q", "-F", str(image))
        looped = _run("mount", "-o", "loop", str(image), str(where)) if made.returncode == 0 else made
        if looped.returncode != 0:
            pytest.skip(f"cannot mount a small filesystem: tmpfs refused ({reason}); "
                        f"loop ext4 refused ({looped.stderr.strip()})")
    try:
        yield where
    finally:
        if _run("umount", str(where)).returncode != 0:
            _run("umount", "-l", str(where))  # a process still holding a file: detach it now, freed when it lets go


def fill(where: Path) -> Path:
    """A file that takes every byte left on `where`'s filesystem (written until ENOSPC, unbuffered)."""
    filler = where / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1 << 9):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    assert os.statvfs(where).f_bavail * os.statvfs(where).f_frsize < (1 << 12)
    return filler


def test_a_full_disk_refuses_writes_keeps_reads_and_resumes_without_reopening(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with small_filesystem(tmp_path / "small") as mounted:
        path = mounted / "memory.db"
        memory = Memory(path, ann_threshold=16)  # an HNSW graph too: the file saved beside the database at close
        try:
            acknowledged = {memory.add(text, scope=SCOPE).block_index: text for text in BEFORE_FILL}
            filler = fill(mounted)

            # writes until the first refused one: a WAL with room left in it may take a few more
            refused = None
            for n in range(40):
                try:
                    block = memory.add(f"가득 찬 디스크 {n} / disk nearly full {n}", scope=SCOPE)
                except StorageFullError as exc:
                    refused = exc
                    break
                acknowledged[block.block_index] = block.text
            assert refused is not None, "no write was refused on a full filesystem"
            assert "disk is full" in str(refused)
            last = memory.store.last_block_index()
            with pytest.raises(StorageFullError):
                memory.add(REFUSED, scope=SCOPE)
            assert memory.store.last_block_index() == last  # rolled back whole: no half chain entry

            # reads, searches and the chain while the disk is still full
            assert {i: memory.get(i).text for i in acknowledged} == acknowledged
            hits = memory.search("나비는 고양이", k=5, scope=SCOPE).hits
            assert hits and all(hit.block.block_index in acknowledged for hit in hits)
            assert not [h for h in memory.search("zebrafullword", k=5).hits if "zebrafullword" in h.block.text]
            assert memory.verify().ok

            # the CLI: one readable line and exit 1 for the write; verify still passes
            cli_add = gieok("add", "CLI로 쓰는 기록 / a CLI write", "--db", str(path), "--channel", "cafe")
            assert cli_add.returncode == 1
            assert "error:" in cli_add.stderr and "disk is full" in cli_add.stderr
            assert len(cli_add.stderr.strip().splitlines()) == 1, cli_add.stderr
            cli_verify = gieok("verify", "--db", str(path))
            assert cli_verify.returncode == 0 and "ok" in cli_verify.stdout, cli_verify.stderr

            # space freed: the same Memory writes again, the next index right after the last acknowledged one
            filler.unlink()
            resumed = memory.add("공간이 생겼어 / space is back", scope=SCOPE)
            assert resumed.block_index == max(acknowledged) + 1
            acknowledged[resumed.block_index] = resumed.text
            found = memory.search("space is back", k=3, scope=SCOPE).hits
            assert found and found[0].block.block_index == resumed.block_index
            report = memory.verify()
            assert report.ok and report.checked == len(acknowledged)

            # the graph saved at close cannot be written on a full disk: the close still succeeds,
            # leaving no half-written file behind
            filler = fill(mounted)
        finally:
            memory.close()
        assert "ANN graph was not saved" in caplog.text
        assert sorted(p.name for p in mounted.iterdir() if ".hnsw" in p.name) == []
        filler.unlink()
        with Memory(path, ann_threshold=16) as reopened:  # every acknowledged write is in the file, nothing else
            assert {b.block_index: b.text for b in reopened.store.iter_blocks()} == acknowledged
            assert reopened.verify().ok
            assert reopened.search("space is back", k=3).hits[0].block.block_index == resumed.block_index


@pytest.fixture
def full_disk_server(tmp_path: Path) -> Iterator[tuple[LiveServer, str, Path]]:
    """`gieok serve` whose home file and log are on the ordinary disk and whose tenant `fulldisk`
    lives on the small filesystem (mounted at `<home>.tenants/`): only the tenant's writes run out."""
    home = tmp_path / "home.db"
    with small_filesystem(tmp_path / "home.tenants") as mounted:
        key = create_key(home, TENANT, "write")
        server = LiveServer(home)
        try:
            yield server, key, mounted
        finally:
            server.stop()


def turned(listed: list[dict[str, Any]]) -> set[str]:
    """The ids of the listed messages that are turn blocks in the memory (stored whole, not just in L1)."""
    return {m["external_id"] for m in listed if m["block_index"] is not None}


def test_the_server_answers_507_while_full_and_writes_again_once_space_is_freed(
        full_disk_server: tuple[LiveServer, str, Path]) -> None:
    server, key, mounted = full_disk_server
    headers = {"Authorization": f"Bearer {key}"}
    acknowledged: list[str] = []

    def post(http: httpx.Client, ids: list[str]) -> httpx.Response:
        messages = [{"id": i, "role": "user", "user": "minji", "text": f"민지 메시지 {i}: 오늘 등산 갔어 / hiked today"}
                    for i in ids]
        response = http.post("/v1/conversations/messages", json={"channel": "cafe", "messages": messages})
        if response.status_code == 202:
            acknowledged.extend(ids)
        return response

    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        for n in range(4):
            assert post(http, [f"m{n}a", f"m{n}b"]).status_code == 202
        filler = fill(mounted)
        refused = None
        for n in range(20):
            answer = post(http, [f"f{n}"])
            if answer.status_code != 202:
                refused = answer
                break
        assert refused is not None and refused.status_code == 507, refused and refused.text
        error = refused.json()["error"]
        assert error["type"] == "storage_full" and "disk is full" in error["message"]

        # reads keep working
        listed = http.get("/v1/conversations/messages", params={"channel": "cafe"})
        assert listed.status_code == 200
        assert set(acknowledged) <= turned(listed.json()["messages"])
        searched = http.post("/v1/search", json={"query": "등산", "k": 5})
        assert searched.status_code == 200 and searched.json()["hits"]
        with Client(server.url, api_key=key, retries=0) as client:
            with pytest.raises(ClientStorageFullError, match="disk is full"):
                client.add("클라이언트 기록 / a client write", scope={"channel": "cafe"})
            assert client.verify().ok

        filler.unlink()  # no restart: the same server stores the next messages
        assert post(http, ["after-a", "after-b"]).status_code == 202
        listed = http.get("/v1/conversations/messages", params={"channel": "cafe"}).json()["messages"]
        assert set(acknowledged) <= turned(listed)
        turns = http.get("/v1/memories", params={"channel": "cafe", "limit": 200}).json()["items"]
        assert all(any(f"메시지 {i}:" in b["text"] for b in turns) for i in acknowledged)
        verified = http.get("/v1/verify").json()
        assert verified["ok"] is True
    assert "disk is full" in " ".join(server.log.split())  # each refused write logged, with the reason


def test_an_io_error_counts_as_a_full_disk_only_when_the_filesystem_is_full(tmp_path: Path) -> None:
    """SQLite reports a WAL index or journal that cannot grow as SQLITE_IOERR ("disk I/O error"),
    not SQLITE_FULL: that is a full disk when the database's filesystem has (next to) nothing free."""
    io_error = sqlite3.OperationalError("disk I/O error")
    with small_filesystem(tmp_path / "small") as mounted:
        path = mounted / "memory.db"
        assert not is_storage_full(io_error, path)  # 4 MiB free: a real I/O fault, not a full disk
        filler = fill(mounted)
        assert is_storage_full(io_error, path)
        assert is_storage_full(OSError(errno.ENOSPC, "No space left on device"), path)
        assert not is_storage_full(sqlite3.OperationalError("database is locked"), path)
        filler.unlink()
    assert is_storage_full(sqlite3.OperationalError("database or disk is full"), tmp_path / "anywhere.db")
