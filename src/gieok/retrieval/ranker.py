"""The learned ranker: a linear model over each candidate's ranking features.

One fixed pair of fusion weights cannot suit every query. A Korean question whose only BM25
match is the name of the person asked about, an English question naming a date, a question
answered by the turn right after the one that repeats its words: each needs the signals mixed
differently. The ranker scores every candidate of the hybrid search (BM25's and the vector
search's, plus the turns next to the best) with weights learned on the dev sets
(`gieok bench ranker --save-model`; measured in docs/benchmarks.md, "Learned ranker"):

- what found it: BM25 score (divided by the best), each signal's reciprocal rank, whether it
  was found at all, and the fixed-weight fusion of both;
- its neighbours: the fused score of the turns one and two before and after it;
- the turn itself: its length in tokens (filler such as "ㅋㅋ" or "lol" rarely answers);
- the query: whether the turn's speaker is named in it, whether the turn lies in a time the
  question names ("in May 2023", "작년 여름"), and the share of Hangul in the query, multiplied
  into the main signals so that Korean and English queries get their own weights.

A linear model keeps the ranking explainable: a hit's score is the sum of its features'
contributions, and every hit carries them (`ScoreBreakdown.parts`). Training is pairwise
(RankNet's logistic loss on score differences between an evidence turn and a non-evidence
candidate of the same question), written with numpy alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from datetime import tzinfo
from functools import lru_cache
from importlib import resources
from itertools import compress
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..callbacks import cleared_on_erasure
from ..index.search_index import CandidateFacts
from ..text.dates import DateQuery, asks_when, calendar_time, question_dates
from ..text.romanize import hangul_name_keys, latin_name_keys, name_key

__all__ = ["FEATURES", "Contributions", "LearnedRanker", "QueryContext", "candidate_features", "display_scores",
           "fit_pairwise", "query_context", "shipped_ranker"]

_HANGUL = re.compile(r"[\uac00-\ud7a3\u3131-\u318e]")
_LATIN = re.compile(r"[A-Za-z]")

# The signals a query's script reweights (each also appears as "ko*<name>").
_SCRIPT_SCALED = ("bm25", "bm25_rank", "vector_rank", "fused", "before_1", "after_1", "length", "speaker_named")

FEATURES: tuple[str, ...] = (
    "bm25",            # BM25 score / the best BM25 score among the candidates
    "bm25_found",      # 1 if BM25 found it
    "bm25_rank",       # 1 / BM25 rank (0 if not found)
    "vector_found",    # 1 if the vector search found it
    "vector_rank",     # 1 / vector rank (0 if not found)
    "fused",           # the fixed-weight fusion: bm25 + min-max scaled cosine
    "before_2", "before_1", "after_1", "after_2",  # fused score of the turn that far before / after
    "length",          # log(1 + tokens)
    "short",           # 1 if at most two tokens ("ㅋㅋㅋ", "lol", "헐 대박")
    "speaker_named",   # 1 if the turn's speaker is named in the query
    "date_named",      # 1 if the turn's time lies in a time the query names
    "time_answer",     # 1 if the query asks when and the turn names a time (a number, "yesterday", "주말")
    "script_gap",      # |Hangul share of the query − Hangul share of the turn's tokens|
    "vector_script_rank",  # 1 / vector rank among the vector candidates written in the turn's script
    *(f"ko*{name}" for name in _SCRIPT_SCALED),
)
_INDEX = {name: i for i, name in enumerate(FEATURES)}
_NEIGHBOUR_OFFSETS = {"before_2": -2, "before_1": -1, "after_1": 1, "after_2": 2}
_OFFSETS = np.asarray(list(_NEIGHBOUR_OFFSETS.values()), dtype=np.int64)
_NEIGHBOUR_COLUMNS = np.asarray([_INDEX[name] for name in _NEIGHBOUR_OFFSETS], dtype=np.int64)
_SCALED_COLUMNS = np.asarray([_INDEX[f"ko*{name}"] for name in _SCRIPT_SCALED], dtype=np.int64)
_SCALE_SOURCES = np.asarray([_INDEX[name] for name in _SCRIPT_SCALED], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class QueryContext:
    """What the features need to know about the query itself."""

    folded: str          # casefolded text, for names
    latin_names: frozenset[str]  # name_key of each Latin word, for Korean names written in Latin
    hangul_names: tuple[str, ...]  # name_key of each Hangul word, for Latin names written in Hangul
    hangul_share: float  # Hangul letters / (Hangul + Latin letters); 0.5 when neither
    dates: DateQuery
    asks_when: bool
    zone: tzinfo
    # Names the caller knows for speakers stored under an id (a chat bot stores user ids as
    # speakers and keeps display names out of long-term memory): stored speaker → name.
    speaker_names: Mapping[str, str] = field(default_factory=dict)


def query_context(text: str, now: float, zone: tzinfo,
                  speaker_names: Mapping[str, str] | None = None) -> QueryContext:
    hangul, latin = len(_HANGUL.findall(text)), len(_LATIN.findall(text))
    share = hangul / (hangul + latin) if hangul + latin else 0.5
    return QueryContext(text.casefold(), frozenset(latin_name_keys(text) if latin else ()),
                        tuple(hangul_name_keys(text) if hangul else ()), share, question_dates(text, now, zone),
                        asks_when(text), zone, dict(speaker_names or {}))


@cleared_on_erasure
@lru_cache(maxsize=65536)
def _speaker_forms(name: str) -> tuple[str, str | None, str | None]:
    """A speaker's name as matched in queries: casefolded ("" when too short to match safely),
    the key a Korean name has in Latin letters, the key a Latin name (four letters or more)
    has in Hangul."""
    folded = name.casefold().strip()
    if len(folded) < 2:
        return "", None, None
    if _HANGUL.search(folded):
        return folded, name_key(folded), None
    key = name_key(folded)
    return folded, None, key if len(key) >= 4 and _LATIN.search(folded) else None


def _named_speakers(codes: np.ndarray, names: Sequence[str], query: QueryContext) -> np.ndarray:
    """1.0 where the row's speaker (two characters or more), or the name the caller gave for
    it, occurs in the query, as written or in the other script ("Minji" for 민지, "다니엘은" for
    Daniel)."""
    out = np.zeros(codes.shape[0], dtype=np.float64)
    for code in set(codes.tolist()):
        if not code:
            continue
        stored = names[code]
        alias = query.speaker_names.get(stored)
        if any(_names_in_query(name, query) for name in ((stored, alias) if alias else (stored,))):
            out[codes == code] = 1.0
    return out


def _names_in_query(name: str, query: QueryContext) -> bool:
    folded, korean_key, latin_key = _speaker_forms(name)
    if not folded:
        return False
    return (folded in query.folded or (korean_key is not None and korean_key in query.latin_names)
            or (latin_key is not None and any(k.startswith(latin_key) for k in query.hangul_names)))


def _in_named_time(times: np.ndarray, dates: DateQuery, zone: tzinfo) -> np.ndarray:
    out = np.zeros(times.shape[0], dtype=np.float64)
    for start, end in dates.ranges:
        out[(times >= start) & (times < end)] = 1.0
    if dates.patterns:
        for i, t in enumerate(times.tolist()):
            if out[i]:
                continue
            day = calendar_time(t, zone)
            if day is not None and any(p.month == day.month and (p.day is None or p.day == day.day)
                                       for p in dates.patterns):
                out[i] = 1.0
    return out


def candidate_features(bm25_scores: np.ndarray, bm25_rank: np.ndarray, vector_rank: np.ndarray,
                       fused: np.ndarray, facts: CandidateFacts, query: QueryContext) -> np.ndarray:
    """The (candidates × FEATURES) matrix. Per candidate: BM25 score, BM25 and vector ranks (0
    where not found), fused score, and what the index knows of it (`facts`)."""
    n = bm25_scores.shape[0]
    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return x
    best = float(bm25_scores.max())
    found_b, found_v = bm25_rank > 0, vector_rank > 0
    x[:, _INDEX["bm25"]] = bm25_scores / best if best > 0 else 0.0
    x[:, _INDEX["bm25_found"]] = found_b
    x[:, _INDEX["bm25_rank"]] = np.divide(1.0, bm25_rank, out=np.zeros(n), where=found_b)
    x[:, _INDEX["vector_found"]] = found_v
    x[:, _INDEX["vector_rank"]] = np.divide(1.0, vector_rank, out=np.zeros(n), where=found_v)
    x[:, _INDEX["fused"]] = fused

    # Neighbours looked up in bulk: turns at offset d of a candidate have its sequence key + d.
    keys = facts.sequence_keys
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    wanted = keys[None, :] + _OFFSETS[:, None]
    at = np.minimum(np.searchsorted(sorted_keys, wanted), n - 1)
    hit = (keys >= 0)[None, :] & (sorted_keys[at] == wanted)
    x[:, _NEIGHBOUR_COLUMNS] = np.where(hit, fused[order[at]], 0.0).T

    doc_hangul = facts.hangul_shares.astype(np.float64)
    x[:, _INDEX["script_gap"]] = np.abs(query.hangul_share - doc_hangul)
    # Multilingual embeddings score a passage in the query's language higher: rank the vector
    # candidates of each script apart, so an answer in the other language is not buried.
    found = np.flatnonzero(found_v)
    if found.size:
        by_rank = found[np.argsort(vector_rank[found], kind="stable")]
        korean = doc_hangul[by_rank] >= 0.5
        within = np.where(korean, np.cumsum(korean), np.cumsum(~korean))  # rank among the same script
        x[by_rank, _INDEX["vector_script_rank"]] = 1.0 / within
    lengths = facts.doc_lengths.astype(np.float64)
    x[:, _INDEX["length"]] = np.log1p(lengths)
    x[:, _INDEX["short"]] = lengths <= 2
    x[:, _INDEX["speaker_named"]] = _named_speakers(facts.speaker_codes, facts.speaker_names, query)
    if query.dates:
        x[:, _INDEX["date_named"]] = _in_named_time(facts.event_time, query.dates, query.zone)
    if query.asks_when:
        x[:, _INDEX["time_answer"]] = facts.time_mentions
    x[:, _SCALED_COLUMNS] = query.hangul_share * x[:, _SCALE_SOURCES]
    return x


class Contributions(Mapping[str, float]):
    """A hit's score split by feature (the non-zero parts), built into a dict only when read:
    most searches never look."""

    __slots__ = ("_dict", "_names", "_values")

    def __init__(self, names: tuple[str, ...], values: np.ndarray) -> None:
        self._names = names
        self._values = values
        self._dict: dict[str, float] | None = None

    def _mapping(self) -> dict[str, float]:
        if self._dict is None:
            values = self._values.tolist()
            self._dict = dict(zip(compress(self._names, values), compress(values, values)))  # the non-zero ones
        return self._dict

    def __getitem__(self, name: str) -> float:
        return self._mapping()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())

    # The dict's own views: Mapping's read every value through __getitem__ (a search answer reads ~2,000)
    def keys(self) -> KeysView[str]:
        return self._mapping().keys()

    def values(self) -> ValuesView[float]:
        return self._mapping().values()

    def items(self) -> ItemsView[str, float]:
        return self._mapping().items()

    def __repr__(self) -> str:
        return repr(self._mapping())


class LearnedRanker:
    """Weights over a subset of FEATURES (the ones it was trained with, by name)."""

    def __init__(self, names: Sequence[str], weights: np.ndarray, meta: dict[str, Any] | None = None) -> None:
        unknown = [n for n in names if n not in _INDEX]
        if unknown:
            raise ValueError(f"ranker names unknown features: {', '.join(unknown)}")
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (len(names),) or not np.all(np.isfinite(weights)):
            raise ValueError("ranker needs one finite weight per feature")
        self.names = tuple(names)
        self.weights = weights
        self.meta = dict(meta or {})
        self._columns = np.asarray([_INDEX[n] for n in self.names], dtype=np.int64)

    def scores(self, features: np.ndarray) -> np.ndarray:
        return features[:, self._columns] @ self.weights

    def parts(self, features: np.ndarray) -> list[Contributions]:
        """For each row of `features`, each feature's contribution to its score."""
        contributions = features[:, self._columns] * self.weights
        return [Contributions(self.names, row) for row in contributions]

    def save(self, target: str | Path | IO[bytes]) -> None:
        np.savez(target, names=np.array(self.names), weights=self.weights,
                 meta=np.array(json.dumps(self.meta, ensure_ascii=False)))

    @classmethod
    def load(cls, source: str | Path | IO[bytes]) -> LearnedRanker:
        with np.load(source, allow_pickle=False) as data:
            return cls([str(n) for n in data["names"]], data["weights"], json.loads(str(data["meta"])))


