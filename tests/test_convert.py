"""``eliza-backends bundle convert`` pieces that need no converter tool: plans, the error that
names the extra, the GGUF <-> HF layout maps, tokenizer rebuilding on small vocabularies,
cached stages, the SentencePiece tokenizer, sidecar tokenizers in bundles.

The conversions themselves (torch, litert-torch) run in the real-model tier, tests/real/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eliza_backends import BundleError, InvalidArgumentError, create_bundle, verify_bundle
from eliza_backends.convert import MissingToolError, parse_plan
from eliza_backends.convert.gguf_source import TokenizerFacts
from eliza_backends.convert.hf_checkpoint import _unpermute, permute_rotary
from eliza_backends.convert.stages import StageRunner
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
    assert np.array_equal(_unpermute(permute_rotary(w, 8), 8), w)
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
