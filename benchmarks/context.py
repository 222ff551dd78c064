"""`gieok bench context`: what `POST /v1/conversations/context` puts in an agent's prompt, against
plain search cut to the same token budget — LoCoMo fed through a real `gieok serve`, as an agent
would feed it.

The run, in order:

1. **Server.** A fresh database in the work directory, a write key for the default tenant, and a
   real `gieok serve` subprocess on 127.0.0.1 (`bench server`'s `ServeProcess`), with timezone
   UTC (LoCoMo's session times carry no zone; `bench locomo` reads them as UTC too). Offline by
   default: the language-model settings (`GIEOK_LLM_CHAIN`, the Gemini / OpenAI keys) are taken
   out of its environment, so no summaries and no facts; `--llm URL` gives it an OpenAI-compatible
   model instead (`llm_chain=openai:<--llm-model>`, `openai_base_url=URL`, its duties every 5 s so
   quiet conversations are extracted too) and, after the feeding, waits until every conversation's
   summary and the facts have stayed unchanged for `--llm-quiet` seconds. `facts_and_summaries`
   in the JSON is what the server's answers said.
2. **Feeding.** A warm-up message in a channel of its own (the pipeline and the guard's classifiers
   load on first use; not timed). Then every conversation in its real order through
   `POST /v1/conversations/messages`: one request per session (cut at 256 messages), channel = the
   conversation's `sample_id`, `id` = the dia_id, role user, `user` = `<sample_id>.<name slug>`
   (one id per speaker and conversation: two conversations have a John), `name` = the speaker,
   `time` = the session's date time + `SECONDS_PER_TURN` per turn, `text` = the turn (with
   LoCoMo's image caption as " [image: …]", as `bench locomo` stores it). Every answer's `stored`
   gives dia_id → block index. `ingest_messages_per_s` = messages / the wall time of the requests.
3. **Questions.** For each question (LoCoMo's have no asker: no `user`) and each budget:
   `POST /v1/conversations/context {channel, query, budget_tokens}`; and once per question
   `POST /v1/search {query, k: 100 (the API's most), scope: {channel}}`, whose hits are kept in
   rank order while the sum of `estimate_tokens(hit text)` stays within the budget (the first hit
   that would exceed it ends the list). An evidence turn **is in** a context when its block is one
   of `parts.recalled`'s `block_index`es, or its text (whitespace collapsed) equals the text of a
   recalled or recent message (`parts.recent` has no block index; and a search drops a block whose
   text repeats one it already returned, so identical text counts as shown); every such turn is
   also checked to appear in `text` (`checks.not_in_text` counts the ones that do not: 0 expected).
   The same rule against the kept search hits gives `search_recall`. Recall is the share of a
   question's evidence turns that are in, averaged over questions; per budget, overall and per
   LoCoMo category (the files' numbers, 1–5).
4. **Latency** (client wall time over one keep-alive connection). The server's embedder caches
   query vectors (by text) and its search layers cache results (by query, scope, k, kinds,
   speaker names, …). Even-numbered questions start with a context call (at a budget that rotates
   over the list, so each budget gets its share): that call embeds the question — **with
   embedding**. Then the plain search (different k / kinds / speaker names from any context search,
   so neither answers from the other's cached result), then the other budgets. Odd-numbered
   questions start with the plain search (it embeds), then every budget. Every context call after
   a question's first is **without embedding**: its vector is cached, while its own search asks for
   a k no earlier call of this question asked (`context_search_k`: k grows with the budget), so the
   result cache cannot answer it. A call whose question text was sent before (LoCoMo repeats one
   question) is left out of the latency samples (counted in `latency_samples.repeated`).
5. **In process**, after the server has stopped: the same database opened with `Memory`, the
   questions' vectors computed first (`embed_queries`), then `Memory.search` as the context route
   runs it (each budget's k, the conversation's scope, kinds turn and note, the speakers' names),
   `query_vector` given, each (question, k) once: `in_process_search_p50_ms`; and as `POST /v1/search`
   runs it (k 100, the conversation's scope, nothing else), each question once:
   `in_process_api_search_p50_ms`. Then `Memory.add_many`
   of the same turns (the same items the pipeline writes, the same batches, embedding included)
   into a fresh memory after an untimed warm-up item: `add_many_messages_per_s`.

Targets (never adjusted): context recall at 2,000 tokens ≥ search recall at 2,000 and ≥ 0.80;
HTTP context p50 without embedding ≤ in-process search p50 + 5 ms; ingest through the API ≥ 0.8 ×
`add_many`'s messages per second; what HTTP adds, query vector cached (issue 41): `/v1/search` over
HTTP ≤ the same search in process + 1.5 ms, the context over HTTP ≤ the server's own total + 1.5 ms
(`targets.http_adds_search`, `targets.http_adds_context`).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.fill import bench_workdir
from benchmarks.locomo import load_locomo
from benchmarks.report import median, p50_p95, print_and_write, progress_bar, results_table, table_console
from benchmarks.server import REQUEST_SECONDS, ServeProcess, create_key
from gieok.chat.agent.agents import MAX_BUDGET, MAX_MESSAGES, MIN_BUDGET
from gieok.chat.agent.context import estimate_tokens
from gieok.chat.settings import ChatSettings
from gieok.errors import InvalidInputError
from gieok.layers.cache import normalise_query
from gieok.memory import Memory, remove_memory_files
from gieok.retrieval.passages import SPEAKER_NAME_KEY

__all__ = ["ContextData", "load_context_data", "parse_budgets", "context_search_k", "measure_context",
           "print_context", "run_context_bench", "CATEGORIES", "DEFAULT_LLM_MODEL"]

SECONDS_PER_TURN = 5
SEARCH_K = 100  # the API's largest k (server/models.py MAX_K)
CONTEXT_KINDS = ("turn", "note")  # what the context's recall searches (ConversationPipeline.agent_context)
WARMUP_CHANNEL = "bench-context-warmup"
TARGET_BUDGET = 2000
RECALL_FLOOR = 0.80
P50_OVERHEAD_MS = 5.0
HTTP_ADDS_MS = 1.5  # issue 41: what HTTP may add to a search and to the context, without the query embedding
INGEST_SHARE = 0.8
DEFAULT_LLM_MODEL = "qwen2.5:7b"
LLM_QUIET_SECONDS = 120.0
LLM_WAIT_SECONDS = 4 * 3600.0  # at most this long for summaries and facts to settle
LLM_POLL_SECONDS = 5.0
EMBED_CHUNK = 32
CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}
_ID = re.compile(r"[^\w.:@#-]+")
_LLM_VARIABLES = ("GIEOK_LLM_CHAIN", "GIEOK_GEMINI_API_KEY", "GIEOK_GEMINI_API_KEYS", "GIEOK_OPENAI_API_KEY",
                  "GIEOK_OPENAI_API_KEYS", "GIEOK_OPENAI_BASE_URL")


# -- the data --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    conversation: str  # the channel
    id: str  # the dia_id
    text: str
    user: str
    name: str
    time: float


@dataclass(frozen=True)
class Question:
    conversation: str
    question: str
    category: str
    evidence: tuple[str, ...]


@dataclass
class ContextData:
    sessions: list[list[Message]]  # in feeding order: conversation by conversation, session by session
    questions: list[Question]
    skipped_questions: int
    messages: dict[tuple[str, str], Message] = field(default_factory=dict)  # (channel, dia_id) -> message

    @property
    def conversations(self) -> list[str]:
        return list(dict.fromkeys(m.conversation for session in self.sessions for m in session))

    def speaker_names(self, conversation: str) -> dict[str, str]:
        return {m.user: m.name for (c, _), m in self.messages.items() if c == conversation}


def slug(value: str) -> str:
    """`value` as an id the API takes (`^[\\w.:@#-]{1,100}$`): lower case, other runs become "-"."""
    return _ID.sub("-", value.strip().lower()).strip("-")[:60] or "x"


def load_context_data(path: str | Path) -> ContextData:
    """The LoCoMo file as an agent's messages and the questions about them; an unreadable file or
    one that is not LoCoMo is an `InvalidInputError` (one line)."""
    data = load_locomo(path)
    if not data.turns:
        raise InvalidInputError(f"{path} has no conversation turns")
    if not data.questions:
        raise InvalidInputError(f"{path} has no question whose evidence names a turn (D<session>:<turn>)")
    channels: dict[str, str] = {}
    for turn in data.turns:
        channel = slug(turn.conversation)
        if channels.setdefault(channel, turn.conversation) != turn.conversation:
            raise InvalidInputError(f"{path}: conversations {channels[channel]!r} and {turn.conversation!r} "
                                    f"have the same id once made a channel name ({channel!r})")
    sessions: list[list[Message]] = []
    messages: dict[tuple[str, str], Message] = {}
    current: tuple[str, int] | None = None
    base = offset = 0
    for turn in data.turns:
        if (turn.conversation, turn.session) != current:
            current = (turn.conversation, turn.session)
            if turn.event_time <= 0:
                raise InvalidInputError(f"{path}: conversation {turn.conversation} session {turn.session} has no "
                                        "readable session_N_date_time (e.g. '1:56 pm on 8 May, 2023')")
            base, offset = int(turn.event_time), 0
            sessions.append([])
        channel = slug(turn.conversation)
        prefix = f"{turn.speaker}: "
        text = turn.text[len(prefix):] if turn.text.startswith(prefix) else turn.text
        message = Message(channel, turn.dia_id, text, f"{channel}.{slug(turn.speaker)}", turn.speaker.strip()[:100],
                          float(base + offset * SECONDS_PER_TURN))
        if (channel, turn.dia_id) in messages:
            raise InvalidInputError(f"{path}: conversation {turn.conversation} has turn {turn.dia_id} twice")
        messages[(channel, turn.dia_id)] = message
        sessions[-1].append(message)
        offset += 1
    questions = [Question(slug(q.conversation), q.question, q.category, tuple(q.evidence)) for q in data.questions]
    return ContextData(sessions, questions, data.skipped_questions, messages)


def parse_budgets(value: str) -> list[int]:
    """`--budget 1000,2000,4000`: distinct token budgets the context route takes, ascending."""
    try:
        budgets = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise InvalidInputError(f"--budget must be a comma-separated list of integers, got {value!r}") from None
    if not budgets or budgets[0] < MIN_BUDGET or budgets[-1] > MAX_BUDGET:
        raise InvalidInputError(f"--budget takes token budgets of {MIN_BUDGET}–{MAX_BUDGET:,}, got {value!r}")
    return budgets


def context_search_k(budget: int, recall_k: int) -> int:
    """The k of the search behind a context of `budget` tokens (ConversationPipeline.agent_context)."""
    return min(100, max(recall_k, budget // 25))


def _batches(data: ContextData) -> list[list[Message]]:
    """The requests of the feeding: one per session, cut at the API's 256 messages."""
    return [session[i : i + MAX_MESSAGES] for session in data.sessions for i in range(0, len(session), MAX_MESSAGES)]