SHIPPED = "ranker.npz"


def shipped_ranker() -> LearnedRanker:
    """The weights trained on the dev sets (`gieok bench ranker --save-model`)."""
    with resources.files("gieok.data").joinpath(SHIPPED).open("rb") as handle:
        return LearnedRanker.load(handle)


def fit_pairwise(groups: Sequence[tuple[np.ndarray, np.ndarray]], *, group_weights: Sequence[float] | None = None,
                 l2: float = 1e-3, negatives: int | None = 60,
                 order_by: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """Linear weights minimising the logistic loss of (evidence − other) score differences.

    `groups`: one (features, labels) pair per question. Each evidence candidate is paired with
    the question's `negatives` highest non-evidence candidates by `order_by` (the first-stage
    score; all of them when either is None), every question counting `group_weights[i]` in total.
    Newton's method on standardised differences with an L2 penalty: a few exact steps, no
    learning rate to tune, the same weights every run."""
    diffs: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for i, (x, y) in enumerate(groups):
        pos = np.flatnonzero(y > 0)
        neg = np.flatnonzero(y <= 0)
        if not len(pos) or not len(neg):
            continue
        if order_by is not None and negatives is not None and len(neg) > negatives:
            neg = neg[np.argsort(-order_by[i][neg], kind="stable")[:negatives]]
        d = (x[pos][:, None, :] - x[neg][None, :, :]).reshape(-1, x.shape[1])
        diffs.append(d)
        weights.append(np.full(len(d), (group_weights[i] if group_weights is not None else 1.0) / len(d)))
    if not diffs:
        raise ValueError("no question has both evidence and other candidates")
    d = np.concatenate(diffs)
    pair_weight = np.concatenate(weights)
    pair_weight /= pair_weight.sum()
    scale = d.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = d / scale
    w = np.zeros(z.shape[1])
    eye = np.eye(z.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(np.clip(z @ w, -30.0, 30.0)))  # P(pair ordered wrongly)
        grad = -(z.T @ (pair_weight * p)) + l2 * w
        hessian = (z * (pair_weight * p * (1.0 - p))[:, None]).T @ z + l2 * eye
        step = np.linalg.solve(hessian, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return w / scale


def display_scores(raw: np.ndarray) -> np.ndarray:
    """Raw ranker scores mapped into (0, 1], the best at 1, order kept (hit scores stay
    comparable with the other ranking modes, whose best hit is also 1)."""
    if raw.shape[0] == 0:
        return raw
    return 2.0 / (1.0 + np.exp(np.minimum(raw.max() - raw, 700.0)))

