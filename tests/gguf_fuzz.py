"""A crash-oracle fuzzer for GGUF files served by the llama.cpp backend.

Cases are *recipes*: a list of mutations applied to the tiny bundle's GGUF. Mutations act on
the parsed file (metadata values, types, counts, missing and duplicated keys, the vocabulary,
the tensor table) as well as on the serialized bytes, so they reach the values llama.cpp
asserts on and not only its layout checks. A worker process (llama.cpp in a child) opens each
case through ``open_stream``, tokenizes, prefills, decodes and detokenizes; the oracle is:

* the worker survives every case: no abort, no fault (a dead worker is a *crash*);
* every case finishes within the time limit (else a *hang*);
* every case either works or raises an :class:`~eliza_backends.ElizaError` (any other exception
  is *untyped*);
* after a contained native abort the process still loads and decodes the pristine model
  (else *poisoned*).

Run it by hand (``python tests/gguf_fuzz.py --cases 2000 --seed 7 --save tests/corpus/gguf_values``)
or through ``tests/test_gguf_fuzz.py``. Recipes are JSON, so what it finds is kept small and
readable in ``tests/corpus/gguf_values/`` and replayed by the suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crash_oracle import Report, Worker, run_cases

ROOT = Path(__file__).resolve().parent.parent
BASE_GGUF = ROOT / "examples" / "bundles" / "tiny" / "text" / "tiny-f16.gguf"

# ------------------------------------------------------------------------------ GGUF model

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
FLOAT_TYPES = (6, 12)
_LIMITS = {0: (0, 255), 1: (-128, 127), 2: (0, 65535), 3: (-32768, 32767), 4: (0, 2**32 - 1),
           5: (-2**31, 2**31 - 1), 10: (0, 2**64 - 1), 11: (-2**63, 2**63 - 1)}


@dataclass
class KV:
    """One metadata pair. Arrays hold ``(element type, items)``; ``count`` overrides the
    element count written (a lie, when it differs from ``len(items)``)."""

    key: bytes
    vtype: int
    value: Any
    count: int | None = None


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int
    n_dims: int | None = None  # overrides len(dims) when written


@dataclass
class GGUF:
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    alignment: int
    data: bytes
    n_kv: int | None = None
    n_tensors: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def find(self, key: str) -> KV | None:
        k = key.encode()
        return next((kv for kv in self.kvs if kv.key == k), None)

    @property
    def arch(self) -> str:
        kv = self.find("general.architecture")
        return kv.value.decode("utf-8", "replace") if kv and kv.vtype == STRING else "llama"


def parse(data: bytes) -> GGUF:
    """Parse a well-formed GGUF (the fuzzer's base file)."""
    pos = 0

    def rd(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> bytes:
        nonlocal pos
        n = rd("<Q")
        v = data[pos:pos + n]
        pos += n
        return v

    def value(t: int) -> Any:
        if t in SCALAR:
            return rd(SCALAR[t])
        if t == STRING:
            return string()
        et, n = rd("<I"), rd("<Q")
        return (et, [value(et) for _ in range(n)])

    assert data[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = rd("<I"), rd("<Q"), rd("<Q")
    kvs = []
    for _ in range(n_kv):
        key = string()
        t = rd("<I")
        kvs.append(KV(key, t, value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = string()
        nd = rd("<I")
        dims = [rd("<Q") for _ in range(nd)]
        tensors.append(TensorInfo(name, dims, rd("<I"), rd("<Q")))
    align = next((kv.value for kv in kvs if kv.key == b"general.alignment"), 32)
    start = -(-pos // align) * align
    return GGUF(version, kvs, tensors, align, data[start:])


def _pack_scalar(t: int, v: Any) -> bytes:
    fmt = SCALAR[t]
    if isinstance(v, (bytes, str)):  # a string where a number now goes: its length
        v = len(v)
    if t in FLOAT_TYPES:
        return struct.pack(fmt, float(v))
    if isinstance(v, float):
        v = int(v) if math.isfinite(v) else 0
    if t == 7:
        return struct.pack("<B", int(v) & 0xFF)
    lo, hi = _LIMITS[t]
    v = int(v)
    if not lo <= v <= hi:  # wrap, as a C writer would
        v = v % (hi - lo + 1) + lo
    return struct.pack(fmt, v)


def serialize(g: GGUF) -> bytes:
    out = bytearray(b"GGUF")
    out += struct.pack("<I", g.version)
    out += struct.pack("<Q", len(g.tensors) if g.n_tensors is None else g.n_tensors)
    out += struct.pack("<Q", len(g.kvs) if g.n_kv is None else g.n_kv)

    def string(b: bytes) -> None:
        out.extend(struct.pack("<Q", len(b)))
        out.extend(b)

    def value(t: int, v: Any, count: int | None = None) -> None:
        if t in SCALAR:
            out.extend(_pack_scalar(t, v))
        elif t == STRING:
            string(v if isinstance(v, bytes) else str(v).encode())
        elif t == ARRAY:
            et, items = v
            out.extend(struct.pack("<IQ", et, len(items) if count is None else count))
            for item in items:
                value(et, item)
        else:  # an unknown type id: write 4 bytes of payload
            out.extend(struct.pack("<I", int(v) if isinstance(v, int) else 0))

    for kv in g.kvs:
        string(kv.key)
        out.extend(struct.pack("<I", kv.vtype))
        value(kv.vtype, kv.value, kv.count)
    for t in g.tensors:
        string(t.name)
        out.extend(struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims))
        for d in t.dims:
            out.extend(struct.pack("<Q", d % 2**64))
        out.extend(struct.pack("<IQ", t.ttype % 2**32, t.offset % 2**64))
    align = g.alignment if isinstance(g.alignment, int) and 0 < g.alignment <= 1 << 24 else 32
    out.extend(b"\0" * (-len(out) % align))
    out.extend(g.data)
    return bytes(out)


# ------------------------------------------------------------------------------ mutations

def _json_float(v: Any) -> float:
    return float(v) if not isinstance(v, str) else {"nan": math.nan, "inf": math.inf,
                                                    "-inf": -math.inf}.get(v, 0.0)


def _decode_value(t: int, v: Any) -> Any:
    """JSON form of a value -> the in-memory form (strings as bytes, floats may be 'nan')."""
    if t == STRING:
        return v.encode("utf-8", "surrogatepass") if isinstance(v, str) else bytes(v)
    if t in FLOAT_TYPES:
        return _json_float(v)
    if t == ARRAY:
        et, items = v
        return (et, [_decode_value(et, i) for i in items])
    return v


def apply(g: GGUF, op: dict[str, Any]) -> bytes | None:
    """Apply one structured mutation to ``g`` in place (byte-level ops return None here and
    are applied to the serialized file by :func:`build`)."""
    kind = op["op"]
    kv = g.find(op["key"]) if "key" in op else None
    if kind == "set":
        new = KV(op["key"].encode(), op["type"], _decode_value(op["type"], op["value"]))
        if kv is None:
            g.kvs.append(new)
        else:
            g.kvs[g.kvs.index(kv)] = new
    elif kind == "delete" and kv is not None:
        g.kvs.remove(kv)
    elif kind == "duplicate" and kv is not None:
        g.kvs.insert(g.kvs.index(kv) + 1, KV(kv.key, kv.vtype, kv.value, kv.count))
    elif kind == "item" and kv is not None and kv.vtype == ARRAY:
        et, items = kv.value
        if items:
            i = op["index"] % len(items)
            if "copy_from" in op:
                items[i] = items[op["copy_from"] % len(items)]
            else:
                items[i] = _decode_value(et, op["value"])
    elif kind == "resize" and kv is not None and kv.vtype == ARRAY:
        et, items = kv.value
        n = op["n"]
        kv.value = (et, items[:n] if n <= len(items) else items + items[:n - len(items)])
    elif kind == "count" and kv is not None:
        kv.count = op["count"]
    elif kind == "elem_type" and kv is not None and kv.vtype == ARRAY:
        et, items = kv.value
        kv.value = (op["type"], [_coerce(op["type"], i) for i in items])
    elif kind == "tensor" and g.tensors:
        t = g.tensors[op["index"] % len(g.tensors)]
        f = op["field"]
        if f == "name":
            t.name = op["value"].encode() if isinstance(op["value"], str) else \
                g.tensors[op["value"] % len(g.tensors)].name
        elif f == "dims":
            t.dims = list(op["value"])
        elif f == "n_dims":
            t.n_dims = op["value"]
        else:
            setattr(t, "ttype" if f == "type" else "offset", op["value"])
    elif kind == "drop_tensor" and g.tensors:
        del g.tensors[op["index"] % len(g.tensors)]
    elif kind == "header":
        setattr(g, op["field"], op["value"])
    return None


def _coerce(t: int, v: Any) -> Any:
    if t == STRING:
        return v if isinstance(v, bytes) else str(v).encode()
    if t in FLOAT_TYPES:
        return float(v) if isinstance(v, (int, float)) else float(len(v))
    if t in SCALAR:
        return int(v) if isinstance(v, (int, float)) and math.isfinite(v) else len(v)
    return v


def build(recipe: list[dict[str, Any]], base: bytes | None = None) -> bytes:
    """The file a recipe describes."""
    data = base if base is not None else BASE_GGUF.read_bytes()
    g = parse(data)
    for op in recipe:
        if op["op"] not in ("bytes", "truncate"):
            apply(g, op)
    out = serialize(g)
    for op in recipe:
        if op["op"] == "bytes" and out:
            at = op["offset"] % len(out)
            patch = bytes.fromhex(op["data"])
            out = out[:at] + patch + out[at + len(patch):]
        elif op["op"] == "truncate":
            out = out[:op["size"] % (len(out) + 1)]
    return out


# ------------------------------------------------------------------------------ generation

_ARCHS = ["llama", "gemma3", "gemma", "qwen2", "qwen3", "phi3", "mistral3", "granite", "olmo",
          "mamba", "rwkv6", "bert", "t5", "gpt2", "falcon", "starcoder2", "deepseek2",
          "qwen3moe", "gemma4", "nope", "", "llama\x00x"]
_TOKENIZERS = ["llama", "gpt2", "bert", "t5", "rwkv", "plamo2", "gemma4", "no_vocab", "none",
               "test", "hybriddna", "whitespace", "unknown", ""]
_PRES = ["default", "gpt-2", "llama3", "qwen2", "deepseek-llm", "kimi-k2", "gemma4", "bogus",
         ""]
_INT_EDGES = [0, 1, 2, 3, 5, 7, 31, 33, 63, 64, 255, 256, 4095, 65535, 2**31 - 1, 2**31,
              2**32 - 1, 2**63, -1, -2**31, 10**6, 384, 383, 385, 128, 4, 2, 32]
_FLOAT_EDGES = ["nan", "inf", "-inf", 0.0, -0.0, -1e-30, -1e-5, 1e-45, 1e30, 3.4e38, -1.0,
                1e-5, 0.5, 1.0, 2.0, 10000.0, -10000.0]
_STR_EDGES = ["", "x", "llama", "\u0000", "\ud800", "a" * 300, "{{", "gpt2", "<0x41>", " "]


def _random_value(rng: random.Random, t: int) -> Any:
    if t in INT_TYPES:
        lo, hi = _LIMITS[t]
        v = rng.choice(_INT_EDGES) if rng.random() < 0.8 else rng.randint(lo, hi)
        return max(lo, min(hi, v)) if rng.random() < 0.7 else v
    if t in FLOAT_TYPES:
        return rng.choice(_FLOAT_EDGES)
    if t == 7:
        return rng.choice([0, 1, 2, 255])
    if t == STRING:
        return rng.choice(_STR_EDGES)
    return (rng.choice([4, 5, 6, 8]), [])


def _hparam_keys(g: GGUF) -> list[str]:
    a = g.arch
    return [f"{a}.{k}" for k in (
        "context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "rope.dimension_count", "rope.freq_base",
        "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "vocab_size",
        "expert_count", "expert_used_count", "expert_shared_count", "rope.scaling.type",
        "rope.scaling.factor", "attention.sliding_window", "rope.freq_scale",
        "attention.max_alibi_bias", "logit_scale", "attention.clamp_kqv",
        "expert_group_count", "expert_group_used_count", "leading_dense_block_count",
        "embedding_length_per_layer_input", "final_logit_softcapping",
        "attn_logit_softcapping", "nextn_predict_layers", "rope.dimension_sections")]


_TOKENIZER_KEYS = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
                   "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                   "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.fim_pad_token_id",
                   "tokenizer.ggml.mask_token_id"]


def random_recipe(rng: random.Random, g: GGUF) -> list[dict[str, Any]]:
    """One to three mutations, weighted toward the values llama.cpp asserts on."""
    ops: list[dict[str, Any]] = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        kind = rng.choices(["hparam", "retype", "delete", "duplicate", "vocab", "tokenizer",
                            "arch", "tensor", "header", "bytes", "truncate", "scalar"],
                           weights=[22, 8, 7, 3, 16, 8, 4, 10, 3, 12, 2, 5])[0]
        if kind == "hparam":
            key = rng.choice(_hparam_keys(g))
            t = rng.choice([4, 4, 4, 5, 6, 10, 11, 12, 8, 7])
            if "epsilon" in key or "freq" in key or "factor" in key or "softcap" in key:
                t = rng.choice([6, 6, 6, 12, 4])
            ops.append({"op": "set", "key": key, "type": t, "value": _random_value(rng, t)})
        elif kind == "scalar":
            kv = rng.choice([kv for kv in g.kvs if kv.vtype != ARRAY])
            ops.append({"op": "set", "key": kv.key.decode(), "type": kv.vtype,
                        "value": _to_json(_random_value(rng, kv.vtype))})
        elif kind == "retype":
            kv = rng.choice(g.kvs)
            t = rng.choice([*SCALAR, STRING, ARRAY, 13, 99])
            if t == ARRAY:
                et = rng.choice([4, 5, 6, 8, 9])
                v: Any = [et, [] if et == 9 else [_to_json(_random_value(rng, et))
                                                  for _ in range(rng.randint(0, 4))]]
            else:
                v = _to_json(_random_value(rng, t)) if t in SCALAR or t == STRING else 0
            ops.append({"op": "set", "key": kv.key.decode(), "type": t, "value": v})
        elif kind == "delete":
            ops.append({"op": "delete", "key": rng.choice(g.kvs).key.decode()})
        elif kind == "duplicate":
            ops.append({"op": "duplicate", "key": rng.choice(g.kvs).key.decode()})
        elif kind == "vocab":
            ops.append(_vocab_op(rng, g))
        elif kind == "tokenizer":
            key = rng.choice(["tokenizer.ggml.model", "tokenizer.ggml.pre", *_TOKENIZER_KEYS,
                              "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
                              "tokenizer.ggml.add_space_prefix"])
            if key == "tokenizer.ggml.model":
                ops.append({"op": "set", "key": key, "type": STRING,
                            "value": rng.choice(_TOKENIZERS)})
            elif key == "tokenizer.ggml.pre":
                ops.append({"op": "set", "key": key, "type": STRING, "value": rng.choice(_PRES)})
            elif key == "tokenizer.chat_template":
                value = rng.choice(["{{ x }", "{% for m in messages %}{{ m.content }}",
                                    "\udcff\udcfe", "{{ bos_token }}"])
                ops.append({"op": "set", "key": key, "type": STRING, "value": value})
            else:
                t = rng.choice([4, 5, 7, 10, 8])
                ops.append({"op": "set", "key": key, "type": t,
                            "value": _to_json(_random_value(rng, t))})
        elif kind == "arch":
            ops.append({"op": "set", "key": "general.architecture", "type": STRING,
                        "value": rng.choice(_ARCHS)})
        elif kind == "tensor":
            ops.append(_tensor_op(rng, g))
        elif kind == "header":
            field_ = rng.choice(["version", "n_kv", "n_tensors", "alignment"])
            value = rng.choice([0, 1, 2, 3, 4, 31, 64, 2**32 - 1, 10**6]) if field_ != \
                "version" else rng.choice([0, 1, 2, 4, 99])
            if field_ == "alignment":
                ops.append({"op": "set", "key": "general.alignment", "type": 4,
                            "value": rng.choice([0, 1, 3, 8, 64, 4096, 2**31])})
            else:
                ops.append({"op": "header", "field": field_, "value": value})
        elif kind == "bytes":
            size = len(serialize(g))
            head = min(size, 12000)  # mostly the header, sometimes the weights
            at = rng.randrange(head) if rng.random() < 0.85 else rng.randrange(size)
            patch = bytes(rng.choice([0, 0xFF, rng.randrange(256)])
                          for _ in range(rng.choice([1, 1, 2, 4, 8])))
            ops.append({"op": "bytes", "offset": at, "data": patch.hex()})
        else:
            ops.append({"op": "truncate", "size": rng.randrange(len(serialize(g)))})
    return ops


def _to_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _vocab_op(rng: random.Random, g: GGUF) -> dict[str, Any]:
    tokens = g.find("tokenizer.ggml.tokens")
    n = len(tokens.value[1]) if tokens else 384
    choice = rng.choice(["dup", "dup", "empty", "bytetok", "type", "type", "resize", "count",
                         "merge", "merge_resize", "scores", "elem", "special_text"])
    if choice == "dup":
        return {"op": "item", "key": "tokenizer.ggml.tokens", "index": rng.randrange(n),
                "copy_from": rng.randrange(n)}
    if choice == "empty":
        return {"op": "item", "key": "tokenizer.ggml.tokens", "index": rng.randrange(n),
                "value": rng.choice(["", "[EMPTY_3]", "\u0000", "<0x0A>", "<|im_end|>"])}
    if choice == "bytetok":
        return {"op": "item", "key": "tokenizer.ggml.tokens", "index": rng.randrange(n),
                "value": rng.choice(["<0x", "<0xZZ>", "<0x0A>", "x", "<0xE3>", "▁"])}
    if choice == "type":
        return {"op": "item", "key": "tokenizer.ggml.token_type", "index": rng.randrange(n),
                "value": rng.choice([-1, 0, 1, 2, 3, 4, 5, 6, 7, 99, 2**31 - 1])}
    if choice == "resize":
        key = rng.choice(["tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.scores"])
        return {"op": "resize", "key": key, "n": rng.choice([0, 1, n // 2, n - 1, n + 1, 2 * n])}
    if choice == "count":
        key = rng.choice(["tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.merges"])
        return {"op": "count", "key": key, "count": rng.choice([0, n - 1, n + 1, 2**31, 2**62])}
    if choice == "merge":
        return {"op": "item", "key": "tokenizer.ggml.merges", "index": rng.randrange(122),
                "value": rng.choice(["", " ", "a", "a b c", "Ġ ", " Ġ", "\u0000 x", "h e"])}
    if choice == "merge_resize":
        return {"op": "resize", "key": "tokenizer.ggml.merges", "n": rng.choice([0, 1, 500])}
    if choice == "scores":
        return {"op": "set", "key": "tokenizer.ggml.scores", "type": ARRAY,
                "value": [6, [rng.choice(["nan", 0.0, -1e30])] * rng.choice([n, n - 1, 1])]}
    if choice == "elem":
        key = rng.choice(["tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.merges"])
        return {"op": "elem_type", "key": key, "type": rng.choice([4, 5, 6, 8, 0])}
    return {"op": "item", "key": "tokenizer.ggml.tokens", "index": rng.randrange(n),
            "value": rng.choice(["<|eot_id|>", "<|im_end|>", "</s>", "<|end|>", "<|return|>",
                                 "<|call|>", "<|channel|>", "<|fim_pad|>"])}


def _tensor_op(rng: random.Random, g: GGUF) -> dict[str, Any]:
    i = rng.randrange(len(g.tensors))
    f = rng.choice(["dims", "dims", "type", "offset", "name", "n_dims", "drop"])
    if f == "drop":
        return {"op": "drop_tensor", "index": i}
    dims = g.tensors[i].dims
    if f == "dims":
        v: Any = rng.choice([[0], [1], [*dims, 1], dims[:1], [d + 1 for d in dims],
                             [2**32, *dims[1:]], [2**63, *dims[1:]], [d // 2 or 1 for d in dims],
                             list(reversed(dims)), [1, 1, 1, 1, 1]])
    elif f == "type":
        v = rng.choice([0, 1, 2, 3, 4, 5, 8, 12, 14, 24, 30, 31, 39, 40, 99, 2**31])
    elif f == "offset":
        v = rng.choice([0, 1, 31, 32, 10**9, 2**63, g.tensors[(i + 1) % len(g.tensors)].offset])
    elif f == "name":
        v = rng.choice(["", "x", "token_embd.weight", "output.weight", "blk.99.attn_q.weight",
                        "blk.0.attn_q.weight", rng.randrange(len(g.tensors))])
    else:
        v = rng.choice([0, 3, 5, 2**31])
    return {"op": "tensor", "index": i, "field": f, "value": v}


def cases(seed: int, n: int) -> Iterator[list[dict[str, Any]]]:
    """``n`` deterministic recipes from ``seed``."""
    rng = random.Random(seed)
    g = parse(BASE_GGUF.read_bytes())
    for _ in range(n):
        yield random_recipe(rng, g)


# ------------------------------------------------------------------------------ the worker

WORKER = r"""
import sys
from pathlib import Path
from eliza_backends import ElizaError, open_stream
try:
    from eliza_llamacpp.native_guard import parked_threads
except ImportError:  # a build without containment (e.g. to show what the fuzzer finds there)
    def parked_threads():
        return 0

TEXTS = ["Four score and seven years ago",
         "h\u00e9llo w\u00f6rld \u2713 \u6f22\u5b57 \U0001f389 \x01\t\n",
         "<|user|>hi<|end|><|im_end|></s>", " ", "\ue000\U0010fffd"]
GOOD = Path(sys.argv[1])

def _serve(bundle):
    with open_stream(bundle, backend="llama.cpp", threads=1, context_size=64, batch_size=16,
                     max_tokens=4, ignore_eos=True) as s:
        sess = s.session
        model = getattr(sess, "_model", None)
        if model is not None:  # the EOG set must equal llama.cpp's own, token by token
            import llama_cpp as lc
            info = getattr(model, "info", None)
            n_vocab = info.vocab_size if info is not None else model.n_vocab
            eog = set(info.eog_token_ids if info is not None else model.eog)
            full = {t for t in range(n_vocab) if lc.llama_vocab_is_eog(model.vocab, t)}
            assert full == eog, (sorted(full), sorted(eog))
        for text in TEXTS:
            sess.detokenize(sess.tokenize(text))
        s.prefill(sess.tokenize(TEXTS[0])[:40] or [0])
        out = [t for step in s for t in step.tokens]
        sess.detokenize(out)
        if sess.chat_template:
            try:
                s.prefill_messages([{"role": "user", "content": "hi"}])
                s.next(2)
            except ElizaError:
                pass
        return len(out)

_before = [0]

def exercise(case_dir, params):
    _before[0] = parked_threads()
    return _serve(Path(case_dir))

def after(verdict):
    verdict["parked"] = parked_threads()
    if verdict["parked"] > _before[0]:  # a contained abort: prove the process is still sound
        try:
            _serve(GOOD)
        except Exception as exc:
            return {"outcome": "poisoned", "detail": repr(exc)[:300], "parked": verdict["parked"]}
    return verdict
"""


def _new_worker(root: Path) -> Worker:
    good = root / "good"
    if not good.is_dir():
        (good / "text").mkdir(parents=True)
        (good / "text" / "m.gguf").write_bytes(BASE_GGUF.read_bytes())
    return Worker(WORKER, [str(good)], python=os.environ.get("GGUF_FUZZ_PYTHON"),
                  env={"GGML_NO_BACKTRACE": "1", "OMP_NUM_THREADS": "1"})


def run(recipes: list[list[dict[str, Any]]], **kwargs: Any) -> Report:
    """Run every recipe (see :func:`run_files`)."""
    base = BASE_GGUF.read_bytes()
    return run_files(((r, lambda r=r: build(r, base)) for r in recipes), **kwargs)


def run_files(items: Iterable[tuple[Any, Callable[[], bytes]]], **kwargs: Any) -> Report:
    """Serve each ``(label, make file bytes)`` as a bundle's only GGUF through the oracle."""
    def case(make: Callable[[], bytes]) -> Callable[[Path], dict[str, Any]]:
        def write(case_dir: Path) -> dict[str, Any]:
            (case_dir / "text").mkdir(exist_ok=True)
            (case_dir / "text" / "m.gguf").write_bytes(make())
            return {}
        return write

    return run_cases(((label, case(make)) for label, make in items), _new_worker, **kwargs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--save", type=Path, help="write each finding as a JSON recipe here")
    args = ap.parse_args(argv)
    report = run(list(cases(args.seed, args.cases)), timeout=args.timeout,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps({"cases": report.cases, "seconds": round(report.seconds, 1),
                      "outcomes": report.outcomes}))
    for n, f in enumerate(report.findings):
        print(f"{f.outcome}: {json.dumps(f.label)}\n    {f.detail[-300:]}")
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            name = f"seed{args.seed}-{n:03d}-{f.outcome}.json"
            (args.save / name).write_text(json.dumps(
                {"recipe": f.label, "found": f"{f.outcome}: {f.detail[-200:]}"}, indent=1)
                + "\n")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