def _wire(message: Message) -> dict[str, Any]:
    return {"id": message.id, "role": "user", "text": message.text, "user": message.user, "name": message.name,
            "time": datetime.fromtimestamp(message.time, UTC).isoformat()}


def _item(message: Message) -> dict[str, Any]:
    """The turn block the pipeline writes for this message (ConversationPipeline._turn_items)."""
    return {"text": message.text, "scope": {"channel": message.conversation, "user": message.user},
            "speaker": message.user, "event_time": message.time,
            "metadata": {"role": "user", "external_id": message.id, SPEAKER_NAME_KEY: message.name}}


def _norm(text: str) -> str:
    return " ".join(text.split())


# A recalled turn's relative dates are written resolved beside them in the context's text ("yesterday
# (2023-05-07)"); a turn is in the text when its words are, the resolutions set aside.
_RESOLVED = re.compile(r" ?\(\d{4}(?:-\d{2}){0,2}(?:~\d{4}(?:-\d{2}){0,2})?\)")


# -- the server ------------------------------------------------------------------------------------

def _server_env(llm_url: str | None, llm_model: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LLM_VARIABLES}
    env["GIEOK_TIMEZONE"] = "UTC"
    if llm_url is not None:
        env.update(GIEOK_LLM_CHAIN=f"openai:{llm_model}", GIEOK_OPENAI_BASE_URL=llm_url,
                   GIEOK_SERVER_DUTY_SECONDS="5", GIEOK_EXTRACTION_IDLE_SECONDS="5")
    return env


