#!/usr/bin/env python
"""Measure the tiny multimodal Gemma 4's (or Gemma 4 Unified's) runtimes against its torch
oracle (BUNDLE/parity.json) straight through each runtime's own API, and write the numbers
into parity.json's "measured".

llama.cpp: the text GGUF + the mmproj GGUF through libmtmd (llama_cpp.mtmd_cpp): each prompt's
rendered text with its media placeholders as libmtmd's marker, mtmd_tokenize (which adds the
begin/end media tokens itself), mtmd_helper_eval_chunks (the model's own image mask), then
greedy decoding without stopping; each media file's projected features by mtmd_encode_chunk.

mlx-vlm: the HF folder through mlx-vlm's own Gemma 4 (processor, towers, masks), greedy by full
recompute like the oracle.

Usage (a venv with llama-cpp-python, mlx-vlm, numpy and Pillow, e.g. .venv-convert):
    .venv-convert/bin/python tools/gemma4_mm_parity.py examples/bundles/gemma4-mm-tiny \
        [llama.cpp] [mlx-vlm]
"""

from __future__ import annotations

import base64
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemma4_mm_family as mm


def decode_array(e: dict[str, Any]) -> Any:
    """A parity.json float32 array ({"dtype", "shape", "base64"})."""
    import numpy as np

    return np.frombuffer(base64.b64decode(e["base64"]), dtype="<f4").reshape(e["shape"])


def mask_distances(prompt: dict[str, Any], first: Any, reference: str) -> dict[str, float]:
    """Max |logit difference| of a runtime's first step from the oracle's under each mask rule
    (``reference``: the oracle's own; the rule a runtime follows is the one it is nearest to)."""
    out = {reference: decode_array(prompt["first_logits"])}
    for rule, alt in prompt.get("other_mask_rules", {}).items():
        out[rule] = decode_array(alt["first_logits"])
    return {rule: round(float(abs(first - ref).max()), 5) for rule, ref in out.items()}


def cosines(a: Any, b: Any) -> dict[str, float]:
    """Row-wise cosine (min, mean) and the cosine of the flattened arrays."""
    import numpy as np

    if a.shape != b.shape:
        return {"shape_mismatch": 1.0}
    rows = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    flat = float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))
    return {"min_row": round(float(rows.min()), 6), "mean_row": round(float(rows.mean()), 6),
            "all": round(flat, 6)}


