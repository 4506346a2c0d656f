"""``eliza-backends bundle convert`` pieces that need no converter tool: plans, the error that
names the extra, the GGUF <-> HF layout maps, tokenizer rebuilding on small vocabularies,
cached stages, the SentencePiece tokenizer, sidecar tokenizers in bundles.

The conversions themselves (torch, litert-torch) run in the real-model tier, tests/real/.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eliza_backends import BundleError, InvalidArgumentError, create_bundle, verify_bundle
from eliza_backends.convert import MissingToolError, parse_plan
from eliza_backends.convert.gguf_source import TokenizerFacts
from eliza_backends.convert.hf_checkpoint import permute_rotary, unpermute_rotary
from eliza_backends.convert.stages import LIMIT_ENV, RECENT_S, StageRunner, cache_limit_bytes
from eliza_backends.convert.tokenizer_build import (
    hf_tokenizer_json,
    sentencepiece_model,
    spm_merges,
)

HEAVY = ("torch", "transformers", "litert_torch", "coremltools", "gguf", "llama_cpp", "mlx")


def test_importing_the_converter_imports_no_tool() -> None:
    code = ("import sys, eliza_backends.convert, eliza_backends.cli; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plans_from_command_line_text() -> None:
    plan = parse_plan("gguf,mlx,litert", ["gguf=f32,q4_k", "q8", "litert=int8"])
    assert plan.formats == {"gguf": ("f32", "q4_k"), "mlx": ("q8",), "litert": ("int8",)}
    assert parse_plan("gguf", []).formats == {"gguf": ("f32",)}
    for bad_formats, bad_precision in (("gguf,onnx", []), ("gguf", ["gguf=q3"]),
                                       ("mlx", ["fp32"]), ("gguf", ["tflite=fp32"])):
        with pytest.raises(InvalidArgumentError):
            parse_plan(bad_formats, bad_precision)


def test_missing_tools_name_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eliza_backends.convert import toolchain

    monkeypatch.setattr(toolchain, "missing", lambda what: ["torch"])
    with pytest.raises(MissingToolError, match=r"eliza-backends\[convert\]") as info:
        toolchain.require("verify")
    assert info.value.code.symbol == "ELIZA_ERR_BACKEND_UNAVAILABLE"


def test_cli_convert_refuses_a_non_gguf_source(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"nope")
    out = subprocess.run([sys.executable, "-m", "eliza_backends", "bundle", "convert",
                          str(tmp_path / "x.bin"), str(tmp_path / "out"), "--formats", "gguf"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "is not a .gguf file" in out.stderr


def test_unpermute_inverts_llama_cpp_rotary_layout() -> None:
    w = np.arange(8 * 64 * 5, dtype=np.float32).reshape(8 * 64, 5)
    assert np.array_equal(unpermute_rotary(permute_rotary(w, 8), 8), w)
    assert not np.array_equal(permute_rotary(w, 8), w)


def _spm_facts() -> TokenizerFacts:
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
              *(f"<0x{b:02X}>" for b in range(256)),
              "\u2581", "a", "b", "c", "ab", "\u2581a", "\u2581ab", "abc", "  "]
    types = [3, 3, 3, 3, 3, 3, *([6] * 256), 1, 1, 1, 1, 1, 1, 1, 1, 4]
    scores = [0.0] * 262 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, 0.0]
    return TokenizerFacts(model="llama", pre="default", tokens=pieces, token_types=types,
                          scores=scores, merges=None, bos_id=2, eos_id=1, unk_id=3, pad_id=0,
                          add_bos=True, add_space_prefix=False, eog_ids=(1, 5),
                          chat_template=None)


def test_spm_merges_follow_piece_scores() -> None:
    merges = spm_merges(_spm_facts())
    # "▁a" (score -6) ranks before "▁ab" (-7) before "abc" (-8): higher score merges first
    assert merges.index(["\u2581", "a"]) < merges.index(["\u2581a", "b"])
    assert merges.index(["a", "b"]) < merges.index(["ab", "c"])


def test_rebuilt_hf_and_sentencepiece_tokenizers_agree() -> None:
    from tokenizers import Tokenizer

    from eliza_backends.prompt.sp_tokenizer import SPTokenizer

    facts = _spm_facts()
    hf = Tokenizer.from_str(json.dumps(hf_tokenizer_json(facts)))
    sp = SPTokenizer(sentencepiece_model(facts))
    for text in ("ab abc", " a", "abc<end_of_turn>ab", "xyz é", "ab  c"):
        want = hf.encode(text, add_special_tokens=False).ids
        assert sp.encode(text, add_special=False) == want, text
        assert sp.decode(want) == text.replace("<end_of_turn>", "")  # control: no text
    assert sp.encode("ab")[0] == 2  # BOS
    assert sp.token_id("<end_of_turn>") == 5 and 5 in sp.special_ids
    assert sp.piece(5) == b"" and sp.piece(262) == b" "
    assert sp.template_tokens(2, frozenset({1, 5})) == {"bos_token": "<bos>",
                                                        "eos_token": "<eos>"}


def test_stages_are_cached_by_content_key(tmp_path: Path) -> None:
    calls = []

    def build(d: Path) -> None:
        calls.append(d)
        (d / "out.txt").write_text("x")

    runner = StageRunner(tmp_path, log=None)
    first = runner.run("s", ("a", 1), build)
    again = runner.run("s", ("a", 1), build)
    other = runner.run("s", ("a", 2), build)
    assert len(calls) == 2 and again.cached and not first.cached and not other.cached
    assert again.directory == first.directory != other.directory

    def broken(d: Path) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        runner.run("t", (), broken)
    resumed = runner.run("t", (), build)  # an unfinished stage is redone, not reused
    assert not resumed.cached and (resumed.directory / "out.txt").is_file()

    moved = runner.rekey(other, ("a", 3))  # filed under a key known once it ran
    assert not other.directory.exists() and (moved.directory / "out.txt").is_file()
    assert runner.run("s", ("a", 3), build).cached and len(calls) == 3


def test_the_stage_cache_keeps_what_was_used_last(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def build(d: Path) -> None:
        (d / "weights.bin").write_bytes(b"w" * 1000)

    earlier = StageRunner(tmp_path, log=None)
    old = [earlier.run("hf", (n,), build).directory for n in range(4)]
    for age, directory in enumerate(old):  # made (and last used) 4, 3, 2 and 1 hours ago
        os.utime(directory / ".done", (time.time() - 3600 * (4 - age),) * 2)
    (tmp_path / "hf-unfinished").mkdir()  # a stage another process is still building
    (tmp_path / "hf-unfinished" / "weights.bin").write_bytes(b"w" * 1000)
    (tmp_path / "verify-modules").mkdir()  # not a stage

    log = io.StringIO()
    runner = StageRunner(tmp_path, log=log)
    assert runner.run("hf", (0,), build).cached  # the oldest, used again: now the newest
    made = runner.run("mlx", ("new",), build).directory
    runner.evict_unused(2500)  # room for two of the five finished stages' 1000 bytes

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [old[0].name, made.name, "hf-unfinished", "verify-modules"])
    assert "removed 3 least recently used stages" in log.getvalue()
    beside = StageRunner(tmp_path, log=None).run("litert", ("beside",), build).directory
    runner.evict_unused(0)  # 0: only this run's stages stay, and those used a moment ago
    assert old[0].is_dir() and made.is_dir() and beside.is_dir()  # (another conversion's)
    os.utime(beside / ".done", (time.time() - RECENT_S - 1,) * 2)
    runner.evict_unused(0)
    assert not beside.exists()

    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(InvalidArgumentError, match=LIMIT_ENV):
        cache_limit_bytes()
    monkeypatch.setenv(LIMIT_ENV, "0.5")
    assert cache_limit_bytes() == 2**29


def test_verify_key_follows_the_serving_modules_it_loaded(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The verify stage is keyed by the source of the serving modules the last verification
    of the same artifacts loaded: a change to one of them re-verifies, a change elsewhere (or
    to the converter and the CLI, which are not serving code) does not."""
    import eliza_llamacpp  # noqa: F401  (a plugin, loaded as a verification loads it)

    import eliza_backends.cli
    import eliza_backends.stream  # noqa: F401
    from eliza_backends.convert import verify_key

    loaded = verify_key.loaded_modules()
    assert {"eliza_backends.stream", "eliza_llamacpp"} <= set(loaded)
    assert not [m for m in loaded if m.startswith(("eliza_backends.convert",
                                                   "eliza_backends.cli"))]
    pkg = tmp_path / "site" / "servepkg"
    pkg.mkdir(parents=True)
    for name, text in (("__init__", ""), ("used", "X = 1\n"), ("unused", "Y = 1\n")):
        (pkg / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    work = tmp_path / "work"
    base = verify_key.base_parts(["stage-a"], {"torch": "2.13.0"})
    assert verify_key.verify_key_parts(work, base)[-1] == "unrecorded"
    verify_key.record_modules(work, base, ["servepkg", "servepkg.used"])
    keyed = verify_key.verify_key_parts(work, base)
    assert keyed[-1] != "unrecorded"
    (pkg / "unused.py").write_text("Y = 2\n")
    assert verify_key.verify_key_parts(work, base) == keyed
    (pkg / "used.py").write_text("X = 2\n")
    changed = verify_key.verify_key_parts(work, base)
    assert changed != keyed
    (pkg / "used.py").rename(pkg / "moved.py")
    assert verify_key.verify_key_parts(work, base) not in (keyed, changed)
    # other artifacts or runtime versions: their own record
    other = verify_key.base_parts(["stage-a"], {"torch": "2.14.0"})
    assert verify_key.recorded_modules(work, other) is None


def test_bundles_accept_and_list_sidecar_tokenizers(tmp_path: Path, tiny_bundle: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    tfl = src / "m.tflite"
    tfl.write_bytes((tiny_bundle / "text" / "tiny.tflite").read_bytes())
    own = src / "m.tokenizer.json"
    own.write_text("{}")
    shared = src / "tokenizer.model"
    shared.write_bytes(b"sp")
    manifest = create_bundle(tmp_path / "b", [tfl, own, shared])
    by_path = {a.path: a for a in manifest.artifacts}
    assert [f.path for f in by_path["text/m.tflite"].files] == ["text/m.tflite",
                                                                "text/m.tokenizer.json"]
    assert by_path["text/tokenizer.model"].format == "tokenizer"
    assert by_path["text/tokenizer.model"].backend is None
    verify_bundle(tmp_path / "b")
    (tmp_path / "b" / "text" / "m.tokenizer.json").write_text("{ }")
    with pytest.raises(BundleError, match=r"m\.tokenizer\.json"):
        verify_bundle(tmp_path / "b")
    with pytest.raises(BundleError, match="at least one model artifact"):
        create_bundle(tmp_path / "c", [shared])


def test_a_hugging_face_folder_converts_to_the_same_gguf(tmp_path: Path, tiny_bundle: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The tiny bundle's MLX folder is a Hugging Face llama checkpoint (float16): converted
    as SRC, its float32 GGUF holds the tiny GGUF's weights (norms: the folder's float16
    values), the tokenizers agree with llama.cpp, and llama.cpp reproduces the oracle."""
    import direct_runtimes as dr
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from eliza_backends.convert import convert

    report = convert(tiny_bundle / "text" / "tiny-mlx", tmp_path / "b",
                     parse_plan("gguf", [], name="tiny"), work_dir=tmp_path / "work", log=None)
    assert report["source"]["kind"] == "huggingface"
    assert report["tokenizer_check"] == {"tokenizer.json": {"strings": 15, "agree": 15}}
    assert [a["paths"] for a in report["artifacts"]] == [["text/tiny-f32.gguf"]]

    def tensors(path: Path) -> dict[str, np.ndarray]:
        return {t.name: dequantize(t.data, t.tensor_type).astype(np.float32)
                for t in GGUFReader(str(path)).tensors}

    want = tensors(tiny_bundle / "text" / "tiny-f16.gguf")
    got = tensors(tmp_path / "b" / "text" / "tiny-f32.gguf")
    assert set(got) == set(want)
    for name, array in got.items():
        if name.endswith("norm.weight"):  # float32 in the GGUF, float16 in the folder
            assert np.allclose(array, want[name], rtol=1e-3), name
        else:
            assert np.array_equal(array, want[name]), name
    oracle = json.loads((tiny_bundle / "oracle.json").read_text(encoding="utf-8"))
    for p in oracle["prompts"]:
        assert dr.llamacpp_greedy(tmp_path / "b" / "text" / "tiny-f32.gguf", p["prompt_ids"],
                                  oracle["n_tokens"]) == p["continuation_ids"], p["name"]
    again = convert(tiny_bundle / "text" / "tiny-mlx", tmp_path / "b",
                    parse_plan("gguf", [], name="tiny"), work_dir=tmp_path / "work", log=None)
    assert all(s["cached"] for s in again["stages"])  # keyed by the folder's content

    # an interrupted run can be rerun into its own bundle (and resumes); a foreign one is not
    import eliza_backends.convert.pipeline as pipeline

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_manifest", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_bundle / "text" / "tiny-mlx", tmp_path / "c",
                parse_plan("gguf", [], name="tiny"), work_dir=tmp_path / "work", log=None)
    monkeypatch.undo()
    resumed = convert(tiny_bundle / "text" / "tiny-mlx", tmp_path / "c",
                      parse_plan("gguf", [], name="tiny"), work_dir=tmp_path / "work", log=None)
    assert all(s["cached"] for s in resumed["stages"])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "mine.txt").write_text("not a bundle")
    with pytest.raises(InvalidArgumentError, match="not a bundle this command made"):
        convert(tiny_bundle / "text" / "tiny-mlx", tmp_path / "d",
                parse_plan("gguf", [], name="tiny"), work_dir=tmp_path / "work", log=None)


def test_sigterm_unwinds_a_running_convert(tmp_path: Path, tiny_bundle: Path) -> None:
    """SIGTERM during a stage exits through Python's unwinding (status 143, not killed by the
    signal), so subprocess.run kills a running exporter instead of leaving it orphaned."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "eliza_backends", "bundle", "convert",
                             str(tiny_bundle / "text" / "tiny-mlx"), str(tmp_path / "b"),
                             "--formats", "gguf", "--work-dir", str(tmp_path / "work")],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "hf: started" in line:
                proc.send_signal(signal.SIGTERM)
                break
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert json.loads((tmp_path / "b" / "convert.json").read_text()) == {"status": "in progress"}