class _Calls:
    """Requests over one keep-alive connection, timed (client wall time); failures counted."""

    def __init__(self, url: str, key: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=REQUEST_SECONDS)
        self.errors: list[str] = []

    def post(self, path: str, body: dict[str, Any], expect: int = 200) -> tuple[dict[str, Any] | None, float]:
        t0 = time.perf_counter()
        try:
            response = self.http.post(path, json=body)
        except Exception as exc:  # a failed request is an error of the run, not a crash
            self.errors.append(f"{path}: {type(exc).__name__}: {exc}")
            return None, 0.0
        ms = (time.perf_counter() - t0) * 1000
        if response.status_code != expect:
            self.errors.append(f"{path}: HTTP {response.status_code}: {response.text[:300]}")
            return None, ms
        return response.json(), ms

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self.http.close()


def _warm_up(calls: _Calls) -> str:
    """One message, one context and one search in a channel of their own: what loads on first use
    (the pipeline, the guard's classifiers, the context path) loads before anything is timed.
    Returns what the server said of summaries and facts."""
    message = {"id": "warm-up", "role": "user", "user": "bench-warm-up", "name": "Warm-up",
               "text": "A warm-up message before the benchmark's conversations.", "time": 1_600_000_000}
    answer, _ = calls.post("/v1/conversations/messages", {"channel": WARMUP_CHANNEL, "messages": [message]}, 202)
    if answer is None:
        raise RuntimeError(f"the warm-up message was refused: {calls.errors[-1]}")
    calls.post("/v1/conversations/context", {"channel": WARMUP_CHANNEL, "query": "the warm-up"})
    calls.post("/v1/search", {"query": "warm-up message", "k": 5, "scope": {"channel": WARMUP_CHANNEL}})
    if calls.errors:
        raise RuntimeError(f"the warm-up failed: {calls.errors[0]}")
    return str(answer["summaries_and_facts"])


def _feed(calls: _Calls, data: ContextData) -> tuple[dict[tuple[str, str], int | None], float]:
    """Every session's messages through the API in order: (channel, dia_id) -> block index, and
    the wall time of the requests (s)."""
    blocks: dict[tuple[str, str], int | None] = {}
    total = sum(len(s) for s in data.sessions)
    elapsed = 0.0
    with progress_bar(f"feed {total:,} messages: POST /v1/conversations/messages", total) as advance:
        for batch in _batches(data):
            channel = batch[0].conversation
            t0 = time.perf_counter()
            answer, _ = calls.post("/v1/conversations/messages",
                                   {"channel": channel, "messages": [_wire(m) for m in batch]}, 202)
            elapsed += time.perf_counter() - t0
            if answer is None:
                raise RuntimeError(f"feeding {channel} failed: {calls.errors[-1]}")
            if answer["duplicates"]:
                raise RuntimeError(f"{channel}: ids stored before: {answer['duplicates'][:5]}")
            for stored in answer["stored"]:
                blocks[(channel, stored["id"])] = stored["block_index"]
            advance(len(batch))
    return blocks, elapsed


