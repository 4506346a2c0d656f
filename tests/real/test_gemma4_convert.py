"""``bundle convert`` of a Gemma 4 family: the tiny family's Hugging Face folders (the target's
is examples/bundles/gemma4-tiny/text/gemma4-tiny-mlx, the assistant's is
examples/bundles/gemma4-tiny/source/assistant) converted with ``--draft`` and ``--verify``
reproduce examples/bundles/gemma4-tiny: byte-identical GGUFs (the same writer, llama.cpp's
convert_hf_to_gguf.py, on the same folders) and LiteRT files, and every other artifact equal to
the float32 torch oracle token for token (the bundle's own parity.json scorer). The same run
makes the Core ML package and checks on Linux what can be checked there (Core ML runs on macOS
only), as for SmolLM2.

Real tier (it needs the converter environment, .venv-convert): runs with
``ELIZA_REAL_MODELS=1``. The conversion is cached like the real models' (``$ELIZA_CACHE_DIR``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from eliza_backends import open_stream
from eliza_backends.manifest import load_manifest
from eliza_backends.testing import generated_tokens, run_to_end

from .models import ROOT, cache_dir, checked_coreml, convert_python

BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
ORACLE = json.loads((BUNDLE / "oracle.json").read_text(encoding="utf-8"))
#: the converted files that must equal the committed ones byte for byte
SAME_BYTES = {
    "text/gemma4-tiny-f32.gguf": "text/gemma4-tiny-f32.gguf",
    "text/draft/mtp/gemma4-tiny-assistant-f32.gguf":
        "text/draft/mtp/gemma4-tiny-assistant-f32.gguf",
    "text/gemma4-tiny-fp32.tflite": "text/gemma4-tiny.tflite",
    "text/gemma4-tiny-fp32.litertlm": "text/gemma4-tiny.litertlm",
}


def sources(root: Path) -> tuple[Path, Path]:
    """The family's Hugging Face folders copied to ``root/target`` and ``root/assistant``
    (llama.cpp's converter names a model after its folder: the tool's folders had these
    names)."""
    target, assistant = root / "target", root / "assistant"
    for src, dst in ((BUNDLE / "text" / "gemma4-tiny-mlx", target),
                     (BUNDLE / "source" / "assistant", assistant)):
        if dst.is_dir():  # fresh: the committed folders may have changed (the stages are
            shutil.rmtree(dst)  # keyed by content, so an unchanged copy converts nothing)
        shutil.copytree(src, dst)
    return target, assistant


def run_convert(src: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``bundle convert SRC OUT ARGS`` in the converter environment (cached stages)."""
    py = convert_python()
    if not py.is_file():
        pytest.fail(f"no converter environment at {py}: run bash scripts/install-convert.sh")
    cmd = [str(py), "-m", "eliza_backends", "bundle", "convert", str(src), str(out),
           "--threads", "1", "--work-dir", str(cache_dir() / "convert"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@functools.cache
def converted() -> Path:
    """The family converted once per process: every Linux format and Core ML, the assistant,
    --verify."""
    work = cache_dir() / "gemma4-tiny-src"
    target, assistant = sources(work)
    out = cache_dir() / "bundles" / "gemma4-tiny"
    done = run_convert(target, out, "--draft", str(assistant), "--formats",
                       "gguf,mlx,litert,coreml", "--prefill-lengths", "32,128",
                       "--cache-length", "1024", "--name", "gemma4-tiny", "--verify")
    if done.returncode != 0:
        pytest.fail(f"bundle convert failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def bundle() -> Path:
    return converted()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("made", sorted(SAME_BYTES))
def test_the_same_writer_gives_the_same_bytes(bundle: Path, made: str) -> None:
    assert sha256(bundle / made) == sha256(BUNDLE / SAME_BYTES[made])


def test_the_manifest_names_the_assistant_as_an_mtp_draft(bundle: Path) -> None:
    arts = {a.path: a for a in load_manifest(bundle).artifacts}
    mtp = arts["text/draft/mtp/gemma4-tiny-assistant-f32.gguf"]
    assert (mtp.format, mtp.role, mtp.kind) == ("gguf", "draft", "mtp")
    # the assistant's MLX folder beside it (mlx-vlm's drafter on the MLX backend, issue 38)
    mtp_mlx = arts["text/draft/mtp/gemma4-tiny-assistant-mlx"]
    assert (mtp_mlx.format, mtp_mlx.role, mtp_mlx.kind) == ("mlx", "draft", "mtp")
    assert {a.role for p, a in arts.items() if p not in (mtp.path, mtp_mlx.path)} == {"model"}
    report = json.loads((bundle / "convert.json").read_text(encoding="utf-8"))
    assert report["model"]["architecture"] == "gemma4"
    assert report["model"]["layer_types"] == ["sliding_attention", "full_attention"] * 2
    # <eos>, then what llama.cpp's Gemma 4 vocabulary ends a turn on: <turn|> and
    # <|tool_response> (the model waits there for the tool's answer)
    assert report["model"]["eog_ids"] == [1, 6, 14]


def test_verify_finds_every_artifact_identical_to_transformers(bundle: Path) -> None:
    parity = json.loads((bundle / "parity.json").read_text(encoding="utf-8"))
    assert len(parity["artifacts"]) == 4  # gguf, mlx, tflite, litertlm (the draft is not scored)
    assert any(p["name"].startswith("long") for p in parity["prompts"])  # past the window
    for label, res in parity["artifacts"].items():
        assert "error" not in res, label
        assert res["greedy_agree"] == res["positions"], (label, res["first_divergence"])


def _oracle_score(bundle: Path, label: str, backend: str,
                  options: dict[str, Any]) -> dict[str, Any]:
    from eliza_backends.convert.verify import score_artifact

    prompts = [(p["name"], p["prompt_ids"]) for p in ORACLE["prompts"]]
    ref = {p["name"]: {"ids": p["continuation_ids"], "gaps": p["logit_gaps"]}
           for p in ORACLE["prompts"]}
    return score_artifact(bundle, backend, options, prompts, ref,
                          frozenset(ORACLE["tokenizer"]["stop_ids"]), threads=1)


def test_every_converted_artifact_reproduces_the_oracle(bundle: Path) -> None:
    """The bundle's own parity.json scorer against oracle.json (14 prompts x 32 tokens, two
    of them 5x and 12x the sliding window): the same counts as the committed bundle's."""
    from eliza_backends.convert.verify import _artifact_runs

    committed = json.loads((BUNDLE / "parity.json").read_text(encoding="utf-8"))["artifacts"]
    runs = _artifact_runs(bundle)
    assert [backend for _l, backend, _o in runs].count("litert-lm") == 2
    for label, backend, options in runs:
        res = _oracle_score(bundle, label, backend, options)
        twin = next(v for k, v in committed.items()
                    if v["backend"] == backend and v["options"][backend].get("session")
                    == options[backend].get("session")
                    and Path(k.split(" ")[0]).suffix == Path(label.split(" ")[0]).suffix)
        assert (res["greedy_agree"], res["positions"]) == \
            (twin["greedy_agree"], twin["positions"]), label
        assert res["greedy_agree"] == res["positions"], label


def test_the_converted_assistant_drafts_for_the_converted_target(bundle: Path) -> None:
    """``drafter="mtp"`` on the converted pair: the oracle's tokens past the sliding window,
    with most drafts accepted."""
    prompt = next(p for p in ORACLE["prompts"] if p["name"] == "long400")
    with open_stream(bundle, backend="llama.cpp", max_tokens=32, temperature=0.0,
                     ignore_eos=True, drafter="mtp", draft_length=3, draft_policy="fixed",
                     threads=1, context_size=512, batch_size=64) as stream:
        stream.prefill(prompt["prompt_ids"])
        steps = run_to_end(stream.session)
    drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
    assert generated_tokens(steps) == prompt["continuation_ids"]
    assert drafted > 0 and accepted / drafted >= 0.5, (drafted, accepted)


def test_a_conditional_generation_folder_converts_to_the_same_gguf(tmp_path: Path) -> None:
    """The same text weights as a ``Gemma4ForConditionalGeneration`` (the text model under
    ``model.language_model``, the config's ``text_config``) give the same GGUF."""
    from safetensors.numpy import load_file, save_file

    target, _ = sources(tmp_path / "flat")
    nested = tmp_path / "nested" / "target"
    shutil.copytree(target, nested)
    weights = load_file(str(target / "model.safetensors"))
    save_file({"model.language_model." + k.removeprefix("model."): v
               for k, v in weights.items()}, str(nested / "model.safetensors"),
              metadata={"format": "pt"})
    text = json.loads((target / "config.json").read_text())
    (nested / "config.json").write_text(json.dumps({
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "text_config": text, "vision_config": None, "audio_config": None,
        "tie_word_embeddings": True, "dtype": "float32"}, indent=2))
    done = run_convert(nested, tmp_path / "out", "--formats", "gguf", "--name", "gemma4-tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sha256(tmp_path / "out" / "text" / "gemma4-tiny-f32.gguf") == \
        sha256(BUNDLE / "text" / "gemma4-tiny-f32.gguf")


def test_the_core_ml_package_is_converted_and_checked(bundle: Path) -> None:
    """Core ML, as for SmolLM2: ``bundle convert`` checked that the traced stateful rewrite,
    run through its own KV state (a 69-token prefill past the 32-token sliding window, then
    three single-token decodes; the shared-KV layers read their source layers' slots), gives
    transformers' float32 logits, and that the saved package has the session's inputs,
    states and output; the states hold only the two layers that compute keys, padded to the
    global layers' head size (64)."""
    spec = checked_coreml(bundle, 33)  # past the 32-token sliding window
    assert spec["state_shape"] == [2, 1, 1, 1024, 64]
    arts = {a.path: a for a in load_manifest(bundle).artifacts}
    assert arts["text/gemma4-tiny-fp32.mlpackage"].format == "mlpackage"
