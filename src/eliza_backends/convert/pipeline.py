"""``eliza-backends bundle convert SRC OUT``: one source model to a bundle in every format.

Stages (each cached by content hash under the work directory, see :mod:`.stages`):

1. ``hf`` — the source made float32 once (:mod:`.float32_pass`): a float32 Hugging Face
   checkpoint and a float32 GGUF with the same weights. From a GGUF: dequantized, the GGUF
   keeps the source's metadata, the tokenizer is rebuilt from the GGUF vocabulary; from a
   Hugging Face folder: widened, the GGUF header written from its config and tokenizer
   (:mod:`.hf_source`, :mod:`.gguf_writer`); from the folder of a family whose GGUF llama.cpp
   writes (Gemma 4): the family's float32 folder (its text model) and the GGUF by llama.cpp's
   own ``convert_hf_to_gguf.py`` (:mod:`.llamacpp_convert`). Either way every tokenizer file must
   tokenize tricky strings exactly as llama.cpp does on that GGUF (:mod:`.tokenizer_check`);
   ``mtp-f32`` (``draft=``) — a Gemma 4 target's ``gemma4_assistant``, by the same script, under
   ``text/draft/mtp/``; with MLX in the plan, ``mtp-mlx`` places it there as an MLX folder too
   (mlx-vlm's drafter, the MLX backend's ``drafter="mtp"``);
2. ``gguf-<precision>`` — llama.cpp's quantizer on the float32 GGUF;
3. ``mlx-<precision>`` — ``mlx_lm convert`` + explicit, checked config;
4. ``litert-<precision>`` — litert-torch ``.tflite`` + a ``.litertlm`` packaged with the
   model's own start/stop tokens and tokenizer;
5. ``coreml-<precision>`` — a Core ML ``.mlpackage`` (converted on Linux; runs on macOS);
6. ``verify`` (``--verify``) — every artifact through ``open_stream`` against a transformers
   float32 reference: ``parity.json``.

The bundle (``OUT/text/...`` + ``manifest.json``) gets copies (hard links where possible) of
the stage outputs. Heavy tools are imported inside the stages only. What differs between
model families (facts, float32 folder, MLX expectations, LiteRT source and flags, Core ML
module, drafts) each stage asks the source's family (:mod:`.families`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..bundle import TEXT_DIR
from ..errors import BackendRuntimeError, InvalidArgumentError
from ..hashing import cache_dir, sha256_file
from ..manifest import write_manifest
from . import toolchain
from .families import ModelFamily, for_architecture
from .llamacpp_convert import confirmed, llamacpp_token_facts
from .plan import (
    DEFAULT_PRECISION,
    FORMAT_NAMES,
    FORMAT_TOOLS,
    PRECISIONS,
    ConvertPlan,
    host_formats,
    parse_plan,
)
from .stages import StageRunner, cache_limit_bytes, content_key, output_bytes, recorded_seconds


def default_cache_dir() -> Path:
    """``$ELIZA_CACHE_DIR`` or ``$XDG_CACHE_HOME/eliza-backends`` (``~/.cache/...``): the one
    cache root of :func:`eliza_backends.hashing.cache_dir`."""
    return cache_dir()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.").lower() or "model"


def _place(src: Path, dest: Path) -> None:
    """Copy a stage output into the bundle (hard links for files where possible)."""
    if dest.exists() or dest.is_symlink():
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        else:
            dest.unlink()
    if src.is_dir():
        shutil.copytree(src, dest, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(src), str(dest))


def _link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], plan: ConvertPlan, *,
            draft: str | os.PathLike[str] | None = None,
            work_dir: str | os.PathLike[str] | None = None,
            log: TextIO | None = sys.stderr, tool_output: bool = False) -> dict[str, Any]:
    """Convert ``src`` (a ``.gguf`` file or a Hugging Face checkpoint folder) into the bundle
    ``out``; returns the conversion report (also written to ``out/convert.json``).
    ``draft``: a Gemma 4 target's ``gemma4_assistant`` folder, converted to a float32 GGUF
    under ``text/draft/mtp/`` (manifest role ``draft``, kind ``mtp``), and with MLX in the plan
    placed there as an MLX folder too.
    ``log`` gets one line per stage; the tools' own output (progress bars, warnings) goes to
    each stage's ``tools.log`` unless ``tool_output``."""
    source = Path(src)
    from_hf = _check_request(source, plan)
    draft_dir = _check_draft(draft, from_hf)
    root = Path(out)
    cache_limit = cache_limit_bytes()  # (a bad bound is refused before any work)
    _claim(root)
    runner = StageRunner(Path(work_dir) if work_dir else default_cache_dir() / "convert", log,
                         tool_output=tool_output)
    job = _float32_stage(source, from_hf, root, plan, runner)
    if draft_dir is not None:
        _mtp_stage(job, draft_dir)
    if "gguf" in plan.formats:  # (a projector serves the llama.cpp text model beside it)
        _place_projectors(job)
    for stage in _STAGES:
        if stage.fmt in plan.formats:
            _run_format(job, stage)
    manifest = write_manifest(root, name=job.name)
    runner.say(f"manifest: {len(manifest.artifacts)} artifacts, "
               f"{sum(len(a.files) for a in manifest.artifacts)} files")
    report = _report(job)
    if plan.verify:
        _verify_stage(job)
        report["parity"] = "parity.json"
    report["seconds"] = round(sum(r.seconds for r in runner.records), 1)
    (root / "convert.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    runner.say(f"bundle {root} ready")
    runner.evict_unused(cache_limit)
    return report


def _check_request(source: Path, plan: ConvertPlan) -> bool:
    """Whether ``source`` is a Hugging Face folder (else a ``.gguf`` file); refuses anything
    else, and a plan whose tools are not installed."""
    from_hf = source.is_dir()
    if from_hf and not (source / "config.json").is_file():
        raise InvalidArgumentError(f"{source} is a folder without config.json: not a Hugging "
                                   "Face checkpoint folder")
    if not from_hf and (not source.is_file() or source.suffix.lower() != ".gguf"):
        raise InvalidArgumentError(f"{source} is not a .gguf file or a Hugging Face folder")
    toolchain.require("hf")
    for fmt in plan.formats:
        toolchain.require(FORMAT_TOOLS[fmt])
    if plan.verify:
        toolchain.require("verify")
    return from_hf


def _check_draft(draft: str | os.PathLike[str] | None, from_hf: bool) -> Path | None:
    """The ``--draft`` folder (None when there is none); refuses a draft for a GGUF source
    and anything that is not a Hugging Face folder."""
    if draft is None:
        return None
    path = Path(draft)
    if not from_hf:
        raise InvalidArgumentError("--draft goes with a Hugging Face folder source (a Gemma 4 "
                                   "target); a GGUF source takes no draft folder")
    if not (path / "config.json").is_file():
        raise InvalidArgumentError(f"--draft {path}: not a Hugging Face folder (no config.json)")
    return path


def _claim(root: Path) -> None:
    """Make ``root`` this command's bundle: new or empty, or one it made before (whose old
    outputs are dropped); marked "in progress" until the report replaces the mark."""
    if root.exists() and any(root.iterdir()):
        if not (root / "convert.json").is_file():
            raise InvalidArgumentError(f"{root} exists and is not a bundle this command made; "
                                       "choose an empty or new directory")
        shutil.rmtree(root / TEXT_DIR, ignore_errors=True)  # our own earlier output: replaced
        for stale in ("parity.json", "manifest.json"):
            (root / stale).unlink(missing_ok=True)
    # claimed before the first stage, so a run that is interrupted can be rerun into ``root``
    # (the cached stages make it resume); the finished report replaces this one
    root.mkdir(parents=True, exist_ok=True)
    (root / "convert.json").write_text(json.dumps({"status": "in progress"}) + "\n")


@dataclass
class _Job:
    """One conversion after its ``hf`` stage: what every format stage reads, and what they
    add (artifacts, stage keys, checked configs) for the report. Single-threaded."""

    source: Path
    from_hf: bool
    src_sha: str
    src_bytes: int
    root: Path
    name: str
    plan: ConvertPlan
    runner: StageRunner
    versions: dict[str, Any]
    facts: Any
    family: ModelFamily
    hf: Any  # the ``hf`` stage's record
    tokenizer_check: dict[str, Any]
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    stage_keys: list[str] = field(default_factory=list)
    checked: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"mlx": {}, "coreml": {}})

    @property
    def text(self) -> Path:
        return self.root / TEXT_DIR

    @property
    def hf_dir(self) -> Path:
        return Path(self.hf.directory) / "hf"

    @property
    def f32_gguf(self) -> Path:
        return Path(self.hf.directory) / "model-f32.gguf"

    def record(self, fmt: str, precision: str, rel: list[Path], stage: Any) -> None:
        size = sum(output_bytes(p) for p in rel)
        self.artifacts.append({"format": fmt, "precision": precision,
                               "paths": [p.relative_to(self.root).as_posix() for p in rel],
                               "bytes": size, "seconds": round(recorded_seconds(stage), 1),
                               "cached": stage.cached})
        self.stage_keys.append(stage.key)


