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
from collections.abc import Sequence
from pathlib import Path

from ..errors import BackendRuntimeError
from .facts import ModelFacts

#: litert-torch 0.10 imports tensorflow.lite.python.schema_py_generated although TensorFlow is
#: not a dependency; the export subprocess gets this one-line module on its PYTHONPATH.
_SHIM = "from ai_edge_litert.schema_py_generated import *  # noqa: F403\n"

RECIPES = {"fp32": "none", "int8": "dynamic_wi8_afp32"}


def export_tflite(python: str, hf_dir: Path, out_dir: Path, *, precision: str,
                  prefill_lengths: list[int], cache_length: int, log_path: Path,
                  threads: int | None = None, extra_flags: Sequence[str] = ()) -> Path:
    """Run ``export_hf`` (in the interpreter ``python``, which has litert-torch) on ``hf_dir``
    with ``extra_flags`` after the converter's own; returns the ``model.tflite`` it wrote in
    ``out_dir``."""
    shim = out_dir / ".shim"
    module = shim / "tensorflow" / "lite" / "python" / "schema_py_generated.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(_SHIM)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # the exporter names and orders some constant tensors in set/dict-of-str order, so with
    # Python's per-process string hashing the same model gave different bytes on each run (the
    # Gemma 4 target's two rotary tables swapped names): one fixed seed, one set of bytes
    env["PYTHONHASHSEED"] = "0"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [python, "-m", "litert_torch.generative.export_hf", f"--model={hf_dir}",
           f"--output_dir={out_dir}",
           f"--prefill_lengths={','.join(map(str, prefill_lengths))}",
           f"--cache_length={cache_length}", f"--quantization_recipe={RECIPES[precision]}",
           "--bundle_litert_lm=False", "--keep_temporary_files=True", *extra_flags]
    with open(log_path, "wb") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    tflite = out_dir / "model.tflite"
    if done.returncode != 0 or not tflite.is_file():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise BackendRuntimeError(f"litert-torch export_hf failed (exit {done.returncode}); "
                                  f"log {log_path}:\n{tail}")
    return tflite


def llm_metadata(facts: ModelFacts, cache_length: int,
                 model_type: str = "generic_model") -> bytes:
    """The serialized LlmMetadata proto for ``facts``; ``model_type``: the ``LlmModelType``
    field that is set (the family's ``litert_model_type``: ``gemma4`` files say so, for the
    engine's Gemma 4 handling; the others are ``generic_model``)."""
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
    kind = llm_model_type_pb2.LlmModelType()
    getattr(kind, model_type).SetInParent()
    md.llm_model_type.CopyFrom(kind)
    return bytes(md.SerializeToString(deterministic=True))


def package_litertlm(tflite: Path, out: Path, facts: ModelFacts, *, cache_length: int,
                     hf_tokenizer: Path | None = None, sp_model: Path | None = None,
                     model_type: str = "generic_model") -> None:
    """Write the ``.litertlm`` at ``out``: metadata (``model_type``: see
    :func:`llm_metadata`), one tokenizer section, the model."""
    from litert_lm_builder import litertlm_builder as lb

    if (hf_tokenizer is None) == (sp_model is None):
        raise ValueError("give exactly one of hf_tokenizer / sp_model")
    meta_path = out.with_suffix(".llm_metadata.pb")
    meta_path.write_bytes(llm_metadata(facts, cache_length, model_type))
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
    out.write_bytes(reproducible_stamps(out.read_bytes()))


#: the builder's random uuid4 and its creation time (ISO, UTC, microseconds) in the header
_UUID = rb"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_TIME = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00"


def reproducible_stamps(data: bytes) -> bytes:
    """``data`` (a ``.litertlm``) with the two stamps litert_lm_builder writes into every file
    replaced in place, same lengths (no flatbuffer offset moves): the uuid4 by a uuid5 of the
    rest of the file, the time by ``$SOURCE_DATE_EPOCH`` (default 0). The same inputs then
    give the same bytes."""
    import datetime
    import hashlib
    import re
    import uuid

    head = data[:4096]  # the system metadata sits in the header
    found = [re.findall(p, head) for p in (_UUID, _TIME)]
    if any(len(f) != 1 for f in found):
        raise BackendRuntimeError(f"unexpected .litertlm header from litert_lm_builder: uuid "
                                  f"and time stamps {found!r}")
    rest = data.replace(found[0][0], b"").replace(found[1][0], b"")
    new_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, "eliza-backends/litertlm/"
                              + hashlib.sha256(rest).hexdigest())).encode()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    new_time = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%f+00:00").encode()
    return data.replace(found[0][0], new_uuid, 1).replace(found[1][0], new_time, 1)


def copy_tflite(src: Path, dest: Path) -> None:
    """Place the exported model (a hard link when the file system allows)."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


__all__ = ["RECIPES", "export_tflite", "llm_metadata", "package_litertlm",
           "reproducible_stamps"]