def _fingerprint(calls: _Calls, channels: Sequence[str]) -> tuple[str, int, int]:
    """What the model has written so far: the summaries and facts as one string, how many
    conversations have a summary, how many facts there are."""
    summaries = [calls.get("/v1/conversations/summary", channel=c) for c in channels]
    facts = calls.get("/v1/facts", history="true", limit=1000)["facts"]
    written = sum(1 for s in summaries if s.get("updates", 0) > 0)  # updated by the model at least once
    return json.dumps([summaries, facts], sort_keys=True, default=str), written, len(facts)


def _settle(calls: _Calls, channels: Sequence[str], quiet: float) -> dict[str, Any]:
    """Wait until the summaries and facts have not changed for `quiet` seconds (or at most
    `LLM_WAIT_SECONDS`): the background extraction has caught up with the feeding."""
    started = time.monotonic()
    last, summaries, facts = _fingerprint(calls, channels)
    changed = started
    with progress_bar(f"summaries and facts: waiting until unchanged for {quiet:g} s", math.ceil(quiet)) as advance:
        shown = 0
        while True:
            time.sleep(LLM_POLL_SECONDS)
            now = time.monotonic()
            current, summaries, facts = _fingerprint(calls, channels)
            if current != last:
                last, changed = current, now
                advance(-shown)
                shown = 0
            quiet_for = min(quiet, now - changed)
            advance(int(quiet_for) - shown)
            shown = int(quiet_for)
            if now - changed >= quiet or now - started >= LLM_WAIT_SECONDS:
                break
    return {"settle_s": round(time.monotonic() - started, 1), "settled": time.monotonic() - changed >= quiet,
            "conversations_with_summary": summaries, "facts": facts}


# -- the questions ---------------------------------------------------------------------------------

@dataclass
class _Scores:
    """One question's recall at each budget, and what was matched how."""

    context: dict[int, float] = field(default_factory=dict)
    search: dict[int, float] = field(default_factory=dict)


@dataclass
class _Run:
    scores: list[tuple[Question, _Scores]] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=lambda: {
        "context_with": [], "context_without": [], "search_with": [], "search_without": []})
    server_ms: dict[str, list[float]] = field(default_factory=lambda: {  # the answer's own timings_ms
        "total_with": [], "total_without": [], "search_without": [], "l1_without": [], "assemble_without": []})
    repeated: int = 0
    not_in_text: int = 0
    via_recent: dict[int, int] = field(default_factory=dict)
    evidence_found: dict[int, int] = field(default_factory=dict)
    context_tokens: dict[int, list[int]] = field(default_factory=dict)
    search_tokens: dict[int, list[int]] = field(default_factory=dict)
    search_sources: dict[str, int] = field(default_factory=dict)


def _in_context(answer: dict[str, Any], evidence: Sequence[Message], blocks: dict[tuple[str, str], int | None],
                run: _Run, budget: int) -> float:
    parts = answer.get("parts") or {}
    recalled = parts.get("recalled") or []
    recent = parts.get("recent") or []
    shown_blocks = {r.get("block_index") for r in recalled}
    recalled_texts = {_norm(r["text"]) for r in recalled}
    recent_texts = {_norm(r["text"]) for r in recent}
    whole = _norm(_RESOLVED.sub("", answer.get("text") or ""))
    found = 0
    for message in evidence:
        text = _norm(message.text)
        block = blocks.get((message.conversation, message.id))
        if (block is not None and block in shown_blocks) or text in recalled_texts or text in recent_texts:
            found += 1
            if text not in whole:
                run.not_in_text += 1
            if not (block is not None and block in shown_blocks) and text not in recalled_texts:
                run.via_recent[budget] = run.via_recent.get(budget, 0) + 1
    run.evidence_found[budget] = run.evidence_found.get(budget, 0) + found
    return found / len(evidence)


def _in_hits(hits: Sequence[dict[str, Any]], evidence: Sequence[Message],
             blocks: dict[tuple[str, str], int | None], budget: int) -> tuple[float, int]:
    """Recall of the hits kept within `budget` tokens (rank order; the first hit that would exceed
    the budget ends the list), and the tokens kept."""
    kept_blocks: set[int] = set()
    kept_texts: set[str] = set()
    used = 0
    for hit in hits:
        cost = estimate_tokens(hit["block"]["text"])
        if used + cost > budget:
            break
        used += cost
        kept_blocks.add(hit["block"]["block_index"])
        kept_texts.add(_norm(hit["block"]["text"]))
    found = sum(1 for m in evidence if blocks.get((m.conversation, m.id)) in kept_blocks
                or _norm(m.text) in kept_texts)
    return found / len(evidence), used


