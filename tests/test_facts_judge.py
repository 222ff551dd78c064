"""The L3 fact judge on real facts: the offline judge's token alignment (the real tokenizer and
embedder, real SQLite files) and the extraction model's verdicts as `FactStore` applies them."""

from __future__ import annotations

from gieok import Memory
from gieok.layers.facts import FactStore, ModelVerdict, PairJudge
from gieok.store.conversation import ConversationTables
from gieok.text.tokenize import get_tokenizer


def facts_of(memory: Memory) -> FactStore:
    return FactStore(memory, ConversationTables(memory.store))


def add(facts: FactStore, text: str, user: str = "1", verdict: ModelVerdict | None = None):
    return facts.add(text, fact_type="user_fact", guild="g1", user_id=user, verdict=verdict)


def current(facts: FactStore, user: str = "1") -> list[str]:
    return [f.text for f in facts.facts(user_id=user)]


def label(old: str, new: str) -> str:
    tokenizer = get_tokenizer()
    return PairJudge().judge(0.99, tokenizer.tokens(new), tokenizer.tokens(old), new, old)


def test_a_new_age_never_supersedes_the_cat(memory: Memory) -> None:
    """Regression: "24살" superseded the same user's unrelated "고양이 이름은 나비" (a number
    appeared, and the cosine of two short facts about one user was high)."""
    facts = facts_of(memory)
    cat = add(facts, "<user:1>의 고양이 이름은 나비다.")
    age = add(facts, "<user:1>는 24살이다.")
    assert age.action == "stored" and age.replaced is None
    older = add(facts, "<user:1>는 25살이다.")
    assert older.action == "superseded" and older.replaced.block_index == age.fact.block_index
    assert current(facts) == ["<user:1>의 고양이 이름은 나비다.", "<user:1>는 25살이다."]
    assert cat.fact.block_index in {f.block_index for f in facts.facts(user_id="1")}


def test_offline_judge_aligns_the_changed_span() -> None:
    # same attribute, same value, other words → duplicate
    assert label("<user:1>는 부산에 산다.", "<user:1>의 거주지는 부산이다.") == "duplicate"
    assert label("<user:1>는 여동생이 한 명 있다.", "<user:1>에게는 여동생이 하나 있다.") == "duplicate"
    assert label("<user:1> has a cat named Nabi.", "<user:1> owns a cat called Nabi.") == "duplicate"
    # same attribute, another value → conflict
    assert label("<user:1>는 24살이다.", "<user:1>는 25살이다.") == "conflict"
    assert label("<user:1> is 27 years old.", "<user:1>는 28살이다.") == "conflict"
    assert label("<user:1>는 커피를 좋아한다.", "<user:1>는 이제 커피를 싫어한다.") == "conflict"
    assert label("<user:1> has a cat named Mochi.", "<user:1> has a cat named Miso.") == "conflict"
    assert label("이 서버의 서버장은 <user:1>이다.", "이 서버의 서버장은 <user:2>이다.") == "conflict"
    # another attribute, or a many-valued one → distinct
    assert label("<user:1>의 고양이 이름은 나비다.", "<user:1>는 24살이다.") == "distinct"
    assert label("<user:1> is 31 years old.", "<user:1> has been playing piano for 31 years.") == "distinct"
    assert label("<user:1>는 일본어를 할 줄 안다.", "<user:1>는 중국어를 할 줄 안다.") == "distinct"
    assert label("<user:1> got married in June 2022.", "<user:1> got engaged in June 2021.") == "distinct"
    assert label("<user:1> lives in Incheon.", "<user:1>는 인천에 거주한다.") != "conflict", "a translation"
    assert label("<user:1>는 고양이 나비를 키운다.", "<user:2>는 고양이 나비를 키운다.") == "distinct"


def test_model_duplicate_and_replaces_are_applied(memory: Memory) -> None:
    facts = facts_of(memory)
    home = add(facts, "<user:1>는 부산에 산다.").fact
    cat = add(facts, "<user:1>의 고양이 이름은 나비다.").fact
    shown = frozenset({home.block_index, cat.block_index})
    # a paraphrase the offline judge would store again: the model says it repeats `home`
    again = add(facts, "<user:1>는 해운대 근처, 그러니까 부산에서 지낸다.",
                verdict=ModelVerdict("duplicate", home.block_index, shown))
    assert again.action == "duplicate" and again.judged_by == "model" and again.fact.block_index == home.block_index
    moved = add(facts, "<user:1>는 서울로 이사했다.", verdict=ModelVerdict("replaces", home.block_index, shown))
    assert moved.action == "superseded" and moved.replaced.block_index == home.block_index
    assert current(facts) == ["<user:1>의 고양이 이름은 나비다.", "<user:1>는 서울로 이사했다."]


def test_a_verdict_naming_a_retired_fact_falls_back_to_the_offline_judge(memory: Memory) -> None:
    facts = facts_of(memory)
    age = add(facts, "<user:1>는 24살이다.").fact
    add(facts, "<user:1>는 25살이다.")  # `age` is retired meanwhile
    late = add(facts, "<user:1>의 고양이 이름은 나비다.", verdict=ModelVerdict("replaces", age.block_index,
                                                                       frozenset({age.block_index})))
    assert late.action == "stored" and late.judged_by == "offline" and "not a current fact" in late.note
    assert current(facts) == ["<user:1>는 25살이다.", "<user:1>의 고양이 이름은 나비다."]


def test_add_is_still_judged_against_facts_the_model_did_not_see(memory: Memory) -> None:
    facts = facts_of(memory)
    seen = add(facts, "<user:1>는 커피를 좋아한다.").fact
    unseen = add(facts, "<user:1>는 24살이다.").fact  # written after the model was shown the list
    outcome = add(facts, "<user:1>는 25살이다.", verdict=ModelVerdict("add", None, frozenset({seen.block_index})))
    assert outcome.action == "superseded" and outcome.replaced.block_index == unseen.block_index
    same = add(facts, "<user:1>는 커피를 좋아한다", verdict=ModelVerdict("add", None, frozenset({seen.block_index})))
    assert same.action == "duplicate", "the very same text is never stored twice"
