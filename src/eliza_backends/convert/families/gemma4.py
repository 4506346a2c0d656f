"""The Gemma 4 text family (GGUF ``gemma4``): what the converter reads from a
``Gemma4ForCausalLM`` or ``Gemma4ForConditionalGeneration`` folder (its text model) and from a
``gemma4_assistant`` (the MTP drafter), and the float32 text-only folder every other format is
made from. Its GGUFs are written by llama.cpp's own converter (:mod:`..llamacpp_convert`), its
Core ML module by :mod:`..coreml_gemma4`; the family adapter is :class:`Gemma4`.

* :func:`model_facts` — the :class:`~.gguf_source.ModelFacts` of the text model (the numbers
  the report, LiteRT's metadata and ``--verify`` need; the GGUF itself is written by llama.cpp's
  own converter, :mod:`.llamacpp_convert`);
* :func:`write_text_folder` — ``Gemma4ForCausalLM`` in float32: the text weights (a
  ``Gemma4ForConditionalGeneration``'s ``model.language_model.*`` renamed ``model.*``, its
  vision and audio towers left out), the text config with the fields mlx-lm reads at the top
  level made explicit (``global_head_dim``, ``use_double_wide_mlp``), the tokenizer files;
* :func:`check_assistant` — a ``gemma4_assistant`` folder that drafts for this target (same
  vocabulary, ``backbone_hidden_size`` = the target's hidden size), else :class:`BundleError`;
* :func:`write_mlx_assistant` — the assistant as an MLX folder for mlx-vlm's ``load_drafter``
  (the MLX backend's ``drafter="mtp"``);
* :func:`litert_source` — the folder as litert-torch 0.10's Gemma 4 exporter takes it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...errors import BundleError
from ..facts import ModelFacts, TokenizerFacts, f32_value
from ..hf_folder import HFFolder
from .base import ModelFamily

#: Hugging Face ``model_type`` -> class, for the targets the converter takes
TARGET_TYPES = {"gemma4_text": "Gemma4ForCausalLM", "gemma4": "Gemma4ForConditionalGeneration"}
ASSISTANT_TYPE = "gemma4_assistant"
#: the model types whose config nests the text model's under ``text_config`` and whose
#: weights keep it under ``model.language_model.`` (Gemma 4 with towers, Gemma 4 Unified)
NESTED_TYPES = ("gemma4", "gemma4_unified")
#: where a Gemma4ForConditionalGeneration keeps its text model's weights
_NESTED = "model.language_model."
#: extra flags litert-torch's export_hf needs for Gemma 4 (one KV cache tensor per layer, as
#: the LiteRT session reads it)
LITERT_EXPORT_FLAGS = ("--split_cache=False",)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                    "chat_template.jinja", "special_tokens_map.json", "generation_config.json")
_BYTE, _NORMAL, _CONTROL = 6, 1, 3


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's ``config.json`` (a ``Gemma4ForCausalLM``'s) from a target's config,
    with ``global_head_dim`` and ``use_double_wide_mlp`` at the top level (mlx-lm defaults
    them to 512 and to the model size's choice), float32."""
    nested = config.get("model_type") in NESTED_TYPES
    text = dict(config.get("text_config") or {}) if nested else dict(config)
    if nested:
        if not text:
            raise BundleError(f"a {config.get('model_type')} config.json without text_config: "
                              "no text model")
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
            if text.get(key) is None and config.get(key) is not None:
                text[key] = config[key]
    text.update(architectures=["Gemma4ForCausalLM"], model_type="gemma4_text",
                dtype="float32")
    text.pop("torch_dtype", None)
    if text.get("global_head_dim") is None:
        text["global_head_dim"] = _full_head_dim(text)
    text.setdefault("use_double_wide_mlp", False)
    return text


def _full_head_dim(text: dict[str, Any]) -> int:
    """The full-attention layers' head size: ``global_head_dim``, else what
    ``per_layer_config`` gives a full layer (transformers folds it there), else ``head_dim``."""
    types = text.get("layer_types") or []
    for idx, layer in (text.get("per_layer_config") or {}).items():
        i = int(idx)
        if i < len(types) and types[i] == "full_attention" and "head_dim" in layer:
            return int(layer["head_dim"])
    return int(text.get("head_dim") or 0)