class LlamaMtmd:
    """The text GGUF and the projector loaded once; one prompt at a time on sequence 0."""

    def __init__(self, root: Path, threads: int = 1) -> None:
        import llama_cpp
        import llama_cpp.mtmd_cpp as mtmd

        self.lc, self.mtmd = llama_cpp, mtmd
        text = next((root / "text").glob("*.gguf"))
        proj = next((root / "text" / "mmproj").glob("*.gguf"))
        self.llm = llama_cpp.Llama(model_path=str(text), n_ctx=1024, n_batch=512,
                                   n_ubatch=512, n_threads=threads, n_threads_batch=threads,
                                   verbose=False)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = threads
        params.print_timings = False
        params.warmup = False
        self.ctx = mtmd.mtmd_init_from_file(str(proj).encode(), self.llm.model, params)
        if not self.ctx:
            raise RuntimeError(f"libmtmd cannot load {proj}")
        self.marker = mtmd.mtmd_default_marker().decode()

    def bitmap(self, root: Path, path: str) -> Any:
        import numpy as np

        if mm.MEDIA_FILES[Path(path).name][0] == "image":
            rgb = np.ascontiguousarray(mm.read_image(root / path))
            h, w, _ = rgb.shape
            buf = (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes())
            return self.mtmd.mtmd_bitmap_init(w, h, buf)
        pcm = np.ascontiguousarray(mm.read_audio(root / path), dtype=np.float32)
        buf = (ctypes.c_float * pcm.size).from_buffer_copy(pcm.tobytes())
        return self.mtmd.mtmd_bitmap_init_from_audio(pcm.size, buf)

    def tokenize(self, text: str, bitmaps: list[Any]) -> Any:
        mtmd = self.mtmd
        chunks = mtmd.mtmd_input_chunks_init()
        raw = text.encode()
        inp = mtmd.mtmd_input_text(raw, len(raw), False, True)
        arr = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        rc = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
        if rc != 0:
            raise RuntimeError(f"mtmd_tokenize returned {rc}")
        return chunks

    def chunk_ids(self, chunks: Any, placeholders: dict[int, int]) -> list[int]:
        """The chunks as one id list, media chunks as runs of their soft-token id."""
        mtmd = self.mtmd
        ids: list[int] = []
        media = iter(placeholders.values())
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            n = mtmd.mtmd_input_chunk_get_n_tokens(c)
            if mtmd.mtmd_input_chunk_get_type(c) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n_out = ctypes.c_size_t()
                toks = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n_out))
                ids.extend(int(toks[j]) for j in range(n_out.value))
            else:
                ids.extend([next(media)] * n)
        return ids

    def greedy(self, root: Path, prompt: dict[str, Any], n: int,
               reference: str) -> dict[str, Any]:
        import numpy as np

        lc, mtmd = self.lc, self.mtmd
        text = prompt["rendered"].replace(mm.IMAGE, self.marker).replace(mm.AUDIO, self.marker)
        bitmaps = [self.bitmap(root, span["file"]) for span in prompt["media"]]
        chunks = self.tokenize(text, bitmaps)
        try:
            soft = {i: mm.TOKEN_IDS[mm.IMAGE if s["kind"] == "image" else mm.AUDIO]
                    for i, s in enumerate(prompt["media"])}
            ids = self.chunk_ids(chunks, soft)
            lc.llama_memory_clear(lc.llama_get_memory(self.llm.ctx), True)
            n_past = lc.llama_pos(0)
            rc = mtmd.mtmd_helper_eval_chunks(self.ctx, self.llm.ctx, chunks, 0, 0, 512, True,
                                              ctypes.byref(n_past))
            if rc != 0:
                raise RuntimeError(f"mtmd_helper_eval_chunks returned {rc}")
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                mtmd.mtmd_bitmap_free(b)
        n_vocab = self.llm.n_vocab()
        out: list[int] = []
        first = None
        for _ in range(n):
            logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.llm.ctx, -1),
                                           shape=(n_vocab,))
            if first is None:
                first = logits.copy()
            out.append(int(np.argmax(logits)))
            tok = (lc.llama_token * 1)(out[-1])
            batch = lc.llama_batch_get_one(tok, 1)
            if lc.llama_decode(self.llm.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
        ref = prompt["continuation_ids"]
        return {"prompt_ids_equal": ids == prompt["prompt_ids"], "ids": out,
                "first_logits_max_abs_diff": mask_distances(prompt, first, reference),
                "equal": sum(a == b for a, b in zip(out, ref, strict=True)),
                "first_divergence": next((i for i, (a, b) in enumerate(zip(out, ref,
                                                                           strict=True))
                                          if a != b), None)}

    def embedding(self, root: Path, path: str) -> Any:
        import numpy as np

        mtmd = self.mtmd
        bitmap = self.bitmap(root, path)
        chunks = self.tokenize(self.marker, [bitmap])
        try:
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                c = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(c) != mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    if mtmd.mtmd_encode_chunk(self.ctx, c) != 0:
                        raise RuntimeError("mtmd_encode_chunk failed")
                    n = mtmd.mtmd_input_chunk_get_n_tokens(c)
                    d = self.lc.llama_model_n_embd(self.llm.model)
                    out = mtmd.mtmd_get_output_embd(self.ctx)
                    return np.ctypeslib.as_array(out, shape=(n * d,)).reshape(n, d).copy()
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)
        raise RuntimeError(f"no media chunk for {path}")


