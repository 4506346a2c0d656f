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

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from .backend.factory import Factory
from .backend.types import Availability
from .bundle import FORMATS, ImplicitBundle, artifact_format, find_artifacts, is_bundle_dir
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
    #: The chosen backend's speculative drafters on this bundle: kind -> what a stream with
    #: ``drafter=kind`` would use, or why it cannot (:meth:`Factory.drafters`).
    drafters: Mapping[str, str] = field(default_factory=dict)
    #: What the chosen backend would load, and its architecture (:meth:`Factory.describe`).
    model: str = ""
    #: The media kinds the chosen backend takes on this bundle: kind -> its encoder
    #: (:meth:`Factory.media`); empty: text only.
    media: Mapping[str, str] = field(default_factory=dict)
    #: What the chosen backend embeds on this bundle (:meth:`Factory.embedding`, described):
    #: "" for a generation model; an embedding model serves embeddings only.
    embedding: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"bundle_dir": self.bundle_dir, "requested": self.requested,
                "requested_by": self.requested_by, "chosen": self.chosen, "error": self.error,
                "candidates": [c.to_dict() for c in self.candidates],
                "broken_plugins": list(self.broken_plugins),
                "error_code": None if self.error_code is None else self.error_code.symbol,
                "drafters": dict(self.drafters), "model": self.model, "media": dict(self.media),
                "embedding": self.embedding}

    def __str__(self) -> str:
        lines = [f"bundle: {self.bundle_dir}"]
        if self.requested:
            lines.append(f"requested: {self.requested} (by {self.requested_by})")
        lines.append(f"chosen: {self.chosen}" if self.chosen else f"error: {self.error}")
        if self.model:
            lines.append(f"model: {self.model}")
        for c in self.candidates:
            lines.append(f"  {c.name:<12} rank {c.rank:>4}  {c.verdict:<15} {c.reason}")
        lines.extend(f"  broken plugin: {p}" for p in self.broken_plugins)
        if self.drafters:
            lines.append(f"drafters ({self.chosen}):")
            lines.extend(f"  {kind:<12} {what}" for kind, what in self.drafters.items())
        if self.chosen:
            lines.append(f"media ({self.chosen}): " + (", ".join(
                f"{kind} ({what})" for kind, what in self.media.items()) or "none (text only)"))
            lines.append(f"task ({self.chosen}): " + (
                f"embeddings only ({self.embedding})" if self.embedding else "generation"))
        return "\n".join(lines)


def explain(bundle_dir: str | os.PathLike[str], *, backend: str | None = None,
            environ: Mapping[str, str] | None = None,
            registry: Registry | None = None) -> SelectionReport:
    """Run the selection and report every candidate's verdict (never raises for selection)."""
    report, _ = _resolve(bundle_dir, backend, environ, registry, detail=True)
    return report


def select(bundle_dir: str | os.PathLike[str], *, backend: str | None = None,
           environ: Mapping[str, str] | None = None, registry: Registry | None = None) -> Factory:
    """The factory that serves ``bundle_dir``; :class:`BackendSelectionError` if none can."""
    report, factory = _resolve(bundle_dir, backend, environ, registry, detail=False)
    if factory is None:
        raise BackendSelectionError(report.error or "no backend selected",
                                    code=report.error_code or Status.ERR_BACKEND_UNAVAILABLE)
    return factory


@dataclass
class _Row:
    """One backend as the selector sees it: can-serve, rank, and availability, each probed
    once; availability on first use (a backend that cannot serve the bundle is not asked,
    unless a report or an error needs its verdict)."""

    factory: Factory
    can_serve: bool
    rank: int
    why_not: str = ""  # why it cannot serve (empty when it can)
    has_artifact: bool = False  # the bundle has an artifact of one of its formats
    _availability: Availability | None = None

    @classmethod
    def probe(cls, factory: Factory, bundle: Path) -> _Row:
        serves = _safe_can_serve(factory, bundle)
        why = "" if serves else _safe_reason(factory, bundle)
        return cls(factory, serves, safe_rank(factory), why,
                   bool(find_artifacts(bundle, factory.formats)))

    @property
    def availability(self) -> Availability:
        """``factory.available()`` (see :func:`safe_available`), asked once."""
        if self._availability is None:
            self._availability = safe_available(self.factory)
        return self._availability

    @property
    def name(self) -> str:
        return self.factory.name

    @property
    def unrunnable(self) -> bool:
        """It is available and the bundle has its kind of artifact, which cannot run here."""
        return self.availability.ok and not self.can_serve and self.has_artifact

    def verdict(self) -> tuple[Verdict, str]:
        """The verdict before any choice: unavailable, cannot serve, or a candidate."""
        if not self.availability.ok:
            return "unavailable", self.availability.reason or "not available on this host"
        if not self.can_serve:
            return "cannot-serve", self.why_not
        return "lower-rank", f"rank {self.rank}"