def text_tensor_name(config: dict[str, Any], key: str) -> str | None:
    """The ``Gemma4ForCausalLM`` name of a checkpoint tensor (None: not the text model's)."""
    if config.get("model_type") not in NESTED_TYPES:
        return key
    if key.startswith(_NESTED):
        return "model." + key[len(_NESTED):]
    return key if key == "lm_head.weight" else None


def model_facts(source: HFFolder) -> ModelFacts:
    """The text model's facts (end ids: the folder's; llama.cpp confirms them later)."""
    c = text_config(source.config)

    def need(key: str) -> Any:
        if c.get(key) is None:
            raise BundleError(f"{source.path}/config.json lacks {key} (text model)")
        return c[key]

    if c.get("enable_moe_block") or c.get("num_experts"):
        raise BundleError(f"{source.path}: a Gemma 4 mixture-of-experts model (26B A4B) is "
                          "not converted yet: the tiny family and the dense sizes are")
    rope = c.get("rope_parameters") or {}
    full = rope.get("full_attention") or {}
    local = rope.get("sliding_attention") or {}
    heads = int(need("num_attention_heads"))
    names = {n for n in (text_tensor_name(source.config, k) for k in source.tensor_names()) if n}
    types = list(need("layer_types"))
    return ModelFacts(
        architecture="gemma4", name=source.model_name(), vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")), intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")), num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=int(need("head_dim")),
        rms_norm_eps=f32_value(float(need("rms_norm_eps"))),
        rope_theta=f32_value(float(full.get("rope_theta") or 1e6)),
        max_position_embeddings=int(need("max_position_embeddings")),
        tie_word_embeddings="lm_head.weight" not in names, tokenizer=tokenizer_facts(source),
        rope_local_theta=f32_value(float(local.get("rope_theta") or 1e4)),
        sliding_window=int(need("sliding_window")),
        extra={"global_head_dim": int(c["global_head_dim"]), "layer_types": types,
               "num_kv_shared_layers": int(c.get("num_kv_shared_layers") or 0),
               "hidden_size_per_layer_input": int(c.get("hidden_size_per_layer_input") or 0),
               "final_logit_softcapping": c.get("final_logit_softcapping")})


def tokenizer_facts(source: HFFolder) -> TokenizerFacts:
    """The vocabulary of the folder's ``tokenizer.json`` (Gemma 4's BPE with byte fallback)
    as the converter's report and the LiteRT metadata need it; the GGUF's own vocabulary is
    llama.cpp's (its ``gemma4`` tokenizer model)."""
    path = source.path / "tokenizer.json"
    try:
        tok = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: a Gemma 4 folder needs its tokenizer.json ({exc})") from None
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        raise BundleError(f"{path} is not a BPE tokenizer with byte fallback (Gemma 4's)")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {int(t["id"]): t for t in tok.get("added_tokens", [])}
    n = int(text_config(source.config).get("vocab_size") or 0)
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [5] * n
    for text, i in vocab.items():
        if 0 <= i < n:
            tokens[i] = text
            types[i] = _BYTE if text.startswith("<0x") and len(text) == 6 else _NORMAL
    for i, t in added.items():
        if 0 <= i < n:
            tokens[i] = str(t["content"])
            types[i] = _CONTROL if t.get("special") else 4
    by_text = {t: i for i, t in enumerate(tokens)}
    cfg = _json(source.path / "tokenizer_config.json")
    text_cfg = text_config(source.config)

    def token(key: str) -> int | None:
        value = text_cfg.get(f"{key}_token_id")
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        name = cfg.get(f"{key}_token")
        name = name.get("content") if isinstance(name, dict) else name
        return by_text.get(name) if isinstance(name, str) else None

    eos = token("eos")
    gen = _json(source.path / "generation_config.json")
    eog = [eos, *_ints(text_cfg.get("eos_token_id")), *_ints(gen.get("eos_token_id"))]
    template_file = source.path / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else \
        cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
    return TokenizerFacts(
        model="gemma4", pre=None, tokens=tokens, token_types=types, scores=None, merges=None,
        bos_id=token("bos"), eos_id=eos, unk_id=token("unk"), pad_id=token("pad"),
        add_bos=cfg.get("add_bos_token", True) is not False, add_space_prefix=False,
        eog_ids=tuple(dict.fromkeys(i for i in eog if i is not None and 0 <= i < n)),
        chat_template=template)