def _float32_stage(source: Path, from_hf: bool, root: Path, plan: ConvertPlan,
                   runner: StageRunner) -> _Job:
    """Hash and read the source, run the ``hf`` stage (float32 checkpoint + GGUF, tokenizers
    checked) and lay out ``root/text``."""
    versions = toolchain.versions()
    code = toolchain.code_hash("facts", "gguf_source", "hf_folder", "hf_source", "hf_checkpoint",
                               "tokenizer_build", "float32_pass", "gguf_writer", "tokenizer_check",
                               "families/__init__", "families/base")
    llama_cpp_script: Path | None = None
    if from_hf:
        from .hf_source import HFSource

        hsrc = HFSource(source)
        family = hsrc.family
        src_bytes = hsrc.size()
        runner.say(f"source {source} (Hugging Face folder, {src_bytes / 1e6:.1f} MB): hashing")
        src_sha = hsrc.content_sha256()
        facts = hsrc.facts()
        name = plan.name or _slug(facts.name)
        code = content_key(code, toolchain.code_hash(*family.code_modules))
        if family.llama_cpp_gguf:
            llama_cpp_script = _llama_cpp_request(plan)
            code = content_key(code, toolchain.code_hash("llamacpp_convert"),
                               _converter_hash(llama_cpp_script))
    else:
        from .gguf_source import GGUFSource

        src_bytes = source.stat().st_size
        runner.say(f"source {source} ({src_bytes / 1e6:.1f} MB): hashing")
        src_sha = sha256_file(source)
        gsrc = GGUFSource(source)
        facts = confirmed(gsrc.facts(), source)
        family = for_architecture(facts.architecture)
        code = content_key(code, toolchain.code_hash(*family.code_modules))
        base, label = gsrc.get("general.basename"), gsrc.get("general.size_label")
        name = plan.name or _slug(f"{base}-{label}" if base and label else facts.name)

    from .float32_pass import write_f32_from_hf, write_hf_and_f32_gguf, write_hf_config
    from .tokenizer_check import check_tokenizers

    def build_hf(d: Path) -> None:
        hf_out, gguf_out = d / "hf", d / "model-f32.gguf"
        if llama_cpp_script is not None:  # llama.cpp's own converter on the folder
            from .llamacpp_convert import convert_hf_to_gguf

            family.write_float32_folder(hsrc, hf_out)
            for file_name, args in (*family.llama_cpp_runs(),
                                    *family.projector_runs(hsrc.config)):
                convert_hf_to_gguf(llama_cpp_script, source, d / file_name, d / "tools.log",
                                   extra_args=args)
        elif from_hf:
            write_f32_from_hf(hsrc, facts, hf_out, gguf_out)
            write_hf_config(confirmed(facts, gguf_out), hf_out)
        else:
            write_hf_and_f32_gguf(gsrc, facts, hf_out, gguf_out)
        report = check_tokenizers(gguf_out, hf_out)
        (d / "tokenizer_check.json").write_text(json.dumps(report, indent=1) + "\n")

    hf = runner.run("hf", (src_sha, from_hf, code, versions["gguf"], versions["safetensors"],
                           versions["llama-cpp-python"], versions["tokenizers"],
                           versions["sentencepiece"]), build_hf)
    if from_hf:  # end ids and BOS as llama.cpp reads the float32 GGUF written from the folder
        facts = confirmed(facts, hf.directory / "model-f32.gguf")
    tokenizer_check = json.loads((hf.directory / "tokenizer_check.json").read_text())
    add_bos, eog = facts.tokenizer.add_bos, facts.tokenizer.eog_ids
    runner.say(f"{facts.architecture} '{facts.name}': {facts.num_layers} layers, hidden "
               f"{facts.hidden_size}, vocab {facts.vocab_size} ({facts.tokenizer.model}), "
               f"BOS {'added' if add_bos else 'not added'}, end ids {list(eog)}; tokenizers "
               f"agree with llama.cpp on {', '.join(tokenizer_check)}")
    job = _Job(source, from_hf, src_sha, src_bytes, root, name, plan, runner, versions, facts,
               family, hf, tokenizer_check, stage_keys=[hf.key])
    job.text.mkdir(parents=True, exist_ok=True)
    return job


