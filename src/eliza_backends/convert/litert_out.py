"""LiteRT artifacts: ``.tflite`` by litert-torch's ``export_hf`` (a subprocess), and the
``.litertlm`` packaged here with ``litert_lm_builder`` so that its metadata is the model's own:

* start token: BOS only if the model really adds one (SmolLM2 adds none; litert-torch would
  write ChatML's ``<|im_start|>`` and the engine would prepend it to every prompt);
* stop tokens: every end-of-generation id, as ids (not punctuation-prefixed strings);
* the chat template as ``jinja_prompt_template``; ``max_num_tokens`` = the cache length;
* the tokenizer section: ``tokenizer.json`` (HF_Tokenizer_Zlib) or, for SentencePiece
  vocabularies, the SentencePiece model (SP_Tokenizer), as Google's own Gemma files carry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import BackendRuntimeError
from .gguf_source import ModelFacts

#: litert-torch 0.10 imports tensorflow.lite.python.schema_py_generated although TensorFlow is
#: not a dependency; the export subprocess gets this one-line module on its PYTHONPATH.
_SHIM = "from ai_edge_litert.schema_py_generated import *  # noqa: F403\n"

RECIPES = {"fp32": "none", "int8": "dynamic_wi8_afp32"}


def export_tflite(python: str, hf_dir: Path, out_dir: Path, *, precision: str,
                  prefill_lengths: list[int], cache_length: int, log_path: Path,
                  threads: int | None = None) -> Path:
    """Run ``export_hf`` (in the interpreter ``python``, which has litert-torch) on ``hf_dir``;
    returns the ``model.tflite`` it wrote in ``out_dir``."""
    shim = out_dir / ".shim"
    module = shim / "tensorflow" / "lite" / "python" / "schema_py_generated.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(_SHIM)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [python, "-m", "litert_torch.generative.export_hf", f"--model={hf_dir}",
           f"--output_dir={out_dir}",
           f"--prefill_lengths={','.join(map(str, prefill_lengths))}",
           f"--cache_length={cache_length}", f"--quantization_recipe={RECIPES[precision]}",
           "--bundle_litert_lm=False", "--keep_temporary_files=True"]
    with open(log_path, "wb") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    tflite = out_dir / "model.tflite"
    if done.returncode != 0 or not tflite.is_file():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise BackendRuntimeError(f"litert-torch export_hf failed (exit {done.returncode}); "
                                  f"log {log_path}:\n{tail}")
    return tflite


def llm_metadata(facts: ModelFacts, cache_length: int) -> bytes:
    """The serialized LlmMetadata proto for ``facts``."""
    from litert_lm_builder.runtime.proto import (
        llm_metadata_pb2,
        llm_model_type_pb2,
        sampler_params_pb2,
    )

    tok = facts.tokenizer
    md = llm_metadata_pb2.LlmMetadata()
    if tok.add_bos and tok.bos_id is not None:
        md.start_token.token_ids.ids.append(tok.bos_id)
    for eog in tok.eog_ids:
        md.stop_tokens.add().token_ids.ids.append(eog)
    if tok.chat_template:
        md.jinja_prompt_template = tok.chat_template
    md.sampler_params.type = sampler_params_pb2.SamplerParameters.GREEDY
    md.sampler_params.k = 1
    md.max_num_tokens = cache_length
    md.llm_model_type.CopyFrom(
        llm_model_type_pb2.LlmModelType(generic_model=llm_model_type_pb2.GenericModel()))
    return bytes(md.SerializeToString(deterministic=True))


def package_litertlm(tflite: Path, out: Path, facts: ModelFacts, *, cache_length: int,
                     hf_tokenizer: Path | None = None, sp_model: Path | None = None) -> None:
    """Write the ``.litertlm`` at ``out``: metadata, one tokenizer section, the model."""
    from litert_lm_builder import litertlm_builder as lb

    if (hf_tokenizer is None) == (sp_model is None):
        raise ValueError("give exactly one of hf_tokenizer / sp_model")
    meta_path = out.with_suffix(".llm_metadata.pb")
    meta_path.write_bytes(llm_metadata(facts, cache_length))
    builder = lb.LitertLmFileBuilder()
    builder.add_system_metadata(lb.Metadata(key="Authors", value="eliza-backends bundle convert",
                                            dtype=lb.DType.STRING))
    builder.add_llm_metadata(str(meta_path))
    if sp_model is not None:
        builder.add_sentencepiece_tokenizer(str(sp_model))
    else:
        assert hf_tokenizer is not None
        builder.add_hf_tokenizer(str(hf_tokenizer))
    builder.add_tflite_model(str(tflite), lb.TfLiteModelType.PREFILL_DECODE)
    with open(out, "wb") as f:
        builder.build(f)
    meta_path.unlink()


def copy_tflite(src: Path, dest: Path) -> None:
    """Place the exported model (a hard link when the file system allows)."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


__all__ = ["RECIPES", "export_tflite", "llm_metadata", "package_litertlm"]
