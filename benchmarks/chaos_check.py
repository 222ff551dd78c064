"""The checks of `gieok bench chaos`, made after the run from its recorded history and the
database (every process stopped):

- **writes**: every acknowledged write is in the store, under the block index it was
  acknowledged with (`acked_lost`: not there at all); no writer's tag is stored twice
  (`stored_twice`, any write, acknowledged or not: a retry must never store a second copy);
- **chat**: every message sent is answered (`messages_lost`, of which `messages_undelivered`
  reached no live bot process) or recorded as missed (`missed_killed_mid_turn`: a turn had taken
  it — the `claimed` event — in a process that was then killed before its reply went out; the
  runtime answers at most once), once (`answered_twice`), in its own channel (`misrouted`), and,
  within a channel, never after a later message of the channel was answered
  (`out_of_order`; a message a restarted bot took in from the channel's history, `caught_up`, is
  answered late by design and not counted); each message is stored as one L1 row (`chat_stored_twice`) and every L1 row
  becomes one turn block (`l1_written_twice`);
- **the chain** verifies (`Memory.verify()`);
- **what clients saw**: every HTTP attempt's outcome (`client_errors`: 503s, and among them those
  without a JSON body or a Retry-After; other 5xx; timeouts; dropped connections), in total and
  inside each fault's window (from its start to its recovery);
- **recovery** of each fault: from its end (the service back, or the kill or drop itself) to
  the later of the first acknowledged HTTP write that started after it and the first reply to a
  chat message sent after it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from benchmarks.chaos_faults import Fault
from benchmarks.chaos_load import History
from benchmarks.loopback_llm import TAG
from benchmarks.report import p50_p95
from gieok.memory import Memory

__all__ = ["check_run", "recovered_at"]

WRITER_TAG_PREFIX = "[w"


def recovered_at(history: History, fault: Fault) -> float | None:
    """The fault's recovery time (module docstring), or None if the run never recovered."""
    http = history.last_success_after(fault.ended)
    chat = history.first_reply_after(fault.ended)
    return None if http is None or chat is None else max(http, chat)


def _replies(history: History) -> list[dict[str, Any]]:
    """Each reply message the bots sent, as its channel shows it at the end: the last text sent or
    edited under its id, the time it was first sent, its channel."""
    final: dict[str, dict[str, Any]] = {}
    for event in history.snapshot("bot_events"):
        if event.get("ev") not in ("send", "edit"):
            continue
        mid = event["mid"]
        if mid not in final:
            final[mid] = {"mid": mid, "channel": event["channel"], "t": event["t"], "text": event["text"],
                          "proc": event["proc"]}
        else:
            final[mid]["text"] = event["text"]
    return sorted(final.values(), key=lambda r: r["t"])


def _killed_mid_turn(history: History, faults: Sequence[Fault], lost: Sequence[Any]) -> set[str]:
    """Tags of lost messages that a turn had taken (`claimed`) in a process killed (kill -9) after
    it took them: the runtime answers a message at most once, so these are recorded as missed
    rather than answered again by the next process (which could answer twice)."""
    import re

    killed: dict[int, float] = {}
    for fault in faults:
        # a bot that died in a claim (kill_bot_in_claim) was killed too: at the fault's end
        found = re.search(r"pid (\d+)", fault.target) if fault.kind in ("kill_bot", "kill_bot_in_claim") \
            and not fault.skipped else None
        if found:
            killed[int(found.group(1))] = fault.started if fault.kind == "kill_bot" else fault.ended
    claimed: dict[str, tuple[int, float]] = {}
    for event in history.snapshot("bot_events"):
        if event.get("ev") == "claimed":
            for message_id in event.get("ids") or ():
                claimed[f"[{message_id}]"] = (int(event.get("pid", 0)), float(event["t"]))
    missed = set()
    for sent in lost:
        pid, when = claimed.get(sent.tag, (0, 0.0))
        if pid in killed and killed[pid] >= when:
            missed.add(sent.tag)
    return missed


