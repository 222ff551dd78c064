"""Gatekeeper stage 2: a small LLM call that decides, and another that remembers.

Two calls, because they have different deadlines: the **decision** blocks the reply path
(respond? retrieve? with which query? is this message an attack?), the **extraction** runs
in the background on a snapshot of the conversation (facts and summary updates). Both ask
for JSON with a schema (constrained output where the provider supports it), read the first
JSON object tolerantly, retry once with a repair prompt, and otherwise fall back explicitly
and log it: respond to explicit calls, retrieve for questions, learn nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import LLMError, LLMOutputError
from ..llm.base import LLM, ChatMessage
from .context import estimate_tokens
from .jsonparse import first_json_object
from .prompts import prompt

__all__ = ["Decision", "Extraction", "ExtractedFact", "Analyst", "DECISION_SCHEMA", "EXTRACTION_SCHEMA",
           "FACT_ACTIONS", "looks_like_question", "parse_fact_action"]

log = logging.getLogger(__name__)

# What the extraction model says about each new fact, against the known facts it was shown.
FACT_ACTIONS = ("add", "duplicate", "replaces", "ignore")
_ACTION = re.compile(r"^\s*(add|ignore|duplicate|replaces?)(?:\s+(?:of\s+)?(\S+))?\s*$", re.IGNORECASE)
_REF = re.compile(r"^[<\[(]?\s*F?(\d{1,4})\s*[>\])]?$", re.IGNORECASE)

DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "response_needed": {"type": "boolean"},
        "retrieval_needed": {"type": "boolean"},
        "search_query": {"type": "string"},
        "suspicious": {"type": "boolean"},
    },
    "required": ["response_needed", "retrieval_needed", "search_query"],
}

_FACT: dict[str, Any] = {"type": "object", "properties": {"fact": {"type": "string"}, "topic": {"type": "string"},
                                          "keywords": {"type": "array", "items": {"type": "string"}},
                                          "action": {"type": "string", "enum": list(FACT_ACTIONS)},
                                          "ref": {"type": "string"}, "source": {"type": "string"}},
         "required": ["fact"]}
_SOURCE = re.compile(r"^[<\[(]?\s*m?(\d{1,4})\s*[>\])]?$", re.IGNORECASE)
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "guild_facts": {"type": "array", "items": _FACT},
        "user_facts": {"type": "array", "items": {**_FACT, "properties": {**_FACT["properties"],
                                                                            "user_id": {"type": "string"}},
                                                  "required": ["user_id", "fact"]}},
        "summary_updates": {"type": "object", "properties": {
            "topic": {"type": "string"}, "mood": {"type": "string"}, "new_topic": {"type": "string"},
            "new_point": {"type": "string"}, "stage": {"type": "string", "enum": ["start", "ongoing", "closing"]}}},
    },
    "required": ["guild_facts", "user_facts", "summary_updates"],
}

MAX_FACTS_PER_EXTRACTION = 10
MAX_QUERY_CHARS = 300

_QUESTION = re.compile(
    r"[?？]|(?:\b(?:what|who|where|when|why|how|which|do you|did you|can you|could you|is it|are you|remember)\b)"
    r"|(?:뭐|뭘|무엇|누구|어디|언제|왜|어떻게|어떤|몇|얼마|알아|기억나|기억해|했더라|였더라|일까|인가요|나요|니\?|냐)",
    re.IGNORECASE)


def looks_like_question(text: str) -> bool:
    """The fallback's retrieval heuristic: questions usually need memory."""
    return bool(_QUESTION.search(text))


def _as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise LLMOutputError(f"{name} must be true or false, got {value!r}")


@dataclass(frozen=True)
class Decision:
    response_needed: bool
    retrieval_needed: bool
    search_query: str
    suspicious: bool = False
    source: str = "llm"  # llm | fallback
    error: str | None = None


@dataclass(frozen=True)
class ExtractedFact:
    text: str
    topic: str
    keywords: tuple[str, ...]
    user_id: str | None  # None for a guild fact
    action: str | None = None  # add | duplicate | replaces | ignore; None: not given or not readable
    ref: str | None = None  # "F3": the known fact it repeats or replaces, as shown to the model
    problem: str | None = None  # why `action` / `ref` could not be read (the offline judge decides)
    source: str | None = None  # "m3": the transcript line that stated it; None: not given or not readable


