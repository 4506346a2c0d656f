"""The shipped tiny Gemma 4 family (examples/bundles/gemma4-tiny): integrity, tokenizer, and
greedy parity with the float32 torch oracle on every Linux backend, past the sliding window.

The target is a ``Gemma4ForCausalLM`` (sliding and full layers with different head sizes,
per-layer embeddings, shared-KV layers, final logit soft-capping) and the assistant its
``gemma4_assistant`` MTP head, both made by tools/make_gemma4_tiny.py. Each runtime's artifact is
loaded directly (tests/direct_runtimes.py) and through the seam (``open_stream``); both must
reproduce oracle.json token for token. A runtime that is not installed skips its tests.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from pathlib import Path
from typing import Any

import pytest

try:  # tests/ as a package or as a plain folder on sys.path
    from . import direct_runtimes as dr
except ImportError:
    import direct_runtimes as dr

from eliza_backends import InferenceContext, open_stream
from eliza_backends.bundle import find_artifacts
from eliza_backends.manifest import load_manifest

BUNDLE = Path(__file__).resolve().parent.parent / "examples" / "bundles" / "gemma4-tiny"
TEXT = BUNDLE / "text"
TARGET_GGUF = TEXT / "gemma4-tiny-f32.gguf"
TARGET_MLX = TEXT / "gemma4-tiny-mlx"
TARGET_TFLITE = TEXT / "gemma4-tiny.tflite"
TARGET_LITERTLM = TEXT / "gemma4-tiny.litertlm"
ASSISTANT_GGUF = TEXT / "draft" / "mtp" / "gemma4-tiny-assistant-f32.gguf"

ORACLE = json.loads((BUNDLE / "oracle.json").read_text(encoding="utf-8"))
MANIFEST = json.loads((BUNDLE / "manifest.json").read_text(encoding="utf-8"))
PROMPTS = ORACLE["prompts"]
PROMPT_IDS = [p["name"] for p in PROMPTS]
N = ORACLE["n_tokens"]
TOK = ORACLE["tokenizer"]
MANIFEST_FILES = [f for a in MANIFEST["artifacts"] for f in a["files"]]


# --------------------------------------------------------------------------- integrity


def test_manifest_names_target_and_mtp_assistant() -> None:
    arts = {a["path"]: a for a in MANIFEST["artifacts"]}
    assert MANIFEST["name"] == "gemma4-tiny"
    assert (arts["text/gemma4-tiny-f32.gguf"]["format"], arts["text/gemma4-tiny-f32.gguf"]
            ["role"]) == ("gguf", "model")
    assert arts["text/gemma4-tiny-mlx"]["role"] == "model"
    mtp = arts["text/draft/mtp/gemma4-tiny-assistant-f32.gguf"]
    assert (mtp["format"], mtp["role"], mtp["kind"]) == ("gguf", "draft", "mtp")
    assert all("kind" not in a for a in MANIFEST["artifacts"] if a is not mtp)
    # the core reads it back, and never offers the MTP head as a standalone draft model
    manifest = load_manifest(BUNDLE)
    assert [a.path for a in manifest.artifacts if a.kind == "mtp"] == [mtp["path"]]
    assert find_artifacts(BUNDLE, ["gguf"], role="draft") == []
    assert find_artifacts(BUNDLE, ["gguf"], role="draft", kind="mtp") == [ASSISTANT_GGUF]


@pytest.mark.parametrize("record", MANIFEST_FILES, ids=[f["path"] for f in MANIFEST_FILES])
def test_manifest_file_matches(record: dict[str, Any]) -> None:
    path = BUNDLE / record["path"]
    assert path.is_file(), f"{record['path']} is in manifest.json but not on disk"
    assert path.stat().st_size == record["size"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == record["sha256"]


def test_every_bundle_file_is_in_manifest() -> None:
    listed = {f["path"] for f in MANIFEST_FILES}
    on_disk = {p.relative_to(BUNDLE).as_posix() for p in TEXT.rglob("*") if p.is_file()}
    assert on_disk - listed == set()


def _gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF (the first metadata key llama.cpp's writer emits)."""
    with open(path, "rb") as f:
        magic, _version, _n_tensors, _n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF"
        (klen,) = struct.unpack("<Q", f.read(8))
        assert f.read(klen) == b"general.architecture"
        (vtype, vlen) = struct.unpack("<IQ", f.read(12))
        assert vtype == 8  # string
        return f.read(vlen).decode()


def test_gguf_architectures() -> None:
    assert _gguf_architecture(TARGET_GGUF) == "gemma4"
    assert _gguf_architecture(ASSISTANT_GGUF) == "gemma4-assistant"


def test_target_keeps_what_makes_gemma4_different() -> None:
    cfg = json.loads((TARGET_MLX / "config.json").read_text(encoding="utf-8"))
    assert cfg["architectures"] == ["Gemma4ForCausalLM"]
    assert {"sliding_attention", "full_attention"} <= set(cfg["layer_types"])
    assert cfg["global_head_dim"] != cfg["head_dim"]
    assert cfg["hidden_size_per_layer_input"] > 0 and cfg["num_kv_shared_layers"] > 0
    assert cfg["final_logit_softcapping"] > 0
    assert cfg["sliding_window"] == ORACLE["sliding_window"]
    long = [p for p in PROMPTS if p["kind"] == "long"]
    assert long and all(len(p["prompt_ids"]) > 4 * cfg["sliding_window"] for p in long)