def _chat(history: History, faults: Sequence[Fault] = ()) -> dict[str, Any]:
    sent = history.snapshot("sent")
    channel_of = {s.tag: s.channel for s in sent}
    number_of = {s.tag: s.number for s in sent}
    answered: Counter[str] = Counter()
    misrouted = out_of_order = 0
    highest: dict[str, int] = defaultdict(int)
    # taken in from a channel's history by a (re)started bot: nobody had it before, so it is answered
    # after later messages of its channel — late, not out of the order any live process kept
    caught_up = {f"[{message_id}]" for e in history.snapshot("bot_events") if e.get("ev") == "caught_up"
                 for message_id in e.get("ids") or ()}  # a message's id is its tag without brackets (chat_tag)
    late: list[str] = []  # examples: "tag (proc) after #n"
    for reply in _replies(history):
        tags = list(dict.fromkeys(TAG.findall(reply["text"])))
        for tag in tags:
            if channel_of.get(tag) != reply["channel"]:
                misrouted += 1
                continue
            if not answered[tag] and number_of[tag] < highest[reply["channel"]] and tag not in caught_up:
                out_of_order += 1
                late.append(f"{tag}({reply['proc']})<#{highest[reply['channel']]}")
            answered[tag] += 1
        for tag in tags:
            if channel_of.get(tag) == reply["channel"]:
                highest[reply["channel"]] = max(highest[reply["channel"]], number_of[tag])
    unanswered = [s for s in sent if not answered[s.tag]]
    missed = _killed_mid_turn(history, faults, unanswered)
    lost = [s for s in unanswered if s.tag not in missed]
    events = history.snapshot("bot_events")
    return {"sent": len(sent), "answered": sum(1 for s in sent if answered[s.tag]),
            "missed_killed_mid_turn": len(missed),
            "messages_lost": len(lost), "messages_undelivered": sum(1 for s in lost if s.delivered == 0),
            "answered_twice": sum(1 for s in sent if answered[s.tag] > 1), "misrouted": misrouted,
            "out_of_order": out_of_order, "caught_up": len(caught_up),
            "refused_by_a_process": sum(1 for e in events if e.get("ev") == "refused"),
            # bots that died between a claim and its enqueue: each message must still be answered
            "died_in_claim": sum(1 for e in events if e.get("ev") == "died_in_claim"),
            "_lost_examples": [s.tag for s in lost[:10]], "_missed_examples": sorted(missed)[:10],
            "_twice_examples": [tag for tag, n in answered.items() if n > 1][:10], "_order_examples": late[:10]}


def _store(db: str, history: History) -> dict[str, Any]:
    writes = history.snapshot("writes")
    sent = {s.tag for s in history.snapshot("sent")}
    blocks_with: dict[str, list[int]] = defaultdict(list)
    l1_turns: Counter[int] = Counter()
    chat_user_turns: Counter[str] = Counter()
    with Memory(db) as memory:
        by_index = {}
        for block in memory.iter_blocks():
            if block.forgotten:
                continue
            by_index[block.block_index] = block.text
            for tag in TAG.findall(block.text):
                if block.kind == "turn" and block.metadata.get("role") == "user":
                    chat_user_turns[tag] += 1
            for tag in _writer_tags(block.text):
                blocks_with[tag].append(block.block_index)
            if block.kind == "turn" and "l1_message" in block.metadata:
                l1_turns[int(block.metadata["l1_message"])] += 1
        chain = memory.verify()
    lost = wrong_index = 0
    examples: list[str] = []
    for write in writes:
        if not write.acked:
            continue
        found = blocks_with.get(write.tag, [])
        if not found:
            lost += 1
            examples.append(write.tag)
        elif write.kind == "memory" and write.block_index not in found:
            wrong_index += 1
    twice = sorted(tag for tag, found in blocks_with.items() if len(found) > 1)
    return {"writes": len(writes), "acked": sum(1 for w in writes if w.acked),
            "unacked": sum(1 for w in writes if not w.acked), "acked_lost": lost, "acked_wrong_index": wrong_index,
            "stored_twice": len(twice), "chat_stored_twice": sum(1 for t, n in chat_user_turns.items() if n > 1),
            "messages_unstored": sum(1 for tag in sent if not chat_user_turns[tag]),
            "l1_written_twice": sum(1 for n in l1_turns.values() if n > 1),
            "chain_verified": chain.ok, "chain": chain.as_dict(),
            "_lost_examples": examples[:10], "_twice_examples": twice[:10]}