@dataclass
class _Selection:
    """One selection in progress: the bundle, the hard request, every backend's row and
    verdict. :meth:`report` turns it into the :class:`SelectionReport`."""

    bundle: Path
    requested: str | None
    requested_by: str | None
    rows: list[_Row]
    broken: tuple[str, ...]
    verdicts: dict[str, tuple[Verdict, str]] = field(default_factory=dict)
    #: Whether the report describes the chosen backend's model and drafters (``explain``;
    #: ``select`` skips those header probes: opening a stream does not read them).
    detail: bool = True

    def verdict(self, row: _Row) -> tuple[Verdict, str]:
        """``row``'s verdict: the one the rules gave it, else its own (:meth:`_Row.verdict`)."""
        given = self.verdicts.get(row.name)
        return given if given is not None else row.verdict()

    def report(self, chosen: Factory | None, error: str | None,
               code: Status = Status.ERR_BACKEND_UNAVAILABLE) -> SelectionReport:
        """The report; ``select`` (not :attr:`detail`) that found a backend lists no
        candidates and no drafters, description or media (it returns only the factory), so
        it asks no other backend's availability and probes nothing more."""
        rows = () if chosen is not None and not self.detail else self.rows
        cands = tuple(Candidate(r.name, *self.verdict(r), r.availability.ok, r.can_serve,
                                r.rank, r.availability.detail) for r in rows)
        return SelectionReport(str(self.bundle), self.requested, self.requested_by,
                               chosen.name if chosen else None, error, cands, self.broken,
                               code if error else None,
                               _safe_drafters(chosen, self.bundle) if chosen and self.detail
                               else {},
                               _safe_describe(chosen, self.bundle) if chosen and self.detail
                               else "",
                               safe_media(chosen, self.bundle) if chosen and self.detail
                               else {},
                               _safe_embedding(chosen, self.bundle) if chosen and self.detail
                               else "")


def _gather(bundle_dir: str | os.PathLike[str], backend: str | None,
            environ: Mapping[str, str] | None, registry: Registry | None) -> _Selection:
    """Probe every registered backend once and read the hard request (argument, then env)."""
    reg = registry or default_registry()
    env = os.environ if environ is None else environ
    requested, requested_by = None, None
    if backend is not None and backend.strip():
        requested, requested_by = backend.strip(), "backend argument"
    elif env.get(BACKEND_ENV, "").strip():
        requested, requested_by = env[BACKEND_ENV].strip(), f"{BACKEND_ENV} env"
    bundle = Path(bundle_dir)
    rows = [_Row.probe(f, bundle) for f in reg.factories()]
    broken = tuple(f"{p.plugin}: {p.error}" for p in reg.problems())
    return _Selection(bundle, requested, requested_by, rows, broken)


def _resolve(bundle_dir: str | os.PathLike[str], backend: str | None,
             environ: Mapping[str, str] | None, registry: Registry | None, *,
             detail: bool) -> tuple[SelectionReport, Factory | None]:
    path = Path(bundle_dir)
    if not is_bundle_dir(path) and artifact_format(path) is not None:
        # a single artifact: select on it staged as a bundle, report the path that was given
        with ImplicitBundle(path) as staged:
            report, factory = _resolve_bundle(staged.root, backend, environ, registry, detail)
        return replace(report, bundle_dir=str(path)), factory
    return _resolve_bundle(path, backend, environ, registry, detail)


def _resolve_bundle(bundle_dir: Path, backend: str | None, environ: Mapping[str, str] | None,
                    registry: Registry | None,
                    detail: bool) -> tuple[SelectionReport, Factory | None]:
    sel = _gather(bundle_dir, backend, environ, registry)
    sel.detail = detail
    if not sel.bundle.is_dir():
        sel.verdicts = {r.name: ("cannot-serve", "no bundle") for r in sel.rows}
        return sel.report(None, f"bundle directory {sel.bundle} does not exist",
                          Status.ERR_BUNDLE), None
    if sel.requested is not None:
        return _hard_request(sel, sel.requested)
    return _auto_select(sel)


