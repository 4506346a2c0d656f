"""Image and audio input on llama.cpp: the seam vs llama-cpp-python's own libmtmd path, side by
side in one process (same projector file, same text model, same threads), interleaved.

    python benchmarks/bench_media.py [--bundle examples/bundles/gemma4-mm-tiny] [--repeat 15]
                                     [--threads 2] [--json]

For each media file of the bundle (``media/``), per round, in alternating order:

- ``encode``: the file's bytes to projected embeddings. seam: ``load_media_file`` (Pillow or
  ``wave`` decode, checks, digest) + ``Projector.encode`` (bitmap, ``mtmd_tokenize``,
  ``mtmd_encode_chunk``); direct: ``mtmd_helper_bitmap_init_from_buf`` (libmtmd's own decoder)
  + ``mtmd_tokenize`` + ``mtmd_encode_chunk``.
- ``prefill``: a chat turn holding the media, into an empty KV cache. seam:
  ``Stream.prefill_pieces`` (decode, checks, plan, encoder, embedding decode, the text);
  direct: ``mtmd_tokenize`` of the same prompt text with the marker + ``mtmd_helper_eval_chunks``
  on a ``llama_context`` of the same size.

Reported: median seconds (min-max) per contender and the median of per-round ratios
seam / direct.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path
from typing import Any

import llama_cpp as lc
from llama_cpp import mtmd_cpp as mt

from eliza_backends import open_stream
from eliza_backends.media import load_media_file

TURN = ("<|turn>user\n", "Describe it.<turn|>\n<|turn>model\n")


def direct_setup(stream: Any) -> tuple[Any, Any]:
    """The seam's own loaded text model and projector context (the same weights and files),
    and a second llama_context for the direct prefill."""
    session = stream.session
    projector = session._media.projector
    model = session._model
    params = lc.llama_context_default_params()
    params.n_ctx = stream.config.context_size
    params.n_batch = params.n_ubatch = stream.config.batch_size
    params.n_threads = params.n_threads_batch = stream.config.threads
    params.no_perf = True
    ctx = lc.llama_init_from_model(model.ptr, params)
    return projector, ctx


def direct_chunks(projector: Any, data: bytes, text: bytes) -> Any:
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    bitmap = mt.mtmd_helper_bitmap_init_from_buf(projector.ctx, buf, len(data), False)
    chunks = mt.mtmd_input_chunks_init()
    inp = mt.mtmd_input_text(text=text, text_len=len(text), add_special=True,
                             parse_special=True)
    bitmaps = (mt.mtmd_bitmap_p_ctypes * 1)(bitmap)
    assert mt.mtmd_tokenize(projector.ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
    mt.mtmd_bitmap_free(bitmap)
    return chunks


def direct_encode(projector: Any, data: bytes) -> float:
    t0 = time.perf_counter()
    chunks = direct_chunks(projector, data, mt.mtmd_default_marker())
    for i in range(mt.mtmd_input_chunks_size(chunks)):
        chunk = mt.mtmd_input_chunks_get(chunks, i)
        if mt.mtmd_input_chunk_get_type(chunk) != 0:
            assert mt.mtmd_encode_chunk(projector.ctx, chunk) == 0
    dt = time.perf_counter() - t0
    mt.mtmd_input_chunks_free(chunks)
    return dt


def direct_prefill(projector: Any, ctx: Any, data: bytes) -> float:
    lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
    text = (TURN[0] + mt.mtmd_default_marker().decode() + TURN[1]).encode()
    t0 = time.perf_counter()
    chunks = direct_chunks(projector, data, text)
    new_past = lc.llama_pos(0)
    assert mt.mtmd_helper_eval_chunks(projector.ctx, ctx, chunks, 0, 0, 256, True,
                                      ctypes.byref(new_past)) == 0
    dt = time.perf_counter() - t0
    mt.mtmd_input_chunks_free(chunks)
    return dt


def seam_encode(stream: Any, path: Path) -> float:
    t0 = time.perf_counter()
    stream.session._media.projector.encode(load_media_file(path))
    return time.perf_counter() - t0


def seam_prefill(stream: Any, path: Path) -> float:
    stream.reset()
    t0 = time.perf_counter()
    stream.prefill_pieces([TURN[0], load_media_file(path), TURN[1]])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default="examples/bundles/gemma4-mm-tiny")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bundle = Path(args.bundle)
    results: dict[str, Any] = {}
    with open_stream(bundle, backend="llama.cpp", threads=args.threads, context_size=512,
                     batch_size=256) as stream:
        stream.prefill_pieces([TURN[0], load_media_file(sorted((bundle / "media").iterdir())[0]),
                               TURN[1]])  # loads the projector
        projector, ctx = direct_setup(stream)
        try:
            for path in sorted((bundle / "media").iterdir()):
                data = path.read_bytes()
                for what, seam, direct in (
                        ("encode", lambda p=path: seam_encode(stream, p),
                         lambda d=data: direct_encode(projector, d)),
                        ("prefill", lambda p=path: seam_prefill(stream, p),
                         lambda d=data: direct_prefill(projector, ctx, d))):
                    seam(), direct()  # warm-up
                    rows: list[tuple[float, float]] = []
                    for r in range(args.repeat):
                        if r % 2:
                            d = direct()
                            s = seam()
                        else:
                            s = seam()
                            d = direct()
                        rows.append((s, d))
                    s_med = statistics.median(s for s, _ in rows)
                    d_med = statistics.median(d for _, d in rows)
                    ratio = statistics.median(s / d for s, d in rows)
                    results[f"{path.name} {what}"] = {
                        "seam_s": s_med, "direct_s": d_med, "ratio": ratio,
                        "seam_range": [min(s for s, _ in rows), max(s for s, _ in rows)],
                        "direct_range": [min(d for _, d in rows), max(d for _, d in rows)]}
        finally:
            lc.llama_free(ctx)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'media':<34} {'seam ms':>10} {'direct ms':>10} {'seam/direct':>12}")
    for name, r in results.items():
        print(f"{name:<34} {r['seam_s'] * 1e3:>10.1f} {r['direct_s'] * 1e3:>10.1f} "
              f"{r['ratio']:>12.3f}")


if __name__ == "__main__":
    main()
