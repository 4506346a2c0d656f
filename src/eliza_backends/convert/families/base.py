"""The family adapter's base class: :class:`ModelFamily`, whose defaults are the plain
decoder the converter writes itself (llama's shape). The contract is in :mod:`.families`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...errors import BundleError
from ..facts import ModelFacts, f32_value
from ..hf_checkpoint import config_dict, gguf_name, hf_name
from ..hf_folder import HFFolder

#: ``need(key)``: a metadata / config value that must be there (:class:`BundleError` if not)
Need = Callable[[str], Any]
#: what mlx-lm's ModelArgs of a converter-written folder must read back (same names)
_MLX_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
             "head_dim", "rms_norm_eps", "vocab_size", "num_key_value_heads", "rope_theta",
             "rope_local_base_freq", "query_pre_attn_scalar", "sliding_window",
             "sliding_window_pattern", "max_position_embeddings", "rope_scaling",
             "tie_word_embeddings", "attention_bias", "mlp_bias", "layer_types", "model_type")


def config_needer(source: HFFolder) -> Need:
    """``need`` over ``source.config``."""
    def need(key: str) -> Any:
        if source.config.get(key) is None:
            raise BundleError(f"{source.path}/config.json lacks {key}")
        return source.config[key]

    return need


class ModelFamily:
    """One model family (see :mod:`.families` for the contract). Subclasses set the class
    attributes and override what differs; one instance per family, stateless, shared by
    threads."""

    #: GGUF ``general.architecture``, and :attr:`ModelFacts.architecture`
    architecture: ClassVar[str] = ""
    #: ``config.json`` ``model_type`` values this family converts
    model_types: ClassVar[tuple[str, ...]] = ()
    #: ``model_type`` values this family recognises but does not convert -> a hint (the
    #: refusal's last words, e.g. "(a Gemma 4 MTP assistant: pass it with --draft ...)")
    refused_model_types: ClassVar[Mapping[str, str]] = {}
    #: ``model_type`` values of the draft folders (``--draft``) this family's targets take
    draft_model_types: ClassVar[tuple[str, ...]] = ()
    #: whether a GGUF of :attr:`architecture` converts (:class:`~..gguf_source.GGUFSource`)
    reads_gguf: ClassVar[bool] = False
    #: whether llama.cpp's ``convert_hf_to_gguf.py`` writes the float32 GGUF (then
    #: :meth:`write_float32_folder` gives the float32 folder); else the converter's own writer
    #: does, through :meth:`to_gguf_tensor` and :meth:`hf_config`
    llama_cpp_gguf: ClassVar[bool] = False
    #: convert/ modules (relative paths without ``.py``) whose code keys this family's
    #: ``hf`` stage, beyond the shared ones; and its ``coreml`` stages
    code_modules: ClassVar[tuple[str, ...]] = ()
    coreml_code_modules: ClassVar[tuple[str, ...]] = ("coreml_out",)
    #: GGUF layer tensor part -> Hugging Face layer module (``blk.N.<part>.weight`` <->
    #: ``model.layers.N.<module>.weight``)
    layer_names: ClassVar[Mapping[str, str]] = {}
    #: whether the GGUF header records ``rope.dimension_count``
    gguf_rope_dimension_count: ClassVar[bool] = True
    #: whether a SentencePiece vocabulary keeps its ``add_dummy_prefix``
    sentencepiece_space_prefix: ClassVar[bool] = True
    #: rope base when ``config.json`` gives none
    default_rope_theta: ClassVar[float] = 1e4
    #: extra ``litert_torch.generative.export_hf`` flags, after the converter's own
    litert_flags: ClassVar[tuple[str, ...]] = ()
    #: the ``LlmModelType`` field the ``.litertlm`` metadata sets
    litert_model_type: ClassVar[str] = "generic_model"

    # ------------------------------------------------------------------ facts

    def model_facts(self, source: HFFolder) -> ModelFacts:
        """The :class:`ModelFacts` of ``source`` (end ids: the folder's own; llama.cpp's view
        of them is read later from the GGUF written from it). :class:`BundleError` for a
        config this family cannot convert."""
        c = source.config
        need = config_needer(source)
        rope = c.get("rope_parameters") or {}
        full = self.full_attention_rope(rope)
        for params in (full, rope.get("sliding_attention") or {}):
            if params.get("rope_type", "default") != "default":
                raise BundleError(f"{source.path}: rope type {params['rope_type']!r} (rope "
                                  "scaling) is not converted yet")
        if c.get("rope_scaling"):
            raise BundleError(f"{source.path}: rope_scaling {c['rope_scaling']!r} is not "
                              "converted yet")
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        head_dim = int(c.get("head_dim") or hidden // heads)
        theta = c.get("rope_theta") or full.get("rope_theta") or self.default_rope_theta
        # a checkpoint that carries its own head uses it, whatever tie_word_embeddings says
        tied = "lm_head.weight" not in source.tensor_names()
        common: dict[str, Any] = dict(
            architecture=self.architecture, name=source.model_name(),
            vocab_size=int(need("vocab_size")), hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")), num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=head_dim,
            rms_norm_eps=f32_value(float(need("rms_norm_eps"))), rope_theta=f32_value(float(theta)),
            max_position_embeddings=int(need("max_position_embeddings")),
            tie_word_embeddings=tied, tokenizer=source.tokenizer_facts(
                sentencepiece_space_prefix=self.sentencepiece_space_prefix))
        common.update(self.config_facts(source, need, rope, head_dim))
        facts = ModelFacts(**common)
        self.check_facts(source, facts)
        return facts

    def full_attention_rope(self, rope: dict[str, Any]) -> dict[str, Any]:
        """The full-attention layers' entry of ``config.json``'s ``rope_parameters``."""
        return rope

    def config_facts(self, source: HFFolder, need: Need, rope: dict[str, Any],
                     head_dim: int) -> dict[str, Any]:
        """The family's own :class:`ModelFacts` fields from ``config.json`` (none here)."""
        return {}

    def check_facts(self, source: HFFolder, facts: ModelFacts) -> None:
        """:class:`BundleError` when ``facts`` hold what the family does not map (nothing
        here)."""

    def gguf_facts(self, need: Need, head_dim: int) -> dict[str, Any]:
        """The family's own :class:`ModelFacts` fields from a GGUF's metadata (``need`` reads
        ``<architecture>.<key>``); none here."""
        return {}

    # ------------------------------------------------------------------ float32 stage

    def write_float32_folder(self, source: HFFolder, out: Path) -> None:
        """``out``: the float32 folder llama.cpp's converter and every other format read
        (:attr:`llama_cpp_gguf` families only)."""
        raise BundleError(f"{self.architecture}: the converter writes its GGUF itself; there "
                          "is no llama.cpp float32 folder to make")

    def llama_cpp_runs(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(file name in the ``hf`` stage, extra ``convert_hf_to_gguf.py`` arguments) for each
        GGUF llama.cpp's converter writes from the source folder; the first is the float32
        model (``model-f32.gguf``)."""
        return (("model-f32.gguf", ()),)

    def media_kinds(self, config: dict[str, Any]) -> tuple[str, ...]:
        """The media (``"image"``, ``"audio"``) a source folder with ``config`` takes, which
        ``--verify`` checks with an image / audio prompt; none here."""
        return ()

    def media_reference(self, source: Path, kind: str, data: Any, question: str,
                        n_tokens: int) -> dict[str, Any]:
        """transformers float32 on the source folder for ``--verify``'s one-item media prompt
        (``data``: RGB uint8 (H, W, 3) / float32 16 kHz PCM): {"ids": the prompt ids,
        "reference_ids": ``n_tokens`` greedy ids}; only families with :meth:`media_kinds`."""
        raise BundleError(f"{self.architecture}: no media reference (the family takes no "
                          "media)")

    def projector_runs(self, config: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(file name in the ``hf`` stage, extra ``convert_hf_to_gguf.py`` arguments) of each
        multimodal projector GGUF llama.cpp's converter writes from a source folder with
        ``config`` (placed under ``text/mmproj/``, manifest role ``mmproj``); none here."""
        return ()

    def to_hf_tensor(self, facts: ModelFacts, gguf_tensor: str, array: Any) -> tuple[str, Any]:
        """(Hugging Face key, HF-layout float32 array) of one dequantized GGUF tensor."""
        key = hf_name(self.layer_names, facts.architecture, gguf_tensor)
        return key, self.hf_layout(facts, key, array)

    def to_gguf_tensor(self, facts: ModelFacts, hf_key: str, array: Any) -> tuple[str, Any]:
        """(GGUF name, llama.cpp-layout float32 array) of one Hugging Face tensor: the inverse
        of :meth:`to_hf_tensor`."""
        return gguf_name(self.layer_names, facts.architecture, hf_key), \
            self.gguf_layout(facts, hf_key, array)

    def hf_layout(self, facts: ModelFacts, hf_key: str, array: Any) -> Any:
        """A GGUF-layout array in Hugging Face layout (unchanged here)."""
        return array

    def gguf_layout(self, facts: ModelFacts, hf_key: str, array: Any) -> Any:
        """A Hugging Face-layout array in GGUF layout: the inverse of :meth:`hf_layout`."""
        return array

    def hf_config(self, facts: ModelFacts) -> dict[str, Any]:
        """The full ``config.json`` of the converter-written float32 folder."""
        return config_dict(facts, self.hf_config_fields(facts))

    def hf_config_fields(self, facts: ModelFacts) -> dict[str, Any]:
        """The family's own ``config.json`` fields (class, ``model_type``, activation, rope
        layout), in the order they are written after the shared ones."""
        raise BundleError(f"{self.architecture}: no converter-written config.json")

    # ------------------------------------------------------------------ formats

    def mlx_expected(self, facts: ModelFacts, hf_dir: Path) -> dict[str, Any]:
        """ModelArgs field -> the value mlx-lm must read back from the MLX folder made from
        ``hf_dir`` (checked by :func:`..mlx_out.check_config`)."""
        cfg = self.hf_config(facts)
        return {k: cfg[k] for k in _MLX_KEYS if k in cfg}

    def mlx_vlm_text_fields(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """For a source folder with ``config`` whose MLX folder is mlx-vlm's (a multimodal
        model: made from the source folder itself, towers and processor included), the
        ``text_config`` fields written explicitly into it; None (here): mlx-lm's folder, made
        from the float32 text folder."""
        return None

    def litert_source(self, hf_dir: Path, out: Path) -> Path:
        """The folder litert-torch's ``export_hf`` converts: ``hf_dir`` itself here; a family
        that needs another writes it at ``out`` and returns ``out`` (removed after)."""
        return hf_dir

    def coreml_module(self, hf_model: Any, facts: ModelFacts, max_len: int,
                      cache_dtype: str) -> Any:
        """The stateful plain-torch module Core ML converts (:mod:`..coreml_out`'s layout)."""
        from ..coreml_out import plain_module

        return plain_module(hf_model, facts, max_len, cache_dtype)

    def check_draft(self, folder: Path, config: dict[str, Any],
                    facts: ModelFacts) -> dict[str, Any]:
        """``config`` (the draft folder's ``config.json``, one of
        :attr:`draft_model_types`) after checking it drafts for ``facts``' model."""
        raise BundleError(f"{folder}: {self.architecture} targets take no --draft folder")

    def write_mlx_draft(self, folder: Path, target_dir: Path, out: Path) -> None:
        """``out``: the draft folder at ``folder`` (checked by :meth:`check_draft`) as the MLX
        backend's ``drafter="mtp"`` loads it; ``target_dir`` is the target's float32 folder."""
        raise BundleError(f"{folder}: {self.architecture} targets take no --draft folder")


__all__ = ["ModelFamily", "Need", "config_needer"]