class MlxVlm:
    """The HF folder through mlx-vlm's own Gemma 4 (its processor, towers and masks), greedy by
    full recompute like the oracle: what mlx-vlm itself does with these prompts."""

    def __init__(self, root: Path) -> None:
        from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor
        from mlx_vlm.utils import load_model

        folder = next(p for p in (root / "text").iterdir() if (p / "config.json").is_file())
        self.model = load_model(folder)
        self.processor = Gemma4Processor.from_pretrained(str(folder))

    def inputs(self, root: Path, images: list[str], clips: list[str]) -> dict[str, Any]:
        import mlx.core as mx
        import numpy as np
        from PIL import Image

        kw: dict[str, Any] = {}
        if images:
            pv, _ = self.processor.image_processor(
                [Image.fromarray(mm.read_image(root / f)) for f in images])
            kw["pixel_values"] = mx.array(pv["pixel_values"])
        if clips:
            fe = self.processor.feature_extractor([mm.read_audio(root / f) for f in clips],
                                                  sampling_rate=16000, return_tensors="np")
            kw["input_features"] = mx.array(np.asarray(fe["input_features"], dtype=np.float32))
            kw["input_features_mask"] = mx.array(np.asarray(fe["input_features_mask"]))
        return kw

    def embedding(self, root: Path, path: str) -> Any:
        import numpy as np

        model = self.model
        if mm.MEDIA_FILES[Path(path).name][0] == "image":
            x = self.inputs(root, [path], [])
            return np.array(model.embed_vision(model.vision_tower(x["pixel_values"]))[0])
        x = self.inputs(root, [], [path])
        enc, pad = model.audio_tower(x["input_features"], ~x["input_features_mask"])
        return np.array(model.embed_audio(enc)[0])[~np.array(pad[0])]

    def greedy(self, root: Path, prompt: dict[str, Any], n: int,
               reference: str) -> dict[str, Any]:
        import mlx.core as mx
        import numpy as np

        kw = self.inputs(root, [s["file"] for s in prompt["media"] if s["kind"] == "image"],
                         [s["file"] for s in prompt["media"] if s["kind"] == "audio"])
        ids = list(prompt["prompt_ids"])
        out: list[int] = []
        first = None
        for _ in range(n):
            t = np.array([ids])
            types = np.zeros_like(t)
            types[t == mm.TOKEN_IDS[mm.IMAGE]] = 1
            types[t == mm.TOKEN_IDS[mm.AUDIO]] = 3
            res = self.model(mx.array(t), mm_token_type_ids=mx.array(types), **kw)
            logits = np.array(getattr(res, "logits", res)[0, -1].astype(mx.float32))
            if first is None:
                first = logits
            out.append(int(np.argmax(logits)))
            ids.append(out[-1])
        ref = prompt["continuation_ids"]
        return {"ids": out, "first_logits_max_abs_diff": mask_distances(prompt, first, reference),
                "equal": sum(a == b for a, b in zip(out, ref, strict=True)),
                "first_divergence": next((i for i, (a, b) in enumerate(zip(out, ref,
                                                                           strict=True))
                                          if a != b), None)}