def parse_fact_action(action: Any, ref: Any) -> tuple[str | None, str | None, str | None]:
    """(action, ref, problem) from a fact item's "action" and "ref": the schema's form
    (`"action": "duplicate", "ref": "F3"`) and the issue's wording in one string
    (`"action": "duplicate of F3"`, `"replaces F2"`); refs as "F3", "f3", "[F3]" or "3". Never
    raises: an unreadable answer is a problem, and the offline judge takes over for that fact."""
    if action is None or (isinstance(action, str) and not action.strip()):
        return None, None, None
    if not isinstance(action, str):
        return None, None, f"action is not a string: {action!r}"
    match = _ACTION.match(action)
    if match is None:
        return None, None, f"unknown action {action[:40]!r}"
    verb = match.group(1).lower()
    verb = "replaces" if verb.startswith("replace") else verb
    raw_ref = match.group(2) or (str(ref) if isinstance(ref, (str, int)) and not isinstance(ref, bool) else "")
    if verb in ("add", "ignore"):
        return verb, None, None
    ref_match = _REF.match(raw_ref.strip()) if raw_ref.strip() else None
    if ref_match is None:
        return None, None, f"{verb} without a readable fact id ({raw_ref[:20]!r})"
    return verb, f"F{int(ref_match.group(1))}", None


@dataclass(frozen=True)
class Extraction:
    guild_facts: tuple[ExtractedFact, ...] = ()
    user_facts: tuple[ExtractedFact, ...] = ()
    summary_updates: dict[str, Any] = field(default_factory=dict)
    source: str = "llm"
    error: str | None = None
    rejected: tuple[str, ...] = ()  # why items were dropped (unknown user, not a sentence …)


def parse_decision(data: Mapping[str, Any], fallback_query: str) -> Decision:
    if not isinstance(data, Mapping):
        raise LLMOutputError("the decision is not an object")
    for key in ("response_needed", "retrieval_needed"):
        if key not in data:
            raise LLMOutputError(f"the decision has no {key}")
    query = data.get("search_query", "")
    if not isinstance(query, str):
        raise LLMOutputError("search_query must be a string")
    query = " ".join(query.split())[:MAX_QUERY_CHARS]
    retrieval = _as_bool(data["retrieval_needed"], "retrieval_needed")
    return Decision(
        response_needed=_as_bool(data["response_needed"], "response_needed"),
        retrieval_needed=retrieval,
        search_query=query or (fallback_query if retrieval else ""),
        suspicious=_as_bool(data.get("suspicious", False), "suspicious"),
    )


def _fact_items(value: Any, with_user: bool, known_users: set[str], rejected: list[str]) -> list[ExtractedFact]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise LLMOutputError("facts must be a list")
    out = []
    for item in value[:MAX_FACTS_PER_EXTRACTION]:
        if isinstance(item, str):
            item = {"fact": item}
        if not isinstance(item, Mapping) or not isinstance(item.get("fact"), str):
            rejected.append("a fact item is not an object with a 'fact' string")
            continue
        text = " ".join(item["fact"].split())
        if len(text) < 4:
            rejected.append(f"fact too short: {text!r}")
            continue
        topic_value, keywords_value = item.get("topic"), item.get("keywords")
        topic = topic_value if isinstance(topic_value, str) else ""
        keywords = keywords_value if isinstance(keywords_value, list) else []
        user_id = None
        if with_user:
            raw = item.get("user_id")
            user_id = str(raw).strip().removeprefix("<user:").removesuffix(">") if isinstance(raw, (str, int)) else ""
            if user_id not in known_users:
                # without its text: a reason goes on the live stream, where no source would take it back
                rejected.append(f"fact about a user not in the conversation ({user_id!r})")
                continue
        action, ref, problem = parse_fact_action(item.get("action"), item.get("ref"))
        raw_source = item.get("source")
        source = _SOURCE.match(str(raw_source).strip()) if isinstance(raw_source, (str, int)) else None
        out.append(ExtractedFact(text[:1000], topic.strip()[:80],
                                 tuple(str(k)[:40] for k in keywords if isinstance(k, (str, int)))[:5], user_id,
                                 action, ref, problem, f"m{int(source.group(1))}" if source else None))
    return out