def _ints(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_text_folder(source: HFFolder, out: Path,
                      config: dict[str, Any] | None = None) -> None:
    """``out``: the text model as a float32 ``Gemma4ForCausalLM`` folder (see the module
    docstring), or with ``config`` as its ``config.json`` (another family's text class); the
    tensors keep their values exactly (float16/bfloat16 widen exactly)."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, array in source.tensors():
        name = text_tensor_name(source.config, key)
        if name is not None:
            state[name] = array
    if "model.embed_tokens.weight" not in state:
        raise BundleError(f"{source.path}: no text model weights (model.embed_tokens / "
                          "model.language_model.embed_tokens)")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config or text_config(source.config),
                                                indent=2, sort_keys=True) + "\n")
    for name in _TOKENIZER_FILES:
        if (source.path / name).is_file():
            shutil.copy2(source.path / name, out / name)


def check_assistant(folder: Path, facts: ModelFacts, assistant_type: str = ASSISTANT_TYPE,
                    architecture: str = "gemma4") -> dict[str, Any]:
    """The assistant folder's ``config.json`` after checking it drafts for ``facts``' model:
    an ``assistant_type`` whose ``backbone_hidden_size`` is the target's hidden size and
    whose vocabulary is the target's, for a target of ``architecture``; :class:`BundleError`
    otherwise."""
    cfg = _json(folder / "config.json")
    if cfg.get("model_type") != assistant_type:
        raise BundleError(f"{folder}: --draft takes a Gemma 4 assistant folder (model_type "
                          f"{assistant_type!r}), this is {cfg.get('model_type')!r}; standalone "
                          "draft models go in with `bundle create --draft`")
    if facts.architecture != architecture:
        raise BundleError(f"{folder} is a {assistant_type} but the target is "
                          f"{facts.architecture}: it drafts for a {architecture} target only")
    backbone = cfg.get("backbone_hidden_size")
    vocab = (cfg.get("text_config") or {}).get("vocab_size", cfg.get("vocab_size"))
    if backbone != facts.hidden_size or vocab != facts.vocab_size:
        raise BundleError(f"{folder}: this assistant drafts for a model of hidden size "
                          f"{backbone} and vocabulary {vocab}; the target has "
                          f"{facts.hidden_size} and {facts.vocab_size}")
    if not list(folder.glob("*.safetensors")):
        raise BundleError(f"{folder} has no safetensors weights")
    return cfg


def write_mlx_assistant(folder: Path, target_dir: Path, out: Path) -> None:
    """``out``: the assistant at ``folder`` as mlx-vlm 0.7.10's ``load_drafter`` takes it (an
    MLX folder for ``text/draft/mtp/``): its ``config.json`` and safetensors weights as they are
    (mlx-vlm reads the Hugging Face layout, names and dtype of a ``gemma4_assistant``), and the
    tokenizer files of the target's folder ``target_dir`` (the same vocabulary, which
    :func:`check_assistant` checked; the MLX backend wants ``tokenizer.json`` in every MLX
    folder, and assistant checkpoints need not ship one)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copy2(folder / "config.json", out / "config.json")
    for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.index.json")):
        shutil.copy2(weights, out / weights.name)
    for name in _TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, out / name)