GEMMA4_TARGET = Path(__file__).resolve().parent.parent / "examples" / "bundles" / \
    "gemma4-tiny" / "text" / "gemma4-tiny-mlx"


def test_a_gemma4_folder_is_read_as_its_text_model() -> None:
    """The tiny Gemma 4 target's facts: sliding and full layers with their own head sizes,
    the window, the end ids (<eos>, <turn|>), the Gemma 4 vocabulary with byte fallback."""
    from eliza_backends.convert.hf_source import HFSource

    facts = HFSource(GEMMA4_TARGET).facts()
    assert (facts.architecture, facts.hidden_size, facts.num_layers, facts.head_dim,
            facts.sliding_window) == ("gemma4", 128, 4, 32, 32)
    assert facts.extra["global_head_dim"] == 64
    assert facts.extra["layer_types"] == ["sliding_attention", "full_attention"] * 2
    tok = facts.tokenizer
    assert (tok.model, tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == \
        ("gemma4", 2, 1, 0, True)
    assert tok.eog_ids == (1, 6) and tok.tokens[6] == "<turn|>" and tok.tokens[17] == "<0x00>"
    assert facts.tie_word_embeddings and tok.chat_template is not None


def test_a_conditional_generation_config_gives_its_text_model() -> None:
    from eliza_backends.convert.families.gemma4 import text_config, text_tensor_name

    text = json.loads((GEMMA4_TARGET / "config.json").read_text())
    nested = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
              "text_config": {k: v for k, v in text.items() if k != "global_head_dim"},
              "vision_config": {"model_type": "gemma4_vision"}}
    flat = text_config(nested)
    assert flat["architectures"] == ["Gemma4ForCausalLM"] and flat["model_type"] == "gemma4_text"
    assert flat["global_head_dim"] == 64  # from per_layer_config, explicit for mlx-lm
    assert text_tensor_name(nested, "model.language_model.layers.0.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert text_tensor_name(nested, "model.vision_tower.encoder.weight") is None
    assert text_tensor_name(text, "model.norm.weight") == "model.norm.weight"


GEMMA4_MM = Path(__file__).resolve().parent.parent / "examples" / "bundles" / \
    "gemma4-mm-tiny" / "text" / "gemma4-mm-tiny-mlx"


def test_a_multimodal_gemma4_gets_a_projector_and_an_mlx_vlm_folder() -> None:
    """A Gemma4ForConditionalGeneration with towers: llama.cpp's converter runs a second time
    with --mmproj (placed under text/mmproj/, role mmproj), and its MLX folder is mlx-vlm's,
    with the text_config fields mlx-vlm would default wrongly written out; a text-only one
    (and the text family's folders) gets neither."""
    from eliza_backends.convert import families

    family = families.for_model_type("gemma4", GEMMA4_MM)
    config = json.loads((GEMMA4_MM / "config.json").read_text())
    assert family.projector_runs(config) == (("mmproj-f32.gguf", ("--mmproj",)),)
    assert family.mlx_vlm_text_fields(config) == {"global_head_dim": 64,
                                                  "use_double_wide_mlp": False}
    text_only = {k: v for k, v in config.items() if k not in ("vision_config", "audio_config")}
    assert family.projector_runs(text_only) == ()
    assert family.mlx_vlm_text_fields(text_only) is None
    flat = json.loads((GEMMA4_TARGET / "config.json").read_text())
    assert family.projector_runs(flat) == () and family.mlx_vlm_text_fields(flat) is None
    assert families.for_model_type("llama", GEMMA4_MM).projector_runs(config) == ()


UNIFIED = Path(__file__).resolve().parent.parent / "examples" / "bundles" / \
    "gemma4-unified-tiny"


def test_gemma4_unified_is_its_own_family(tmp_path: Path) -> None:
    """A Gemma4UnifiedForConditionalGeneration folder: the gemma4_unified family (its GGUFs by
    llama.cpp's converter: the text model, the gemma4uv + gemma4ua projector; mlx-vlm's MLX
    folder; image and audio checked by --verify against the Unified reference); its text
    folder is a Gemma4UnifiedForCausalLM; its assistant is refused as a source and checked as a
    draft; LiteRT and Core ML refuse with a message."""
    from eliza_backends.convert import families
    from eliza_backends.convert.families.gemma4_unified import text_folder_config
    from eliza_backends.convert.hf_source import HFSource

    folder = UNIFIED / "text" / "gemma4-unified-tiny-mlx"
    config = json.loads((folder / "config.json").read_text())
    family = families.for_model_type("gemma4_unified", folder)
    assert family.architecture == "gemma4_unified" and family.llama_cpp_gguf
    assert family.media_kinds(config) == ("image", "audio")
    assert family.projector_runs(config) == (("mmproj-f32.gguf", ("--mmproj",)),)
    assert family.mlx_vlm_text_fields(config) == {"global_head_dim": 64,
                                                  "use_double_wide_mlp": False}
    facts = HFSource(folder).facts()
    assert (facts.architecture, facts.vocab_size, facts.hidden_size) == ("gemma4_unified",
                                                                         519, 128)
    assert facts.extra["hidden_size_per_layer_input"] == 0
    text = text_folder_config(config)
    assert (text["model_type"], text["architectures"]) == ("gemma4_unified_text",
                                                           ["Gemma4UnifiedForCausalLM"])
    assert "hidden_size_per_layer_input" not in text and text["global_head_dim"] == 64
    with pytest.raises(BundleError, match="--draft"):
        HFSource(UNIFIED / "source" / "assistant")
    draft = UNIFIED / "source" / "assistant"
    assert families.check_draft(draft, facts)["model_type"] == "gemma4_unified_assistant"
    with pytest.raises(BundleError, match="drafts for a gemma4_unified target only"):
        families.check_draft(draft, HFSource(GEMMA4_TARGET).facts())
    with pytest.raises(BundleError, match="drop litert"):
        family.litert_source(folder, tmp_path)
    with pytest.raises(BundleError, match="drop coreml"):
        family.coreml_module(None, facts, 64, "float32")


def test_verify_media_sends_what_the_reference_reads() -> None:
    """--verify's test media: a 70-token image (sides multiples of 48 px) and 1 s of 16 kHz
    PCM that survive the OpenAI parts a client sends bit for bit (what the runtimes decode is
    what transformers reads); a multimodal Gemma 4 asks for both."""
    import numpy as np

    from eliza_backends.convert import families
    from eliza_backends.convert.verify_media import _part, test_audio, test_image
    from eliza_backends.media import media_from_part

    image, audio = test_image(), test_audio()
    assert image.shape == (336, 480, 3) and (336 // 48) * (480 // 48) == 70
    assert np.array_equal(media_from_part(_part("image", image)).data, image)
    assert np.array_equal(media_from_part(_part("audio", audio)).data, audio)
    family = families.for_model_type("gemma4", GEMMA4_MM)
    config = json.loads((GEMMA4_MM / "config.json").read_text())
    assert family.media_kinds(config) == ("image", "audio")
    assert family.media_kinds(json.loads((GEMMA4_TARGET / "config.json").read_text())) == ()


def test_a_gemma4_assistant_is_refused_as_a_source_and_checked_as_a_draft(tmp_path: Path
                                                                          ) -> None:
    from eliza_backends.convert.families.gemma4 import check_assistant
    from eliza_backends.convert.hf_source import HFSource

    facts = HFSource(GEMMA4_TARGET).facts()
    folder = tmp_path / "assistant"
    folder.mkdir()
    cfg = {"model_type": "gemma4_assistant", "backbone_hidden_size": 128,
           "text_config": {"vocab_size": 512}}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BundleError, match="--draft"):
        HFSource(folder)
    with pytest.raises(BundleError, match="no safetensors"):
        check_assistant(folder, facts)
    (folder / "model.safetensors").write_bytes(b"")
    assert check_assistant(folder, facts)["backbone_hidden_size"] == 128
    (folder / "config.json").write_text(json.dumps({**cfg, "backbone_hidden_size": 640}))
    with pytest.raises(BundleError, match="hidden size 640"):
        check_assistant(folder, facts)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(BundleError, match="gemma4_assistant"):
        check_assistant(folder, facts)


def test_gemma4_requests_are_checked_before_any_work(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No llama.cpp converter script: the error says where it comes from; a draft for a GGUF
    source."""
    from eliza_backends.convert import convert, toolchain
    from eliza_backends.convert.pipeline import _llama_cpp_request

    monkeypatch.delenv("ELIZA_LLAMA_CPP_CONVERTER", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(MissingToolError, match=r"convert_hf_to_gguf\.py"):
        _llama_cpp_request(parse_plan("gguf"))
    assert not toolchain.can_make("hf-llama-cpp")
    gguf = Path(__file__).resolve().parent.parent / "examples" / "bundles" / "gemma4-tiny" / \
        "text" / "gemma4-tiny-f32.gguf"
    with pytest.raises(InvalidArgumentError, match="--draft goes with a Hugging Face folder"):
        convert(gguf, tmp_path / "b", parse_plan("gguf"), draft=GEMMA4_TARGET, log=None)


def test_every_model_type_and_architecture_has_one_family(tmp_path: Path) -> None:
    """The families table: one family per model_type and per architecture, each found by
    both; a model_type no family converts is refused with the ones that do and the hint of
    the family that recognises it."""
    from eliza_backends.convert import families

    types = [t for f in families.FAMILIES for t in f.model_types]
    archs = [f.architecture for f in families.FAMILIES]
    assert len(types) == len(set(types)) and len(archs) == len(set(archs))
    for family in families.FAMILIES:
        assert families.for_architecture(family.architecture) is family
        for model_type in family.model_types:
            assert families.for_model_type(model_type, tmp_path) is family
    assert families.gguf_architectures() == ("llama", "gemma3")
    with pytest.raises(BundleError, match=r"'gemma3' is not one .*gemma4_text.*multimodal"):
        families.for_model_type("gemma3", tmp_path)
    with pytest.raises(BundleError, match="'mistral' is not one the converter maps"):
        families.for_model_type("mistral", tmp_path)
