"""A crash-oracle fuzzer for TFLite models on both LiteRT runtimes.

Cases patch the tiny bundle's ``tiny.tflite`` in place: the fuzzer walks the flatbuffer once
(with its own small reader, independent of the validator under test) and records every place a
runtime reads a value from: offsets, vtable entries, vector lengths, and the indices between
tables (signature -> subgraph, tensor map -> tensor, operator -> tensors and operator code,
tensor -> buffer, options -> subgraph), tensor types and shapes, buffer extents. A case writes
edge values into one to three of those places, or flips bytes, or truncates, and is served by
ai-edge-litert's Interpreter, its CompiledModel, or (patched inside ``tiny.litertlm``'s TFLite
section) the LiteRT-LM engine. The oracle is :mod:`crash_oracle`'s: no crash, no hang, nothing
untyped.

    python tests/tflite_fuzz.py --cases 500 --seed 3 [--save tests/corpus/tflite]
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from crash_oracle import Report, Worker, run_cases

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "examples" / "bundles" / "tiny" / "text"
BASE_TFLITE = TEXT / "tiny.tflite"
BASE_LITERTLM = TEXT / "tiny.litertlm"
SESSIONS = ("interpreter", "compiled", "engine")


@dataclass(frozen=True)
class Site:
    """A place in the flatbuffer a runtime reads: byte position, struct format, what it is."""

    pos: int
    fmt: str
    kind: str  # index | count | offset | vtable | soffset | type | dim | extent | scalar
    limit: int = 0  # for an index: how many things it may name


class _Walker:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.sites = buf, []  # type: ignore[var-annotated]

    def u32(self, p: int) -> int:
        return int(struct.unpack_from("<I", self.buf, p)[0])

    def table(self, pos: int) -> dict[int, int]:
        """Field index -> absolute position, recording the table's soffset and vtable."""
        self.sites.append(Site(pos, "<i", "soffset"))
        vt = pos - struct.unpack_from("<i", self.buf, pos)[0]
        vsize = struct.unpack_from("<H", self.buf, vt)[0]
        fields = {}
        for i, slot in enumerate(range(vt + 4, vt + vsize, 2)):
            self.sites.append(Site(slot, "<H", "vtable"))
            off = struct.unpack_from("<H", self.buf, slot)[0]
            if off:
                fields[i] = pos + off
        return fields

    def ref(self, field: int) -> int:
        self.sites.append(Site(field, "<I", "offset"))
        return field + self.u32(field)

    def vector(self, field: int, elem: int, kind: str = "", fmt: str = "<i",
               limit: int = 0) -> tuple[int, int]:
        vec = self.ref(field)
        n = self.u32(vec)
        self.sites.append(Site(vec, "<I", "count"))
        if kind:
            for i in range(min(n, 64)):
                self.sites.append(Site(vec + 4 + elem * i, fmt, kind, limit))
        return vec + 4, n

    def tables(self, field: int) -> list[dict[int, int]]:
        start, n = self.vector(field, 4)
        return [self.table(self.ref(start + 4 * i)) for i in range(n)]