def mlx_expected(hf_dir: Path) -> dict[str, Any]:
    """The numbers mlx-lm's ``gemma4_text`` must read back from the MLX config: every field
    of the text config that its ``ModelArgs`` has (compared by :func:`..mlx_out.check_config`)."""
    import dataclasses

    from ..mlx_out import model_args_class

    cfg = json.loads((hf_dir / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(model_args_class(cfg))}
    return {k: v for k, v in cfg.items() if k in fields}


def litert_source(hf_dir: Path, out: Path) -> Path:
    """``out``: ``hf_dir`` as litert-torch 0.10's Gemma 4 exporter takes it — a config with
    ``experts_implementation: eager`` (transformers settles a model without experts on
    ``grouped_mm``, which the exporter's patched text model refuses); the other files linked."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in hf_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            try:
                os.link(f, out / f.name)
            except OSError:
                shutil.copy2(f, out / f.name)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["experts_implementation"] = "eager"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


#: the text_config fields mlx-vlm 0.7.10 reads with a wrong default when absent
#: (global_head_dim: 512) written into a multimodal MLX folder
MLX_VLM_TEXT_FIELDS = ("global_head_dim", "use_double_wide_mlp")


def media_towers(config: dict[str, Any]) -> tuple[str, ...]:
    """The media towers (``vision_config``, ``audio_config``) of a Gemma4ForConditionalGeneration
    ``config.json``; () for a text-only one."""
    return tuple(k for k in ("vision_config", "audio_config")
                 if isinstance(config.get(k), dict))


class Gemma4(ModelFamily):
    """``gemma4``: the text model of a Gemma 4 target, GGUF by llama.cpp's converter (see the
    module docstring); a ``gemma4_assistant`` folder drafts for it (``--draft``). A
    ``Gemma4ForConditionalGeneration`` with vision / audio towers also gets llama.cpp's
    projector (``--mmproj``: gemma4v + gemma4a) and mlx-vlm's MLX folder."""

    architecture = "gemma4"
    model_types = tuple(TARGET_TYPES)
    refused_model_types: ClassVar[Mapping[str, str]] = {
        ASSISTANT_TYPE: "(a Gemma 4 MTP assistant: pass it with --draft next to its target's "
                        "folder)"}
    draft_model_types = (ASSISTANT_TYPE,)
    llama_cpp_gguf = True
    code_modules: ClassVar[tuple[str, ...]] = ("families/gemma4",)
    coreml_code_modules: ClassVar[tuple[str, ...]] = ("coreml_out", "coreml_gemma4")
    litert_flags = LITERT_EXPORT_FLAGS
    litert_model_type = "gemma4"

    def model_facts(self, source: HFFolder) -> ModelFacts:
        return model_facts(source)

    def write_float32_folder(self, source: HFFolder, out: Path) -> None:
        write_text_folder(source, out)

    def media_kinds(self, config: dict[str, Any]) -> tuple[str, ...]:
        kind = {"vision_config": "image", "audio_config": "audio"}
        return tuple(kind[t] for t in media_towers(config))

    def media_reference(self, source: Path, kind: str, data: Any, question: str,
                        n_tokens: int) -> dict[str, Any]:
        from .gemma4_media import gemma4_reference

        return gemma4_reference(source, kind, data, question, n_tokens)

    def projector_runs(self, config: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return (("mmproj-f32.gguf", ("--mmproj",)),) if media_towers(config) else ()

    def mlx_expected(self, facts: ModelFacts, hf_dir: Path) -> dict[str, Any]:
        return mlx_expected(hf_dir)

    def mlx_vlm_text_fields(self, config: dict[str, Any]) -> dict[str, Any] | None:
        if not media_towers(config):
            return None
        text = text_config(config)
        return {k: text[k] for k in MLX_VLM_TEXT_FIELDS if k in text}

    def litert_source(self, hf_dir: Path, out: Path) -> Path:
        return litert_source(hf_dir, out)

    def coreml_module(self, hf_model: Any, facts: ModelFacts, max_len: int,
                      cache_dtype: str) -> Any:
        from .. import coreml_gemma4

        return coreml_gemma4.plain_module(hf_model, max_len, cache_dtype)

    def check_draft(self, folder: Path, config: dict[str, Any],
                    facts: ModelFacts) -> dict[str, Any]:
        return check_assistant(folder, facts)

    def write_mlx_draft(self, folder: Path, target_dir: Path, out: Path) -> None:
        write_mlx_assistant(folder, target_dir, out)


FAMILY = Gemma4()

__all__ = ["ASSISTANT_TYPE", "FAMILY", "LITERT_EXPORT_FLAGS", "MLX_VLM_TEXT_FIELDS",
           "NESTED_TYPES", "TARGET_TYPES", "Gemma4", "check_assistant", "litert_source",
           "media_towers", "mlx_expected", "model_facts", "text_config", "text_tensor_name",
           "tokenizer_facts", "write_mlx_assistant", "write_text_folder"]
