"""Which backend serves a bundle: the seed's resolution table (§2.3), with one extension.

1. A hard request (``backend=`` or the ``ELIZA_LLM_BACKEND`` env, ``backend=`` winning) is
   matched case-insensitively against names and aliases. ``llama.cpp`` / ``llamacpp`` force
   llama.cpp. A name that is not registered, not available on this host, or whose backend cannot
   serve the bundle raises :class:`BackendSelectionError` saying which, and never falls back.
2. Otherwise, among backends that are available and can serve the bundle, the highest
   ``preference_rank()`` **above 0** wins; ties go to the alphabetically first name.
3. Else llama.cpp, when it is available and can serve.
4. Else (the extension) the highest-ranked remaining candidate with rank <= 0: a backend may
   rank itself below llama.cpp on hosts where it is slower and still serve bundles llama.cpp
   cannot (and stay reachable by hard select).
5. Else :class:`BackendSelectionError` listing what each backend lacked.

:func:`explain` returns every candidate's verdict; :func:`select` returns the chosen factory.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .backend import Factory
from .errors import BackendSelectionError, Status
from .registry import Registry, default_registry, safe_available, safe_rank

BACKEND_ENV = "ELIZA_LLM_BACKEND"
LLAMA_CPP = "llama.cpp"

#: Where the first-party backends come from, for "pip install" hints.
KNOWN_BACKENDS: dict[str, str] = {
    "llama.cpp": "llamacpp", "llamacpp": "llamacpp",
    "litert-lm": "litert", "litert": "litert",
    "mlx-coreml": "mlx", "mlx": "mlx", "coreml": "mlx",
}

Verdict = Literal["chosen", "unavailable", "cannot-serve", "lower-rank", "not-requested",
                  "below-llama.cpp"]


@dataclass(frozen=True)
class Candidate:
    """One backend's verdict in a selection."""

    name: str
    verdict: Verdict
    reason: str
    available: bool
    can_serve: bool
    rank: int
    detail: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "verdict": self.verdict, "reason": self.reason,
                "available": self.available, "can_serve": self.can_serve, "rank": self.rank,
                "detail": dict(self.detail)}


@dataclass(frozen=True)
class SelectionReport:
    """The outcome of a selection: the chosen backend or the error, and every candidate."""

    bundle_dir: str
    requested: str | None
    requested_by: str | None
    chosen: str | None
    error: str | None
    candidates: tuple[Candidate, ...]
    broken_plugins: tuple[str, ...] = ()
    error_code: Status | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"bundle_dir": self.bundle_dir, "requested": self.requested,
                "requested_by": self.requested_by, "chosen": self.chosen, "error": self.error,
                "candidates": [c.to_dict() for c in self.candidates],
                "broken_plugins": list(self.broken_plugins),
                "error_code": None if self.error_code is None else self.error_code.symbol}

    def __str__(self) -> str:
        lines = [f"bundle: {self.bundle_dir}"]
        if self.requested:
            lines.append(f"requested: {self.requested} (by {self.requested_by})")
        lines.append(f"chosen: {self.chosen}" if self.chosen else f"error: {self.error}")
        for c in self.candidates:
            lines.append(f"  {c.name:<12} rank {c.rank:>4}  {c.verdict:<15} {c.reason}")
        lines.extend(f"  broken plugin: {p}" for p in self.broken_plugins)
        return "\n".join(lines)


def explain(bundle_dir: str | os.PathLike[str], *, backend: str | None = None,
            environ: Mapping[str, str] | None = None,
            registry: Registry | None = None) -> SelectionReport:
    """Run the selection and report every candidate's verdict (never raises for selection)."""
    report, _ = _resolve(bundle_dir, backend, environ, registry)
    return report


def select(bundle_dir: str | os.PathLike[str], *, backend: str | None = None,
           environ: Mapping[str, str] | None = None, registry: Registry | None = None) -> Factory:
    """The factory that serves ``bundle_dir``; :class:`BackendSelectionError` if none can."""
    report, factory = _resolve(bundle_dir, backend, environ, registry)
    if factory is None:
        raise BackendSelectionError(report.error or "no backend selected",
                                    code=report.error_code or Status.ERR_BACKEND_UNAVAILABLE)
    return factory