def _hard_request(sel: _Selection, requested: str) -> tuple[SelectionReport, Factory | None]:
    """Rule 1: the named backend, or an error saying why not (never a fallback)."""
    key = requested.lower()
    match = next((r for r in sel.rows if key in (n.lower() for n in r.factory.names())), None)
    for r in sel.rows:
        if r is not match:
            sel.verdicts[r.name] = ("not-requested", f"{sel.requested_by} asks for {requested}")
    if match is None:
        err = _unknown_backend(requested, sel.requested_by, [r.factory for r in sel.rows])
        return sel.report(None, err, Status.ERR_BACKEND_NOT_INSTALLED), None
    pinned = _safe_pinned(match.factory, requested)
    if pinned is not match.factory:  # an alias naming one engine: that engine's verdict
        match = _Row.probe(pinned, sel.bundle)
        sel.rows = [match if r.name == match.name else r for r in sel.rows]
    f = match.factory
    if not match.availability.ok:
        reason = match.availability.reason
        sel.verdicts[f.name] = ("unavailable", reason)
        if not match.availability.installed:
            err = (f"{sel.requested_by} asks for backend {requested!r} ({f.name}), whose "
                   f"runtime is not installed: {reason}")
            return sel.report(None, err, Status.ERR_BACKEND_NOT_INSTALLED), None
        err = (f"{sel.requested_by} asks for backend {requested!r} ({f.name}), which is "
               f"installed but not available on this host: {reason}. Unset it to let the "
               "selector choose, or fix the runtime install.")
        return sel.report(None, err), None
    if not match.can_serve:
        sel.verdicts[f.name] = ("cannot-serve", match.why_not)
        if match.has_artifact:  # its kind of artifact is there, and cannot run on this host
            err = (f"{sel.requested_by} asks for backend {requested!r} ({f.name}), which "
                   f"cannot serve {sel.bundle} here: {match.why_not}")
            return sel.report(None, err), None
        err = (f"{sel.requested_by} asks for backend {requested!r} ({f.name}), which cannot "
               f"serve {sel.bundle}: {match.why_not}. Add one (`eliza-backends bundle "
               "create`) or choose another backend.")
        return sel.report(None, err, Status.ERR_CANNOT_SERVE), None
    sel.verdicts[f.name] = ("chosen", f"requested by {sel.requested_by}")
    return sel.report(f, None), f


def _auto_select(sel: _Selection) -> tuple[SelectionReport, Factory | None]:
    """Rules 2-5: the highest rank above 0, else llama.cpp, else the best rank <= 0."""
    candidates = [r for r in sel.rows if r.can_serve and r.availability.ok]
    others = sorted((r for r in candidates if r.name != LLAMA_CPP),
                    key=lambda r: (-r.rank, r.name))
    llama = next((r for r in candidates if r.name == LLAMA_CPP), None)
    best = others[0] if others else None
    if best is not None and best.rank > 0:
        chosen, reason = best, f"highest rank ({best.rank}) among backends that can serve"
    elif llama is not None:
        chosen, reason = llama, "llama.cpp: the default when no backend ranked above 0 can serve"
    elif best is not None:
        chosen, reason = best, f"llama.cpp cannot serve; highest remaining rank ({best.rank})"
    else:
        return _nothing_serves(sel), None
    for r in candidates:
        sel.verdicts[r.name] = _candidate_verdict(r, chosen, reason, llama is not None)
    return sel.report(chosen.factory, None), chosen.factory


