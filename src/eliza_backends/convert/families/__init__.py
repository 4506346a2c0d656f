"""Model families: everything the converter knows that differs between one family of models
and another, one adapter module per family, looked up here by ``config.json``'s
``model_type`` (:func:`for_model_type`) or by the GGUF / :class:`~..facts.ModelFacts`
architecture (:func:`for_architecture`). Nothing outside this package branches on a family's
name; the stages (:mod:`..pipeline`, :mod:`..float32_pass`, :mod:`..gguf_source`,
:mod:`..hf_source`) ask the family.

Adding a family = one module here that defines ``FAMILY`` (an instance of a
:class:`~.base.ModelFamily` subclass) + one line in :data:`FAMILIES`. The adapter provides
(defaults in :class:`~.base.ModelFamily`: the plain decoder the converter writes itself):

Recognition (class attributes)
    ``architecture`` (str): the GGUF ``general.architecture`` and ``ModelFacts.architecture``;
    ``model_types`` (tuple of str): the ``config.json`` ``model_type`` values it converts;
    ``refused_model_types`` ({model_type: hint}): ones it recognises but refuses, the hint
    ending the error; ``draft_model_types``: the ``--draft`` folders its targets take;
    ``reads_gguf`` (bool): whether a GGUF of the architecture is a source.
Model facts
    ``model_facts(source: HFFolder) -> ModelFacts`` (end ids as the folder says them;
    :class:`~...errors.BundleError` for what the family does not map);
    ``gguf_facts(need, head_dim) -> dict`` the family's own ModelFacts fields from a GGUF
    (``need(key)`` reads ``<architecture>.<key>``). The default ``model_facts`` reads a
    llama-shaped config, adjusted by ``full_attention_rope``, ``config_facts``,
    ``check_facts``, ``default_rope_theta`` and ``sentencepiece_space_prefix``.
Float32 stage (the ``hf`` stage every format is made from)
    ``llama_cpp_gguf`` (bool): llama.cpp's ``convert_hf_to_gguf.py`` writes the GGUFs, each of
    ``llama_cpp_runs() -> ((file name, extra script arguments), ...)`` from the source folder
    (the first is ``model-f32.gguf``), and ``write_float32_folder(source, out)`` writes the
    float32 Hugging Face folder the other formats read; otherwise the converter writes both,
    tensor by tensor through ``to_gguf_tensor`` / ``to_hf_tensor(facts, name, float32 array)
    -> (name, float32 array)`` (from ``layer_names``, ``hf_layout`` / ``gguf_layout``) and
    ``hf_config(facts) -> dict`` (``config.json``); ``gguf_rope_dimension_count`` (bool);
    ``code_modules``: the convert/ modules (paths without ``.py``) whose code keys the stage;
    ``projector_runs(config) -> ((file name, extra script arguments), ...)``: multimodal
    projectors llama.cpp's converter also writes from the source folder in that stage, placed
    under ``text/mmproj/`` (manifest role ``mmproj``; Gemma 4 with towers: ``--mmproj``).
MLX
    ``mlx_expected(facts, hf_dir) -> {ModelArgs field: value}`` mlx-lm must read back;
    ``mlx_vlm_text_fields(config) -> dict | None``: for a multimodal source, the MLX folder is
    ``mlx_vlm convert`` of the source folder itself with these ``text_config`` fields written
    out (None: mlx-lm's, from the float32 text folder).
Media
    ``media_kinds(config) -> ("image", "audio")``: what ``--verify`` also checks with an image
    / audio prompt (:mod:`..verify_media`), against ``media_reference(source, kind, data,
    question, n_tokens) -> {"ids", "reference_ids"}`` (transformers float32 on the source).
LiteRT
    ``litert_source(hf_dir, out) -> Path`` the folder litert-torch's ``export_hf`` converts
    (``hf_dir`` itself, or a variant written at ``out``); ``litert_flags`` (extra export
    flags); ``litert_model_type`` (the ``LlmModelType`` field of the ``.litertlm`` metadata).
Core ML
    ``coreml_module(hf_model, facts, max_len, cache_dtype) -> torch module`` in
    :mod:`..coreml_out`'s stateful layout (``max_len`` positions; ``cache_dtype`` "float16" or
    "float32"); ``coreml_code_modules`` key its stages.
Drafts
    ``check_draft(folder, config, facts) -> config`` for a folder of ``draft_model_types``.

Each ``model_type`` and each architecture belongs to one family (checked by
tests/test_convert.py). Gemma 4 with towers is the ``gemma4`` family's (a projector run and
an mlx-vlm folder, above); Gemma 4 Unified is one more module (a subclass of Gemma 4's
adapter: other names, its own media reference, no LiteRT / Core ML). Not in the contract yet: a
multimodal ``.litertlm`` (litert-torch 0.10 exports one only at E2B's tower widths).

Adapters are stateless singletons (safe from any thread); they import heavy tools (torch,
mlx-lm) inside the methods that need them, so importing this package stays cheap. An adapter
imports what is below it (:mod:`..facts`, :mod:`..hf_folder`, :mod:`..hf_checkpoint`, the
format writers) and never the modules that look families up.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import BundleError
from ..facts import ModelFacts
from . import gemma3, gemma4, gemma4_unified, llama
from .base import ModelFamily

#: every family, in the order errors list them
FAMILIES: tuple[ModelFamily, ...] = (
    llama.FAMILY,
    gemma3.FAMILY,
    gemma4.FAMILY,
    gemma4_unified.FAMILY,
)


def model_types() -> list[str]:
    """Every ``model_type`` some family converts."""
    return [t for f in FAMILIES for t in f.model_types]


def for_model_type(model_type: object, path: Path) -> ModelFamily:
    """The family that converts ``model_type`` (the folder ``path``'s); :class:`BundleError`
    naming the ones that convert, with the recognising family's hint when one refuses it."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    hint = next((f.refused_model_types[model_type] for f in FAMILIES
                 if isinstance(model_type, str) and model_type in f.refused_model_types), "")
    raise BundleError(f"{path}: model_type {model_type!r} is not one the converter maps yet "
                      f"({', '.join(model_types())}){' ' + hint if hint else ''}")


def gguf_architectures() -> tuple[str, ...]:
    """The GGUF architectures a GGUF source may have."""
    return tuple(f.architecture for f in FAMILIES if f.reads_gguf)


def for_architecture(architecture: str) -> ModelFamily:
    """The family of ``architecture`` (GGUF / :class:`ModelFacts`); :class:`BundleError` if
    none."""
    for family in FAMILIES:
        if family.architecture == architecture:
            return family
    raise BundleError(f"architecture {architecture!r} is not one the converter maps "
                      f"({', '.join(f.architecture for f in FAMILIES)})")


def check_draft(folder: Path, facts: ModelFacts) -> dict[str, object]:
    """The ``--draft`` folder's ``config.json`` after its family checked that it drafts for
    ``facts``' model; :class:`BundleError` when no family takes it as a draft."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    kind = config.get("model_type") if isinstance(config, dict) else None
    for family in FAMILIES:
        if kind in family.draft_model_types:
            return family.check_draft(folder, config, facts)
    kinds = ", ".join(repr(k) for f in FAMILIES for k in f.draft_model_types)
    raise BundleError(f"{folder}: --draft takes an MTP assistant folder (model_type {kinds}), "
                      f"this is {kind!r}; standalone draft models go in with `bundle create "
                      "--draft`")


__all__ = ["FAMILIES", "ModelFamily", "check_draft", "for_architecture", "for_model_type",
           "gguf_architectures", "model_types"]
