"""The Gemma 4 Unified family (``gemma4_unified``: ``Gemma4UnifiedForConditionalGeneration``,
the 12B "Unified" size): no vision or audio encoder — raw 48x48 image patches and raw
640-sample audio frames are projected straight into a Gemma 4 text model that has no per-layer
inputs. Its MTP assistant is a ``gemma4_unified_assistant``.

Everything but the names is the :mod:`.gemma4` family's: llama.cpp's converter writes the text
GGUF (``general.architecture`` ``gemma4``) and, with ``--mmproj``, one projector file with
``gemma4uv`` (image) and ``gemma4ua`` (audio); the float32 text folder is a
``Gemma4UnifiedForCausalLM`` (:func:`text_folder_config`); the MLX folder is
mlx-vlm's (its ``gemma4_unified``) from the source folder with ``global_head_dim`` /
``use_double_wide_mlp`` written out; the assistant converts as Gemma 4's. Its ``--verify`` media
reference is :func:`.gemma4_media.unified_reference` (Gemma 4's image mask built explicitly:
the Unified forward's own differs, see there).

Not converted: LiteRT and Core ML (litert-torch 0.10 and the Core ML module know the Gemma 4
text model; the Unified projections have no exporter) — both refuse with a message.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...errors import BundleError
from ..facts import ModelFacts
from ..hf_folder import HFFolder
from .gemma4 import (
    Gemma4,
    check_assistant,
    model_facts,
    text_config,
    write_mlx_assistant,
    write_text_folder,
)

MODEL_TYPE = "gemma4_unified"
ASSISTANT_TYPE = "gemma4_unified_assistant"
TEXT_TYPE = "gemma4_unified_text"
_NO_EXPORT = ("Gemma 4 Unified converts to GGUF (text + gemma4uv/gemma4ua projector + "
              "assistant) and MLX; {what} of it is not made yet: drop {fmt} from --formats")


def text_folder_config(config: dict[str, Any]) -> dict[str, Any]:
    """The float32 text folder's ``config.json``: Gemma 4's text config (:func:`.text_config`)
    as a ``Gemma4UnifiedForCausalLM`` (transformers 5.24's ``Gemma4ForCausalLM`` without
    per-layer inputs fails on KV-shared layers)."""
    text = text_config(config)
    text.update(architectures=["Gemma4UnifiedForCausalLM"], model_type=TEXT_TYPE)
    return text


class Gemma4Unified(Gemma4):
    """``gemma4_unified`` (see the module docstring). :attr:`architecture` is the family's key
    (the report's, ``ModelFacts.architecture``); its GGUF's ``general.architecture`` is
    ``gemma4``."""

    architecture = "gemma4_unified"
    model_types = (MODEL_TYPE,)
    refused_model_types: ClassVar[Mapping[str, str]] = {
        ASSISTANT_TYPE: "(a Gemma 4 Unified MTP assistant: pass it with --draft next to its "
                        "target's folder)"}
    draft_model_types = (ASSISTANT_TYPE,)
    code_modules: ClassVar[tuple[str, ...]] = ("families/gemma4", "families/gemma4_unified",
                                               "families/gemma4_media")

    def model_facts(self, source: HFFolder) -> ModelFacts:
        return dataclasses.replace(model_facts(source), architecture=self.architecture)

    def write_float32_folder(self, source: HFFolder, out: Path) -> None:
        write_text_folder(source, out, text_folder_config(source.config))

    def media_reference(self, source: Path, kind: str, data: Any, question: str,
                        n_tokens: int) -> dict[str, Any]:
        from .gemma4_media import unified_reference

        return unified_reference(source, kind, data, question, n_tokens)

    def litert_source(self, hf_dir: Path, out: Path) -> Path:
        raise BundleError(_NO_EXPORT.format(what="a LiteRT model", fmt="litert"))

    def coreml_module(self, hf_model: Any, facts: ModelFacts, max_len: int,
                      cache_dtype: str) -> Any:
        raise BundleError(_NO_EXPORT.format(what="a Core ML model", fmt="coreml"))

    def check_draft(self, folder: Path, config: dict[str, Any],
                    facts: ModelFacts) -> dict[str, Any]:
        return check_assistant(folder, facts, ASSISTANT_TYPE, self.architecture)

    def write_mlx_draft(self, folder: Path, target_dir: Path, out: Path) -> None:
        write_mlx_unified_assistant(folder, target_dir, out)


#: the assistant's text_config fields mlx-vlm 0.7.10 (its gemma4 TextConfig) defaults to E2B's
#: per-layer-input sizes when absent, which a Unified config never writes
_MLX_ASSISTANT_FIELDS = {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}


def write_mlx_unified_assistant(folder: Path, target_dir: Path, out: Path) -> None:
    """``out``: the Unified assistant as mlx-vlm's ``load_drafter`` takes it — Gemma 4's
    (:func:`.write_mlx_assistant`) with the per-layer-input sizes written as 0 into its
    ``text_config`` (:data:`_MLX_ASSISTANT_FIELDS`)."""
    write_mlx_assistant(folder, target_dir, out)
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    text = cfg.setdefault("text_config", {})
    for key, value in _MLX_ASSISTANT_FIELDS.items():
        text.setdefault(key, value)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


FAMILY = Gemma4Unified()

__all__ = ["ASSISTANT_TYPE", "FAMILY", "MODEL_TYPE", "TEXT_TYPE", "Gemma4Unified",
           "text_folder_config", "write_mlx_unified_assistant"]