def _resolve(bundle_dir: str | os.PathLike[str], backend: str | None,
             environ: Mapping[str, str] | None,
             registry: Registry | None) -> tuple[SelectionReport, Factory | None]:
    reg = registry or default_registry()
    env = os.environ if environ is None else environ
    requested, requested_by = None, None
    if backend is not None and backend.strip():
        requested, requested_by = backend.strip(), "backend argument"
    elif env.get(BACKEND_ENV, "").strip():
        requested, requested_by = env[BACKEND_ENV].strip(), f"{BACKEND_ENV} env"

    bundle = Path(bundle_dir)
    factories = reg.factories()
    broken = tuple(f"{p.plugin}: {p.error}" for p in reg.problems())
    rows: list[tuple[Factory, Any, bool, int]] = []
    for f in factories:
        avail = safe_available(f)
        rows.append((f, avail, _safe_can_serve(f, bundle), safe_rank(f)))

    def report(chosen: Factory | None, error: str | None,
               verdicts: dict[str, tuple[Verdict, str]],
               code: Status = Status.ERR_BACKEND_UNAVAILABLE) -> SelectionReport:
        cands = tuple(
            Candidate(f.name, verdicts[f.name][0], verdicts[f.name][1], a.ok, s, r, a.detail)
            for f, a, s, r in rows)
        return SelectionReport(str(bundle), requested, requested_by,
                               chosen.name if chosen else None, error, cands, broken,
                               code if error else None)

    if not bundle.is_dir():
        err = f"bundle directory {bundle} does not exist"
        return report(None, err, {f.name: ("cannot-serve", "no bundle") for f, *_ in rows},
                      Status.ERR_BUNDLE), None

    def base_verdict(f: Factory, a: Any, s: bool, r: int) -> tuple[Verdict, str]:
        if not a.ok:
            return "unavailable", a.reason or "not available on this host"
        if not s:
            return "cannot-serve", f"no {'/'.join(f.formats) or 'matching'} artifact under text/"
        return "lower-rank", f"rank {r}"

    verdicts = {f.name: base_verdict(f, a, s, r) for f, a, s, r in rows}

    if requested is not None:
        key = requested.lower()
        match = next((row for row in rows if key in (n.lower() for n in row[0].names())), None)
        for f, *_ in rows:
            if match is None or f is not match[0]:
                verdicts[f.name] = ("not-requested", f"{requested_by} asks for {requested}")
        if match is None:
            err = _unknown_backend(requested, requested_by, factories)
            return report(None, err, verdicts), None
        f, a, s, _ = match
        if not a.ok:
            err = (f"{requested_by} asks for backend {requested!r} ({f.name}), which is installed "
                   f"but not available on this host: {a.reason}. Unset it to let the selector "
                   "choose, or fix the runtime install.")
            verdicts[f.name] = ("unavailable", a.reason)
            return report(None, err, verdicts), None
        if not s:
            err = (f"{requested_by} asks for backend {requested!r} ({f.name}), which cannot serve "
                   f"{bundle}: no {'/'.join(f.formats)} artifact under text/. Add one "
                   "(`eliza-backends bundle create`) or choose another backend.")
            verdicts[f.name] = ("cannot-serve", verdicts[f.name][1])
            return report(None, err, verdicts, Status.ERR_CANNOT_SERVE), None
        verdicts[f.name] = ("chosen", f"requested by {requested_by}")
        return report(f, None, verdicts), f

    candidates = [(f, r) for f, a, s, r in rows if a.ok and s]
    ranked = sorted((c for c in candidates if c[1] > 0 and c[0].name != LLAMA_CPP),
                    key=lambda c: (-c[1], c[0].name))
    llama = next((f for f, _ in candidates if f.name == LLAMA_CPP), None)
    low = sorted((c for c in candidates if c[1] <= 0 and c[0].name != LLAMA_CPP),
                 key=lambda c: (-c[1], c[0].name))
    if ranked:
        chosen = ranked[0][0]
        reason = f"highest rank ({ranked[0][1]}) among backends that can serve"
    elif llama is not None:
        chosen = llama
        reason = "llama.cpp: the default when no backend ranked above 0 can serve"
    elif low:
        chosen = low[0][0]
        reason = f"llama.cpp cannot serve; highest remaining rank ({low[0][1]})"
    else:
        lacks = "; ".join(f"{f.name}: {verdicts[f.name][1]}" for f, *_ in rows) or \
            "no backend is installed"
        err = (f"no installed backend can serve {bundle} ({lacks}). Install a backend for the "
               "bundle's artifacts (pip install eliza-backends[all]) or add a .gguf to text/.")
        return report(None, err, verdicts, Status.ERR_CANNOT_SERVE), None
    for f, r in candidates:
        if f is chosen:
            verdicts[f.name] = ("chosen", reason)
        elif r <= 0 and f.name != LLAMA_CPP and llama is not None:
            why = f.rank_reason() or "ranks itself at or below llama.cpp on this host"
            verdicts[f.name] = ("below-llama.cpp", f"rank {r} <= 0: {why}")
        else:
            verdicts[f.name] = ("lower-rank", f"rank {r} < {safe_rank(chosen)} of {chosen.name}"
                                if f.name != LLAMA_CPP else "a higher-ranked backend can serve")
    return report(chosen, None, verdicts), chosen


def _safe_can_serve(factory: Factory, bundle: Path) -> bool:
    try:
        return bool(factory.can_serve(bundle))
    except Exception:
        return False


def _unknown_backend(requested: str, requested_by: str | None,
                     factories: list[Factory]) -> str:
    installed = ", ".join(f.name for f in factories) or "none"
    msg = f"{requested_by} asks for backend {requested!r}, which is not installed " \
          f"(installed: {installed})."
    names = {n.lower() for f in factories for n in f.names()} | set(KNOWN_BACKENDS)
    key = requested.lower()
    close = [key] if key in KNOWN_BACKENDS else difflib.get_close_matches(key, sorted(names),
                                                                           n=1, cutoff=0.6)
    if close and close[0] != key:
        msg += f" Did you mean {close[0]!r}?"
    extra = KNOWN_BACKENDS.get(close[0]) if close else None
    if extra and close[0] not in {n.lower() for f in factories for n in f.names()}:
        msg += f" Install it with: pip install 'eliza-backends[{extra}]'."
    elif requested_by and requested_by.startswith(BACKEND_ENV):
        msg += f" Unset {BACKEND_ENV} to let the selector choose."
    else:
        msg += " Pass one of the installed names, or none to let the selector choose."
    return msg


__all__ = ["BACKEND_ENV", "Candidate", "SelectionReport", "Verdict", "explain", "select"]
