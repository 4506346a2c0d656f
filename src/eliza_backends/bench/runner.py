"""``eliza-backends bench``: measure each backend on a bundle, each run in a fresh process.

For every selected backend and repeat (interleaved: A B A B ...), a worker process opens a
stream, prefills ``prompt_tokens`` tokens and decodes ``gen_tokens``, and reports: load time
(open, including the weights), time to first token (prefill start to first token), prefill and
decode tokens/s, drafter acceptance, and peak RSS of the process. The driver prints medians
with min-max and can emit JSON.

Progress moves within a run: the worker reports its stage (load, prefill, decode n/N) on
stderr as :data:`PROGRESS_MARK` lines, and the driver redraws its bar from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

#: Starts a worker's stderr line that reports progress: ``MARK {"stage", "done", "total"}``.
PROGRESS_MARK = "\x1eeliza-progress "
#: Called with a run's stage ("load", "prefill", "decode"), work done and total (tokens).
ProgressCallback = Callable[[str, int, int], None]

PROMPT_TEXT = ("A lighthouse keeper kept a log of every ship that passed the rocks, the hour it "
               "passed, and the weather that carried it. ")
METRICS = ("load_s", "ttft_s", "prefill_tps", "decode_tps", "acceptance", "peak_rss_mb")


def run_worker(bundle: str, backend: str, prompt_tokens: int, gen_tokens: int,
               config: dict[str, Any], progress: ProgressCallback | None = None, *,
               media_rounds: int = 0,
               media_files: dict[str, str] | None = None) -> dict[str, Any]:
    """One measurement in this process (the driver runs it in a fresh one). ``progress`` is
    told each stage, and every 16 decoded tokens (one short stderr write in the worker: well
    under 0.1% of the decode time it measures). ``media_rounds`` > 0 and a session that takes
    media: then also the media prefills of :mod:`eliza_backends.bench.media` (``media_files``:
    kind -> file), in the result's ``"media"``."""
    from ..stream import open_stream

    report = progress or (lambda stage, done, total: None)
    report("load", 0, 1)
    t0 = time.perf_counter()
    stream = open_stream(bundle, backend=backend, max_tokens=gen_tokens, ignore_eos=True,
                         **config)
    load = time.perf_counter() - t0
    unit = stream.session.tokenize(PROMPT_TEXT, add_special=False)
    ids = (unit * (prompt_tokens // max(len(unit), 1) + 1))[:prompt_tokens]
    bos = stream.session.bos_token_id
    if bos is not None:
        ids = [bos, *ids[:-1]]
    with stream:
        report("prefill", 0, len(ids))
        stream.prefill(ids)
        first = None
        t_decode = time.perf_counter()
        n = 0
        for step in stream:
            if first is None and step.tokens:
                first = time.perf_counter()
            n += len(step.tokens)
            if n % 16 < len(step.tokens):
                report("decode", n, gen_tokens)
        t_end = time.perf_counter()
        m = stream.metrics
        decode_tps = (n - 1) / (t_end - first) if first is not None and n > 1 else 0.0
        media = None
        if media_rounds > 0 and stream.session.capabilities.media:
            report("media", 0, 1)
            media = _measure_media(stream, bundle, media_rounds, media_files)
        return {
            "backend": stream.backend, "load_s": load,
            "ttft_s": m.time_to_first_token, "prefill_tps": m.prefill_tokens_per_second,
            "decode_tps": decode_tps, "tokens": n, "drafted": m.drafted,
            "accepted": m.accepted, "acceptance": m.acceptance_rate,
            "decode_wall_s": t_end - t_decode,
            "peak_rss_mb": peak_rss_mb(), "media": media,
        }


def _measure_media(stream: Any, bundle: str, rounds: int,
                   files: dict[str, str] | None) -> dict[str, Any]:
    from ..registry import default_registry
    from .media import measure_media, media_samples

    factory = default_registry().get(stream.backend)
    assert factory is not None  # (it opened the stream)
    samples = media_samples(bundle, stream.session.capabilities.media, files)
    return measure_media(stream, factory, samples, rounds)


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB since it started its program: Linux's
    ``VmHWM``. Not ``ru_maxrss``: a child started with ``vfork``/``exec`` (what ``subprocess``
    does) inherits its parent's peak there, so a worker of a 1.7 GB driver reported 1.7 GB
    whatever it ran. Elsewhere ``ru_maxrss`` (bytes on macOS, KiB on the BSDs)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


@dataclass
class BenchReport:
    """Every run, and per-backend summaries (median / min / max of each metric)."""

    bundle: str
    prompt_tokens: int
    gen_tokens: int
    repeat: int
    config: dict[str, Any]
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, dict[str, float] | None]]:
        """Per backend and metric: {"median", "min", "max"} (None when never measured)."""
        return {backend: {key: summarize(r.get(key) for r in runs) for key in METRICS}
                for backend, runs in self.runs.items()}

    def media_summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per backend that measured media, per kind: see
        :func:`eliza_backends.bench.media.media_summary`."""
        from .media import media_summary

        out = {backend: media_summary(runs) for backend, runs in self.runs.items()}
        return {backend: kinds for backend, kinds in out.items() if kinds}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"bundle": self.bundle, "prompt_tokens": self.prompt_tokens,
                "gen_tokens": self.gen_tokens, "repeat": self.repeat, "config": self.config,
                "summary": self.summary(), "media": self.media_summary(), "runs": self.runs,
                "errors": self.errors}

    def table(self) -> str:
        """A plain-text table of the summaries."""
        head = ["backend", "decode tok/s", "prefill tok/s", "first token ms", "load s",
                "peak RSS MB", "acceptance"]
        rows = []
        for backend, s in self.summary().items():
            rows.append([backend, cell(s["decode_tps"]), cell(s["prefill_tps"]),
                         cell(s["ttft_s"], 1000), cell(s["load_s"], 1.0, ".2f"),
                         cell(s["peak_rss_mb"], 1.0, ".0f"),
                         cell(s["acceptance"], 100, ".0f") + ("%" if s["acceptance"] else "")])
        rows += [[b, f"error: {e}", "", "", "", "", ""] for b, e in self.errors.items()]
        media = self.media_table()
        return format_table(head, rows) + (f"\n\n{media}" if media else "")

    def media_table(self) -> str:
        """The media prefills (medians over every round; "" when none was measured): the
        seam's wall and CPU ms, the direct reference's, the ratios seam / reference."""
        head = ["backend", "media", "seam ms", "seam CPU ms", "first token ms", "direct ms",
                "direct CPU ms", "ratio", "CPU ratio", "load"]
        rows, names = [], set()
        for backend, kinds in self.media_summary().items():
            for kind, r in kinds.items():
                names.add(r.get("reference") or "")
                ms = {k: f"{r[k] * 1000:.1f}" if k in r else "-" for k in (
                    "seam_wall_s", "seam_cpu_s", "first_token_s", "reference_wall_s",
                    "reference_cpu_s")}
                agree = "" if r.get("positions_agree", True) else " (positions differ!)"
                rows.append([backend, f"{kind} ({r['file']}, {r['positions']} pos){agree}",
                             ms["seam_wall_s"], ms["seam_cpu_s"], ms["first_token_s"],
                             ms["reference_wall_s"], ms["reference_cpu_s"],
                             f"{r['ratio_wall']:.3f}" if "ratio_wall" in r else "-",
                             f"{r['ratio_cpu']:.3f}" if "ratio_cpu" in r else "-",
                             f"{r['load'][0]:.1f}-{r['load'][1]:.1f}"])
        if not rows:
            return ""
        direct = ", ".join(sorted(n for n in names if n)) or "none"
        return (f"media prefill (direct: {direct}; load: 1-minute load average)\n"
                + format_table(head, rows))


def summarize(values: Iterable[float | None]) -> dict[str, float] | None:
    """``{"median", "min", "max"}`` of the measured values (None entries skipped); None when
    nothing was measured."""
    got = [v for v in values if v is not None]
    if not got:
        return None
    return {"median": statistics.median(got), "min": min(got), "max": max(got)}


def cell(s: dict[str, float] | None, scale: float = 1.0, fmt: str = ".1f") -> str:
    """``"median (min-max)"`` of a :func:`summarize` result, times ``scale``; "-" for None."""
    if s is None:
        return "-"
    return f"{s['median'] * scale:{fmt}} ({s['min'] * scale:{fmt}}-{s['max'] * scale:{fmt}})"


def format_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned plain-text columns, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    return "\n".join(lines)


def spawn_worker(argv: Sequence[str], *, timeout: float = 1800, python: str | None = None,
                 cwd: str | None = None,
                 on_progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Run ``python *argv`` in a fresh process (``PYTHONHASHSEED=0``; ``python`` defaults to
    this interpreter) and parse the JSON object on the last line of its stdout.
    :class:`RuntimeError` with its last stderr line when it fails. ``on_progress`` is called,
    as they arrive, with the :data:`PROGRESS_MARK` lines the worker writes to stderr."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if on_progress is None:
        proc = subprocess.run([python or sys.executable, *argv], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=env)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    else:
        stdout, stderr, code = _run_with_progress([python or sys.executable, *argv], timeout,
                                                  cwd, env, on_progress)
    lines = stdout.strip().splitlines()
    if code != 0 or not lines:
        raise RuntimeError((stderr.strip().splitlines() or ["worker failed"])[-1])
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _run_with_progress(cmd: list[str], timeout: float, cwd: str | None, env: dict[str, str],
                       on_progress: ProgressCallback) -> tuple[str, str, int]:
    """Run ``cmd``, reading its stderr line by line (progress marks go to ``on_progress``,
    the rest is kept); a thread drains stdout so neither pipe can fill up."""
    import threading

    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=cwd, env=env) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        stdout = proc.stdout
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(stdout.read()), daemon=True)
        reader.start()
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        kept: list[str] = []
        try:
            for line in proc.stderr:
                if line.startswith(PROGRESS_MARK):
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        mark = json.loads(line[len(PROGRESS_MARK):])
                        on_progress(str(mark["stage"]), int(mark["done"]), int(mark["total"]))
                else:
                    kept.append(line)
            code = proc.wait()
        finally:
            timer.cancel()
        reader.join()
    if code < 0:
        raise subprocess.TimeoutExpired(cmd, timeout)
    return "".join(out), "".join(kept), code


def _progress(done: int, total: int, label: str, out: TextIO) -> None:
    width = 24
    filled = width * done // total
    out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<32}")
    if done == total:
        out.write("\n")
    out.flush()


def bench(bundle: str, backends: Sequence[str], *, prompt_tokens: int = 128,
          gen_tokens: int = 128, repeat: int = 3, config: dict[str, Any] | None = None,
          progress: TextIO | None = sys.stderr, timeout: float = 1800, media_rounds: int = 5,
          media_files: dict[str, str] | None = None) -> BenchReport:
    """Measure ``backends`` on ``bundle``, interleaved, each run in a fresh process; where a
    backend's session takes media, also ``media_rounds`` media prefills per run (0: none;
    see :mod:`eliza_backends.bench.media`)."""
    cfg = dict(config or {})
    report = BenchReport(bundle, prompt_tokens, gen_tokens, repeat, cfg)
    total, done = repeat * len(backends), 0
    for _ in range(repeat):
        for backend in backends:
            if backend in report.errors:
                done += 1
                continue
            if progress is not None:
                _progress(done, total, backend, progress)
            args = json.dumps({"bundle": bundle, "backend": backend,
                               "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
                               "config": cfg, "media_rounds": media_rounds,
                               "media_files": media_files})
            def within(stage: str, n: int, of: int, run: int = done,
                       name: str = backend) -> None:
                assert progress is not None
                step = f" {n}/{of}" if stage != "load" else ""
                _progress(run, total, f"{name}: {stage}{step}", progress)

            try:
                result = spawn_worker(["-m", "eliza_backends.bench", args], timeout=timeout,
                                      on_progress=within if progress is not None else None)
            except RuntimeError as exc:
                report.errors[backend] = str(exc)
            else:
                report.runs.setdefault(backend, []).append(result)
            done += 1
    if progress is not None:
        _progress(total, total, "done", progress)
    return report


def worker_main(argv: Sequence[str]) -> int:
    from ..errors import ElizaError

    spec = json.loads(argv[0])

    def report(stage: str, done: int, total: int) -> None:
        sys.stderr.write(PROGRESS_MARK + json.dumps(
            {"stage": stage, "done": done, "total": total}) + "\n")
        sys.stderr.flush()

    try:
        result = run_worker(spec["bundle"], spec["backend"], spec["prompt_tokens"],
                            spec["gen_tokens"], spec["config"], report,
                            media_rounds=spec.get("media_rounds", 0),
                            media_files=spec.get("media_files"))
    except ElizaError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


__all__ = ["PROGRESS_MARK", "BenchReport", "ProgressCallback", "bench", "cell", "format_table",
           "peak_rss_mb", "run_worker", "spawn_worker", "summarize", "worker_main"]
