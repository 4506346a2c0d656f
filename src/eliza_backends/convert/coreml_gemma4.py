"""Gemma 4's stateful plain-torch network for the Core ML stage (:mod:`.coreml_out`).

coremltools 9.0 cannot convert a trace of transformers 5.24's ``Gemma4ForCausalLM`` (its mask
code calls ``torch.diff``, which has no coremltools conversion, and its cache classes are
Python objects a trace cannot hold). As for llama and Gemma 3, the network is therefore
rewritten here in plain torch ops with the KV cache as two buffers, so the mask comes in as
the ``causalMask`` input and no ``aten::diff`` is ever traced; no op conversion is registered.

What the rewrite carries of Gemma 4 (read from the transformers model it wraps, so the numbers
are the checkpoint's own): sliding and global layers with their own head sizes and rope tables
(the global table is transformers' "proportional" partial rope, taken from its buffers),
q/k/v norms (v without scale), attention scaling 1, per-layer embeddings, the layer scalar,
shared-KV layers (a ``reuse`` layer reads the cache slot of the last ``store`` layer of its
type, so the cache holds only the layers that compute keys), and final-logit soft-capping.

Cache layout: ``keyCache`` / ``valueCache`` are ``[kv_layers, 1, kv_heads, max_len, head_dim]``
with ``kv_layers`` the layers that compute keys, ``kv_heads`` and ``head_dim`` the largest of
them; a layer with fewer heads or a smaller head size uses the leading part of its slot. The
Core ML session reads only the next-to-last axis (the context length), as for the others.
"""

from __future__ import annotations

from typing import Any

from ..errors import BundleError

#: the names the Core ML session reads for the KV state (see :mod:`.coreml_out`)
KEYS, VALUES = "keyCache", "valueCache"


def kv_slots(hf_model: Any) -> list[int]:
    """For every layer of ``hf_model``, the cache slot its attention reads: its own for a layer
    that computes keys, the last storing layer of its type's for a shared-KV (``reuse``) one."""
    slots: list[int] = []
    last: dict[str, int] = {}
    owners = 0
    for layer in hf_model.model.layers:
        a = layer.self_attn
        if a.is_kv_shared_layer:
            if a.layer_type not in last:
                raise BundleError(f"Gemma 4 layer {a.layer_idx} reuses the keys of a "
                                  f"{a.layer_type} layer, and none comes before it")
            slots.append(last[a.layer_type])
        else:
            slots.append(owners)
            last[a.layer_type] = owners
            owners += 1
    return slots


