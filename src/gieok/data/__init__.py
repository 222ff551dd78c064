"""Data the engine ships: the learned ranker's weights, English stop words and the demo chat.
(The chat's labeled training sets and classifier weights are in `gieok.chat.data`; evaluation
data stays with the benchmarks, outside the wheel.) Read with `importlib.resources`."""

__all__: list[str] = []