def parse_extraction(data: Mapping[str, Any], known_users: set[str]) -> Extraction:
    if not isinstance(data, Mapping):
        raise LLMOutputError("the extraction is not an object")
    rejected: list[str] = []
    updates = data.get("summary_updates") or {}
    if not isinstance(updates, Mapping):
        raise LLMOutputError("summary_updates must be an object")
    clean_updates = {k: v for k, v in updates.items() if isinstance(v, str) and k != "core"}
    return Extraction(
        guild_facts=tuple(_fact_items(data.get("guild_facts"), False, known_users, rejected)),
        user_facts=tuple(_fact_items(data.get("user_facts"), True, known_users, rejected)),
        summary_updates=clean_updates,
        rejected=tuple(rejected),
    )


class Analyst:
    """Stage 2 over any `LLM`. Without one (no provider configured) every call falls back."""

    def __init__(self, llm: LLM | None, *, bot_name: str, language: str = "ko",
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 on_call: Callable[[str, str | None, int], Awaitable[None]] | None = None) -> None:
        """`on_call(purpose, guild, tokens)`: after each model call ("decide", "extract"), with the
        estimated tokens it sent and received (agent/usage.py)."""
        self.llm = llm
        self.bot_name = bot_name
        self.language = language
        self.on_event = on_event or (lambda kind, data: None)
        self.on_call = on_call

    async def _call(self, messages: list[ChatMessage], schema: dict[str, Any], purpose: str,
                    guild: str | None) -> str:
        assert self.llm is not None
        try:
            response = await self.llm.chat(messages, json_schema=schema, temperature=0.0)
        except LLMError:
            if self.on_call is not None:  # a call that failed still cost its prompt (at least one try)
                await self.on_call(purpose, guild, sum(estimate_tokens(m.content) for m in messages))
            raise
        if self.on_call is not None:
            await self.on_call(purpose, guild, sum(estimate_tokens(m.content) for m in messages)
                               + estimate_tokens(response.text))
        return response.text

    async def _ask_json(self, text: str, schema: dict[str, Any], parse: Callable[[Any], Any],
                        language: str | None = None, *, purpose: str = "decide", guild: str | None = None) -> Any:
        if self.llm is None:
            raise LLMError("no language model configured for the gatekeeper")
        messages = [ChatMessage("user", text)]
        answer = await self._call(messages, schema, purpose, guild)
        try:
            return parse(first_json_object(answer))
        except LLMOutputError as exc:
            log.info("gatekeeper: %s; asking once more", exc)
            repair = prompt("repair", language or self.language).substitute(problem=str(exc))
            messages = [*messages, ChatMessage("assistant", answer[:4000]), ChatMessage("user", repair)]
            return parse(first_json_object(await self._call(messages, schema, purpose, guild)))

    async def decide(self, *, message: str, user_id: str, explicit: bool, recent: str, summary: str,
                     guild: str | None = None) -> Decision:
        text = prompt("decision", self.language).substitute(
            bot_name=self.bot_name, explicit="yes" if explicit else "no", summary=summary or "-",
            recent=recent or "-", user_id=user_id, message=message)
        try:
            return await self._ask_json(text, DECISION_SCHEMA, lambda d: parse_decision(d, message), guild=guild)
        except LLMError as exc:  # LLMOutputError included: two bad answers
            log.warning("gatekeeper decision fell back: %s", exc)
            self.on_event("decision_fallback", {"error": str(exc)})
            return Decision(response_needed=explicit, retrieval_needed=looks_like_question(message),
                            search_query=message[:MAX_QUERY_CHARS], source="fallback", error=str(exc))

    async def extract(self, *, transcript: str, summary: str, known_users: set[str],
                      known_facts: str = "-", language: str | None = None, guild: str | None = None) -> Extraction:
        """`known_facts`: the current facts about the conversation's users and guild, one per
        line with a short id ("F1 <user:42>: …", agent/fact_review.py), for the model to say
        which new fact repeats or replaces which — in this same call, not another. `language`:
        the conversation's (its prompt, so its facts and summary come back in it); default the bot's."""
        language = language or self.language
        text = prompt("extraction", language).substitute(bot_name=self.bot_name, summary=summary or "-",
                                                         transcript=transcript, known_facts=known_facts or "-")
        try:
            return await self._ask_json(text, EXTRACTION_SCHEMA, lambda d: parse_extraction(d, known_users),
                                        language, purpose="extract", guild=guild)
        except LLMError as exc:
            log.warning("gatekeeper extraction fell back (nothing learned): %s", exc)
            self.on_event("extraction_fallback", {"error": str(exc)})
            return Extraction(source="fallback", error=str(exc))