def state_shape(hf_model: Any, max_len: int) -> tuple[int, int, int, int, int]:
    """The ``keyCache`` / ``valueCache`` shape for ``hf_model`` with ``max_len`` positions."""
    attns = [layer.self_attn for layer in hf_model.model.layers
             if not layer.self_attn.is_kv_shared_layer]
    heads = max(a.k_proj.out_features // a.head_dim for a in attns)
    return (len(attns), 1, heads, max_len, max(a.head_dim for a in attns))


def _rope_tables(hf_model: Any, max_len: int) -> dict[str, tuple[Any, Any]]:
    """Per layer type, the cos and sin tables (float32 ``[max_len, head_dim]``) transformers'
    Gemma 4 rotary embedding gives positions ``0 .. max_len - 1`` (its own inverse
    frequencies and attention scaling: default rope for sliding, proportional for global)."""
    import torch

    rot = hf_model.model.rotary_emb
    tables = {}
    for kind in set(hf_model.config.layer_types):
        inv = getattr(rot, f"{kind}_inv_freq").to(torch.float32)
        scaling = float(getattr(rot, f"{kind}_attention_scaling"))
        freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        tables[kind] = (emb.cos() * scaling, emb.sin() * scaling)
    return tables


def _check_supported(hf_model: Any) -> None:
    """:class:`BundleError` for a Gemma 4 the rewrite does not carry (mixture of experts, a
    non-tanh-GELU MLP, bidirectional attention)."""
    c = hf_model.config
    if getattr(c, "enable_moe_block", False):
        raise BundleError("Core ML: a Gemma 4 mixture-of-experts model is not rewritten for "
                          "Core ML (the dense sizes and the tiny family are)")
    if c.hidden_activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise BundleError(f"Core ML: Gemma 4 with hidden_activation {c.hidden_activation!r} is "
                          "not rewritten (gelu_pytorch_tanh is)")
    if getattr(c, "use_bidirectional_attention", None):
        raise BundleError("Core ML: a Gemma 4 with bidirectional attention is not a causal "
                          "language model this stage converts")


def plain_module(hf_model: Any, max_len: int, cache_dtype: str = "float16") -> Any:
    """The stateful plain-torch rewrite of ``hf_model`` (transformers' float32
    ``Gemma4ForCausalLM``): ``forward(inputIds, causalMask) -> logits`` in the layout of
    :mod:`.coreml_out`, the KV of ``max_len`` positions in the buffers ``keyCache`` /
    ``valueCache`` (:func:`state_shape`) stored as ``cache_dtype``. Not thread-safe: a call
    writes the buffers."""
    import torch

    _check_supported(hf_model)
    store = getattr(torch, cache_dtype)
    c = hf_model.config
    slots = kv_slots(hf_model)
    ple = int(c.hidden_size_per_layer_input or 0)

    class Gemma4Stateful(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf_model
            shape = state_shape(hf_model, max_len)
            self.register_buffer(KEYS, torch.zeros(shape, dtype=store))
            self.register_buffer(VALUES, torch.zeros(shape, dtype=store))
            for kind, (cos, sin) in _rope_tables(hf_model, max_len).items():
                self.register_buffer(f"cos_{kind}", cos, persistent=False)
                self.register_buffer(f"sin_{kind}", sin, persistent=False)

        @staticmethod
        def rms(x: Any, w: Any | None) -> Any:
            y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps, -0.5)
            return y if w is None else y * w

        def per_layer_inputs(self, ids: Any, x: Any) -> Any:
            m, n = self.hf.model, ids.shape[1]
            tok = torch.nn.functional.embedding(ids, m.embed_tokens_per_layer.weight) \
                * (ple ** 0.5)
            proj = m.per_layer_model_projection(x) * (c.hidden_size ** -0.5)
            proj = self.rms(proj.reshape(1, n, c.num_hidden_layers, ple),
                            m.per_layer_projection_norm.weight)
            return (proj + tok.reshape(1, n, c.num_hidden_layers, ple)) * (2.0 ** -0.5)

        def forward(self, input_ids: Any, causal_mask: Any) -> Any:
            m, n = self.hf.model, input_ids.shape[1]
            end = causal_mask.shape[3]
            past = end - n
            x = torch.nn.functional.embedding(input_ids, m.embed_tokens.weight) \
                * (c.hidden_size ** 0.5)
            per_layer = self.per_layer_inputs(input_ids, x) if ple else None
            pos = torch.arange(n) + past
            mask = causal_mask.to(torch.float32)
            far = (torch.arange(end)[None, :] <= pos[:, None] - c.sliding_window)
            masks = {"full_attention": mask,
                     "sliding_attention": mask + far.to(torch.float32) * -1e30}
            for i, layer in enumerate(m.layers):
                kind = c.layer_types[i]
                cos = torch.nn.functional.embedding(pos, getattr(self, f"cos_{kind}"))
                sin = torch.nn.functional.embedding(pos, getattr(self, f"sin_{kind}"))
                h = self.rms(x, layer.input_layernorm.weight)
                o = _attention(self, layer.self_attn, h, (cos, sin), slots[i], (past, end),
                               masks[kind], store)
                x = _layer_rest(self, layer, x, o,
                                per_layer[:, :, i, :] if per_layer is not None else None)
            logits = self.hf.lm_head(self.rms(x, m.norm.weight))
            cap = c.final_logit_softcapping
            return torch.tanh(logits / cap) * cap if cap else logits

    return Gemma4Stateful().eval()


def _rotate(t: Any, cos: Any, sin: Any) -> Any:
    """``t`` (``[1, n, heads, head_dim]``) rotated by the per-position ``cos``/``sin``
    (``[n, head_dim]``), transformers' rotate-half convention."""
    import torch

    half = int(t.shape[-1]) // 2  # a python int at trace time (see _attention)
    rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
    return t * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def _attention(module: Any, a: Any, h: Any, rope: tuple[Any, Any], slot: int,
               span: tuple[int, int], mask: Any, store: Any) -> Any:
    """One layer's attention output (``[1, n, hidden]``, before the post-attention norm) from
    the normed hidden states ``h``; a layer that computes keys writes them (normed, rotated)
    and its values (normed) into cache ``slot`` at positions ``past .. end`` first."""
    import torch

    n, hd = h.shape[1], a.head_dim
    (past, end), heads = span, a.q_proj.out_features // hd
    q = _rotate(module.rms(a.q_proj(h).view(1, n, heads, hd), a.q_norm.weight), *rope)
    keys, values = getattr(module, KEYS), getattr(module, VALUES)
    # python ints (a traced tensor size would become an 'int' op coremltools cannot convert)
    kv_heads = _slot_heads(module, slot)
    if not a.is_kv_shared_layer:
        raw = a.k_proj(h).view(1, n, kv_heads, hd)
        v = a.v_proj(h).view(1, n, kv_heads, hd) if a.v_proj is not None else raw
        k = _rotate(module.rms(raw, a.k_norm.weight), *rope).transpose(1, 2)
        v = module.rms(v, None).transpose(1, 2)
        keys[slot, :, :kv_heads, past:end, :hd] = k.to(store)
        values[slot, :, :kv_heads, past:end, :hd] = v.to(store)
    rep = heads // kv_heads
    k_all = keys[slot, :, :kv_heads, :end, :hd].to(torch.float32).repeat_interleave(rep, dim=1)
    v_all = values[slot, :, :kv_heads, :end, :hd].to(torch.float32).repeat_interleave(rep, dim=1)
    scores = q.transpose(1, 2) @ k_all.transpose(-1, -2) + mask  # Gemma 4's scaling is 1
    o = torch.softmax(scores, dim=-1) @ v_all
    return a.o_proj(o.transpose(1, 2).reshape(1, n, heads * hd))


def _slot_heads(module: Any, slot: int) -> int:
    """The KV heads the layer owning cache ``slot`` computes."""
    owner = [layer.self_attn for layer in module.hf.model.layers
             if not layer.self_attn.is_kv_shared_layer][slot]
    return int(owner.k_proj.out_features // owner.head_dim)


def _layer_rest(module: Any, layer: Any, x: Any, o: Any, per_layer: Any | None) -> Any:
    """The residual stream after ``layer``'s attention output ``o``: sandwich-normed
    attention and tanh-GELU MLP, the per-layer-embedding branch, the layer scalar."""
    import torch

    gelu = torch.nn.functional.gelu
    mlp = layer.mlp
    x = x + module.rms(o, layer.post_attention_layernorm.weight)
    h = module.rms(x, layer.pre_feedforward_layernorm.weight)
    f = mlp.down_proj(gelu(mlp.gate_proj(h), approximate="tanh") * mlp.up_proj(h))
    x = x + module.rms(f, layer.post_feedforward_layernorm.weight)
    if per_layer is not None:
        g = gelu(layer.per_layer_input_gate(x), approximate="tanh") * per_layer
        x = x + module.rms(layer.per_layer_projection(g), layer.post_per_layer_input_norm.weight)
    return x * layer.layer_scalar


__all__ = ["KEYS", "VALUES", "kv_slots", "plain_module", "state_shape"]