@lru_cache(maxsize=1)
def sites() -> tuple[Site, ...]:
    """Every patchable place of the base model (computed once)."""
    buf = BASE_TFLITE.read_bytes()
    w = _Walker(buf)
    model = w.table(w.ref(0))
    opcodes = w.tables(model[1]) if 1 in model else []
    subgraphs = w.tables(model[2])
    buffers = w.tables(model[4]) if 4 in model else []
    for f in buffers:
        for i in (1, 2):
            if i in f:
                w.sites.append(Site(f[i], "<Q", "extent"))
        if 0 in f:
            w.vector(f[0], 1)
    for f in w.tables(model[6]) if 6 in model else []:
        if 1 in f:
            w.sites.append(Site(f[1], "<I", "index", len(buffers)))
    for g in subgraphs:
        tensors = w.tables(g[0])
        for t in tensors:
            if 0 in t:
                w.vector(t[0], 4, "dim")
            if 1 in t:
                w.sites.append(Site(t[1], "<B", "type"))
            if 2 in t:
                w.sites.append(Site(t[2], "<I", "index", len(buffers)))
        for i in (1, 2):
            if i in g:
                w.vector(g[i], 4, "index", limit=len(tensors))
        for op in w.tables(g[3]) if 3 in g else []:
            if 0 in op:
                w.sites.append(Site(op[0], "<I", "index", len(opcodes)))
            for i in (1, 2):
                if i in op:
                    w.vector(op[i], 4, "index", limit=len(tensors))
            for table_field in (4, 12):
                if table_field in op:
                    options = w.table(w.ref(op[table_field]))
                    for pos in options.values():  # scalars (and subgraph indices) of options
                        w.sites.append(Site(pos, "<i", "index", len(subgraphs)))
    for sd in w.tables(model[7]) if 7 in model else []:
        if 4 in sd:
            w.sites.append(Site(sd[4], "<I", "index", len(subgraphs)))
        for i in (0, 1):
            for m in w.tables(sd[i]) if i in sd else []:
                if 1 in m:
                    w.sites.append(Site(m[1], "<I", "index", 150))
    return tuple(w.sites)


def _edge(rng: random.Random, site: Site) -> int:
    if site.kind == "index":
        return rng.choice([site.limit, site.limit + 1, site.limit + 7, 2**31 - 1, 2**32 - 1,
                           2**32 - 2, 0, 1, rng.randrange(max(site.limit, 1))])
    if site.kind == "count":
        return rng.choice([0, 1, 2**31, 2**32 - 1, 1 << 20, rng.randrange(4096)])
    if site.kind == "offset":
        return rng.choice([0, 4, 2**31, 2**32 - 4, rng.randrange(1 << 22)])
    if site.kind == "vtable":
        return rng.choice([0, 1, 2, 3, 4, 6, 0xFFFF, 0x7FFF, rng.randrange(256)])
    if site.kind == "soffset":
        return rng.choice([0, 4, -4, 2**31 - 1, -(2**31), rng.randrange(-4096, 4096)])
    if site.kind == "type":
        return rng.choice([5, 13, 14, 17, 19, 22, 23, 99, 255, rng.randrange(24)])
    if site.kind == "dim":
        return rng.choice([-1, -2, 0, 2**31 - 1, 1 << 20, 3, rng.randrange(300)])
    return rng.choice([2**62, 2**40, 1, 0, rng.randrange(1 << 24)])  # extent


def _pack(fmt: str, value: int) -> bytes:
    size = struct.calcsize(fmt)
    return (value % (1 << (8 * size))).to_bytes(size, "little")


def random_recipe(rng: random.Random) -> dict[str, Any]:
    """One case: the runtime that serves it and one to three patches."""
    all_sites = sites()
    patches: list[dict[str, Any]] = []
    size = BASE_TFLITE.stat().st_size
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        roll = rng.random()
        if roll < 0.8:
            preferred = [s for s in all_sites if s.kind == rng.choice(
                ["index", "index", "index", "count", "offset", "vtable", "soffset", "type",
                 "dim", "extent"])] or list(all_sites)
            site = rng.choice(preferred)
            patches.append({"op": "patch", "pos": site.pos,
                            "data": _pack(site.fmt, _edge(rng, site)).hex(), "kind": site.kind})
        elif roll < 0.95:
            near = rng.choice(all_sites).pos
            patches.append({"op": "patch", "pos": max(0, near + rng.randrange(-8, 8)),
                            "data": bytes(rng.randrange(256) for _ in range(rng.choice(
                                [1, 2, 4]))).hex(), "kind": "bytes"})
        else:
            patches.append({"op": "truncate", "size": rng.randrange(size)})
    return {"session": rng.choice(SESSIONS), "patches": patches}