# --------------------------------------------------------------------------- tokenizer / oracle


def test_tokenizer_is_gemma_style_bpe() -> None:
    tj = json.loads((TARGET_MLX / "tokenizer.json").read_text(encoding="utf-8"))
    assert tj["model"]["type"] == "BPE" and tj["model"]["byte_fallback"]
    vocab = tj["model"]["vocab"]
    assert [k for k, _ in sorted(vocab.items(), key=lambda kv: kv[1])][:4] == \
        ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert all(f"<0x{b:02X}>" in vocab for b in range(256))
    assert len(vocab) == TOK["vocab_size"]
    assert {t["content"]: t["id"] for t in tj["added_tokens"]} == TOK["special_tokens"]


def test_oracle_prompts_are_well_formed() -> None:
    assert {p["kind"] for p in PROMPTS} == {"train", "unseen", "chat", "long"}
    for p in PROMPTS:
        assert p["prompt_ids"][0] == TOK["bos_id"]
        assert len(p["continuation_ids"]) == N
        assert p["min_logit_gap"] >= ORACLE["min_gap_required"], p["name"]
        if p["kind"] == "chat":
            assert p["rendered"] == TOK["bos_token"] + p["text"]
            assert p["text"].endswith("<|turn>model\n")


def test_chat_template_renders_oracle_chat_prompts() -> None:
    from eliza_backends import render_chat

    for p in (p for p in PROMPTS if p["kind"] == "chat"):
        assert render_chat(TOK["chat_template"], p["messages"], bos_token=TOK["bos_token"],
                           add_generation_prompt=True) == p["rendered"]


def test_hf_tokenizer_reproduces_prompt_ids() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TARGET_MLX / "tokenizer.json"))
    for p in PROMPTS:
        assert tok.encode(p["text"]).ids == p["prompt_ids"], p["name"]


# --------------------------------------------------------------------------- direct runtimes


@pytest.mark.parametrize("prompt", PROMPTS, ids=PROMPT_IDS)
def test_llamacpp_greedy_matches_oracle(prompt: dict[str, Any]) -> None:
    pytest.importorskip("llama_cpp")
    assert dr.llamacpp_greedy(TARGET_GGUF, prompt["prompt_ids"], N) == \
        prompt["continuation_ids"]


@pytest.mark.parametrize("prompt", PROMPTS, ids=PROMPT_IDS)
def test_llamacpp_tokenizes_like_hf(prompt: dict[str, Any]) -> None:
    pytest.importorskip("llama_cpp")
    assert dr.llamacpp_tokenize(TARGET_GGUF, prompt["text"]) == prompt["prompt_ids"]


def test_llamacpp_vocabulary_stops() -> None:
    pytest.importorskip("llama_cpp")
    import llama_cpp

    llm = dr._llama(str(TARGET_GGUF), 512)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert llama_cpp.llama_vocab_n_tokens(vocab) == TOK["vocab_size"]
    assert llama_cpp.llama_vocab_bos(vocab) == TOK["bos_id"]
    for t in TOK["stop_ids"]:
        assert llama_cpp.llama_vocab_is_eog(vocab, t)
    assert llm.metadata.get("tokenizer.chat_template") == TOK["chat_template"]


def test_llamacpp_mtp_assistant_drafts_losslessly() -> None:
    """The assistant, as llama.cpp runs it (an MTP context over the target's), leaves greedy
    output unchanged and has most of its drafts accepted on the oracle prompts."""
    pytest.importorskip("llama_cpp")
    drafted = accepted = 0
    for p in PROMPTS:
        got, d, a = dr.llamacpp_mtp_greedy(TARGET_GGUF, ASSISTANT_GGUF, p["prompt_ids"], N, 4)
        assert got == p["continuation_ids"], p["name"]
        assert 0 <= a <= d
        drafted += d
        accepted += a
    assert drafted > 0 and accepted / drafted >= 0.5, (accepted, drafted)


@pytest.mark.parametrize("prompt", PROMPTS, ids=PROMPT_IDS)
def test_mlx_greedy_matches_oracle(prompt: dict[str, Any]) -> None:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    assert dr.mlx_greedy(TARGET_MLX, prompt["prompt_ids"], N) == prompt["continuation_ids"]


@pytest.mark.parametrize("prompt", PROMPTS, ids=PROMPT_IDS)
def test_tflite_greedy_matches_oracle(prompt: dict[str, Any]) -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    assert dr.tflite_greedy(TARGET_TFLITE, prompt["prompt_ids"], N) == \
        prompt["continuation_ids"]


@pytest.fixture(scope="module")
def litertlm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("litert_lm")
    return tmp_path_factory.mktemp("litertlm_cache")


