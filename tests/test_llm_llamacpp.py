"""The llama.cpp provider against a real llama-cpp-python build and a real (tiny) GGUF model.

No model can be downloaded here, so the test writes one: a llama-architecture GGUF with seeded
random weights (2 layers, width 64, 4 heads), a SentencePiece-style vocabulary of a few hundred
tokens (control tokens, all 256 byte tokens, printable ASCII, a few merges) and a ChatML chat
template, about 0.5 MB, made with the `gguf` package in well under a second. llama.cpp loads
it and generates; the text is garbage, which is the point: everything between `LlamaCppLLM`
and llama.cpp runs for real (loading, chat templates, tokenising, sampling, grammars, streaming,
tool-call parsing), and only the words mean nothing.

Nothing is mocked. Where a test needs to see when llama.cpp was busy, it wraps the real loaded
model's `create_chat_completion` and calls through.

Skipped unless the optional pieces are installed (CI does not install them):
    CMAKE_ARGS="-DGGML_NATIVE=OFF" .venv/bin/pip install 'llama-cpp-python==0.3.36' gguf==0.19.0
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is an optional extra: "
                    "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'gieok[llamacpp]'")
gguf = pytest.importorskip("gguf", reason="the test builds its GGUF model with the gguf package "
                           "(in the llamacpp extra): pip install gguf==0.19.0")

import numpy as np  # noqa: E402

from gieok.chat.llm import ChatMessage, ToolCall, ToolSpec, create_llm  # noqa: E402
from gieok.chat.llm.llamacpp import LlamaCppLLM  # noqa: E402
from gieok.chat.settings import ChatSettings  # noqa: E402
from gieok.errors import LLMError  # noqa: E402

CHATML = ("{% for message in messages %}{{ '<|im_start|>' ~ message['role'] ~ '\\n' ~ (message['content'] or '') "
          "~ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
N_CTX_TRAIN = 512
QUESTION = [ChatMessage("system", "You are terse."), ChatMessage("user", "Hello there, how are you?")]
MOOD = {"type": "object", "additionalProperties": False, "required": ["mood", "loud"],
        "properties": {"mood": {"enum": ["up", "down"]}, "loud": {"type": "boolean"}}}
SET_MOOD = ToolSpec("set_mood", "Set the mood of the room.", MOOD)


def write_tiny_llama(path: Path, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                     n_layer: int = 2, n_ff: int = 128) -> int:
    """A llama-architecture GGUF with seeded random F32 weights; returns the vocabulary size."""
    token_type = gguf.TokenType
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(piece: str, kind: Any = token_type.NORMAL, score: float = 0.0) -> None:
        tokens.append(piece)
        scores.append(score)
        types.append(kind)

    for piece, kind in (("<unk>", token_type.UNKNOWN), ("<s>", token_type.CONTROL), ("</s>", token_type.CONTROL),
                        ("<|im_start|>", token_type.CONTROL), ("<|im_end|>", token_type.CONTROL)):
        add(piece, kind)
    for byte in range(256):  # SPM byte fallback: any text tokenises, any byte can be generated
        add(f"<0x{byte:02X}>", token_type.BYTE)
    add("\u2581", score=-1.0)  # SentencePiece's word-boundary space
    for code in range(0x21, 0x7F):
        add(chr(code), score=-1.0)
    for merge in ("\u2581t", "th", "he", "\u2581th", "\u2581the", "in", "er", "an", "\u2581a"):
        add(merge, score=-0.5 + 0.01 * len(merge))  # SPM merges pairs by score, so longer ones win

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("gieok-test-tiny-llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))  # ChatML ends a turn with it
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def weights(name: str, rows: int, cols: int, scale: float) -> None:
        # numpy (rows, cols) is ggml's ne = {cols, rows}: rows are the output features
        writer.add_tensor(name, (rng.standard_normal((rows, cols)) * scale).astype(np.float32))

    def ones(name: str) -> None:
        writer.add_tensor(name, np.ones(n_embd, dtype=np.float32))

    weights("token_embd.weight", len(tokens), n_embd, 1.0)
    ones("output_norm.weight")
    weights("output.weight", len(tokens), n_embd, 1.0)
    for layer in range(n_layer):
        block = f"blk.{layer}"
        ones(f"{block}.attn_norm.weight")
        weights(f"{block}.attn_q.weight", n_head * head_dim, n_embd, 0.1)
        weights(f"{block}.attn_k.weight", n_head_kv * head_dim, n_embd, 0.1)
        weights(f"{block}.attn_v.weight", n_head_kv * head_dim, n_embd, 0.1)
        weights(f"{block}.attn_output.weight", n_embd, n_head * head_dim, 0.1)
        ones(f"{block}.ffn_norm.weight")
        weights(f"{block}.ffn_gate.weight", n_ff, n_embd, 0.1)
        weights(f"{block}.ffn_up.weight", n_ff, n_embd, 0.1)
        weights(f"{block}.ffn_down.weight", n_embd, n_ff, 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(tokens)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_tiny_llama(path)
    return path


def tiny(model_path: Path, **options: Any) -> LlamaCppLLM:
    options.setdefault("n_ctx", N_CTX_TRAIN)
    options.setdefault("n_threads", 1)  # the box is shared; a 64-wide model gains nothing from more
    return LlamaCppLLM(str(model_path), **options)


def spy_on_model(llm: LlamaCppLLM, *, hold: float = 0.0) -> tuple[list[tuple[float, float]], threading.Event]:
    """Load the real model and wrap its `create_chat_completion`: records (start, end) of each
    call, sets the event when one starts, and keeps the model busy `hold` seconds longer."""
    asyncio.run(llm.chat(QUESTION, max_tokens=1))  # loads it
    model = llm._llama
    real: Callable[..., Any] = model.create_chat_completion
    spans: list[tuple[float, float]] = []
    started = threading.Event()

    def timed(**request: Any) -> Any:
        start = time.monotonic()
        started.set()
        try:
            result = real(**request)
            time.sleep(hold)
            return result
        finally:
            spans.append((start, time.monotonic()))

    model.create_chat_completion = timed
    return spans, started


def test_constructing_does_not_load_the_model(model_path: Path) -> None:
    llm = tiny(model_path)
    assert not llm.loaded
    assert (llm.name, llm.model, llm.provider) == ("llamacpp:tiny-llama.gguf", "tiny-llama.gguf", "llamacpp")
    asyncio.run(llm.chat(QUESTION, max_tokens=2))
    assert llm.loaded


def test_chat_returns_text(model_path: Path) -> None:
    response = asyncio.run(tiny(model_path).chat(QUESTION, temperature=0.0, max_tokens=16))
    assert isinstance(response.text, str) and response.text  # random weights: garbage, but text
    assert response.tool_calls == []
    assert (response.provider, response.model) == ("llamacpp", "tiny-llama.gguf")
    # not <= 16: llama-cpp-python checks max_tokens only once a UTF-8 character is complete, and
    # random weights sample lone byte tokens that start multi-byte characters
    assert response.usage["completion_tokens"] > 0
    assert response.usage["prompt_tokens"] > 10  # the ChatML prompt, special tokens and all
    assert response.usage["total_tokens"] == response.usage["prompt_tokens"] + response.usage["completion_tokens"]


def test_stream_yields_the_same_reply_in_pieces(model_path: Path) -> None:
    llm = tiny(model_path)

    async def collect() -> list[str]:
        return [piece async for piece in llm.stream(QUESTION, temperature=0.0, max_tokens=16)]

    pieces = asyncio.run(collect())
    assert len(pieces) > 1 and all(isinstance(p, str) and p for p in pieces)
    # greedy decoding is deterministic: the pieces join to what chat answers
    assert "".join(pieces) == asyncio.run(llm.chat(QUESTION, temperature=0.0, max_tokens=16)).text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_constrains_the_output_with_a_grammar(model_path: Path, temperature: float) -> None:
    llm = tiny(model_path)
    free = asyncio.run(llm.chat(QUESTION, temperature=temperature, max_tokens=32)).text
    with pytest.raises(ValueError):  # unconstrained, random weights write no JSON...
        json.loads(free)
    for question in (QUESTION, [ChatMessage("user", "mood?")], [ChatMessage("user", "아무 말이나 해 봐")]):
        text = asyncio.run(llm.chat(question, json_schema=MOOD, temperature=temperature, max_tokens=32)).text
        value = json.loads(text)  # ...constrained, they can write nothing else
        assert set(value) == {"mood", "loud"}
        assert value["mood"] in ("up", "down") and isinstance(value["loud"], bool)


def test_a_missing_file_is_an_llm_error(tmp_path: Path) -> None:
    with pytest.raises(LLMError, match="GGUF model file not found"):
        LlamaCppLLM(str(tmp_path / "absent.gguf"))
    with pytest.raises(LLMError, match="GGUF model file not found"):
        create_llm(ChatSettings.load(llm_chain=f"llamacpp:{tmp_path / 'absent.gguf'}"))


def test_a_broken_file_is_an_llm_error_and_llama_cpp_says_why_in_the_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file" * 64)
    llm = tiny(broken)  # it is a file: construction succeeds, the load fails on first use
    with (caplog.at_level(logging.DEBUG, logger="gieok.llama_cpp"),
          pytest.raises(LLMError, match=r"llamacpp:broken\.gguf: .*Failed to load model")):
        asyncio.run(llm.chat(QUESTION, max_tokens=4))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("invalid magic" in message for message in errors), errors
    assert "llama" not in capfd.readouterr().err


def test_llama_cpp_logs_go_to_logging_not_stderr(model_path: Path, caplog: pytest.LogCaptureFixture,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger="gieok.llama_cpp"):
        # a context beyond the trained one makes llama.cpp warn while loading
        asyncio.run(tiny(model_path, n_ctx=2 * N_CTX_TRAIN).chat(QUESTION, max_tokens=4))
    out, err = capfd.readouterr()
    assert err == "" and out == ""
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("n_ctx_train" in message for message in warnings), warnings
    assert any(r.levelno == logging.DEBUG and "llama.cpp:" in r.getMessage() for r in caplog.records)


def test_context_overflow_is_an_llm_error(model_path: Path) -> None:
    long = [ChatMessage("user", "word " * 2000)]
    with pytest.raises(LLMError, match="exceed context window"):
        asyncio.run(tiny(model_path, n_ctx=256).chat(long, max_tokens=4))


def test_concurrent_calls_both_complete_one_at_a_time(model_path: Path) -> None:
    llm = tiny(model_path)
    spans, _ = spy_on_model(llm, hold=0.05)

    async def both() -> list[Any]:
        return await asyncio.gather(llm.chat(QUESTION, max_tokens=8),
                                    llm.chat([ChatMessage("user", "and you?")], json_schema=MOOD, max_tokens=32))

    first, second = asyncio.run(both())
    assert first.text and json.loads(second.text)["mood"] in ("up", "down")
    (_a_start, a_end), (b_start, _b_end) = sorted(spans)
    assert a_end <= b_start  # never two calls in one llama.cpp context at once


def test_a_cancelled_call_keeps_the_model_until_its_thread_is_done(model_path: Path) -> None:
    """A caller that gives up (a timeout, a failover) cannot stop llama.cpp mid-call: the next
    call must wait for that thread, not start beside it on the same context."""
    llm = tiny(model_path)
    spans, started = spy_on_model(llm, hold=0.3)

    async def cancel_then_ask() -> str:
        doomed = asyncio.create_task(llm.chat(QUESTION, max_tokens=4))
        await asyncio.to_thread(started.wait, 10)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return (await llm.chat(QUESTION, max_tokens=4)).text

    asyncio.run(cancel_then_ask())
    (_a_start, a_end), (b_start, _b_end) = sorted(spans)
    assert a_end <= b_start


def test_a_stream_left_early_frees_the_model(model_path: Path) -> None:
    llm = tiny(model_path)

    async def take_one_then_chat() -> str:
        pieces = llm.stream(QUESTION, temperature=0.0, max_tokens=32)
        first = await anext(pieces)
        await pieces.aclose()
        reply = await asyncio.wait_for(llm.chat(QUESTION, max_tokens=4), timeout=30)
        return first + reply.text

    assert asyncio.run(take_one_then_chat())


@pytest.fixture(scope="module")
def tool_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another seed: offered tools, this one chooses to call them (the default one to answer in
    words). The choice is llama-cpp-python's greedy first step, so a seed decides it for good."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama-caller.gguf"
    write_tiny_llama(path, seed=2)
    return path


def test_tool_call_round_trip_with_chatml_function_calling(tool_model_path: Path) -> None:
    llm = tiny(tool_model_path, chat_format="chatml-function-calling", n_ctx=1024)
    ask = [ChatMessage("user", "Cheer up the room.")]
    response = asyncio.run(llm.chat(ask, tools=[SET_MOOD], max_tokens=32))
    assert response.text == "" and len(response.tool_calls) >= 1
    call = response.tool_calls[0]
    assert isinstance(call, ToolCall) and call.name == "set_mood" and call.id
    # the arguments are grammar-bound to the tool's schema, so even random weights fill it in
    assert set(call.arguments) == {"mood", "loud"} and call.arguments["mood"] in ("up", "down")
    assert isinstance(call.arguments["loud"], bool)

    def after(result: str) -> list[ChatMessage]:
        return [*ask, ChatMessage("assistant", "", tool_calls=(call,)),
                ChatMessage("tool", result, tool_call_id=call.id, name=call.name)]

    # asked again with the result, as the tool loop does: with tools, then (last round) without
    again = asyncio.run(llm.chat(after("done"), tools=[SET_MOOD], max_tokens=32))
    assert all(c.name == "set_mood" for c in again.tool_calls)
    short = asyncio.run(llm.chat(after("done"), temperature=0.0, max_tokens=4))
    long = asyncio.run(llm.chat(after("done, and the room is cheerful now " * 4), temperature=0.0, max_tokens=4))
    # this format's template drops `tool` messages; sent as user turns, the result is in the prompt
    assert long.usage["prompt_tokens"] > short.usage["prompt_tokens"] + 20


def test_an_answer_in_words_while_tools_are_offered_gets_written(model_path: Path) -> None:
    llm = tiny(model_path, chat_format="chatml-function-calling", n_ctx=1024)
    ask = [ChatMessage("user", "Cheer up the room.")]
    # llama-cpp-python 0.3.36 alone: the model chose a message, and the handler's grammar let it
    # write only a tool name
    asyncio.run(llm.chat(ask, max_tokens=1))  # loads it
    raw = llm._llama.create_chat_completion(**llm._request(ask, None, [SET_MOOD], None, 16))
    assert raw["choices"][0]["message"]["content"] == "functions.set_mood:"
    response = asyncio.run(llm.chat(ask, tools=[SET_MOOD], temperature=0.0, max_tokens=16))
    assert response.tool_calls == [] and response.text and "functions." not in response.text
    assert response.usage["completion_tokens"] > raw["usage"]["completion_tokens"]  # both asks counted


def test_create_llm_builds_a_llamacpp_route_and_the_router_uses_it(model_path: Path) -> None:
    settings = ChatSettings.load().with_overrides(llm_chain=f"llamacpp:{model_path}", llamacpp_n_ctx=N_CTX_TRAIN)
    router = create_llm(settings)
    assert router.name == f"router(llamacpp:{model_path})"
    [route] = router.routes
    [slot] = route.keys
    assert isinstance(slot.llm, LlamaCppLLM) and not slot.llm.loaded and slot.label == "local"

    async def chat_and_stream() -> tuple[str, str, str]:
        reply = await router.chat(QUESTION, temperature=0.0, max_tokens=16)
        structured = await router.chat(QUESTION, json_schema=MOOD, max_tokens=32)
        streamed = "".join([piece async for piece in router.stream(QUESTION, temperature=0.0, max_tokens=16)])
        return reply.text, structured.text, streamed

    text, structured, streamed = asyncio.run(chat_and_stream())
    assert text and streamed == text
    assert json.loads(structured)["loud"] in (True, False)
    assert router.health.providers[f"llamacpp:{model_path}"].successes == 3


def test_the_chain_setting_picks_a_chat_format_that_calls_tools(tool_model_path: Path) -> None:
    settings = ChatSettings.load().with_overrides(llm_chain=f"llamacpp:{tool_model_path}", llamacpp_n_ctx=1024,
                                              llamacpp_chat_format="chatml-function-calling")
    router = create_llm(settings)
    response = asyncio.run(router.chat([ChatMessage("user", "Cheer up the room.")], tools=[SET_MOOD], max_tokens=32))
    assert [call.name for call in response.tool_calls][:1] == ["set_mood"]


def test_the_gguf_embedder_turns_texts_into_unit_vectors_quietly(model_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """`embedder = "gguf:<path>"`: the same tiny model as an embedding model (random weights:
    the vectors mean nothing, but they come from llama.cpp and go through gieok's checks)."""
    import numpy as np

    from gieok.embed import create_embedder

    capfd.readouterr()
    embedder = create_embedder(f"gguf:{model_path}", ChatSettings.load())
    vectors = embedder.embed_passages(["첫 문장", "second sentence", "첫 문장"])
    assert vectors.shape == (3, 64) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])
    assert embedder.name == "gguf/tiny-llama.gguf"
    out, err = capfd.readouterr()
    assert "llama" not in out + err, "llama.cpp's log goes to logging, not the terminal"
