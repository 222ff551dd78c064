"""Issue 43: a serve worker's search cache must not keep results no one can be answered with.

Chat queries rarely repeat and every turn writes to its channel, so under an agent's loop nearly
every cached result is made stale by the next turn. The cache drops those at the write (and
expired ones at the next put) instead of holding them until the LRU pushes them out, and keeps
nothing per conversation beyond its live entries.
"""

from __future__ import annotations

from gieok import Memory, Scope
from gieok.layers.cache import SearchCache
from manual_clock import ManualClock


def test_more_conversations_than_entries_keep_at_most_the_bound() -> None:
    cache = SearchCache(max_entries=8, ttl_seconds=300)
    for n in range(8 + 5):  # N + k conversations searched, none written to
        scope = Scope(guild="g", channel=f"대화-{n}", user=f"user-{n}")
        cache.put(scope, cache.key(scope, "고양이 이름이 뭐야?"), (f"hit {n}",))
    assert len(cache) == 8
    assert cache.scopes_tracked() == 8  # the five oldest conversations left nothing behind
    newest = Scope(guild="g", channel="대화-12", user="user-12")
    assert cache.get(newest, cache.key(newest, "고양이 이름이 뭐야")) == ("hit 12",)


def test_a_write_releases_the_results_it_made_stale_and_no_others() -> None:
    cache = SearchCache(max_entries=64, ttl_seconds=300)
    quiet = Scope(guild="g", channel="quiet")
    cache.put(quiet, cache.key(quiet, "what is the cat's name"), ("quiet hit",))
    for n in range(40):  # the agents' loop: a search in a conversation, then a turn written to it
        channel, user = Scope(guild="g", channel=f"agent-{n}"), Scope(guild="g", channel=f"agent-{n}", user="u")
        cache.put(channel, cache.key(channel, f"오늘 저녁 {n}"), ("stale soon",))
        cache.put(user, cache.key(user, f"dinner tonight {n}"), ("stale soon",))
        cache.invalidate(Scope(guild="g", channel=f"agent-{n}", user="u"))
    assert len(cache) == 1
    assert cache.scopes_tracked() == 1
    assert cache.get(quiet, cache.key(quiet, "What is the cat's name?")) == ("quiet hit",)
    everything = Scope()
    cache.put(everything, cache.key(everything, "cat"), ("unscoped",))
    cache.invalidate(Scope(guild="g", channel="elsewhere"))  # an unscoped search sees every write
    assert cache.get(everything, cache.key(everything, "cat")) is None
    assert cache.get(quiet, cache.key(quiet, "what is the cat's name")) == ("quiet hit",)


def test_expired_results_are_released_at_the_next_put() -> None:
    clock = ManualClock()
    cache = SearchCache(max_entries=64, ttl_seconds=60, clock=clock)
    for n in range(5):
        scope = Scope(channel=f"c{n}")
        cache.put(scope, cache.key(scope, "보리"), ("old",))
    clock.now += 61
    fresh = Scope(channel="fresh")
    cache.put(fresh, cache.key(fresh, "bori"), ("new",))
    assert len(cache) == 1
    assert cache.scopes_tracked() == 1


def test_memory_keeps_no_stale_results_and_answers_with_the_new_turn(tmp_path) -> None:
    with Memory(tmp_path / "m.db", cache_size=64) as memory:
        for n in range(6):
            scope = {"guild": "g", "channel": f"ch{n}"}
            memory.remember(f"민지: 우리 고양이 이름은 보리야 ({n})", scope=scope, speaker="민지")
            others = len(memory.cache)  # the earlier conversations' last answers
            before = memory.search("고양이 이름", k=5, scope=scope)
            assert len(memory.cache) > others
            memory.remember(f"Alex: my dog is called Max ({n})", scope=scope, speaker="Alex")
            assert len(memory.cache) == others  # the write released the result it made stale, only it
            after = memory.search("고양이 이름", k=5, scope=scope)
            assert len(after.hits) == len(before.hits) + 1  # answered again, with the new turn
        assert memory.cache.scopes_tracked() == 6
        quiet = {"guild": "g", "channel": "ch0"}
        memory.search("dog name", k=5, scope=quiet)
        kept = len(memory.cache)
        memory.remember("지훈: 오늘 회의는 세 시", scope={"guild": "g", "channel": "ch5"}, speaker="지훈")
        assert len(memory.cache) < kept  # ch5's answers released; ch0's left alone
        assert memory.cache.scopes_tracked() == 5
