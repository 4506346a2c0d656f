"""The in-process OpenAI-shaped API on every installed backend: the same chat completions,
chunks, text completions, stop strings, budgets and usage everywhere, checked against the tiny
bundle's oracle; multi-turn prefix reuse on a Stream; typed errors for bad requests."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import (
    ContextFullError,
    InferenceContext,
    InvalidArgumentError,
    chat_completion,
    completion,
    open_stream,
)
from eliza_backends.config import StreamConfig
from eliza_backends.openai.chat import chat_job
from eliza_backends.openai.generation import FINISH_REASONS, GenerationJob, finish_reason
from eliza_backends.openai.types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    parse_request,
)
from eliza_backends.serving import Sampling, session_key

ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
PROMPTS = {p["name"]: p for p in ORACLE["prompts"]}
MATH = [{"role": "user", "content": "What is two plus two?"}]

VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("llama.cpp", "llama_cpp", {}),
    ("litert-lm", "ai_edge_litert", {}),
    ("litert-lm", "litert_lm", {"litert-lm": {"session": "engine"}}),
    ("mlx", "mlx_lm", {}),
]


def _variants() -> list[Any]:
    out = []
    for backend, module, options in VARIANTS:
        label = backend + ("/engine" if options else "")
        marks = [] if importlib.util.find_spec(module) else [
            pytest.mark.skip(reason=f"{module} is not installed")]
        out.append(pytest.param((backend, options), id=label, marks=marks))
    return out


@pytest.fixture(params=_variants())
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    backend, options = request.param
    return backend, options


def _config(options: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"threads": 1, "options": options, **more}


def _completion_tokens(options: Any) -> int:
    """The reply's tokens and its end-of-turn token; the LiteRT-LM engine stops at the end
    token without handing it back (and no longer invents it), so it counts one fewer."""
    engine = (options or {}).get("litert-lm", {}).get("session") == "engine"
    return int(PROMPTS["chat_math"]["first_stop_index"]) + (0 if engine else 1)


def test_chat_completion_has_the_openai_shape_and_the_oracle_reply(variant: Any) -> None:
    backend, options = variant
    reply = chat_completion(TINY_BUNDLE, MATH, max_tokens=48, backend=backend,
                            config=_config(options))
    assert isinstance(reply, ChatCompletion)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == "tiny" and reply.created > 1_700_000_000
    [choice] = reply.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == PROMPTS["chat_math"]["text_until_stop"]
    assert choice.finish_reason == "stop"  # the end-of-turn token
    usage = reply.usage
    assert usage.prompt_tokens == len(PROMPTS["chat_math"]["prompt_ids"])
    assert usage.completion_tokens == _completion_tokens(options)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_chunks_add_up_to_the_same_reply(variant: Any) -> None:
    backend, options = variant
    chunks = list(chat_completion(TINY_BUNDLE, MATH, max_tokens=48, stream=True,
                                  backend=backend, config=_config(options),
                                  stream_options={"include_usage": True}))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    first, *middle, last_choice, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(c.choices[0].finish_reason is None for c in middle)
    assert last_choice.choices[0].finish_reason == "stop"
    text = "".join(c.choices[0].delta.content or "" for c in [*middle, last_choice])
    assert text == PROMPTS["chat_math"]["text_until_stop"]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == _completion_tokens(options)


@pytest.mark.parametrize("name", ["gettysburg", "river"])
def test_text_completion_continues_like_the_oracle(variant: Any, name: str) -> None:
    backend, options = variant
    prompt = PROMPTS[name]
    out = completion(TINY_BUNDLE, prompt["text"], max_tokens=32, backend=backend,
                     config=_config(options))
    assert isinstance(out, Completion) and out.object == "text_completion"
    assert out.choices[0].text == prompt["continuation_text"]
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 32
    assert out.usage.prompt_tokens == len(prompt["prompt_ids"])


def test_stop_strings_and_budget_are_per_request(variant: Any) -> None:
    backend, options = variant
    text = PROMPTS["gettysburg"]["continuation_text"]  # " our fathers brought forth on ..."
    with InferenceContext(TINY_BUNDLE) as ctx:
        stopped = completion(ctx, "Four score and seven years ago", max_tokens=32,
                             stop=["forth", "zzz"], backend=backend, config=_config(options))
        short = completion(ctx, "Four score and seven years ago", max_tokens=3,
                           backend=backend, config=_config(options))
        streamed = "".join(c.choices[0].text for c in completion(
            ctx, "Four score and seven years ago", max_tokens=32, stop="forth", stream=True,
            backend=backend, config=_config(options)))
    assert stopped.choices[0].text == text[:text.index("forth")]
    assert stopped.choices[0].finish_reason == "stop"
    assert streamed == stopped.choices[0].text
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None and short.usage.completion_tokens == 3
    assert text.startswith(short.choices[0].text) and short.choices[0].text


def test_a_conversation_on_a_stream_reuses_its_prefix(variant: Any) -> None:
    backend, options = variant
    messages: list[dict[str, str]] = list(MATH)
    with open_stream(TINY_BUNDLE, backend=backend, **_config(options)) as stream:
        reuse = stream.session.capabilities.prefix_reuse
        first = chat_completion(stream, messages, max_tokens=32)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And three plus three?"}]
        second = chat_completion(stream, messages, max_tokens=32)
        again = chat_completion(stream, messages, max_tokens=32)
    alone = chat_completion(TINY_BUNDLE, messages, max_tokens=32, backend=backend,
                            config=_config(options))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == alone.choices[0].message.content
    assert again.choices[0].message.content == alone.choices[0].message.content
    if reuse:
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    else:
        assert second.usage.prompt_tokens_details.cached_tokens == 0


def test_seeded_sampling_repeats_and_n_choices_differ_by_seed() -> None:
    kwargs: dict[str, Any] = {"max_tokens": 24, "temperature": 1.5, "config": {"threads": 1}}
    with InferenceContext(TINY_BUNDLE) as ctx:
        a = completion(ctx, "Hello", seed=7, n=3, **kwargs)
        b = completion(ctx, "Hello", seed=7, n=3, **kwargs)
        c = completion(ctx, "Hello", seed=8, **kwargs)
    texts = [ch.text for ch in a.choices]
    assert texts == [ch.text for ch in b.choices]
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert len(set(texts)) > 1, texts  # choice i samples with seed + i
    assert c.choices[0].text == texts[1]  # seed 8 is choice 1 of seed 7
    assert a.usage is not None and 3 <= a.usage.completion_tokens <= 3 * 24


def test_a_stream_with_other_sampling_settings_is_refused() -> None:
    with open_stream(TINY_BUNDLE, threads=1) as stream:
        with pytest.raises(InvalidArgumentError, match="other sampling settings"):
            chat_completion(stream, MATH, temperature=0.7)
        # greedy requests fit a greedy stream whatever their seed
        assert chat_completion(stream, MATH, seed=5, max_tokens=4).choices[0].message.content


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"messages": []}, "send at least one message"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"bogus": 1}, "unknown field"),
    ({"stop": [""]}, "non-empty"),
    ({"top_logprobs": 3}, "top_logprobs needs logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"frequency_penalty": 0.5}, "repeat_penalty"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
])
def test_bad_requests_are_invalid_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    messages = kwargs.pop("messages", MATH)
    with pytest.raises(InvalidArgumentError, match=match):
        chat_completion(TINY_BUNDLE, messages, **kwargs)


def test_a_request_that_cannot_fit_is_a_context_full_error() -> None:
    small = {"context_size": 256, "batch_size": 256}
    with InferenceContext(TINY_BUNDLE) as ctx:
        with pytest.raises(ContextFullError, match="lower max_tokens"):
            chat_completion(ctx, MATH, max_tokens=5000, config=small)
        with pytest.raises(ContextFullError, match="shorten the prompt"):
            completion(ctx, "word " * 400, config=small)


def test_finish_reasons_map_to_openai_terms() -> None:
    assert FINISH_REASONS == {"eos": "stop", "stop": "stop", "length": "length",
                              "context": "length"}
    assert finish_reason("context") == "length"


def test_session_key_ignores_what_greedy_decoding_ignores() -> None:
    greedy = StreamConfig(temperature=0.0, seed=1)
    assert session_key(greedy) == session_key(StreamConfig(temperature=0.0, seed=2, top_p=0.5))
    assert session_key(StreamConfig(max_tokens=5, stop=("x",))) == session_key(StreamConfig())
    assert session_key(StreamConfig(temperature=0.5, seed=1)) != session_key(
        StreamConfig(temperature=0.5, seed=2))


def test_a_job_of_any_front_end_picks_its_sessions_by_the_shared_keys() -> None:
    request = parse_request(ChatCompletionRequest, {
        "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "seed": 3, "n": 2,
        "max_tokens": 4, "stop": "x"})
    job = chat_job(request)
    assert (job.max_tokens, job.stop, job.n) == (4, ("x",), 2)
    assert job.prompt == [{"role": "user", "content": "hi"}]
    base = StreamConfig()
    assert job.session_config(base, 1).seed == 4  # choice i samples with seed + i
    other = GenerationJob(prompt="hi", sampling=Sampling(temperature=0.7, seed=3))
    assert session_key(other.session_config(base)) == session_key(job.session_config(base))


def test_importing_the_package_does_not_import_the_api_models() -> None:
    import subprocess
    import sys

    code = ("import sys, eliza_backends; print('eliza_backends.openai.types' in sys.modules, "
            "'starlette' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("logprobs", [False, True])
def test_a_text_steps_json_is_the_chunks_json(logprobs: bool) -> None:
    """The server's per-token shortcut (``Responder.step_json``) writes exactly the JSON of
    the chunk ``step`` builds, for every step of a real reply, in chat and text shapes; it
    steps aside (None) for the last step and whenever logprobs are asked for."""
    from eliza_backends.openai.formatting import Responder
    from eliza_backends.openai.generation import Generation
    from eliza_backends.server.api_errors import sse

    body = {"messages": MATH, "max_tokens": 48, "logprobs": logprobs}
    job = chat_job(parse_request(ChatCompletionRequest, body))
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as stream:
        for kind in ("chat", "text"):
            responder = Responder(kind, 'a "model" é')
            gen = Generation.of_job(stream, job)
            gen.start()
            shortcuts = 0
            while not gen.done:
                text = gen.step()
                encoded = responder.step_json(0, text, gen)
                if encoded is None:
                    continue
                shortcuts += 1
                [chunk] = responder.step(0, text, gen)
                assert f"data: {encoded}\n\n".encode() == sse(chunk)
            assert responder.step_json(0, "x", gen) is None  # (ended)
            assert shortcuts == 0 if logprobs else shortcuts > 3
            stream.end_generation(gen)
            stream.reset()
