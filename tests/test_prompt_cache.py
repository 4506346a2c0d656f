"""The host-memory prompt cache (:mod:`eliza_backends.backend.prompt_cache`, ``serve
--cache-ram``) on real llama.cpp sessions: a conversation that comes back after another one
used its session restores its KV state and gets exactly the reply it gets without the cache
(greedy), on the tiny llama bundle and on gemma4-tiny (sliding window of 32: a restored window
is cut back only where it is valid); the LRU drops the oldest state under byte pressure; a
conversation sharing only a system prompt with a cached one never gets more than that prefix;
media items compare by digest; the batched server and a single-slot server both hit; a slot
saved on a batched sliding-window sequence restored into an own context is a typed SlotError.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess

from eliza_backends import InferenceContext, SlotError, Stream, open_stream
from eliza_backends.backend.prompt_cache import PromptCache, reusable
from eliza_backends.backend.slot_state import SlotSnapshot
from eliza_backends.backend.types import MediaSpan
from eliza_backends.openai.generation import Generation

GEMMA4_TINY = Path(__file__).resolve().parent.parent / "examples" / "bundles" / "gemma4-tiny"
BUNDLES = {"tiny": TINY_BUNDLE, "gemma4-tiny": GEMMA4_TINY}
CONFIG: dict[str, Any] = {"threads": 1, "context_size": 1024}
SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 3}
TOPICS = ("rivers", "mountains", "the sea")


def _conversation(topic: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": f"Tell me about {topic}. " * 20}]


def _reply(stream: Stream, messages: list[dict[str, str]] | list[int]) -> tuple[str, int]:
    """The greedy reply to ``messages`` (or token ids; 12 tokens at most) and the prompt
    tokens the session held already."""
    gen = Generation(stream, messages, max_tokens=12)
    gen.start()
    while not gen.done:
        gen.step()
    stream.end_generation()
    return gen.text, gen.cached_tokens


def _rotate(stream: Stream, topics: tuple[str, ...], turns: int = 2
            ) -> list[tuple[str, str, int]]:
    """Each conversation of ``topics`` takes a turn on ``stream``, ``turns`` times round:
    (topic, reply, cached prompt tokens) per turn; a turn adds the reply and a new question."""
    chats = {t: _conversation(t) for t in topics}
    out = []
    for turn in range(turns):
        for topic, messages in chats.items():
            text, cached = _reply(stream, messages)
            out.append((topic, text, cached))
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"More on {topic}, turn {turn}."}]
    return out


@pytest.fixture(scope="module", params=list(BUNDLES))
def context(request: pytest.FixtureRequest) -> Iterator[InferenceContext]:
    with InferenceContext(BUNDLES[request.param]) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def uncached(context: InferenceContext) -> list[tuple[str, str, int]]:
    """The rotation on a session without a cache: each turn re-prefills its conversation."""
    with open_stream(context, CONFIG, backend="llama.cpp") as stream:
        return _rotate(stream, TOPICS[:2])


def test_a_returning_conversation_restores_its_state_and_replies_the_same(
        context: InferenceContext, uncached: list[tuple[str, str, int]]) -> None:
    cache = PromptCache(64 << 20)
    with open_stream(context, CONFIG, backend="llama.cpp") as stream:
        stream.prompt_cache = cache
        cached = _rotate(stream, TOPICS[:2])
        # a sliding window's state restores only whole: each eviction also keeps the state
        # at the last prompt's end (the reply comes back as text)
        per_eviction = 2 if stream.session.save_slot().min_keep else 1
    assert [(t, r) for t, r, _ in cached] == [(t, r) for t, r, _ in uncached]
    second_round = cached[2:]
    for (_, _, with_cache), (_, _, without) in zip(second_round, uncached[2:], strict=True):
        assert with_cache > 300 > without  # the whole history, not just the system prompt
    stats = cache.stats()
    assert stats["hits"] == 2 and stats["refused"] == 0
    assert stats["stored"] == 3 * per_eviction and stats["entries"] >= 1
    assert 0 < stats["bytes"] <= 64 << 20


def _continue(messages: list[dict[str, str]], reply: str) -> list[dict[str, str]]:
    """``messages`` as they come back: the reply and a new question added."""
    return [*messages, {"role": "assistant", "content": reply},
            {"role": "user", "content": "And then?"}]


def test_under_byte_pressure_the_oldest_state_is_dropped(context: InferenceContext) -> None:
    chats = [_conversation(t) for t in TOPICS]
    with open_stream(context, CONFIG, backend="llama.cpp") as stream:
        replies = [_reply(stream, chats[0])[0]]
        state = stream.session.save_slot()
        per = 2 if state.min_keep else 1  # a sliding window's eviction keeps two states
        cache = PromptCache(state.nbytes * per * 3 // 2)  # one eviction's states, not two
        stream.prompt_cache = cache
        replies.append(_reply(stream, chats[1])[0])  # saves topic 0's state
        replies.append(_reply(stream, chats[2])[0])  # saves topic 1's, drops topic 0's
        stats = cache.stats()
        assert stats["stored"] == 2 * per and stats["dropped"] == per
        assert stats["entries"] == per and stats["bytes"] <= cache.limit_bytes
        _, held = _reply(stream, _continue(chats[0], replies[0]))  # dropped: re-prefilled
        assert held < 100 and cache.stats()["hits"] == 0
        assert cache.stats()["dropped"] == 2 * per  # topic 2's states took topic 1's room
        _, held = _reply(stream, _continue(chats[2], replies[2]))  # still there
        assert cache.stats()["hits"] == 1 and held > 300


def test_a_state_the_cache_holds_is_not_saved_again(context: InferenceContext) -> None:
    """One short prompt asked three times, its reply longer than it (each request evicts the
    last one's state): the second request saves the state, the third finds it covered by
    that entry and saves nothing (llama-server's cache skips such a state too); the replies
    are the same."""
    with open_stream(context, CONFIG, backend="llama.cpp") as stream:
        ids = list(stream.session.tokenize("Once upon a time"))
        stream.prompt_cache = cache = PromptCache(64 << 20)
        replies = [_reply(stream, ids)[0]]
        assert stream.session.n_past > 2 * len(ids)  # the next request evicts this state
        replies.append(_reply(stream, ids)[0])
        first = cache.stats()
        assert first["stored"] >= 1 and first["entries"] >= 1
        replies.append(_reply(stream, ids)[0])
        stats = cache.stats()
        assert stats["covered"] == first["covered"] + 1  # the third request copied nothing
        assert stats["stored"] == first["stored"] and stats["entries"] == first["entries"]
        assert replies[1:] == replies[:2]


def test_conversations_taking_turns_unchanged_are_copied_once(context: InferenceContext
                                                              ) -> None:
    """Two short prompts take turns on one session, three times round (each evicts the
    other's state): a restored state stays in the cache, so once each has been saved, the
    evictions copy nothing and every turn restores; the replies are the uncached ones."""
    with open_stream(context, CONFIG, backend="llama.cpp") as stream:
        prompts = [list(stream.session.tokenize(t)) for t in ("Once upon a time", "The sea")]
        alone = [_reply(stream, p)[0] for p in prompts]
        stream.session.reset()
        stream.prompt_cache = cache = PromptCache(64 << 20)
        replies = [_reply(stream, p)[0] for _ in range(3) for p in prompts]
        stats = cache.stats()
    assert replies == alone * 3
    assert stats["stored"] == 2 and stats["covered"] == 3  # turns 2 and 3 (saves), 4-6
    assert stats["hits"] == 4 and stats["entries"] == 2


def test_a_conversation_sharing_only_the_system_prompt_gets_only_that(
        context: InferenceContext) -> None:
    """Two conversations with one system prompt, differing after it: the cached one never
    gives the other more than the shared prefix, and the reply is the uncached one."""
    with open_stream(context, CONFIG, backend="llama.cpp") as ref:
        alone, _ = _reply(ref, _conversation(TOPICS[1]))
        system_ids = len(ref.chat_tokens([SYSTEM], add_generation_prompt=False))
    with open_stream(context, CONFIG, backend="llama.cpp") as stream:
        stream.prompt_cache = cache = PromptCache(64 << 20)
        _reply(stream, _conversation(TOPICS[0]))
        stream.session.reset()  # the session holds nothing: only the cache could give a prefix
        text, held = _reply(stream, _conversation(TOPICS[1]))
        assert text == alone
        assert held <= system_ids + 8  # the system turn (and the next turn's opening markup)
        stats = cache.stats()
        assert stats["hits"] <= 1 and stats["hit_tokens"] == (held if stats["hits"] else 0)


def test_sliding_window_states_restore_only_where_valid() -> None:
    """gemma4-tiny (window 32): a restored state holds only the window's last positions of its
    sliding layers, so it is offered only to a request that keeps about all of it, and a cut
    further back re-prefills (never a wrong prefix)."""
    with InferenceContext(GEMMA4_TINY) as context, \
            open_stream(context, CONFIG, backend="llama.cpp") as stream, \
            open_stream(context, CONFIG, backend="llama.cpp") as ref:
        long_prompt = _conversation(TOPICS[0])
        _reply(stream, long_prompt)
        snapshot = stream.session.save_slot()
        assert snapshot.min_keep >= len(snapshot.tokens) - 2  # the window's end only
        stream.session.restore_slot(snapshot)
        assert stream.session.reset_keep(100) == 0  # cut before the window: a full reset
        assert stream.session.history == ()
        stream.session.restore_slot(snapshot)
        assert stream.session.history == snapshot.tokens
        # the same prompt again (it ends inside the saved reply): not offered, replied right
        cache = PromptCache(64 << 20)
        assert cache.store(snapshot)
        stream.session.reset()
        stream.prompt_cache = cache
        text, _ = _reply(stream, long_prompt)
        assert cache.stats()["hits"] == 0
        assert text == _reply(ref, long_prompt)[0]


def test_a_sliding_window_eviction_keeps_the_state_at_the_prompt_end_too() -> None:
    """The reply comes back as text, which need not tokenize as it was generated: on a
    sliding-window model an eviction also keeps the state where the reply started, so a
    request that shares the prompt but not the reply's tokens still restores (and replies as
    a session that prefilled it all)."""
    with InferenceContext(GEMMA4_TINY) as context, \
            open_stream(context, CONFIG, backend="llama.cpp") as stream, \
            open_stream(context, CONFIG, backend="llama.cpp") as ref:
        prompt = stream.session.tokenize("Once upon a time " * 30)
        stream.prefill_reusing(prompt)
        stream.text()  # the reply: its tokens are in the history after the prompt
        assert stream.session.n_past > len(prompt)
        cache = PromptCache(64 << 20)
        cache.evict(stream.session, len(prompt))
        assert cache.stats()["stored"] == 2
        stream.session.reset()
        stream.prompt_cache = cache
        other = [*prompt, *stream.session.tokenize(" and then", add_special=False)]
        text, held = _reply(stream, other)
        assert held == len(prompt) and cache.stats()["hits"] == 1
        assert text == _reply(ref, other)[0]


def test_media_items_compare_by_digest() -> None:
    """Two sequences with the same ids but another image at the same place share only the ids
    before the image (the placeholder ids are equal, the digests are not)."""
    ids = list(range(1, 40))
    cat, dog = MediaSpan(10, 20, "image", "cat"), MediaSpan(10, 20, "image", "dog")
    assert reusable(ids, [cat], ids, [cat]) == len(ids)
    assert reusable(ids, [cat], ids, [dog]) == 10
    assert reusable(ids, [cat], ids, []) == 10
    cache = PromptCache(1 << 20)
    cache.store(SlotSnapshot(tuple(ids), (cat,), b"x" * 100))
    assert cache._find(ids, [dog], 0) is not None  # the 10 ids before the image
    assert cache._find(ids, [dog], 10) is None  # nothing past them


def test_a_batched_sliding_window_slot_restored_into_an_own_context_is_a_slot_error(
        tmp_path: Path) -> None:
    """The known gap: a sliding-window model's two caches are not converted between a
    batched context's per-sequence layout and an own context's (kv_streams), so llama.cpp
    refuses the state: a typed SlotError, and the session is left empty and usable."""
    with InferenceContext(GEMMA4_TINY, parallel=2) as batched, \
            open_stream(batched, CONFIG, backend="llama.cpp") as a:
        a.prefill("The river does not hurry, yet everything is accomplished.")
        a.session.save_slot(tmp_path / "a.slot")
    with InferenceContext(GEMMA4_TINY) as own, \
            open_stream(own, CONFIG, backend="llama.cpp") as solo:
        solo.prefill("Something else entirely.")
        with pytest.raises(SlotError, match="refused"):
            solo.session.restore_slot(tmp_path / "a.slot")
        assert solo.session.history == ()
        solo.prefill("Once upon a time")
        assert next(iter(solo)).tokens


# ---------------------------------------------------------------------------- the server


def _chat(server: ServerProcess, messages: list[dict[str, str]]) -> tuple[str, int]:
    body = json.dumps({"model": server.health()["model"], "messages": messages, "max_tokens": 12,
                       "temperature": 0}).encode()
    request = urllib.request.Request(server.url + "/chat/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        out = json.load(resp)
    details = out["usage"].get("prompt_tokens_details") or {}
    return out["choices"][0]["message"]["content"], int(details.get("cached_tokens") or 0)


def _server_rotation(server: ServerProcess, topics: tuple[str, ...]) -> list[tuple[str, int]]:
    chats = {t: _conversation(t) for t in topics}
    out = []
    for turn in range(2):
        for topic, messages in chats.items():
            text, cached = _chat(server, messages)
            out.append((text, cached))
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"More on {topic}, turn {turn}."}]
    return out


@pytest.mark.parametrize(("bundle", "slots"), [("tiny", ["--parallel", "1"]),
                                               ("tiny", ["--parallel", "2"]),
                                               ("gemma4-tiny", ["--parallel", "2"])])
def test_the_server_restores_returning_conversations(bundle: str, slots: list[str]) -> None:
    """More conversations than slots, each coming back: with ``--cache-ram`` the replies are
    those of the server without it, the returning turns hold their history, and /health
    counts the hits; ``--cache-ram 0`` has no cache."""
    topics = TOPICS[:int(slots[1]) + 1]
    common = ["--backend", "llama.cpp", "--threads", "1", "--context-size", "1024", *slots]
    with ServerProcess(BUNDLES[bundle], *common, "--cache-ram", "0") as plain:
        without = _server_rotation(plain, topics)
        assert plain.health()["prompt_cache"] is None
    with ServerProcess(BUNDLES[bundle], *common, "--cache-ram", "64") as cached:
        with_cache = _server_rotation(cached, topics)
        stats = cached.health()["prompt_cache"]
    assert [t for t, _ in with_cache] == [t for t, _ in without]
    returning = with_cache[len(topics):]
    assert all(held > 300 for _, held in returning), with_cache
    assert stats["hits"] >= 1 and stats["refused"] == 0
    assert stats["limit_bytes"] == 64 << 20 and stats["bytes"] <= 64 << 20


def _post(server: ServerProcess, path: str, body: dict[str, Any] | None = None
          ) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(server.root + path, json.dumps(body or {}).encode(),
                                     {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_slot_files_survive_a_restart(tmp_path: Path) -> None:
    """``/slots/0?action=save`` writes the slot's conversation into ``--slot-save-path``; a new
    server restores it and continues the conversation from its state, with the reply of a
    server that prefilled it all; names outside the folder, unknown slots and missing files
    are refused."""
    common = ["--backend", "llama.cpp", "--threads", "1", "--context-size", "1024",
              "--parallel", "1", "--cache-ram", "0"]
    chat = _conversation(TOPICS[0])
    with ServerProcess(TINY_BUNDLE, *common) as plain:
        first, _ = _chat(plain, chat)
        again = _continue(chat, first)
        expected, _ = _chat(plain, again)
        status, body = _post(plain, "/slots/0?action=save", {"filename": "a.bin"})
        assert status == 400 and body["error"]["code"] == "slot_save_path_unset"
    with ServerProcess(TINY_BUNDLE, *common, "--slot-save-path", str(tmp_path)) as before:
        assert _chat(before, chat)[0] == first
        status, saved = _post(before, "/slots/0?action=save", {"filename": "a.bin"})
        assert status == 200 and saved["id_slot"] == 0 and saved["n_saved"] > 300
        assert saved["n_written"] == (tmp_path / "a.bin").stat().st_size
        for bad in ("../a.bin", "/etc/passwd", ".hidden", "a/b", "", 7):
            status, body = _post(before, "/slots/0?action=save", {"filename": bad})
            assert status == 400 and body["error"]["code"] == "invalid_filename", bad
        assert not (tmp_path.parent / "a.bin").exists()
        assert _post(before, "/slots/3?action=save", {"filename": "b.bin"})[0] == 400
        assert _post(before, "/slots/0?action=dance")[0] == 400
    with ServerProcess(TINY_BUNDLE, *common, "--slot-save-path", str(tmp_path)) as after:
        status, body = _post(after, "/slots/0?action=restore", {"filename": "missing.bin"})
        assert status == 400 and body["error"]["code"] == "invalid_slot_file"
        status, restored = _post(after, "/slots/0?action=restore", {"filename": "a.bin"})
        assert status == 200 and restored["n_restored"] == saved["n_saved"]
        reply, held = _chat(after, again)
        assert reply == expected and held >= saved["n_saved"] - 2
        status, erased = _post(after, "/slots/0?action=erase")
        assert status == 200 and erased["n_erased"] > held
        assert after.health()["slots"][0]["n_past"] == 0
