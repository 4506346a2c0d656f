"""Core ML artifact: a stateful ML Program converted by coremltools on Linux, where it cannot
run (prediction is macOS-only; the MLX/Core ML backend gates it to macOS 15+).

The layout is the one :mod:`eliza_mlx.coreml_session` serves as "stateful" (Apple's stateful
LLM layout): inputs ``inputIds`` (int32 ``[1, n]``) and ``causalMask`` (float16
``[1, 1, n, past + n]``, 0 where a query may attend, -inf elsewhere), the KV cache as two
Core ML states ``keyCache`` / ``valueCache`` (float ``[layers, 1, kv_heads, cache_length,
head_dim]``), output ``logits`` (float32 ``[1, n, vocab]``). The model writes the new keys and
values at positions ``past .. past + n`` (``past`` is the mask's width minus ``n``), so a
session truncates its sequence by narrowing the mask. Gemma's sliding-window layers mask keys
more than ``sliding_window`` positions back themselves.

coremltools cannot trace transformers' own modules (mask code with ``aten::diff``, cache
classes), so the network is rewritten in plain torch ops: here (:func:`plain_module`) for llama
and Gemma 3, in :mod:`.coreml_gemma4` for Gemma 4 (whose cache holds only the layers that
compute keys, padded to the largest head size: see there); each family names its rewrite
(:mod:`.families`) and :func:`convert_coreml` is given it. What Linux can check,
:func:`convert_coreml` checks before and after converting: the traced module, run step by
step through its own KV state, gives transformers' float32 logits (prefill and decode, past
the sliding window for Gemma); the saved package's spec loads and has exactly the inputs,
states and output the session expects.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import BundleError
from .facts import ModelFacts

#: names the Core ML session's stateful layout reads (eliza_mlx.coreml_session.Layout)
IDS, MASK, KEYS, VALUES, LOGITS = "inputIds", "causalMask", "keyCache", "valueCache", "logits"
#: largest |logit| difference from transformers the rewrite may have (float32 reassociation)
TOLERANCE = 2e-3


def plain_module(hf_model: Any, facts: ModelFacts, max_len: int,
                 cache_dtype: str = "float16", *, gemma: bool = False) -> Any:
    """The stateful plain-torch rewrite of ``hf_model`` (a transformers float32 model of
    ``facts``): ``forward(inputIds, causalMask) -> logits``, KV in the buffers
    ``keyCache`` / ``valueCache`` of ``max_len`` positions, stored as ``cache_dtype``
    (float16: what Core ML states hold; float32: to check the rewrite exactly). ``gemma``:
    Gemma 3's block (embeddings scaled, ``1 + w`` norms, q/k norms, sandwich norms,
    tanh-GELU), else llama's."""
    import torch

    store = getattr(torch, cache_dtype)
    c = facts
    rep = c.num_heads // c.num_kv_heads
    half = c.head_dim // 2
    kinds = c.layer_types() or ["full_attention"] * c.num_layers
    window = c.sliding_window or max_len

    class Stateful(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf_model
            shape = (c.num_layers, 1, c.num_kv_heads, max_len, c.head_dim)
            self.register_buffer(KEYS, torch.zeros(shape, dtype=store))
            self.register_buffer(VALUES, torch.zeros(shape, dtype=store))
            cos, sin = _rope_table(c, c.rope_theta, max_len)
            self.register_buffer("cos_g", cos, persistent=False)
            self.register_buffer("sin_g", sin, persistent=False)
            cos, sin = _rope_table(c, c.rope_local_theta or c.rope_theta, max_len)
            self.register_buffer("cos_l", cos, persistent=False)
            self.register_buffer("sin_l", sin, persistent=False)

        @staticmethod
        def rms(x: Any, w: Any) -> Any:
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)
            return y * (1.0 + w) if gemma else w * y

        @staticmethod
        def rotate(t: Any) -> Any:
            return torch.cat([-t[..., half:], t[..., :half]], dim=-1)

        def forward(self, input_ids: Any, causal_mask: Any) -> Any:
            m = self.hf.model
            n = input_ids.shape[1]
            end = causal_mask.shape[3]
            past = end - n
            # the plain lookup (transformers' Gemma embedding scales inside its own module)
            x = torch.nn.functional.embedding(input_ids, m.embed_tokens.weight)
            if gemma:
                x = x * (c.hidden_size ** 0.5)
            pos = torch.arange(n) + past
            mask = causal_mask.to(torch.float32)
            keys = torch.arange(end)
            far = (keys[None, :] <= pos[:, None] - window).to(torch.float32)
            local_mask = mask + far * -1e30
            scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
            for i, layer in enumerate(m.layers):
                local = kinds[i] == "sliding_attention"
                cos_t, sin_t = (self.cos_l, self.sin_l) if local else (self.cos_g, self.sin_g)
                cos = torch.nn.functional.embedding(pos, cos_t)[None, None]
                sin = torch.nn.functional.embedding(pos, sin_t)[None, None]
                a = layer.self_attn
                h = self.rms(x, layer.input_layernorm.weight)
                q, k, v = _qkv(self, a, h, cos, sin, c, gemma)
                getattr(self, KEYS)[i, :, :, past:end, :] = k.to(store)
                getattr(self, VALUES)[i, :, :, past:end, :] = v.to(store)
                k_all = getattr(self, KEYS)[i, :, :, :end, :].to(torch.float32) \
                    .repeat_interleave(rep, dim=1)
                v_all = getattr(self, VALUES)[i, :, :, :end, :].to(torch.float32) \
                    .repeat_interleave(rep, dim=1)
                scores = (q @ k_all.transpose(-1, -2)) * scale + (local_mask if local else mask)
                o = torch.softmax(scores, dim=-1) @ v_all
                o = a.o_proj(o.transpose(1, 2).reshape(1, n, c.num_heads * c.head_dim))
                x = _mlp_residual(self, layer, x, o, gemma)
            return self.hf.lm_head(self.rms(x, m.norm.weight))

    return Stateful().eval()