@pytest.mark.parametrize("prompt", PROMPTS, ids=PROMPT_IDS)
def test_litertlm_engine_text_matches_oracle(litertlm_cache: Path,
                                             prompt: dict[str, Any]) -> None:
    """The LiteRT-LM engine (text in, text out; it adds <bos> itself) gives the oracle's text up
    to its first stop token."""
    got = dr.litertlm_generate_text(TARGET_LITERTLM, prompt["text"], N, litertlm_cache)
    expected = prompt["text_until_stop"]
    if prompt["first_stop_index"] is None and got != expected:
        # cut at N tokens, the engine's streaming detokenizer holds back trailing whitespace
        assert got == expected.rstrip() and expected[len(got):].isspace()
    else:
        assert got == expected


# --------------------------------------------------------------------------- through the seam

#: (label, backend, module that must be installed, options)
BACKENDS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("llama.cpp", "llama.cpp", "llama_cpp", {}),
    ("mlx", "mlx", "mlx_lm", {}),
    ("litert/interpreter", "litert-lm", "ai_edge_litert",
     {"litert-lm": {"session": "interpreter", "runtime": "interpreter"}}),
    ("litert/compiled", "litert-lm", "ai_edge_litert",
     {"litert-lm": {"session": "interpreter", "runtime": "compiled"}}),
]


def _backend_params() -> list[Any]:
    out = []
    for label, backend, module, options in BACKENDS:
        marks = [] if importlib.util.find_spec(module) else [
            pytest.mark.skip(reason=f"{module} is not installed")]
        out.append(pytest.param(backend, options, marks=marks, id=label))
    return out


@pytest.fixture(scope="module")
def gemma4() -> Any:
    ctx = InferenceContext(BUNDLE)
    yield ctx
    ctx.close()


@pytest.mark.parametrize(("backend", "options"), _backend_params())
@pytest.mark.parametrize("step", [1, 5])
def test_seam_streams_the_oracle(gemma4: InferenceContext, backend: str,
                                 options: dict[str, Any], step: int) -> None:
    """Every backend streams the oracle's greedy tokens (the same as llama.cpp's), including
    prompts far past the 32-token sliding window; prompts share one session (prefix reuse)."""
    with open_stream(gemma4, backend=backend, options=options, max_tokens=N, ignore_eos=True,
                     tokens_per_step=step, threads=1, context_size=1024) as stream:
        for case in PROMPTS:
            stream.prefill_reusing(case["prompt_ids"])
            got = [t for s in stream for t in s.tokens]
            assert got == case["continuation_ids"], case["name"]


CHAT = [p for p in PROMPTS if p["kind"] == "chat"]


@pytest.mark.parametrize(("backend", "options"), _backend_params())
@pytest.mark.parametrize("prompt", CHAT, ids=[p["name"] for p in CHAT])
def test_chat_through_the_gemma4_template(gemma4: InferenceContext, backend: str,
                                          options: dict[str, Any],
                                          prompt: dict[str, Any]) -> None:
    """Chat messages rendered with the bundle's Gemma 4 template reach the model as the oracle's
    prompt, and the reply stops at <turn|> with the oracle's text."""
    assert prompt["first_stop_index"] is not None
    with open_stream(gemma4, backend=backend, options=options, max_tokens=N, threads=1,
                     temperature=0.0) as stream:
        assert stream.chat_tokens(prompt["messages"]) == prompt["prompt_ids"]
        stream.prefill_messages(prompt["messages"])
        steps = list(stream)
    got = [t for s in steps for t in s.tokens]
    # the reply, and the <turn|> that ended it
    assert got == prompt["continuation_ids"][: prompt["first_stop_index"] + 1]
    assert got[-1] == TOK["end_id"] and steps[-1].finish_reason == "eos"


def test_explain_names_the_architecture_each_backend_would_load() -> None:
    """``select --explain``: the chosen backend's artifact and its architecture (a header /
    config probe, no model load): Gemma 4 as llama.cpp and mlx-lm name it."""
    from eliza_backends import explain

    report = explain(BUNDLE, backend="llama.cpp")
    assert report.model == "text/gemma4-tiny-f32.gguf (GGUF architecture gemma4)"
    assert "model: text/gemma4-tiny-f32.gguf (GGUF architecture gemma4)" in str(report)
    assert report.to_dict()["model"] == report.model
    mlx = explain(BUNDLE, backend="mlx")
    if mlx.chosen:  # mlx installed (Linux: mlx[cpu])
        assert mlx.model == "text/gemma4-tiny-mlx (model_type gemma4_text)"
    litert = explain(BUNDLE, backend="litert-lm")
    if litert.chosen:
        assert litert.model == "text/gemma4-tiny.litertlm (LiteRT-LM model type gemma4)"
    tiny = explain(BUNDLE.parent / "tiny", backend="litert-lm")
    if tiny.chosen:  # the tiny llama bundle's own LlmMetadata says generic
        assert tiny.model == "text/tiny.litertlm (LiteRT-LM model type generic_model)"