def _writer_tags(text: str) -> list[str]:
    import re

    return re.findall(r"\[w\d+-\d+\]", text)


def _outcome(status: int | None, error: str | None, json_body: bool, retry_after: bool) -> str:
    if status is None:
        return "timeouts" if error == "timeout" else "connection_errors"
    if status == 503:
        return "503" if json_body and retry_after else "503_incomplete"
    if status >= 500:
        return "500"
    if status >= 400:
        return "4xx"
    return "ok"


def _client_view(history: History, faults: Sequence[Fault]) -> dict[str, Any]:
    attempts = history.snapshot("attempts")
    total: Counter[str] = Counter(_outcome(a.status, a.error, a.json_body, a.retry_after) for a in attempts)
    during: dict[str, Counter[str]] = defaultdict(Counter)
    for fault in faults:
        if fault.skipped:
            continue
        until = fault.recovered if fault.recovered is not None else fault.ended + 60
        for a in attempts:
            if fault.started <= a.t0 <= until:
                during[fault.kind][_outcome(a.status, a.error, a.json_body, a.retry_after)] += 1
    keys = ("503", "500", "timeouts", "connection_errors", "503_incomplete", "4xx")
    return {"client_errors": {k: total.get(k, 0) for k in keys}, "requests": len(attempts),
            "client_view_by_kind": {kind: {k: c.get(k, 0) for k in ("ok", *keys)}
                                    for kind, c in sorted(during.items())}}


def check_run(db: str, history: History, faults: Sequence[Fault], processes: dict[str, Any]) -> dict[str, Any]:
    """The report's numbers (module docstring); `processes`: what the harness counted of the
    processes (unexpected exits, restarts)."""
    injected = [f for f in faults if not f.skipped]
    for fault in injected:
        fault.recovered = recovered_at(history, fault)
    recoveries = [f.recovered - f.ended for f in injected if f.recovered is not None]
    by_kind: dict[str, list[float]] = defaultdict(list)
    for fault in injected:
        if fault.recovered is not None:
            by_kind[fault.kind].append(fault.recovered - fault.ended)
    chat = _chat(history, injected)
    store = _store(db, history)
    view = _client_view(history, faults)
    report: dict[str, Any] = {
        "faults": {"total": len(injected), "by_kind": dict(sorted(Counter(f.kind for f in injected).items())),
                   "skipped": len(faults) - len(injected)},
        "acked_lost": store["acked_lost"],
        "stored_twice": store["stored_twice"],
        "messages_lost": chat["messages_lost"],
        "answered_twice": chat["answered_twice"],
        "misrouted": chat["misrouted"],
        "out_of_order": chat["out_of_order"],
        "chain_verified": store["chain_verified"],
        "client_errors": view["client_errors"],
        "recovery_s": p50_p95(recoveries),
        "recovery_s_by_kind": {kind: {**p50_p95(values), "max": round(max(values), 3)}
                               for kind, values in sorted(by_kind.items())},
        "not_recovered": sum(1 for f in injected if f.recovered is None),
        "l1_written_twice": store["l1_written_twice"],
        "writes": {k: store[k] for k in ("writes", "acked", "unacked", "acked_wrong_index")},
        "missed_killed_mid_turn": chat["missed_killed_mid_turn"],
        "chat": {k: chat[k] for k in ("sent", "answered", "messages_undelivered", "refused_by_a_process",
                                      "died_in_claim")}
                | {"chat_stored_twice": store["chat_stored_twice"], "messages_unstored": store["messages_unstored"]},
        "requests": view["requests"],
        "client_view_by_kind": view["client_view_by_kind"],
        "processes": processes,
        "fault_log": [f.as_dict() for f in injected],
        "_examples": {"acked_lost": store["_lost_examples"], "stored_twice": store["_twice_examples"],
                      "messages_lost": chat["_lost_examples"], "answered_twice": chat["_twice_examples"],
                      "out_of_order": chat["_order_examples"], "missed_killed_mid_turn": chat["_missed_examples"]},
        "_chain": store["chain"],
    }
    return report