def _rope_table(facts: ModelFacts, theta: float, max_len: int) -> tuple[Any, Any]:
    """The rotary cos and sin tables (float32 ``[max_len, head_dim]``) for base ``theta``."""
    import torch

    c = facts
    inv = 1.0 / (theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _qkv(module: Any, a: Any, h: Any, cos: Any, sin: Any, facts: ModelFacts,
         gemma: bool) -> tuple[Any, Any, Any]:
    """One layer's queries and keys (normed for Gemma, rotated) and values
    (``[1, heads, n, head_dim]``) from the normed hidden states ``h`` (``[1, n, hidden]``);
    ``a`` is the layer's attention, ``module`` the :func:`plain_module` (its ``rms``/``rotate``)."""
    c, n = facts, h.shape[1]
    q = a.q_proj(h).view(1, n, c.num_heads, c.head_dim).transpose(1, 2)
    k = a.k_proj(h).view(1, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
    v = a.v_proj(h).view(1, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
    if gemma:
        q = module.rms(q, a.q_norm.weight)
        k = module.rms(k, a.k_norm.weight)
    q = q * cos + module.rotate(q) * sin
    k = k * cos + module.rotate(k) * sin
    return q, k, v


def _mlp_residual(module: Any, layer: Any, x: Any, o: Any, gemma: bool) -> Any:
    """The residual stream ``x`` after ``layer``'s attention output ``o`` and its MLP
    (Gemma: sandwich norms and tanh-GELU; Llama: SiLU)."""
    import torch

    mlp = layer.mlp
    if gemma:
        x = x + module.rms(o, layer.post_attention_layernorm.weight)
        h = module.rms(x, layer.pre_feedforward_layernorm.weight)
        f = mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(h), approximate="tanh")
                          * mlp.up_proj(h))
        return x + module.rms(f, layer.post_feedforward_layernorm.weight)
    x = x + o
    h = module.rms(x, layer.post_attention_layernorm.weight)
    return x + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h))


def causal_mask(past: int, n: int) -> Any:
    """The float16 mask the Core ML session builds for ``n`` new tokens after ``past``."""
    import numpy as np

    mask = np.full((1, 1, n, past + n), -np.inf, dtype=np.float16)
    for i in range(n):
        mask[0, 0, i, :past + i + 1] = 0
    return mask


def check_against_transformers(module: Any, hf_model: Any, facts: ModelFacts,
                               chunks: list[int], tolerance: float | None) -> dict[str, Any]:
    """Feed a token sequence through ``module`` in ``chunks`` (prefill sizes, then single
    tokens) through its own KV buffers and compare every position's logits with transformers'
    on the whole sequence: the largest difference and the positions whose top-1 agrees.
    :class:`BundleError` beyond ``tolerance`` (None: report only). Resets the buffers before
    and after."""
    import torch

    total = sum(chunks)
    ids = [(5 + 7919 * i) % (facts.vocab_size - 8) + 4 for i in range(total)]
    with torch.no_grad():
        want = hf_model(torch.tensor([ids])).logits[0]
        getattr(module, KEYS).zero_()
        getattr(module, VALUES).zero_()
        got, past = [], 0
        for n in chunks:
            mask = torch.from_numpy(causal_mask(past, n))
            got.append(module(torch.tensor([ids[past:past + n]], dtype=torch.int32), mask)[0])
            past += n
        getattr(module, KEYS).zero_()
        getattr(module, VALUES).zero_()
    err = float((torch.cat(got) - want).abs().max())
    agree = int((torch.cat(got).argmax(-1) == want.argmax(-1)).sum())
    if tolerance is not None and err > tolerance:
        raise BundleError(f"the Core ML rewrite of {facts.architecture} differs from "
                          f"transformers by {err:.3g} in the logits; not converting")
    return {"positions": total, "chunks": chunks, "max_abs_logit_diff": err,
            "top1_agree": agree}