def _ask(calls: _Calls, data: ContextData, budgets: list[int], blocks: dict[tuple[str, str], int | None]) -> _Run:
    """Every question at every budget, and its plain search (module docstring: the order)."""
    run = _Run()
    embedded: set[str] = set()
    asked: set[tuple[str, str]] = set()
    with progress_bar(f"questions: context at {len(budgets)} budget(s) + search", len(data.questions)) as advance:
        for i, question in enumerate(data.questions):
            evidence = [data.messages[(question.conversation, e)] for e in question.evidence]
            scores = _Scores()
            query = question.question.strip()
            # asked before: its vector is cached (the embedder's key is the text) and a result of
            # its own may be (the result cache's key is the normalised query)
            repeated = query in embedded or (question.conversation, normalise_query(query)) in asked
            if i % 2 == 0:
                first = budgets[(i // 2) % len(budgets)]
                plan: list[int | None] = [first, None, *(b for b in budgets if b != first)]
            else:
                plan = [None, *budgets]
            for step, budget in enumerate(plan):
                fresh = step == 0 and not repeated  # the question's first call embeds it
                kind = "with" if fresh else "without"
                if budget is None:
                    answer, ms = calls.post("/v1/search", {"query": question.question, "k": SEARCH_K,
                                                           "scope": {"channel": question.conversation}})
                    hits = answer["hits"] if answer is not None else []
                    if answer is not None:
                        run.search_sources[answer["source"]] = run.search_sources.get(answer["source"], 0) + 1
                        if not repeated:
                            run.latency[f"search_{kind}"].append(ms)
                    for b in budgets:
                        scores.search[b], used = _in_hits(hits, evidence, blocks, b)
                        run.search_tokens.setdefault(b, []).append(used)
                    continue
                answer, ms = calls.post("/v1/conversations/context", {
                    "channel": question.conversation, "query": question.question, "budget_tokens": budget})
                if answer is None:
                    scores.context[budget] = 0.0
                    continue
                if not repeated:
                    run.latency[f"context_{kind}"].append(ms)
                    timings = answer["timings_ms"]
                    run.server_ms[f"total_{kind}"].append(float(timings.get("total_ms", 0.0)))
                    if kind == "without":
                        for part in ("search", "l1", "assemble"):
                            run.server_ms[f"{part}_without"].append(float(timings.get(f"{part}_ms", 0.0)))
                scores.context[budget] = _in_context(answer, evidence, blocks, run, budget)
                run.context_tokens.setdefault(budget, []).append(int(answer["tokens"]["total"]))
            if repeated:
                run.repeated += 1
            embedded.add(query)
            asked.add((question.conversation, normalise_query(query)))
            run.scores.append((question, scores))
            advance()
    return run


# -- in process ------------------------------------------------------------------------------------

def _in_process_search(db: Path, data: ContextData, budgets: list[int], recall_k: int) -> dict[str, Any]:
    """`Memory.search` as the context route runs it, query vectors given (module docstring)."""
    ks = sorted({context_search_k(b, recall_k) for b in budgets})
    latencies: list[float] = []
    as_api: list[float] = []  # the search `POST /v1/search` runs (k=SEARCH_K, the channel's scope)
    with Memory(db, timezone="UTC") as memory:
        texts = [q.question for q in data.questions]
        vectors: list[np.ndarray] = []
        with progress_bar("in process: embed the questions (embed_queries)", len(texts)) as advance:
            for start in range(0, len(texts), EMBED_CHUNK):
                vectors.extend(memory.embedder.embed_queries(texts[start : start + EMBED_CHUNK]))
                advance(len(texts[start : start + EMBED_CHUNK]))
        names = {c: data.speaker_names(c) for c in data.conversations}
        done: set[tuple[str, str, int]] = set()
        with progress_bar(f"in process: Memory.search at k={','.join(map(str, ks))}", len(texts) * len(ks)) as advance:
            for question, vector in zip(data.questions, vectors):
                for k in ks:
                    key = (question.conversation, normalise_query(question.question), k)
                    if key not in done:
                        done.add(key)
                        t0 = time.perf_counter()
                        memory.search(question.question, k, scope={"channel": question.conversation},
                                      kinds=CONTEXT_KINDS, speaker_names=names[question.conversation],
                                      query_vector=vector)
                        latencies.append((time.perf_counter() - t0) * 1000)
                    advance()
        with progress_bar(f"in process: Memory.search as /v1/search runs it (k={SEARCH_K})", len(texts)) as advance:
            asked: set[tuple[str, str]] = set()  # apart from `done`: a budget's k may be SEARCH_K too
            for question, vector in zip(data.questions, vectors):
                asking = (question.conversation, normalise_query(question.question))
                if asking not in asked:
                    asked.add(asking)
                    t0 = time.perf_counter()
                    memory.search(question.question, SEARCH_K, scope={"channel": question.conversation},
                                  query_vector=vector)
                    as_api.append((time.perf_counter() - t0) * 1000)
                advance()
    return {**p50_p95(latencies), "searches": len(latencies), "ks": ks,
            "as_api": {**p50_p95(as_api), "searches": len(as_api)}}


def _add_many_rate(path: Path, data: ContextData) -> dict[str, Any]:
    """`Memory.add_many` of the same turns, in the same batches, embedding included."""
    remove_memory_files(path)
    elapsed = 0.0
    total = sum(len(s) for s in data.sessions)
    with Memory(path, timezone="UTC") as memory:
        warm = Message(WARMUP_CHANNEL, "warm-up", "A warm-up message before the benchmark's conversations.",
                       "bench-warm-up", "Warm-up", 1_600_000_000.0)
        memory.add_many([_item(warm)])
        with progress_bar(f"in process: Memory.add_many of the {total:,} turns", total) as advance:
            for batch in _batches(data):
                t0 = time.perf_counter()
                memory.add_many([_item(m) for m in batch])
                elapsed += time.perf_counter() - t0
                advance(len(batch))
    return {"messages": total, "seconds": round(elapsed, 3),
            "messages_per_s": round(total / elapsed, 2) if elapsed > 0 else 0.0}


# -- the report ------------------------------------------------------------------------------------

def _mean(values: Sequence[float]) -> float:
    return round(float(np.mean(values)), 4) if values else 0.0


def _recall(run: _Run, budgets: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    categories = sorted({q.category for q, _ in run.scores})
    for b in budgets:
        by_category = {}
        for cat in categories:
            rows = [s for q, s in run.scores if q.category == cat]
            by_category[cat] = {"context_recall": _mean([s.context.get(b, 0.0) for s in rows]),
                                "search_recall": _mean([s.search.get(b, 0.0) for s in rows]), "questions": len(rows)}
        out[str(b)] = {
            "context_recall": _mean([s.context.get(b, 0.0) for _, s in run.scores]),
            "search_recall": _mean([s.search.get(b, 0.0) for _, s in run.scores]),
            "by_category": by_category,
            "context_tokens_p50": median(run.context_tokens.get(b, [])),
            "search_tokens_p50": median(run.search_tokens.get(b, [])),
            "evidence_found_via_recent": run.via_recent.get(b, 0),
            "evidence_found": run.evidence_found.get(b, 0),
        }
    return out


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    at = report["budgets"].get(str(TARGET_BUDGET))
    recall: dict[str, Any] = {"budget": TARGET_BUDGET, "floor": RECALL_FLOOR, "context_recall": None,
                              "search_recall": None, "pass": None}
    if at is not None:
        recall.update(context_recall=at["context_recall"], search_recall=at["search_recall"],
                      **{"pass": at["context_recall"] >= at["search_recall"] and at["context_recall"] >= RECALL_FLOOR})
    without = report["context_p50_ms"]["without_embedding"]
    in_process = report["in_process_search_p50_ms"]
    limit = round(in_process + P50_OVERHEAD_MS, 3)
    search_http, search_local = report["search_p50_ms"]["without_embedding"], report["in_process_api_search_p50_ms"]
    context_http, context_own = without, report["server_context_p50_ms"]["without_embedding"]
    api, local = report["ingest_messages_per_s"], report["add_many_messages_per_s"]
    floor = round(INGEST_SHARE * local, 2)
    return {
        "context_recall_at_2000": recall,
        "context_p50_without_embedding": {"http_p50_ms": without, "in_process_search_p50_ms": in_process,
                                          "limit_ms": limit, "pass": without <= limit},
        "http_adds_search": {"http_p50_ms": search_http, "in_process_p50_ms": search_local,
                             "adds_ms": round(search_http - search_local, 3), "limit_ms": HTTP_ADDS_MS,
                             "pass": search_http - search_local <= HTTP_ADDS_MS},
        "http_adds_context": {"http_p50_ms": context_http, "server_own_p50_ms": context_own,
                              "adds_ms": round(context_http - context_own, 3), "limit_ms": HTTP_ADDS_MS,
                              "pass": context_http - context_own <= HTTP_ADDS_MS},
        "ingest_rate": {"api_messages_per_s": api, "add_many_messages_per_s": local, "min_messages_per_s": floor,
                        "share": round(api / local, 3) if local else None, "pass": api >= floor},
    }


def measure_context(data_path: str | Path, budgets: Sequence[int], *, workdir: Path | None = None,
                    llm_url: str | None = None, llm_model: str = DEFAULT_LLM_MODEL,
                    llm_quiet: float = LLM_QUIET_SECONDS) -> dict[str, Any]:
    """The run of the module docstring; the report `print_context` prints."""
    budgets = sorted(set(budgets))
    data = load_context_data(data_path)
    workdir = bench_workdir("context", workdir)
    db = workdir / "context.db"
    remove_memory_files(db)
    Memory(db, timezone="UTC").close()
    key = create_key(db)
    recall_k = ChatSettings.load(db=str(db), timezone="UTC").recall_k
    messages = sum(len(s) for s in data.sessions)
    llm: dict[str, Any] | None = None
    server = ServeProcess(db, workdir / "server.log", env=_server_env(llm_url, llm_model))
    calls = _Calls(server.url, key)
    try:
        said = _warm_up(calls)
        blocks, feed_seconds = _feed(calls, data)
        if llm_url is not None:
            llm = {"url": llm_url, "model": llm_model, **_settle(calls, data.conversations, llm_quiet)}
        run = _ask(calls, data, budgets, blocks)
    finally:
        calls.close()
        exit_code = server.stop()
    in_process = _in_process_search(db, data, budgets, recall_k)
    add_many = _add_many_rate(workdir / "add-many.db", data)
    latency = {name: p50_p95(values) for name, values in run.latency.items()}
    report: dict[str, Any] = {
        "budgets": _recall(run, budgets),
        "context_p50_ms": {"with_embedding": latency["context_with"]["p50"],
                           "without_embedding": latency["context_without"]["p50"]},
        "context_p95_ms": {"with_embedding": latency["context_with"]["p95"],
                           "without_embedding": latency["context_without"]["p95"]},
        "server_context_p50_ms": {"with_embedding": round(median(run.server_ms["total_with"]), 3),
                                  "without_embedding": round(median(run.server_ms["total_without"]), 3),
                                  **{f"{part}_without_embedding": round(median(run.server_ms[f"{part}_without"]), 3)
                                     for part in ("search", "l1", "assemble")}},
        "search_p50_ms": {"with_embedding": latency["search_with"]["p50"],
                          "without_embedding": latency["search_without"]["p50"]},
        "latency_samples": {"context_with_embedding": len(run.latency["context_with"]),
                            "context_without_embedding": len(run.latency["context_without"]),
                            "repeated": run.repeated},
        "in_process_search_p50_ms": in_process["p50"],
        "in_process_search_p95_ms": in_process["p95"],
        "in_process_api_search_p50_ms": in_process["as_api"]["p50"],
        "ingest_messages_per_s": round(messages / feed_seconds, 2) if feed_seconds > 0 else 0.0,
        "ingest_seconds": round(feed_seconds, 3),
        "add_many_messages_per_s": add_many["messages_per_s"],
        "add_many_seconds": add_many["seconds"],
        "messages": messages,
        "stored_without_block": sum(1 for b in blocks.values() if b is None),
        "conversations": len(data.conversations),
        "questions": len(data.questions),
        "skipped_questions": data.skipped_questions,
        "facts_and_summaries": "on" if said == "on" else "off",
        "llm": llm,
        "search_k": SEARCH_K,
        "context_search_k": {str(b): context_search_k(b, recall_k) for b in budgets},
        "search_sources": run.search_sources,
        "checks": {"not_in_text": run.not_in_text},
        "errors": len(calls.errors),
    }
    report["targets"] = _targets(report)
    report.update(_first_errors=calls.errors[:3], _server_exit=exit_code, _said=said, _in_process=in_process,
                  _workdir=str(workdir))
    return report


def _verdict(passed: bool | None) -> str:
    return "[green]pass[/]" if passed else "[dim]not measured[/]" if passed is None else "[red]MISS[/]"


def print_context(report: dict[str, Any], console: Console | None = None) -> None:
    out = table_console(console)
    budgets = list(report["budgets"])
    table = results_table(f"evidence in the context vs plain search cut to the same tokens — {report['questions']} "
                          f"questions, {report['messages']:,} messages in {report['conversations']} conversations; "
                          f"summaries and facts {report['facts_and_summaries']}",
                          ("budget", "context recall", "search recall", "Δ", "context tokens p50",
                           "search tokens p50", "context search k", "found via recent"))
    for b, row in report["budgets"].items():
        table.add_row(f"{int(b):,}", f"{row['context_recall']:.3f}", f"{row['search_recall']:.3f}",
                      f"{row['context_recall'] - row['search_recall']:+.3f}", f"{row['context_tokens_p50']:.0f}",
                      f"{row['search_tokens_p50']:.0f}", str(report["context_search_k"][b]),
                      f"{row['evidence_found_via_recent']} of {row['evidence_found']}")
    out.print(table)
    cats = results_table("recall by LoCoMo category (context / search)",
                         ("category", "questions", *(f"{int(b):,} tokens" for b in budgets)), left=("category",))
    first = report["budgets"][budgets[0]]["by_category"]
    for cat in first:
        cats.add_row(f"{cat} {CATEGORIES.get(cat, '')}".strip(), str(first[cat]["questions"]), *(
            f"{report['budgets'][b]['by_category'][cat]['context_recall']:.3f} / "
            f"{report['budgets'][b]['by_category'][cat]['search_recall']:.3f}" for b in budgets))
    out.print(cats)
    samples = report["latency_samples"]
    lat = results_table("latency (client wall time over HTTP; in process: Memory.search, query vector given)",
                        ("call", "p50", "p95", "samples", "server's own p50"), left=("call",))
    lat.add_row("context, with the query embedding", _ms(report["context_p50_ms"]["with_embedding"]),
                _ms(report["context_p95_ms"]["with_embedding"]), str(samples["context_with_embedding"]),
                _ms(report["server_context_p50_ms"]["with_embedding"]))
    lat.add_row("context, query vector cached", _ms(report["context_p50_ms"]["without_embedding"]),
                _ms(report["context_p95_ms"]["without_embedding"]), str(samples["context_without_embedding"]),
                _ms(report["server_context_p50_ms"]["without_embedding"]))
    search = report["search_p50_ms"]
    lat.add_row("POST /v1/search k=100, with / without the embedding",
                f"{_ms(search['with_embedding'])} / {_ms(search['without_embedding'])}", "", "", "")
    ip = report["_in_process"]
    lat.add_row(f"in process Memory.search (k={','.join(map(str, ip['ks']))})", _ms(ip["p50"]), _ms(ip["p95"]),
                str(ip["searches"]), "")
    lat.add_row(f"in process Memory.search as /v1/search runs it (k={SEARCH_K})", _ms(ip["as_api"]["p50"]),
                _ms(ip["as_api"]["p95"]), str(ip["as_api"]["searches"]), "")
    out.print(lat)
    own = report["server_context_p50_ms"]
    out.print(f"the server's own context time, query vector cached (timings_ms p50): recent messages "
              f"{own['l1_without_embedding']:.2f} ms, search {own['search_without_embedding']:.2f} ms, assembly "
              f"{own['assemble_without_embedding']:.2f} ms, total {own['without_embedding']:.2f} ms",
              highlight=False)
    out.print(f"ingest: {report['messages']:,} messages through the API in {report['ingest_seconds']:.1f} s = "
              f"{report['ingest_messages_per_s']:.2f}/s; Memory.add_many in process "
              f"{report['add_many_seconds']:.1f} s = {report['add_many_messages_per_s']:.2f}/s", highlight=False)
    targets = report["targets"]
    checks = results_table("targets", ("target", "measured", "needed", "result"), left=("target", "measured", "needed"))
    recall = targets["context_recall_at_2000"]
    if recall["pass"] is None:
        checks.add_row("context recall at 2,000 tokens", "(2000 not among --budget)", "", _verdict(None))
    else:
        checks.add_row("context recall at 2,000 tokens", f"{recall['context_recall']:.3f}",
                       f"≥ search {recall['search_recall']:.3f} and ≥ {RECALL_FLOOR:.2f}", _verdict(recall["pass"]))
    p50 = targets["context_p50_without_embedding"]
    checks.add_row("HTTP context p50, query vector cached", _ms(p50["http_p50_ms"]),
                   f"≤ {p50['in_process_search_p50_ms']:.2f} + {P50_OVERHEAD_MS:g} = {p50['limit_ms']:.2f} ms",
                   _verdict(p50["pass"]))
    for name, label, base, base_key in (
            ("http_adds_search", "what HTTP adds: POST /v1/search k=100", "in process", "in_process_p50_ms"),
            ("http_adds_context", "what HTTP adds: context", "the server's own", "server_own_p50_ms")):
        adds = targets[name]
        checks.add_row(f"{label}, query vector cached", f"+{adds['adds_ms']:.2f} ms",
                       f"≤ {base} {adds[base_key]:.2f} + {adds['limit_ms']:g} ms", _verdict(adds["pass"]))
    rate = targets["ingest_rate"]
    checks.add_row("ingest through the API", f"{rate['api_messages_per_s']:.2f}/s ({rate['share']} ×)",
                   f"≥ {INGEST_SHARE:g} × {rate['add_many_messages_per_s']:.2f} = {rate['min_messages_per_s']:.2f}/s",
                   _verdict(rate["pass"]))
    out.print(checks)
    if report["llm"]:
        llm = report["llm"]
        out.print(f"model {llm['model']} at {llm['url']}: summaries in {llm['conversations_with_summary']} "
                  f"conversations, {llm['facts']} facts; settled after {llm['settle_s']:.0f} s"
                  f"{'' if llm['settled'] else ' (NOT settled: the wait limit)'}", highlight=False, markup=False)
    elif report["_said"] != "on":
        out.print(f"summaries and facts: {report['_said']}", highlight=False, markup=False)
    out.print(f"errors: {report['errors']}; evidence counted but not in the context's text: "
              f"{report['checks']['not_in_text']}", highlight=False)
    for error in report["_first_errors"]:
        out.print(f"first error: {error}", highlight=False, markup=False)
    code = report["_server_exit"]
    out.print(f"gieok serve stopped with SIGTERM: exit {code}"
              f"{' (graceful)' if code in (0, -signal.SIGTERM) else ' (NOT graceful)'}; work dir {report['_workdir']}",
              highlight=False, markup=False)


def _ms(value: float | None) -> str:
    return f"{value:.2f} ms" if value is not None else "-"


def run_context_bench(data_path: str | Path, budgets: Sequence[int], json_out: str | Path | None = None, *,
                      workdir: Path | None = None, llm_url: str | None = None, llm_model: str = DEFAULT_LLM_MODEL,
                      llm_quiet: float = LLM_QUIET_SECONDS) -> dict[str, Any]:
    report = measure_context(data_path, budgets, workdir=workdir, llm_url=llm_url, llm_model=llm_model,
                             llm_quiet=llm_quiet)
    return print_and_write(report, print_context, json_out)