def cases(seed: int, n: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for _ in range(n):
        yield random_recipe(rng)


@lru_cache(maxsize=1)
def _litertlm_section() -> tuple[int, int]:
    sys.path.insert(0, str(ROOT / "plugins" / "eliza_litert" / "src"))
    from eliza_litert.container import read_container

    container = read_container(BASE_LITERTLM)
    sec = container.find("TFLiteModel")
    assert sec is not None
    return sec.begin, sec.end


def build(recipe: dict[str, Any]) -> tuple[str, bytes]:
    """(file name, bytes) for a recipe: a patched .tflite, or a .litertlm whose TFLite section
    carries the same patches."""
    engine = recipe["session"] == "engine"
    data = bytearray(BASE_TFLITE.read_bytes())
    for p in recipe["patches"]:
        if p["op"] == "patch":
            patch = bytes.fromhex(p["data"])
            data[p["pos"]:p["pos"] + len(patch)] = patch
        else:
            del data[p["size"]:]
    if not engine:
        return "model.tflite", bytes(data)
    begin, end = _litertlm_section()
    container = bytearray(BASE_LITERTLM.read_bytes())
    model = bytes(data[:end - begin]).ljust(min(len(data), end - begin), b"\0")
    container[begin:begin + len(model)] = model
    if len(model) < end - begin:  # a truncated model: zero the rest of its section
        container[begin + len(model):end] = bytes(end - begin - len(model))
    return "model.litertlm", bytes(container)


WORKER = r"""
from pathlib import Path
from eliza_backends import open_stream

def exercise(case_dir, params):
    options = {"session": "engine"} if params["session"] == "engine" else \
        {"session": "interpreter", "runtime": params["session"]}
    with open_stream(case_dir, backend="litert-lm", options={"litert-lm": options}, threads=1,
                     max_tokens=3, ignore_eos=params["session"] != "engine") as s:
        ids = s.session.tokenize("Four score and seven")
        s.prefill(ids)
        out = [t for step in s for t in step.tokens]
        return len(out)
"""


def _tokenizer_json() -> str:
    sys.path.insert(0, str(ROOT / "plugins" / "eliza_litert" / "src"))
    from eliza_litert.container import read_container

    found = read_container(BASE_LITERTLM).hf_tokenizer_json()
    assert found is not None
    return found


def run(recipes: list[dict[str, Any]], **kwargs: Any) -> Report:
    tokenizer = _tokenizer_json()

    def case(recipe: dict[str, Any]) -> Callable[[Path], dict[str, Any]]:
        def write(case_dir: Path) -> dict[str, Any]:
            text = case_dir / "text"
            text.mkdir(exist_ok=True)
            for old in text.iterdir():
                old.unlink()
            name, data = build(recipe)
            (text / name).write_bytes(data)
            if name.endswith(".tflite"):
                (text / "tokenizer.json").write_text(tokenizer)
            return {"session": recipe["session"]}
        return write

    def new_worker(_root: Path) -> Worker:
        import os

        return Worker(WORKER, [], python=os.environ.get("TFLITE_FUZZ_PYTHON"),
                      env={"TF_CPP_MIN_LOG_LEVEL": "3"})

    return run_cases(((r, case(r)) for r in recipes), new_worker, **kwargs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path)
    args = ap.parse_args(argv)
    report = run(list(cases(args.seed, args.cases)),
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps({"cases": report.cases, "seconds": round(report.seconds, 1),
                      "outcomes": report.outcomes}))
    for n, f in enumerate(report.findings):
        print(f"{f.outcome}: {json.dumps(f.label)}\n    {f.detail[-300:]}")
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"seed{args.seed}-{n:03d}-{f.outcome}.json").write_text(json.dumps(
                {"recipe": f.label, "found": f"{f.outcome}: {f.detail[-200:]}"}, indent=1)
                + "\n")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