def _nothing_serves(sel: _Selection) -> SelectionReport:
    """Rule 5's error. When the bundle has artifacts, it says what would run them (a backend
    to install, or one that is installed but cannot run here); only a bundle with no artifact
    is told to add one."""
    absent = sorted({f.backend for f in FORMATS.values() if find_artifacts(sel.bundle, [f.name])}
                    - {r.name for r in sel.rows})
    missing = [r for r in sel.rows if r.can_serve and not r.availability.installed]
    unavailable = [r for r in sel.rows if r.can_serve and not r.availability.ok
                   and r.availability.installed]
    unrunnable = [r for r in sel.rows if r.unrunnable]
    blockers = [*(f"{name} serves its artifacts and is not installed: pip install "
                  f"'eliza-backends[{KNOWN_BACKENDS.get(name, name)}]'" for name in absent),
                *(f"{r.name} serves its artifacts and is not installed: "
                  f"{r.availability.reason}" for r in missing),
                *(f"{r.name} serves its artifacts and is installed but not available on this "
                  f"host: {r.availability.reason}" for r in unavailable),
                *(f"{r.name}: {r.why_not}" for r in unrunnable)]
    if blockers:
        code = Status.ERR_BACKEND_NOT_INSTALLED if not (unavailable or unrunnable) else \
            Status.ERR_BACKEND_UNAVAILABLE
        return sel.report(None, f"no backend can run {sel.bundle} on this host: "
                          + "; ".join(blockers), code)
    lacks = "; ".join(f"{r.name}: {sel.verdict(r)[1]}" for r in sel.rows) or \
        "no backend is installed"
    err = (f"no installed backend can serve {sel.bundle} ({lacks}): it has no model artifact "
           "under text/. Add one (a .gguf, `eliza-backends bundle create`).")
    return sel.report(None, err, Status.ERR_CANNOT_SERVE)


def _candidate_verdict(row: _Row, chosen: _Row, reason: str,
                       llama_serves: bool) -> tuple[Verdict, str]:
    if row is chosen:
        return "chosen", reason
    if row.rank <= 0 and row.name != LLAMA_CPP and llama_serves:
        why = row.factory.rank_reason() or "ranks itself at or below llama.cpp on this host"
        return "below-llama.cpp", f"rank {row.rank} <= 0: {why}"
    if row.name == LLAMA_CPP:
        return "lower-rank", "a higher-ranked backend can serve"
    return "lower-rank", f"rank {row.rank} < {chosen.rank} of {chosen.name}"


def _safe_can_serve(factory: Factory, bundle: Path) -> bool:
    try:
        return bool(factory.can_serve(bundle))
    except Exception:
        return False


def _safe_reason(factory: Factory, bundle: Path) -> str:
    try:
        return str(factory.cannot_serve_reason(bundle))
    except Exception as exc:
        return f"cannot_serve_reason() failed: {type(exc).__name__}: {exc}"


def _safe_drafters(factory: Factory, bundle: Path) -> dict[str, str]:
    try:
        return {str(k): str(v) for k, v in factory.drafters(bundle).items()}
    except Exception as exc:
        return {"?": f"drafters() failed: {type(exc).__name__}: {exc}"}


def safe_media(factory: Factory, bundle: str | os.PathLike[str]) -> dict[str, str]:
    """:meth:`Factory.media`; a failing plugin takes no media (``"?"`` says why)."""
    try:
        return {str(k): str(v) for k, v in factory.media(bundle).items()}
    except Exception as exc:
        return {"?": f"media() failed: {type(exc).__name__}: {exc}"}


def _safe_embedding(factory: Factory, bundle: Path) -> str:
    try:
        spec = factory.embedding(bundle)
    except Exception as exc:
        return f"embedding() failed: {type(exc).__name__}: {exc}"
    return spec.describe() if spec is not None else ""


def _safe_describe(factory: Factory, bundle: Path) -> str:
    try:
        return str(factory.describe(bundle))
    except Exception as exc:
        return f"describe() failed: {type(exc).__name__}: {exc}"


def _safe_pinned(factory: Factory, name: str) -> Factory:
    try:
        pinned = factory.pinned(name)
    except Exception:
        return factory
    return pinned if isinstance(pinned, Factory) else factory


def _unknown_backend(requested: str, requested_by: str | None,
                     factories: list[Factory]) -> str:
    installed = ", ".join(f.name for f in factories) or "none"
    msg = f"{requested_by} asks for backend {requested!r}, which is not installed " \
          f"(installed: {installed})."
    names = {n.lower() for f in factories for n in f.names()} | set(KNOWN_BACKENDS)
    key = requested.lower()
    import difflib  # (only an unknown backend name pays for it)

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


__all__ = ["BACKEND_ENV", "Candidate", "SelectionReport", "Verdict", "explain", "safe_media",
           "select"]
