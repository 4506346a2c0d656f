"""LiteRT backend for eliza-backends: ``text/*.litertlm`` (and ``text/*.tflite`` with
``prefill_<N>`` / ``decode`` signatures).

Two sessions:

* ``interpreter`` (token-exact): the model's own prefill/decode signatures on ai-edge-litert's
  Interpreter, the KV cache held in numpy, the core's numpy sampler; token ids in and out, prefix
  reuse, slots, cancel between chunks and tokens (:mod:`eliza_litert.session`).
* ``engine``: ``litert_lm.Engine`` (LiteRT-LM's own runtime, accelerators and benchmark info);
  text-level, so token ids must round-trip through the tokenizer, no slots, no prefix reuse
  (:mod:`eliza_litert.litert_lm_session`).

``options={"litert-lm": {"session": "auto" | "interpreter" | "engine"}}``; ``auto`` is the
interpreter on the CPU rung of the accelerator ladder and the engine on an NPU/GPU rung.

This module stays light: it imports neither ``ai_edge_litert`` nor ``litert_lm`` nor numpy.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping

from eliza_backends import (
    Availability,
    BackendRuntimeError,
    BackendSelectionError,
    BundleError,
    Factory,
    InferenceContext,
    Session,
    StreamConfig,
    hookimpl,
)
from eliza_backends.backend import (
    cpu_count,
    distribution_version,
    native_exit_to_logging,
    native_stderr_to_logging,
    quiet_by_default,
)

from .ladder import ACCELERATOR_ENV, LADDER, LadderResult, real_host, resolve
from .options import LiteRTOptions

#: LiteRT's own log lines (captured from fd 2 around loads); ERROR unless the
#: application sets a level (``eliza-backends -v`` shows INFO).
NATIVE_LOG = quiet_by_default(logging.getLogger("eliza_litert.native"))

__version__ = "0.1.0"

#: Measured with benchmarks/bench_litert.py on the tiny bundle (1 thread, 2-core x86_64 CPU
#: host, medians of interleaved runs; see the README): decode tok/s of the token-exact
#: interpreter session and of llama.cpp, both through the seam. The CPU rung's rank reason.
CPU_EVIDENCE = ("measured decode on x86_64 CPU: LiteRT 0.33-0.58x llama.cpp's tok/s on the "
                "tiny bundle (benchmarks/bench_litert.py) and 0.56-0.67x on an 87M-parameter "
                "llama at 1-2 threads (benchmarks/bench_litert_realistic.py)")
#: Rank on the CPU rung: below llama.cpp (0), because LiteRT measured slower there.
CPU_RANK = -10


class LiteRTFactory(Factory):
    """Serves ``text/*.litertlm`` / ``text/*.tflite`` on ai-edge-litert or litert_lm.Engine."""

    name = "litert-lm"
    aliases = ("litert",)
    formats = ("litertlm", "tflite")
    pip_extra = "litert"
    options_model = LiteRTOptions
    native_loggers = ("eliza_litert.native",)

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._cache: tuple[tuple[str, str], Availability, LadderResult] | None = None
        # rungs that failed to start in this process, and why (explain() reports them)
        self._fallbacks: dict[str, str] = {}

    def _fell_back(self, rung: str, to: str, why: str) -> None:
        """An unforced rung failed to start and ``to`` serves instead: say so in the log
        and, from now on, in ``explain()`` (``detail["fallback"]``)."""
        self._fallbacks[rung] = f"{rung} failed to start ({why}); fell back to {to}"
        _log.warning("litert-lm: %s", self._fallbacks[rung])

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def ladder(self, force: str | None = None, forced_by: str | None = None) -> LadderResult:
        """The accelerator rung this host would use (``force`` overrides the env)."""
        env = self._env()
        if force is None and env.get(ACCELERATOR_ENV, "").strip():
            force, forced_by = env[ACCELERATOR_ENV], f"{ACCELERATOR_ENV} env"
        return resolve(real_host(env), force=force, forced_by=forced_by)

    def _state(self) -> tuple[Availability, LadderResult]:
        env = self._env()
        key = (env.get(ACCELERATOR_ENV, ""), env.get("LD_LIBRARY_PATH", ""))
        if self._cache is None or self._cache[0] != key:
            ladder = self.ladder()
            self._cache = (key, self._probe_runtime(ladder), ladder)
        return self._cache[1], self._cache[2]

    @staticmethod
    def _probe_runtime(ladder: LadderResult) -> Availability:
        if importlib.util.find_spec("ai_edge_litert") is None:
            return Availability.missing("ai-edge-litert is not installed: pip install "
                                        "'eliza-backends[litert]'")
        if importlib.util.find_spec("numpy") is None or \
                importlib.util.find_spec("tokenizers") is None:
            return Availability.missing("numpy/tokenizers are missing: pip install "
                                        "'eliza-backends[litert]'")
        if ladder.chosen is None:
            return Availability.no(ladder.error or "no accelerator rung is usable",
                                   **ladder.detail())
        detail = ladder.detail()
        detail["ai-edge-litert"] = distribution_version("ai-edge-litert") or "?"
        lm = distribution_version("litert-lm-api")
        detail["litert-lm-api"] = lm or "not installed (engine session unavailable)"
        detail["ladder"] = ladder.summary()
        return Availability.yes(**detail)

    def available(self) -> Availability:
        """ai-edge-litert, numpy and tokenizers are installed (found, not imported) and a rung
        of the accelerator ladder is usable (a forced rung that is absent makes this false).
        ``detail["fallback"]``: rungs that failed to start here, and what served instead."""
        avail = self._state()[0]
        if not self._fallbacks:
            return avail
        return Availability(avail.ok, avail.reason,
                            {**avail.detail, "fallback": "; ".join(self._fallbacks.values())},
                            installed=avail.installed)

    def preference_rank(self) -> int:
        """The chosen rung's rank: NPU 40, GPU 20; on the CPU rung below llama.cpp (measured
        slower there)."""
        _, ladder = self._state()
        if ladder.chosen is None:
            return CPU_RANK
        return CPU_RANK if ladder.chosen.name == "cpu" else ladder.chosen.rank

    def rank_reason(self) -> str:
        _, ladder = self._state()
        if ladder.chosen is None:
            return ladder.error or "no accelerator rung"
        if ladder.chosen.name == "cpu":
            skipped = "; ".join(f"{r.name}: {p.reason.split(' (')[0]}"
                                for r, p in ladder.skipped)
            return (f"CPU rung [{skipped or 'forced'}]; LiteRT is slower than llama.cpp on CPU "
                    f"({CPU_EVIDENCE}), so it ranks {CPU_RANK}, below llama.cpp")
        return (f"{ladder.chosen.label} rung: rank {ladder.chosen.rank}, above llama.cpp "
                f"({ladder.summary()})")

    def describe(self, bundle_dir: str | os.PathLike[str]) -> str:
        """The artifact a stream would load; for a ``.litertlm``, the model type its
        LlmMetadata declares (a header read: the weights are not touched)."""
        where = super().describe(bundle_dir)
        if not where.endswith(".litertlm"):
            return where
        from .container import read_container

        try:
            kind = read_container(os.path.join(bundle_dir, where)).llm_metadata().model_type
        except BundleError:
            return where
        return f"{where} (LiteRT-LM model type {kind})" if kind else where

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        # LiteRT writes its load-time log lines to fd 2 itself: route them into logging (and
        # the ones it writes when the process exits: DestroyAccelerator ...)
        native_exit_to_logging(NATIVE_LOG)
        with native_stderr_to_logging(NATIVE_LOG):
            return self._open(context, config)

    def _open(self, context: InferenceContext, config: StreamConfig) -> Session:
        options: LiteRTOptions = self.parse_options(config)
        if options.accelerator is not None:
            ladder = self.ladder(options.accelerator, f"options[{self.name!r}].accelerator")
        else:
            ladder = self._state()[1]
        if ladder.chosen is None:
            raise BackendSelectionError(ladder.error or "no accelerator rung is usable")
        kind = options.session
        if kind == "auto":
            kind = "interpreter" if ladder.chosen.name == "cpu" else "engine"
        path = self.artifact(context.bundle_dir, name=options.artifact)
        if kind == "engine":
            if importlib.util.find_spec("litert_lm") is None:
                raise BackendSelectionError(
                    "the engine session needs litert-lm-api: pip install 'eliza-backends[litert]'"
                    " (or use session='interpreter')")
            if path.suffix.lower() != ".litertlm":
                try:
                    path = self.artifact(context.bundle_dir, formats=("litertlm",))
                except BundleError:
                    raise BackendSelectionError(
                        f"the engine session needs a .litertlm under {context.bundle_dir}/text/"
                        f"; {path.name} is a .tflite (use session='interpreter')") from None
            from .litert_lm_session import open_engine_session

            # the probes only saw files; if the engine cannot start on a rung that was not
            # forced, walk on down the ladder (the CPU rung always probes true)
            rungs = [ladder.chosen] if ladder.forced_by else [ladder.chosen] + [
                r for r in LADDER[LADDER.index(ladder.chosen) + 1:]
                if ladder.probes.get(r.name, r.probe(real_host(self._env()))).ok]
            failures: list[str] = []
            for rung in rungs:
                try:
                    session = open_engine_session(context, config, options, path, rung)
                except BackendRuntimeError as exc:
                    failures.append(f"{rung.name}: {exc.message}")
                    continue
                for failed in failures:
                    name, _, why = failed.partition(": ")
                    self._fell_back(name, rung.name, why)
                return session
            raise BackendRuntimeError("LiteRT-LM could not start on any usable rung: "
                                      + "; ".join(failures))
        from .model import shared_model
        from .session import LiteRTSession

        threads = config.threads or cpu_count()
        accel = ladder.chosen.engine_backend if options.runtime == "compiled" else "cpu"
        rung = ladder.chosen
        try:
            model = shared_model(context, path, threads, options.runtime, accel, options.cache_dir)
        except BundleError as exc:
            if accel == "cpu":
                raise
            # the accelerator, or the file? The CPU decides: a file it loads is sound
            model = shared_model(context, path, threads, options.runtime, "cpu",
                                 options.cache_dir)
            if ladder.forced_by:
                raise BackendRuntimeError(
                    f"the {ladder.chosen.label} accelerator ({ladder.forced_by}) cannot run "
                    f"{path.name}, which loads on the CPU: {exc.message}") from None
            self._fell_back(ladder.chosen.name, "cpu", exc.message)
            rung = next(r for r in LADDER if r.name == "cpu")
        drafter = self.make_drafter(context, config, model.info, greedy_only=True)
        return LiteRTSession(model, config, context, rung, drafter)


_log = logging.getLogger("eliza_litert")


@hookimpl
def eliza_backends_factories() -> list[Factory]:
    """The LiteRT factory."""
    return [LiteRTFactory()]


__all__ = ["LiteRTFactory", "LiteRTOptions", "eliza_backends_factories"]
