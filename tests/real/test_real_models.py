"""Real pretrained models in every Linux format (see conftest.py for how they are made).

What must hold, with identical float32 weights in every format:

* ``parity.json`` (written by ``bundle convert --verify`` through ``open_stream``): the float32
  GGUF on llama.cpp, the MLX folder, the ``.tflite`` on the token-exact LiteRT session and the
  ``.litertlm`` on the LiteRT-LM engine each give the transformers float32 reference's 32
  greedy tokens on all 8 prompts (256/256), and for Gemma also on a 600- and a 900-token prompt
  (past its 512-token sliding window);
* the same ids straight through the seam here, llama.cpp and LiteRT side by side;
* SmolLM2's own chat template gives the same reply on every backend, ending at <|im_end|>;
* the original Q4 GGUFs through the seam equal ``llama_cpp.Llama`` at the same flash-attention
  setting;
* the rebuilt tokenizers (tokenizer.json, Gemma's SentencePiece section) tokenize tricky strings
  exactly as llama.cpp does on the source GGUF; a SentencePiece ``.litertlm`` is served by both
  LiteRT sessions; the manifest lists every file, sidecar tokenizers included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eliza_backends import open_stream, verify_bundle

from .conftest import parity
from .models import THREADS, checked_coreml

F32 = {  # artifact label in parity.json -> what serves it
    "gguf": "-f32.gguf", "mlx": "-mlx-f32", "tflite": "-fp32.tflite",
    "engine": "-fp32.litertlm (engine)",
}
TRICKY = [
    "Hello world", "1234567890 and 3.14159", "  leading and   runs of   spaces  ",
    "日本語のテキストと中文", "emoji 😀🎉👍🏽 ok", "def f(x):\n\treturn x**2  # code\n",
    "mixed\n\n\nnewlines\r\n", "ünïcödé façade naïve", "x = [1,2,3]; y = {'k': 'v'}",
    "a" * 50, "tabs\tand\u00a0nbsp", "\uff46\uff55\uff4c\uff4c\u3000width", "",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _f32_results(bundle: Path) -> dict[str, dict[str, Any]]:
    arts = parity(bundle)["artifacts"]
    out = {}
    for kind, suffix in F32.items():
        label = next((k for k in arts if k.endswith(suffix)), None)
        assert label is not None, f"parity.json has no {kind} artifact ({sorted(arts)})"
        out[kind] = arts[label]
    return out


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_float32_artifacts_match_the_reference_everywhere(model: str,
                                                          request: pytest.FixtureRequest) -> None:
    bundle: Path = request.getfixturevalue(model)
    doc = parity(bundle)
    short = [p for p in doc["prompts"] if p["name"].startswith("short")]
    assert len(short) == 8 and doc["n_tokens"] == 32
    for kind, res in _f32_results(bundle).items():
        assert "error" not in res, (kind, res.get("error"))
        by_name = {p["prompt"]: p for p in res["prompts"]}
        agree = sum(by_name[p["name"]]["greedy_agree"] for p in short)
        assert agree == 256, (kind, agree, res["first_divergence"])
        if kind != "engine":  # the engine is text-level: tokens up to its stop only
            for p in short:
                assert by_name[p["name"]]["ids"] == p["reference_ids"], (kind, p["name"])


def test_gemma_agrees_past_its_sliding_window(gemma3: Path) -> None:
    doc = parity(gemma3)
    long = {p["name"]: p for p in doc["prompts"] if p["name"].startswith("long")}
    assert {len(p["ids"]) for p in long.values()} == {600, 900}
    for kind, res in _f32_results(gemma3).items():
        for p in res["prompts"]:
            if p["prompt"] in long:
                assert p["greedy_agree"] == 32 == p["compared"], (kind, p["prompt"])


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_seam_here_gives_the_parity_ids(model: str, request: pytest.FixtureRequest) -> None:
    """Not only the converter's run: this interpreter's llama.cpp and LiteRT sessions agree."""
    bundle: Path = request.getfixturevalue(model)
    doc = parity(bundle)
    names = {p.name for p in (bundle / "text").iterdir()}
    gguf = next(n for n in names if n.endswith("-f32.gguf"))
    tfl = next(n for n in names if n.endswith("-fp32.tflite"))
    for backend, options in (("llama.cpp", {"llama.cpp": {"artifact": gguf}}),
                             ("litert-lm", {"litert-lm": {"artifact": tfl,
                                                          "session": "interpreter"}})):
        with open_stream(bundle, backend=backend, options=options, max_tokens=32,
                         temperature=0.0, ignore_eos=True, context_size=1024,
                         threads=THREADS) as stream:
            for p in doc["prompts"][:4]:
                stream.reset()
                stream.prefill(p["ids"])
                got = [t for step in stream for t in step.tokens]
                assert got == p["reference_ids"], (backend, p["name"])


CHAT_VARIANTS = [
    ("llama.cpp", {}), ("mlx", {}),
    ("litert-lm", {"session": "interpreter"}), ("litert-lm", {"session": "engine"}),
]


def test_smollm2_chat_replies_the_same_on_every_backend(smollm2: Path) -> None:
    replies = {}
    names = {p.name for p in (smollm2 / "text").iterdir()}
    artifacts = {"llama.cpp": next(n for n in names if n.endswith("-f32.gguf")),
                 "mlx": next(n for n in names if n.endswith("-mlx-f32")),
                 "litert-lm": next(n for n in names if n.endswith("-fp32.litertlm"))}
    for backend, opts in CHAT_VARIANTS:
        options = {backend: {"artifact": artifacts[backend], **opts}}
        with open_stream(smollm2, backend=backend, options=options, max_tokens=48,
                         temperature=0.0, threads=THREADS) as stream:
            assert stream.session.chat_template and "<|im_start|>" in stream.session.chat_template
            stream.prefill_messages(CHAT)
            steps = list(stream)
            tokens = [t for s in steps for t in s.tokens]
            assert steps[-1].finish_reason == "eos", (backend, opts, tokens)
            if opts.get("session") != "engine":
                assert tokens[-1] == 2  # <|im_end|>, SmolLM2's end of turn
            else:  # the engine stops on the end of turn without reporting its id (15.13)
                assert 2 not in tokens, tokens
            replies[f"{backend}{opts}"] = "".join(s.text for s in steps)
    assert len(set(replies.values())) == 1, replies
    assert "Paris" in next(iter(replies.values()))


@pytest.mark.parametrize("flash", ["off", "on"])
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_original_q4_gguf_equals_llama_cpp_llama(model: str, flash: str,
                                                 request: pytest.FixtureRequest) -> None:
    import llama_cpp
    import numpy as np

    bundle: Path = request.getfixturevalue(model)
    source: Path = request.getfixturevalue(f"{model}_source")
    prompts = [p["ids"] for p in parity(bundle)["prompts"] if p["name"].startswith("short")]
    from direct_runtimes import direct_llama

    llm = direct_llama(model_path=str(source), n_ctx=256, n_batch=256, n_threads=THREADS,
                          flash_attn=flash == "on", verbose=False)
    want = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        out = []
        for _ in range(32):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                           shape=(llm.n_vocab(),))
            out.append(int(np.argmax(logits)))
            llm.eval([out[-1]])
        want.append(out)
    del llm
    name = next(p.name for p in (bundle / "text").iterdir() if p.name.endswith("-source.gguf"))
    with open_stream(bundle, backend="llama.cpp", max_tokens=32, temperature=0.0,
                     ignore_eos=True, context_size=256, batch_size=256, threads=THREADS,
                     options={"llama.cpp": {"artifact": name, "flash_attention": flash}}) as s:
        for ids, expected in zip(prompts, want, strict=True):
            s.reset()
            s.prefill(ids)
            assert [t for step in s for t in step.tokens] == expected


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_rebuilt_tokenizers_tokenize_like_llama_cpp(model: str,
                                                    request: pytest.FixtureRequest) -> None:
    import llama_cpp

    from eliza_backends.prompt.hf_tokenizer import HFTokenizer

    bundle: Path = request.getfixturevalue(model)
    source: Path = request.getfixturevalue(f"{model}_source")
    llm = llama_cpp.Llama(model_path=str(source), vocab_only=True, verbose=False)
    mlx_dir = next(p for p in (bundle / "text").iterdir() if p.name.endswith("-mlx-f32"))
    tokenizers = [HFTokenizer.from_file(mlx_dir / "tokenizer.json")]
    if model == "gemma3":
        from eliza_litert.container import read_container

        from eliza_backends.prompt.sp_tokenizer import SPTokenizer

        lm = next(p for p in (bundle / "text").iterdir() if p.suffix == ".litertlm")
        sp = read_container(lm).sp_tokenizer_model()
        assert sp is not None, "Gemma's .litertlm should carry a SentencePiece section"
        tokenizers.append(SPTokenizer(sp))
    for tok in tokenizers:
        for text in [*TRICKY, "<start_of_turn>user\nhi<end_of_turn>\n",
                     "<|im_start|>user\nhi<|im_end|>\n"]:
            want = llm.tokenize(text.encode(), add_bos=False, special=True)
            assert tok.encode(text, add_special=False) == want, (type(tok).__name__, text)
            assert tok.decode(want) == llm.detokenize(want).decode("utf-8", "replace")


def test_sentencepiece_litertlm_is_served_by_both_litert_sessions(gemma3: Path) -> None:
    doc = parity(gemma3)
    lm = next(p.name for p in (gemma3 / "text").iterdir() if p.suffix == ".litertlm")
    p = doc["prompts"][0]
    for session in ("interpreter", "engine"):
        with open_stream(gemma3, backend="litert-lm", max_tokens=16, temperature=0.0,
                         threads=THREADS,
                         options={"litert-lm": {"artifact": lm, "session": session}}) as s:
            assert type(s.session._loaded.tokenizer if session == "engine"
                        else s.session._model.tokenizer).__name__ == "SPTokenizer"
            s.prefill(p["ids"])
            got = [t for step in s for t in step.tokens]
            assert got == p["reference_ids"][:16], session


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_manifest_lists_every_file(model: str, request: pytest.FixtureRequest) -> None:
    bundle: Path = request.getfixturevalue(model)
    manifest = verify_bundle(bundle, hashes=False)
    listed = {f.path for a in manifest.artifacts for f in a.files}
    on_disk = {p.relative_to(bundle).as_posix() for p in (bundle / "text").rglob("*")
               if p.is_file()}
    assert on_disk == listed
    assert any(p.endswith(".tokenizer.json") for p in listed)
    report = json.loads((bundle / "convert.json").read_text())
    checked = report["mlx_config_checked"]["f32"]
    assert checked["rope_theta"] == (100000.0 if model == "smollm2" else 1000000.0)
    if model == "gemma3":
        assert checked["rope_local_base_freq"] == 10000.0
        assert checked["sliding_window"] == 512


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_original_q4_source_agrees_with_the_float32_reference(model: str,
                                                              request: pytest.FixtureRequest
                                                              ) -> None:
    """The quantized source is not expected to be exact, but fed the reference's tokens it
    must pick the reference's top-1 almost everywhere, and its first greedy divergence must
    fall where the reference's top two logits nearly tie (a real difference, e.g. a wrong
    dequantization or layout, diverges early at a large gap and fails teacher-forcing)."""
    bundle: Path = request.getfixturevalue(model)
    arts = parity(bundle)["artifacts"]
    res = next(v for k, v in arts.items() if k.endswith("-source.gguf"))
    assert "error" not in res, res.get("error")
    assert res["teacher_forced_agree"] >= 0.9 * res["positions"], res
    fd = res["first_divergence"]
    if fd is not None:
        assert fd["reference_gap"] < 1.0, fd


def test_smollm2_core_ml_package_is_converted_and_checked(smollm2: Path) -> None:
    """Core ML: converted on Linux, run only on macOS. What Linux can check is checked by
    ``bundle convert`` and recorded in convert.json: the traced program, run step by step
    through its own KV state (prefill, then decode), gives transformers' float32 logits, and
    the saved package has the inputs, states and output the Core ML session reads."""
    checked_coreml(smollm2, 24)
    manifest = verify_bundle(smollm2, hashes=False)
    assert any(a.format == "mlpackage" for a in manifest.artifacts)


PARAGRAPH = ("The lighthouse stood on the northern cliff for two hundred years. Every night the "
             "keeper climbed the ninety steps, trimmed the wick and wound the clockwork that "
             "turned the lens, and every morning he wrote the weather in a leather book.")


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_drafted_greedy_output_is_plain_greedy_output(model: str,
                                                      request: pytest.FixtureRequest) -> None:
    """On the original Q4 files, n-gram drafting (k = 1 and 4) changes nothing in greedy output
    on input-grounded prompts. With llama.cpp's non-flash attention a batch's attention
    rounded differently from one token's and SmolLM2's drafted 'repeat' output left plain
    greedy at its third token (a 0.05 logprob gap); flash attention, the default, is batch
    invariant."""
    bundle: Path = request.getfixturevalue(model)
    name = next(p.name for p in (bundle / "text").iterdir() if p.name.endswith("-source.gguf"))
    prompts = [f"Repeat this paragraph exactly.\n\n{PARAGRAPH}\n\nRepeated:\n",
               f"Rewrite the paragraph with 'keeper' replaced by 'guardian'.\n\n{PARAGRAPH}\n\n"
               "Rewritten:\n"]
    common: dict[str, Any] = {"backend": "llama.cpp", "max_tokens": 48, "ignore_eos": True,
                              "context_size": 512, "threads": THREADS,
                              "options": {"llama.cpp": {"artifact": name}}}
    for prompt in prompts:
        with open_stream(bundle, **common) as s:
            s.prefill(prompt)
            plain = [t for step in s for t in step.tokens]
        for k in (1, 4):
            with open_stream(bundle, drafter="ngram", draft_policy="fixed", draft_length=k,
                             **common) as s:
                s.prefill(prompt)
                steps = list(s)
            assert [t for step in steps for t in step.tokens] == plain, (model, k, prompt[:20])
            assert sum(step.accepted for step in steps) > 0  # the drafter did draft and hit