class MlxVlmUnified(MlxVlm):
    """The same for a Gemma 4 Unified folder: mlx-vlm's gemma4_unified (its raw-patch / raw-frame
    processor, projections and masks)."""

    def __init__(self, root: Path) -> None:
        from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import (
            Gemma4UnifiedProcessor,
        )
        from mlx_vlm.utils import load_model

        folder = next(p for p in (root / "text").iterdir() if (p / "config.json").is_file())
        self.model = load_model(folder)
        self.processor = Gemma4UnifiedProcessor.from_pretrained(str(folder))

    def inputs(self, root: Path, images: list[str], clips: list[str]) -> dict[str, Any]:
        import mlx.core as mx
        import numpy as np
        from PIL import Image

        kw: dict[str, Any] = {}
        if images:
            pv, _ = self.processor.image_processor(
                [Image.fromarray(mm.read_image(root / f)) for f in images])
            kw["pixel_values"] = mx.array(np.asarray(pv["pixel_values"], dtype=np.float32))
            kw["image_position_ids"] = mx.array(np.asarray(pv["image_position_ids"]))
        if clips:
            fe = self.processor.feature_extractor([mm.read_audio(root / f) for f in clips],
                                                  sampling_rate=16000, return_tensors="np")
            kw["input_features"] = mx.array(np.asarray(fe["input_features"], dtype=np.float32))
            kw["input_features_mask"] = mx.array(np.asarray(fe["input_features_mask"]))
        return kw

    def embedding(self, root: Path, path: str) -> Any:
        import numpy as np

        model = self.model
        if mm.MEDIA_FILES[Path(path).name][0] == "image":
            x = self.inputs(root, [path], [])
            return np.array(model.get_image_features(x["pixel_values"],
                                                     x["image_position_ids"]))
        x = self.inputs(root, [], [path])
        return np.array(model.get_audio_features(x["input_features"],
                                                 x["input_features_mask"]))


def measure(rt: Any, root: Path, doc: dict[str, Any]) -> dict[str, Any]:
    prompts = {p["name"]: rt.greedy(root, p, doc["n_tokens"], doc["mask"]["reference"])
               for p in doc["prompts"]}
    media = {path: cosines(rt.embedding(root, path), decode_array(entry["embedding"]))
             for path, entry in doc["media"].items()}
    return {"tokens_equal": sum(r["equal"] for r in prompts.values()),
            "tokens_compared": doc["n_tokens"] * len(prompts),
            "prompts": prompts, "embeddings_cosine": media}


def measure_mlx(root: Path, doc: dict[str, Any]) -> dict[str, Any]:
    import importlib.metadata as md

    unified = "Unified" in doc["reference"]
    res = measure((MlxVlmUnified if unified else MlxVlm)(root), root, doc)
    return {"runtime": f"mlx {md.version('mlx')} / mlx-vlm {md.version('mlx-vlm')} (its own "
                       "Gemma 4 processor, towers and masks; full recompute)",
            "mask": "mlx-vlm's own: with use_bidirectional_attention='vision' and "
                    "mm_token_type_ids, the image block is OR-ed in on every layer after the "
                    "sliding window (and skipped when the mask is not square, i.e. a prefill "
                    "after a cached prefix)", **res}


def measure_llamacpp(root: Path, doc: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp

    res = measure(LlamaMtmd(root), root, doc)
    keyed = ("for gemma4uv always" if "Unified" in doc["reference"] else
             "for gemma4v at n_embd 128 (only 1536/2560 are keyed causal)")
    return {"runtime": f"llama-cpp-python {llama_cpp.__version__} (libmtmd)",
            "mask": f"libmtmd's own: mtmd_decode_use_non_causal is true {keyed}; llama.cpp's "
                    "Gemma 4 makes a non-causal batch bidirectional on sliding layers only",
            **res}


RUNTIMES = {"llama.cpp": measure_llamacpp, "mlx-vlm": measure_mlx}


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve()
    path = root / "parity.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    measured = doc.setdefault("measured", {})
    for runtime in argv[1:] or list(RUNTIMES):
        measured[runtime] = res = RUNTIMES[runtime](root, doc)
        print(f"{runtime}: tokens {res['tokens_equal']}/{res['tokens_compared']}")
        for name, r in res["prompts"].items():
            print(f"  {name}: {r['equal']}/{doc['n_tokens']} first divergence "
                  f"{r['first_divergence']}; first-step max |dlogit| by mask rule "
                  f"{r['first_logits_max_abs_diff']}")
        for name, c in res["embeddings_cosine"].items():
            print(f"  {name}: cosine {c}")
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
