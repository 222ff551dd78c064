"""A memory to and from JSON lines, and re-embedding in place — the facade's bulk operations,
beside `store/transfer.py` (a whole store copied to another backend with its vectors).

- **export**: a header, then every block in index order, tombstones too;
- **import**: every line checked first (JSON, fields, digests, hashes, links) and nothing written
  unless all pass; into an empty memory the chain is kept exactly, into another one the live
  blocks are appended anew — except those the memory holds already (a live block with the same
  content digest, kind, scope and event time), so importing an export back into the memory it
  came from, or twice into another, writes nothing the second time;
- **reindex**: every live block re-embedded with another embedder in one transaction.

The facade hands these functions what they need, never itself: an export reads the memory's
`Store`; an import writes through the memory's `WritePath` (memory/writes.py says which of its
members an import uses). Nothing here reaches into `Memory`, and no other part of memory/ imports
this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, nullcontext
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..chain import GENESIS, digest_of, hash_of
from ..config import Settings
from ..config.settings import is_database_url
from ..embed import Priority, create_embedder, embed_ahead
from ..errors import ImportFormatError, InvalidInputError
from ..retrieval.passages import PASSAGES_KEY, PassageContext
from ..store.base import Store
from ..store.factory import open_store
from ..types import Block, Scope
from ..validate import check_importance, check_kind, clean_text
from .embedding import DEFAULT_EMBEDDER
from .ingest import passage_source
from .writes import WRITE_CHUNK, Progress, WritePath

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "export_lines", "export_jsonl", "import_jsonl", "reindex",
           "sidecar_path", "remove_memory_files"]

EXPORT_FORMAT = "gieok-blocks"
EXPORT_VERSION = 1
IMPORT_GROUP = 4096  # records per `write_chunked` of an import into a memory that is not empty
# An import into a memory that holds blocks builds the store's vector graph once after it (PostgreSQL;
# store.vector_index_deferred) when it brings at least this many and the memory holds at most
# RATIO × as many: a vector inserted into the graph costs ~15 × what building over it does.
DEFER_INDEX_MIN = 1000
DEFER_INDEX_RATIO = 5


def export_lines(store: Store) -> Iterator[str]:
    """The export as lines (newline included): a header, then every block in index order."""
    header = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
              "embedder": store.get_meta("embedder"), "blocks": store.counts()["blocks"]}
    yield json.dumps(header, ensure_ascii=False) + "\n"
    for block in store.iter_blocks():
        yield json.dumps(block.as_dict(), ensure_ascii=False, sort_keys=True) + "\n"


def export_jsonl(store: Store, out: str | os.PathLike[str] | IO[str], progress: Progress | None = None) -> int:
    """Write the export to a file or stream; returns the number of blocks. A file is written whole
    or not at all: beside it first, then renamed over it — an export that fails midway (a damaged
    block, a full disk) left a partial file in place of the backup it was overwriting."""
    if not isinstance(out, (str, os.PathLike)):
        return _write_export(store, out, progress)
    target = Path(out)
    if target.exists() and not target.is_file():
        # a device, a pipe, /dev/stdout (links followed): written to as it is — renaming over it would replace it
        handle, _ = _open_text(target, "w")
        try:
            with handle:
                return _write_export(store, handle, progress)
        except OSError as exc:
            raise InvalidInputError(f"cannot write {target}: {exc.strerror}") from None
    target = target.resolve() if target.is_symlink() else target  # a link to a file: the file is replaced
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            count = _write_export(store, handle, progress)
        os.replace(partial, target)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {target}: {exc.strerror}; nothing was written there") from None
    finally:
        partial.unlink(missing_ok=True)
    return count


def _write_export(store: Store, handle: IO[str], progress: Progress | None) -> int:
    count = -1  # the first line is the header
    for line in export_lines(store):
        handle.write(line)
        count += 1
        if progress and count and count % 500 == 0:
            progress(500)
    if progress:
        progress(count % 500)
    return count


def import_jsonl(writes: WritePath, source: str | os.PathLike[str] | IO[str], progress: Progress | None = None) -> int:
    """Read an export into the memory `writes` belongs to (see the module's docstring). Files are
    read twice rather than held in memory; a non-seekable stream is buffered."""
    if isinstance(source, (str, os.PathLike)):
        def records() -> Iterator[Block]:
            return _read_export(source)
    else:
        buffered = list(_read_export(source))

        def records() -> Iterator[Block]:
            return iter(buffered)

    first_index = _verify_records(records())
    if first_index is None:
        return 0
    if writes.store.last_block_index() == 0 and first_index == 1:
        return _import_exact(writes, records(), progress)
    present = {_identity(block) for block in writes.store.iter_blocks() if not block.forgotten}

    def new(record: Block) -> bool:
        return not record.forgotten and _identity(record) not in present

    incoming = 0
    for record in records():  # the append path re-validates against this store's limits
        if new(record):
            writes.prepare(**_record_fields(record))
            incoming += 1
    defer = incoming >= DEFER_INDEX_MIN and len(present) <= DEFER_INDEX_RATIO * incoming
    with writes.store.vector_index_deferred() if defer else nullcontext():
        return _import_new(writes, records(), new, progress)


def _import_new(writes: WritePath, records: Iterable[Block], new: Callable[[Block], bool],
                progress: Progress | None) -> int:
    count = 0
    group: list[dict[str, Any]] = []
    for record in records:  # groups: each write_chunked embeds ahead of its commits on every engine
        if not new(record):
            continue
        group.append(_record_fields(record))
        if len(group) == IMPORT_GROUP:
            count += len(writes.write_chunked(writes.prepare_many(group), None, progress))
            group = []
    if group:
        count += len(writes.write_chunked(writes.prepare_many(group), None, progress))
    return count


def _import_exact(writes: WritePath, records: Iterable[Block], progress: Progress | None) -> int:
    """Every record with its index and hash; the passages of the live ones embedded as bulk work,
    ahead of the commits (each chunk of `WRITE_CHUNK` one transaction)."""
    embedder = writes.embedder()  # records the embedder before the first block goes in
    context = writes.passage_context()

    def chunks() -> Iterator[tuple[list[Block], list[str]]]:
        chunk: list[Block] = []
        for record in records:
            chunk.append(record)
            if len(chunk) == WRITE_CHUNK:
                yield chunk, _live_texts(chunk, context)
                chunk = []
        if chunk:
            yield chunk, _live_texts(chunk, context)

    total = 0
    with writes.store.vector_index_deferred(), \
            closing(embed_ahead(embedder, chunks(), writes.settings.embed_batch_size,
                                priority=Priority.BULK)) as embedded:  # into an empty memory: build the graph once
        for chunk, vectors_live in embedded:
            _import_exact_chunk(writes, chunk, vectors_live)
            total += len(chunk)
            if progress:
                progress(len(chunk))
    return total


def _live_texts(chunk: list[Block], context: PassageContext) -> list[str]:
    """The passage texts of a chunk's live records (forgotten ones still end a context)."""
    texts = context.texts_for([passage_source(r) for r in chunk])
    return [text for record, text in zip(chunk, texts) if not record.forgotten]


def _import_exact_chunk(writes: WritePath, chunk: list[Block], vectors_live: np.ndarray) -> None:
    vectors = np.zeros((len(chunk), writes.embedder().dimension), dtype=np.float32)
    tokens: list[list[str]] = []
    j = 0
    for i, record in enumerate(chunk):
        if record.forgotten:
            tokens.append([])
        else:
            vectors[i] = vectors_live[j]
            j += 1
            tokens.append(writes.tokenizer.tokens(record.text))
    writes.append_exact(chunk, tokens, vectors)


def reindex(path: str | os.PathLike[str], embedder_spec: str | None = None, *,
            settings: Settings | None = None, progress: Progress | None = None) -> int:
    """Re-embed every live block with `embedder_spec` (default: the configured one, else the
    recorded one) and record it. Vectors are computed first and written in a single
    transaction, so a crash leaves the old, consistent state."""
    settings = settings or Settings()
    store = open_store(path, busy_timeout_ms=settings.busy_timeout_ms)
    try:
        spec = embedder_spec or settings.embedder or store.get_meta("embedder_spec") or DEFAULT_EMBEDDER
        embedder = create_embedder(spec, settings)
        context = PassageContext(settings.embed_context_turns, settings.embed_context_gap_seconds,
                                 context_words=settings.embed_context_words)
        live, texts = [], []
        for block in store.iter_blocks():  # every block, in order: forgotten turns still end a context
            text = context.text_for(passage_source(block))
            if not block.forgotten:
                live.append(block)
                texts.append(text)
        vectors = np.zeros((len(live), embedder.dimension), dtype=np.float32)
        size = settings.embed_batch_size
        chunks = ((start, texts[start : start + size]) for start in range(0, len(live), size))
        with closing(embed_ahead(embedder, chunks, size, priority=Priority.BULK)) as embedded:
            for start, chunk_vectors in embedded:  # bulk work: every engine, behind any query
                vectors[start : start + len(chunk_vectors)] = chunk_vectors
                if progress:
                    progress(len(chunk_vectors))
        store.reembed([b.block_index for b in live], vectors, {
            "embedder_spec": spec, "embedder": embedder.name, "dimension": str(embedder.dimension),
            PASSAGES_KEY: context.recipe,
        })
    finally:
        store.close()
    if not is_database_url(str(path)):  # PostgreSQL keeps its graph in the database, rebuilt by reembed
        graph = sidecar_path(path)  # built from the old vectors: rebuilt on next open
        for stale in (graph, graph.with_name(graph.name + ".json")):
            stale.unlink(missing_ok=True)
    return len(live)


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where the HNSW graph of the memory at `path` is saved."""
    path = Path(path)
    return path.with_name(path.name + ".hnsw")


def remove_memory_files(path: str | os.PathLike[str]) -> None:
    """Delete a memory completely: the database, its WAL files and the saved graph."""
    graph = sidecar_path(path)
    for file in (Path(path), Path(f"{path}-wal"), Path(f"{path}-shm"), graph, graph.with_name(graph.name + ".json")):
        file.unlink(missing_ok=True)


def _open_text(target: str | os.PathLike[str] | IO[str], mode: str) -> tuple[IO[str], bool]:
    if isinstance(target, (str, os.PathLike)):
        try:
            return open(target, mode, encoding="utf-8"), True
        except OSError as exc:
            raise InvalidInputError(f"cannot open {target}: {exc.strerror}") from None
    return target, False


def _read_export(source: str | os.PathLike[str] | IO[str]) -> Iterator[Block]:
    """The records of an export, checked line by line; a file whose header counts another number
    of blocks than it holds was cut short (or added to) and is refused — read whole before any
    write (`import_jsonl` verifies first). An excerpt is a file without its header."""
    handle, owned = _open_text(source, "r")
    said: int | None = None
    held = 0
    try:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ImportFormatError(f"line {number}: not JSON ({exc.msg})") from None
            if not isinstance(data, dict):
                raise ImportFormatError(f"line {number}: expected a JSON object")
            if "format" in data:
                if data.get("format") != EXPORT_FORMAT:
                    raise ImportFormatError(f"line {number}: unsupported export format {data.get('format')!r}")
                if data.get("version") != EXPORT_VERSION:
                    raise ImportFormatError(f"line {number}: export version {data.get('version')!r}; this gieok "
                                            f"reads version {EXPORT_VERSION}")
                blocks = data.get("blocks")
                said = blocks if isinstance(blocks, int) and not isinstance(blocks, bool) else None
                continue
            held += 1
            yield _record_from_json(data, number)
        if said is not None and held != said:
            raise ImportFormatError(f"the export's header counts {said:,} blocks and the file holds {held:,}: it was "
                                    "cut short or added to (an excerpt is imported without its header line)")
    except UnicodeDecodeError:
        raise ImportFormatError("the file is not UTF-8 text") from None
    finally:
        if owned:
            handle.close()


def _record_from_json(data: dict[str, Any], number: int) -> Block:
    try:
        forgotten = bool(data.get("forgotten", False))
        scope = Scope.of(data.get("scope"))
        text = data["text"]
        if not forgotten:
            text = clean_text(text, max_chars=10**7)
        elif text != "" or data.get("speaker") or data.get("keywords") or data.get("tags") or data.get("metadata"):
            # a tombstone keeps its header only: content on one would bring forgotten words back
            raise ImportFormatError(f"line {number}: a forgotten block with content")
        return Block(
            block_index=int(data["block_index"]), kind=check_kind(data["kind"]), text=text, scope=scope,
            speaker=data.get("speaker"), event_time=float(data["event_time"]),
            insert_time=float(data["insert_time"]), importance=check_importance(data["importance"]),
            keywords=tuple(data.get("keywords") or ()), tags=tuple(data.get("tags") or ()),
            metadata=dict(data.get("metadata") or {}), conv_pos=data.get("conv_pos"),
            content_digest=str(data["content_digest"]), prev_hash=str(data["prev_hash"]), hash=str(data["hash"]),
            forgotten=forgotten,
        )
    except ImportFormatError:
        raise
    except KeyError as exc:
        raise ImportFormatError(f"line {number}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ImportFormatError(f"line {number}: {exc}") from None


def _identity(block: Block) -> tuple[Any, ...]:
    """What makes two blocks the same block for an import: their content (its digest: text,
    speaker, keywords, tags, metadata), kind, scope and event time — not their place in a chain."""
    return (block.content_digest, block.kind, block.scope.guild, block.scope.channel, block.scope.user,
            block.event_time)


def _record_fields(r: Block) -> dict[str, Any]:
    return {"text": r.text, "kind": r.kind, "scope": r.scope, "speaker": r.speaker, "event_time": r.event_time,
            "importance": r.importance, "keywords": list(r.keywords), "tags": list(r.tags), "metadata": r.metadata}


def _verify_records(records: Iterable[Block]) -> int | None:
    """Every record's digest and hash must verify and consecutive records must link.
    A file may start mid-chain (an excerpt), but a file starting at block 1 starts at genesis.
    Returns the first block index, or None for an empty file."""
    first: int | None = None
    prev: Block | None = None
    for r in records:
        if prev is not None and (r.block_index != prev.block_index + 1 or r.prev_hash != prev.hash):
            raise ImportFormatError(f"block {r.block_index}: the chain is broken after block {prev.block_index}")
        if prev is None and r.block_index == 1 and r.prev_hash != GENESIS:
            raise ImportFormatError("block 1 does not start at the genesis hash")
        if not r.forgotten and digest_of(r) != r.content_digest:
            raise ImportFormatError(f"block {r.block_index}: content does not match its digest")
        if hash_of(r) != r.hash:
            raise ImportFormatError(f"block {r.block_index}: hash does not verify")
        if first is None:
            first = r.block_index
        prev = r
    return first
