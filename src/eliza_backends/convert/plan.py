"""What ``bundle convert`` is asked to make: the formats, their precisions
(:data:`PRECISIONS`), and :class:`ConvertPlan` parsed from CLI-style text
(:func:`parse_plan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from . import toolchain

FORMAT_NAMES = ("gguf", "mlx", "litert", "coreml")
PRECISIONS: dict[str, tuple[str, ...]] = {
    "gguf": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k"),
    "mlx": ("f32", "f16", "bf16", "q8", "q4"),
    "litert": ("fp32", "int8"),
    "coreml": ("fp32", "fp16"),
}
DEFAULT_PRECISION = {"gguf": "f32", "mlx": "f32", "litert": "fp32", "coreml": "fp32"}
#: format -> the toolchain.NEEDS key that must be installed to make it
FORMAT_TOOLS = {"gguf": "gguf", "mlx": "mlx", "litert": "litert", "coreml": "coreml"}


@dataclass(frozen=True)
class ConvertPlan:
    """What to make: formats with their precisions, LiteRT shapes, verification."""

    formats: dict[str, tuple[str, ...]]
    prefill_lengths: tuple[int, ...] = (128,)
    cache_length: int = 1024
    litert_tokenizer: str = "auto"  # auto | hf | sp
    verify: bool = False
    name: str | None = None
    threads: int | None = None
    keep_source_gguf: bool = True


def host_formats() -> list[str]:
    """The formats whose tools are installed here, in :data:`FORMAT_NAMES` order."""
    return [f for f in FORMAT_NAMES if toolchain.can_make(FORMAT_TOOLS[f])]


def parse_plan(formats: str | None, precision: Sequence[str] = (), **kw: Any) -> ConvertPlan:
    """Build a :class:`ConvertPlan` from CLI-style text: ``formats="gguf,mlx"``,
    ``precision=["gguf=f32,q8_0", "mlx=q4"]`` (a bare value applies to every format that
    accepts it). :class:`InvalidArgumentError` for unknown names."""
    names = [f.strip() for f in formats.split(",") if f.strip()] if formats else host_formats()
    for n in names:
        if n not in FORMAT_NAMES:
            raise InvalidArgumentError(f"unknown format {n!r}; choose from "
                                       f"{', '.join(FORMAT_NAMES)}")
    chosen: dict[str, list[str]] = {}
    for item in precision:
        fmt, eq, values = item.partition("=")
        targets = [fmt] if eq else [n for n in names if item in PRECISIONS[n]]
        vals = values.split(",") if eq else [item]
        if eq and fmt not in FORMAT_NAMES:
            raise InvalidArgumentError(f"--precision {item!r}: unknown format {fmt!r}")
        if not targets:
            raise InvalidArgumentError(f"--precision {item!r} fits none of {names}")
        for t in targets:
            for v in vals:
                if v not in PRECISIONS[t]:
                    raise InvalidArgumentError(
                        f"--precision {t}={v}: {t} takes {', '.join(PRECISIONS[t])}")
                chosen.setdefault(t, []).append(v)
    plan = {n: tuple(dict.fromkeys(chosen.get(n) or [DEFAULT_PRECISION[n]])) for n in names}
    return ConvertPlan(formats=plan, **kw)


__all__ = ["DEFAULT_PRECISION", "FORMAT_NAMES", "FORMAT_TOOLS", "PRECISIONS", "ConvertPlan",
           "host_formats", "parse_plan"]