def check_spec(path: Path, facts: ModelFacts, max_len: int,
               shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Load the saved package's spec and check its inputs, states and output are the
    session's stateful layout (names, types, shapes; the states ``shape``, by default
    ``[layers, 1, kv_heads, max_len, head_dim]``); returns what it found."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(path))
    desc = spec.description
    found: dict[str, Any] = {"inputs": [i.name for i in desc.input],
                             "states": [s.name for s in desc.state],
                             "outputs": [o.name for o in desc.output]}
    want = {"inputs": [IDS, MASK], "states": [KEYS, VALUES], "outputs": [LOGITS]}
    if {k: sorted(v) for k, v in found.items()} != {k: sorted(v) for k, v in want.items()}:
        raise BundleError(f"{path}: the converted model has {found}, the Core ML session "
                          f"expects {want}")
    arrays = ct.proto.FeatureTypes_pb2.ArrayFeatureType
    want_shape = list(shape or (facts.num_layers, 1, facts.num_kv_heads, max_len,
                                facts.head_dim))
    for s in desc.state:
        got = list(s.type.stateType.arrayType.shape)
        if got != want_shape:
            raise BundleError(f"{path}: state {s.name} has shape {got}, expected {want_shape}")
    types = {i.name: i.type.multiArrayType for i in desc.input}
    if types[IDS].dataType != arrays.INT32 or types[MASK].dataType != arrays.FLOAT16:
        raise BundleError(f"{path}: {IDS} must be int32 and {MASK} float16")
    bounds = {name: [(r.lowerBound, r.upperBound) for r in t.shapeRange.sizeRanges]
              for name, t in types.items()}
    found["state_shape"] = want_shape
    found["input_ranges"] = bounds
    found["spec_version"] = int(spec.specificationVersion)
    return found


def convert_coreml(hf_dir: Path, facts: ModelFacts, out: Path, precision: str,
                   max_len: int, rewrite: Callable[[Any, ModelFacts, int, str], Any]
                   ) -> dict[str, Any]:
    """Write the ``.mlpackage`` at ``out`` (``precision`` fp32 or fp16) and return the checks'
    findings (:func:`check_against_transformers`, :func:`check_spec`). ``rewrite(hf_model,
    facts, max_len, cache_dtype)``: the family's stateful plain-torch module (its
    ``coreml_module``)."""
    import coremltools as ct
    import numpy as np
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    probe_n = 8
    example = (torch.zeros((1, probe_n), dtype=torch.int32),
               torch.from_numpy(causal_mask(0, probe_n)))
    # the traced program is what gets converted: it is checked, not only the eager module,
    # through its own state, prefill then decode (a sliding-window model past its window):
    # exactly with a float32 cache (the rewrite and the trace), then as converted
    span = (facts.sliding_window or 0) + 40
    chunks = [min(max(span - 3, 16), max_len - 8), 1, 1, 1] if facts.sliding_window else \
        [24, 1, 1, 1]
    with torch.no_grad():
        exact = torch.jit.trace(rewrite(model, facts, max_len, "float32"), example,
                                check_trace=False)
        traced = torch.jit.trace(rewrite(model, facts, max_len, "float16"), example,
                                 check_trace=False)
    checked = {"float32_cache": check_against_transformers(exact, model, facts, chunks,
                                                           TOLERANCE),
               "float16_cache": check_against_transformers(traced, model, facts, chunks, None)}
    del exact
    length = ct.RangeDim(lower_bound=1, upper_bound=max_len, default=probe_n)
    end = ct.RangeDim(lower_bound=1, upper_bound=max_len, default=probe_n)
    state_shape = tuple(getattr(traced, KEYS).shape)
    mlmodel = ct.convert(
        traced,
        inputs=[ct.TensorType(name=IDS, shape=(1, length), dtype=np.int32),
                ct.TensorType(name=MASK, shape=(1, 1, length, end), dtype=np.float16)],
        outputs=[ct.TensorType(name=LOGITS, dtype=np.float32)],
        states=[ct.StateType(wrapped_type=ct.TensorType(shape=state_shape, dtype=np.float16),
                             name=name) for name in (KEYS, VALUES)],
        convert_to="mlprogram",
        compute_precision=ct.precision.FLOAT32 if precision == "fp32" else ct.precision.FLOAT16,
        minimum_deployment_target=ct.target.macOS15, skip_model_load=True)
    mlmodel.save(str(out))
    return {"traced_vs_transformers": checked,
            "spec": check_spec(out, facts, max_len, state_shape)}


__all__ = ["IDS", "KEYS", "LOGITS", "MASK", "TOLERANCE", "VALUES", "causal_mask",
           "check_against_transformers", "check_spec", "convert_coreml", "plain_module"]