def _llama_cpp_request(plan: ConvertPlan) -> Path:
    """The llama.cpp converter script, for a source whose family's GGUF llama.cpp writes."""
    toolchain.require("hf-llama-cpp")
    script = toolchain.llama_cpp_converter()
    assert script is not None  # require checked
    return script


def _converter_hash(script: Path) -> str:
    from .llamacpp_convert import converter_hash

    return converter_hash(script)


def _source_config(job: _Job) -> dict[str, Any]:
    """A Hugging Face source's ``config.json`` ({} for a GGUF source)."""
    if not job.from_hf:
        return {}
    data = json.loads((job.source / "config.json").read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _place_projectors(job: _Job) -> None:
    """The multimodal projectors the ``hf`` stage wrote (the family's ``projector_runs``),
    placed under ``text/mmproj/`` (manifest role ``mmproj``)."""
    from ..bundle import MMPROJ_DIR

    for file_name, _args in job.family.projector_runs(_source_config(job)):
        dest = job.text / MMPROJ_DIR / f"{job.name}-{file_name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        _place(job.hf.directory / file_name, dest)
        job.record("gguf", "f32", [dest], job.hf)
        job.artifacts[-1].update(role="mmproj")


def _mtp_stage(job: _Job, folder: Path) -> None:
    """The ``mtp-f32`` stage: the MTP assistant at ``folder`` (a Gemma 4 target's), checked
    against the target by its family and converted by llama.cpp's converter; placed under
    ``text/draft/mtp/``. With MLX in the plan, ``mtp-mlx``: the family's MLX folder of it
    there too."""
    from ..bundle import DRAFT_DIR, MTP_DIR
    from .families import check_draft
    from .hf_folder import folder_sha256

    check_draft(folder, job.facts)
    script = toolchain.llama_cpp_converter()
    assert script is not None  # the target, whose family takes drafts, required it
    sha = folder_sha256(folder)

    def build(d: Path) -> None:
        from .llamacpp_convert import convert_hf_to_gguf

        convert_hf_to_gguf(script, folder, d / "assistant-f32.gguf", d / "tools.log")
        llamacpp_token_facts(d / "assistant-f32.gguf")  # llama.cpp reads it back

    st = job.runner.run("mtp-f32", (job.hf.key, sha, toolchain.code_hash("llamacpp_convert"),
                                    _converter_hash(script)), build)
    dest = job.text / DRAFT_DIR / MTP_DIR / f"{job.name}-assistant-f32.gguf"
    dest.parent.mkdir(parents=True, exist_ok=True)
    _place(st.directory / "assistant-f32.gguf", dest)
    job.record("gguf", "f32", [dest], st)
    job.artifacts[-1].update(role="draft", kind="mtp", source=str(folder), source_sha256=sha)
    if "mlx" in job.plan.formats:
        st = job.runner.run("mtp-mlx", (job.hf.key, sha,
                                        toolchain.code_hash(*job.family.code_modules)),
                            lambda d: job.family.write_mlx_draft(folder, job.hf_dir,
                                                                 d / "assistant-mlx"))
        dest = dest.parent / f"{job.name}-assistant-mlx"
        _place(st.directory / "assistant-mlx", dest)
        job.record("mlx", "f32", [dest], st)
        job.artifacts[-1].update(role="draft", kind="mtp", source=str(folder),
                                 source_sha256=sha)


@dataclass(frozen=True)
class _FormatStage:
    """One output format as a table entry. For each precision ``p`` of the plan (after
    ``prepare(job)`` once, whose result ``prep`` the others get): ``reuse(job, p)`` may name a
    file that is already the output (no stage); else the stage ``<fmt>-<p>`` runs
    ``build(job, p, prep, dir)`` keyed by ``key(job, p, prep)`` (the ``hf`` key, the precision,
    tool versions, code hashes), and ``outputs(job, p, dir)`` (stage file -> bundle path under
    text/) are placed in the bundle; with ``checked``, the stage's ``checked.json`` goes into
    the report."""

    fmt: str
    prepare: Callable[[_Job], Any]
    key: Callable[[_Job, str, Any], tuple[Any, ...]]
    build: Callable[[_Job, str, Any, Path], None]
    outputs: Callable[[_Job, str, Path], list[tuple[Path, Path]]]
    checked: bool = False
    reuse: Callable[[_Job, str], Path | None] = lambda job, p: None


def _run_format(job: _Job, stage: _FormatStage) -> None:
    """Every precision of ``stage``'s format: run (or reuse) its stage, place its outputs."""
    prep = stage.prepare(job)
    for prec in job.plan.formats[stage.fmt]:
        ready = stage.reuse(job, prec)
        if ready is not None:
            dest = stage.outputs(job, prec, ready.parent)[0][1]
            _place(ready, dest)
            job.record(stage.fmt, prec, [dest], job.hf)
            continue
        st = job.runner.run(f"{stage.fmt}-{prec}", stage.key(job, prec, prep),
                            functools.partial(stage.build, job, prec, prep))
        places = stage.outputs(job, prec, Path(st.directory))
        for made, dest in places:
            _place(made, dest)
        if stage.checked:
            job.checked[stage.fmt][prec] = json.loads(
                (st.directory / "checked.json").read_text())
        job.record(stage.fmt, prec, [dest for _, dest in places], st)


def _gguf_prepare(job: _Job) -> None:
    if job.plan.keep_source_gguf and not job.from_hf:
        dest = job.text / f"{job.name}-source.gguf"
        _place(job.source, dest)
        job.artifacts.append({"format": "gguf", "precision": "source",
                              "paths": [dest.relative_to(job.root).as_posix()],
                              "bytes": output_bytes(dest), "seconds": 0.0, "cached": True})


def _gguf_build(job: _Job, p: str, prep: Any, d: Path) -> None:
    from .gguf_out import quantize

    quantize(job.f32_gguf, d / "model.gguf", p, job.plan.threads)


def _mlx_prepare(job: _Job) -> tuple[str, dict[str, Any]]:
    """("mlx_lm", the ModelArgs it must read back) for the float32 text folder, or
    ("mlx_vlm", the text_config fields written explicitly) for a multimodal source folder."""
    vlm_fields = job.family.mlx_vlm_text_fields(_source_config(job))
    if vlm_fields is not None:
        toolchain.require("mlx-vlm")
        return "mlx_vlm", vlm_fields
    return "mlx_lm", job.family.mlx_expected(job.facts, job.hf_dir)


def _mlx_build(job: _Job, p: str, prep: tuple[str, dict[str, Any]], d: Path) -> None:
    from .mlx_out import convert_mlx, convert_mlx_vlm

    tool, expected = prep
    if tool == "mlx_vlm":
        seen = convert_mlx_vlm(job.source, d / "mlx", p, expected, d / "mlx_convert.log")
    else:
        seen = convert_mlx(job.hf_dir, d / "mlx", p, expected, d / "mlx_convert.log")
    (d / "checked.json").write_text(json.dumps(seen, indent=1, default=str))


def _litert_prepare(job: _Job) -> tuple[Any, Any, bool]:
    """(the litert-torch python, its version, whether the tokenizer is SentencePiece's)."""
    exporter = toolchain.litert_torch_python()
    assert exporter is not None  # toolchain.require("litert") checked
    exporter_version = toolchain.litert_torch_version(exporter)
    plan = job.plan
    use_sp = plan.litert_tokenizer == "sp" or (
        plan.litert_tokenizer == "auto" and job.facts.tokenizer.model == "llama")
    return exporter, exporter_version, use_sp


def _litert_build(job: _Job, p: str, prep: tuple[Any, Any, bool], d: Path) -> None:
    from .litert_out import export_tflite, package_litertlm

    (exporter, _, use_sp), plan, hf_dir = prep, job.plan, job.hf_dir
    source = job.family.litert_source(hf_dir, d / "export-src")
    tfl = export_tflite(exporter, source, d / "export", precision=p,
                        prefill_lengths=list(plan.prefill_lengths),
                        cache_length=plan.cache_length, log_path=d / "export.log",
                        threads=plan.threads, extra_flags=job.family.litert_flags)
    os.replace(tfl, d / "model.tflite")
    shutil.rmtree(d / "export")
    if source != hf_dir:
        shutil.rmtree(source)
    package_litertlm(d / "model.tflite", d / "model.litertlm", job.facts,
                     cache_length=plan.cache_length,
                     hf_tokenizer=None if use_sp else hf_dir / "tokenizer.json",
                     sp_model=hf_dir / "tokenizer.model" if use_sp else None,
                     model_type=job.family.litert_model_type)


def _litert_outputs(job: _Job, p: str, d: Path) -> list[tuple[Path, Path]]:
    base = f"{job.name}-{p}"
    return [(d / "model.tflite", job.text / f"{base}.tflite"),
            (d / "model.litertlm", job.text / f"{base}.litertlm"),
            (job.hf_dir / "tokenizer.json", job.text / f"{base}.tokenizer.json")]


def _coreml_build(job: _Job, p: str, prep: Any, d: Path) -> None:
    from .coreml_out import convert_coreml

    checks = convert_coreml(job.hf_dir, job.facts, d / "model.mlpackage", p,
                            job.plan.cache_length, job.family.coreml_module)
    (d / "checked.json").write_text(json.dumps(checks, indent=1, default=str))


#: The format stages, in the order they run; their keys are the cache keys (keep them stable:
#: a changed key reconverts every cached stage).
_STAGES: tuple[_FormatStage, ...] = (
    _FormatStage(
        "gguf", _gguf_prepare,
        key=lambda job, p, _: (job.hf.key, p, job.versions["llama-cpp-python"],
                               toolchain.code_hash("gguf_out")),
        build=_gguf_build,
        outputs=lambda job, p, d: [(d / "model.gguf", job.text / f"{job.name}-{p}.gguf")],
        reuse=lambda job, p: job.f32_gguf if p == "f32" else None),
    _FormatStage(
        "mlx", _mlx_prepare,
        key=lambda job, p, prep: (job.hf.key, p, job.versions["mlx-lm"], job.versions["mlx"],
                                  toolchain.code_hash("mlx_out"), prep[0],
                                  job.versions["mlx-vlm"] if prep[0] == "mlx_vlm" else "-"),
        build=_mlx_build,
        outputs=lambda job, p, d: [(d / "mlx", job.text / f"{job.name}-mlx-{p}")],
        checked=True),
    _FormatStage(
        "litert", _litert_prepare,
        key=lambda job, p, prep: (job.hf.key, p, list(job.plan.prefill_lengths),
                                  job.plan.cache_length, prep[2], prep[1],
                                  job.versions["litert-lm-builder"],
                                  toolchain.code_hash("litert_out")),
        build=_litert_build, outputs=_litert_outputs),
    _FormatStage(
        "coreml", lambda job: None,
        key=lambda job, p, _: (job.hf.key, p, job.plan.cache_length,
                               job.versions["coremltools"], job.versions["torch"],
                               toolchain.code_hash(*job.family.coreml_code_modules)),
        build=_coreml_build,
        outputs=lambda job, p, d: [(d / "model.mlpackage",
                                    job.text / f"{job.name}-{p}.mlpackage")],
        checked=True),
)


def _report(job: _Job) -> dict[str, Any]:
    """The conversion report (``convert.json``) without ``parity`` and ``seconds``."""
    facts = job.facts
    return {
        "schema_version": 1,
        "source": {"path": str(job.source), "kind": "huggingface" if job.from_hf else "gguf",
                   "sha256": job.src_sha, "bytes": job.src_bytes},
        "model": {"architecture": facts.architecture, "name": facts.name,
                  "layers": facts.num_layers, "hidden": facts.hidden_size,
                  "vocab": facts.vocab_size, "tokenizer": facts.tokenizer.model,
                  "add_bos": facts.tokenizer.add_bos, "bos_id": facts.tokenizer.bos_id,
                  "eog_ids": list(facts.tokenizer.eog_ids),
                  "chat_template": facts.tokenizer.chat_template
                  is not None, "sliding_window": facts.sliding_window, **facts.extra},
        "tokenizer_check": job.tokenizer_check,
        "tools": job.versions, "converter_code": toolchain.code_hash(),
        "artifacts": job.artifacts, "mlx_config_checked": job.checked["mlx"],
        "coreml_checked": job.checked["coreml"], "stages": job.runner.summary(),
    }


def _verify_stage(job: _Job) -> None:
    """The ``verify`` stage: every artifact against transformers; ``parity.json`` in the
    bundle."""
    from . import verify_key
    from .verify import verify_bundle_parity

    root, versions = job.root, job.versions
    # keyed by the artifacts, the runtimes' versions, verify.py and the serving modules the
    # last verification of these artifacts loaded (see verify_key)
    vbase = verify_key.base_parts(job.stage_keys, versions)

    def build_verify(d: Path) -> None:
        parity = verify_bundle_parity(root, job.hf_dir, job.f32_gguf, job.facts,
                                      log=job.runner.say, threads=job.plan.threads)
        failed = {k: v["error"] for k, v in parity["artifacts"].items() if "error" in v}
        kinds = job.family.media_kinds(_source_config(job))
        if kinds:  # image / audio prompts too (a multimodal source)
            from .verify import _artifact_runs
            from .verify_media import verify_media

            parity["media"] = verify_media(root, job.source, kinds, _artifact_runs(root),
                                           job.family.media_reference,
                                           log=job.runner.say, threads=job.plan.threads)
            failed.update({f"{k} (media)": v["error"]
                           for k, v in parity["media"]["artifacts"].items() if "error" in v})
        text = json.dumps(parity, indent=1) + "\n"
        if failed:  # left in the bundle for a look; the stage stays unfinished
            (root / "parity.json").write_text(text)
            raise BackendRuntimeError(f"--verify could not run every artifact: {failed}")
        (d / "parity.json").write_text(text)
        verify_key.record_modules(job.runner.work_dir, vbase, verify_key.loaded_modules())

    st = job.runner.run("verify", verify_key.verify_key_parts(job.runner.work_dir, vbase),
                        build_verify)
    if not st.cached:  # filed under the modules it loaded, where the next run looks
        st = job.runner.rekey(st, verify_key.verify_key_parts(job.runner.work_dir, vbase))
    shutil.copy2(st.directory / "parity.json", root / "parity.json")


__all__ = ["DEFAULT_PRECISION", "FORMAT_NAMES", "PRECISIONS", "ConvertPlan", "convert",
           "default_cache_dir", "host_formats", "parse_plan"]
