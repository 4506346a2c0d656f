"""``eliza-backends bundle convert SRC OUT``: one source model to a bundle in every format.

Stages (each cached by content hash under the work directory, see :mod:`.stages`):

1. ``hf`` — the source made float32 once (:mod:`.float32_pass`): a float32 Hugging Face
   checkpoint and a float32 GGUF with the same weights. From a GGUF: dequantized, the GGUF
   keeps the source's metadata, the tokenizer is rebuilt from the GGUF vocabulary; from a
   Hugging Face folder: widened, the GGUF header written from its config and tokenizer
   (:mod:`.hf_source`, :mod:`.gguf_writer`). Either way every tokenizer file must tokenize
   tricky strings exactly as llama.cpp does on that GGUF (:mod:`.tokenizer_check`);
2. ``gguf-<precision>`` — llama.cpp's quantizer on the float32 GGUF;
3. ``mlx-<precision>`` — ``mlx_lm convert`` + explicit, checked config;
4. ``litert-<precision>`` — litert-torch ``.tflite`` + a ``.litertlm`` packaged with the
   model's own start/stop tokens and tokenizer;
5. ``coreml-<precision>`` — a Core ML ``.mlpackage`` (converted on Linux; runs on macOS);
6. ``verify`` (``--verify``) — every artifact through ``open_stream`` against a transformers
   float32 reference: ``parity.json``.

The bundle (``OUT/text/...`` + ``manifest.json``) gets copies (hard links where possible) of
the stage outputs. Heavy tools are imported inside the stages only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..bundle import TEXT_DIR, write_manifest
from ..errors import BackendRuntimeError, InvalidArgumentError
from ..hashing import cache_dir, sha256_file
from . import toolchain
from .stages import StageRunner

FORMAT_NAMES = ("gguf", "mlx", "litert", "coreml")
PRECISIONS: dict[str, tuple[str, ...]] = {
    "gguf": ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k"),
    "mlx": ("f32", "f16", "bf16", "q8", "q4"),
    "litert": ("fp32", "int8"),
    "coreml": ("fp32", "fp16"),
}
DEFAULT_PRECISION = {"gguf": "f32", "mlx": "f32", "litert": "fp32", "coreml": "fp32"}
#: format -> the toolchain.NEEDS key that must be installed to make it
_TOOLS = {"gguf": "gguf", "mlx": "mlx", "litert": "litert", "coreml": "coreml"}


def default_cache_dir() -> Path:
    """``$ELIZA_CACHE_DIR`` or ``$XDG_CACHE_HOME/eliza-backends`` (``~/.cache/...``): the one
    cache root of :func:`eliza_backends.hashing.cache_dir`."""
    return cache_dir()


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
    return [f for f in FORMAT_NAMES if toolchain.can_make(_TOOLS[f])]


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


def _quiet(level: int, text: bytes, user: object) -> None:
    """llama.cpp log callback that drops everything (the converter prints its own lines)."""


_QUIET: Any = None


def llamacpp_token_facts(gguf_path: Path) -> tuple[tuple[int, ...], bool]:
    """(every end-of-generation id, eos first; whether BOS is added) as llama.cpp sees them."""
    import ctypes

    import llama_cpp as lc

    global _QUIET
    if _QUIET is None:
        _QUIET = lc.llama_log_callback(_quiet)
    lc.llama_log_set(_QUIET, ctypes.c_void_p(0))
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(gguf_path).encode(), params)
    if not model:
        raise InvalidArgumentError(f"llama.cpp cannot read {gguf_path}")
    try:
        vocab = lc.llama_model_get_vocab(model)
        n = lc.llama_vocab_n_tokens(vocab)
        eos = lc.llama_vocab_eos(vocab)
        eog = [t for t in range(n) if lc.llama_vocab_is_eog(vocab, t)]
        ordered = ([eos] if eos in eog else []) + [t for t in eog if t != eos]
        return tuple(ordered), bool(lc.llama_vocab_get_add_bos(vocab))
    finally:
        lc.llama_model_free(model)


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], plan: ConvertPlan, *,
            work_dir: str | os.PathLike[str] | None = None,
            log: TextIO | None = sys.stderr, tool_output: bool = False) -> dict[str, Any]:
    """Convert ``src`` (a ``.gguf`` file or a Hugging Face checkpoint folder) into the bundle
    ``out``; returns the conversion report (also written to ``out/convert.json``).
    ``log`` gets one line per stage; the tools' own output (progress bars, warnings) goes to
    each stage's ``tools.log`` unless ``tool_output``."""
    source = Path(src)
    from_hf = source.is_dir()
    if from_hf and not (source / "config.json").is_file():
        raise InvalidArgumentError(f"{source} is a folder without config.json: not a Hugging "
                                   "Face checkpoint folder")
    if not from_hf and (not source.is_file() or source.suffix.lower() != ".gguf"):
        raise InvalidArgumentError(f"{source} is not a .gguf file or a Hugging Face folder")
    toolchain.require("hf")
    for fmt in plan.formats:
        toolchain.require(_TOOLS[fmt])
    if plan.verify:
        toolchain.require("verify")
    root = Path(out)
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
    runner = StageRunner(Path(work_dir) if work_dir else default_cache_dir() / "convert", log,
                         tool_output=tool_output)
    versions = toolchain.versions()
    code = toolchain.code_hash("gguf_source", "hf_source", "hf_checkpoint", "tokenizer_build",
                               "float32_pass", "gguf_writer", "tokenizer_check")
    if from_hf:
        from .hf_source import HFSource

        hsrc = HFSource(source)
        src_bytes = hsrc.size()
        runner.say(f"source {source} (Hugging Face folder, {src_bytes / 1e6:.1f} MB): hashing")
        src_sha = hsrc.content_sha256()
        facts = hsrc.facts()
        name = plan.name or _slug(facts.name)
    else:
        from .gguf_source import GGUFSource

        src_bytes = source.stat().st_size
        runner.say(f"source {source} ({src_bytes / 1e6:.1f} MB): hashing")
        src_sha = sha256_file(source)
        gsrc = GGUFSource(source)
        facts = _confirmed(gsrc.facts(), source)
        base, label = gsrc.get("general.basename"), gsrc.get("general.size_label")
        name = plan.name or _slug(f"{base}-{label}" if base and label else facts.name)

    from .float32_pass import write_f32_from_hf, write_hf_and_f32_gguf, write_hf_config
    from .tokenizer_check import check_tokenizers

    def build_hf(d: Path) -> None:
        hf_out, gguf_out = d / "hf", d / "model-f32.gguf"
        if from_hf:
            write_f32_from_hf(hsrc, facts, hf_out, gguf_out)
            write_hf_config(_confirmed(facts, gguf_out), hf_out)
        else:
            write_hf_and_f32_gguf(gsrc, facts, hf_out, gguf_out)
        report = check_tokenizers(gguf_out, hf_out)
        (d / "tokenizer_check.json").write_text(json.dumps(report, indent=1) + "\n")

    hf = runner.run("hf", (src_sha, from_hf, code, versions["gguf"], versions["safetensors"],
                           versions["llama-cpp-python"], versions["tokenizers"],
                           versions["sentencepiece"]), build_hf)
    hf_dir, f32_gguf = hf.directory / "hf", hf.directory / "model-f32.gguf"
    if from_hf:  # end ids and BOS as llama.cpp reads the float32 GGUF written from the folder
        facts = _confirmed(facts, f32_gguf)
    tokenizer_check = json.loads((hf.directory / "tokenizer_check.json").read_text())
    add_bos, eog = facts.tokenizer.add_bos, facts.tokenizer.eog_ids
    runner.say(f"{facts.architecture} '{facts.name}': {facts.num_layers} layers, hidden "
               f"{facts.hidden_size}, vocab {facts.vocab_size} ({facts.tokenizer.model}), "
               f"BOS {'added' if add_bos else 'not added'}, end ids {list(eog)}; tokenizers "
               f"agree with llama.cpp on {', '.join(tokenizer_check)}")
    text = root / TEXT_DIR
    text.mkdir(parents=True, exist_ok=True)
    artifacts: list[dict[str, Any]] = []
    stage_keys = [hf.key]

    def record(fmt: str, precision: str, rel: list[Path], stage: Any) -> None:
        size = sum(_size(p) for p in rel)
        artifacts.append({"format": fmt, "precision": precision,
                          "paths": [p.relative_to(root).as_posix() for p in rel],
                          "bytes": size, "seconds": round(_stage_time(stage), 1),
                          "cached": stage.cached})
        stage_keys.append(stage.key)

    if "gguf" in plan.formats:
        if plan.keep_source_gguf and not from_hf:
            dest = text / f"{name}-source.gguf"
            _place(source, dest)
            artifacts.append({"format": "gguf", "precision": "source",
                              "paths": [dest.relative_to(root).as_posix()],
                              "bytes": _size(dest), "seconds": 0.0, "cached": True})
        for prec in plan.formats["gguf"]:
            dest = text / f"{name}-{prec}.gguf"
            if prec == "f32":
                _place(f32_gguf, dest)
                record("gguf", prec, [dest], hf)
                continue
            from .gguf_out import quantize

            def build_gguf(d: Path, p: str = prec) -> None:
                quantize(f32_gguf, d / "model.gguf", p, plan.threads)

            st = runner.run(f"gguf-{prec}", (hf.key, prec, versions["llama-cpp-python"],
                                             toolchain.code_hash("gguf_out")),
                            build_gguf)
            _place(st.directory / "model.gguf", dest)
            record("gguf", prec, [dest], st)

    mlx_checked: dict[str, Any] = {}
    if "mlx" in plan.formats:
        from .hf_checkpoint import config_dict
        from .mlx_out import convert_mlx

        expected = _mlx_expected(config_dict(facts))
        for prec in plan.formats["mlx"]:
            def build_mlx(d: Path, p: str = prec) -> None:
                seen = convert_mlx(hf_dir, d / "mlx", p, expected, d / "mlx_convert.log")
                (d / "checked.json").write_text(json.dumps(seen, indent=1, default=str))

            st = runner.run(f"mlx-{prec}", (hf.key, prec, versions["mlx-lm"], versions["mlx"],
                                            toolchain.code_hash("mlx_out")),
                            build_mlx)
            dest = text / f"{name}-mlx-{prec}"
            _place(st.directory / "mlx", dest)
            mlx_checked[prec] = json.loads((st.directory / "checked.json").read_text())
            record("mlx", prec, [dest], st)

    if "litert" in plan.formats:
        from .litert_out import export_tflite, package_litertlm

        exporter = toolchain.litert_torch_python()
        assert exporter is not None  # toolchain.require("litert") checked
        exporter_version = toolchain.litert_torch_version(exporter)
        use_sp = plan.litert_tokenizer == "sp" or (
            plan.litert_tokenizer == "auto" and facts.tokenizer.model == "llama")
        for prec in plan.formats["litert"]:
            def build_litert(d: Path, p: str = prec) -> None:
                tfl = export_tflite(exporter, hf_dir, d / "export", precision=p,
                                    prefill_lengths=list(plan.prefill_lengths),
                                    cache_length=plan.cache_length, log_path=d / "export.log",
                                    threads=plan.threads)
                os.replace(tfl, d / "model.tflite")
                shutil.rmtree(d / "export")
                package_litertlm(d / "model.tflite", d / "model.litertlm", facts,
                                 cache_length=plan.cache_length,
                                 hf_tokenizer=None if use_sp else hf_dir / "tokenizer.json",
                                 sp_model=hf_dir / "tokenizer.model" if use_sp else None)

            st = runner.run(f"litert-{prec}",
                            (hf.key, prec, list(plan.prefill_lengths), plan.cache_length,
                             use_sp, exporter_version, versions["litert-lm-builder"],
                             toolchain.code_hash("litert_out")),
                            build_litert)
            base = f"{name}-{prec}"
            tfl, lm = text / f"{base}.tflite", text / f"{base}.litertlm"
            side = text / f"{base}.tokenizer.json"
            _place(st.directory / "model.tflite", tfl)
            _place(st.directory / "model.litertlm", lm)
            _place(hf_dir / "tokenizer.json", side)
            record("litert", prec, [tfl, lm, side], st)

    coreml_checked: dict[str, Any] = {}
    if "coreml" in plan.formats:
        from .coreml_out import convert_coreml

        for prec in plan.formats["coreml"]:
            def build_coreml(d: Path, p: str = prec) -> None:
                checks = convert_coreml(hf_dir, facts, d / "model.mlpackage", p,
                                        plan.cache_length)
                (d / "checked.json").write_text(json.dumps(checks, indent=1, default=str))

            st = runner.run(f"coreml-{prec}", (hf.key, prec, plan.cache_length,
                                               versions["coremltools"], versions["torch"],
                                               toolchain.code_hash("coreml_out")), build_coreml)
            dest = text / f"{name}-{prec}.mlpackage"
            _place(st.directory / "model.mlpackage", dest)
            coreml_checked[prec] = json.loads((st.directory / "checked.json").read_text())
            record("coreml", prec, [dest], st)

    manifest = write_manifest(root, name=name)
    runner.say(f"manifest: {len(manifest.artifacts)} artifacts, "
               f"{sum(len(a.files) for a in manifest.artifacts)} files")
    report: dict[str, Any] = {
        "schema_version": 1,
        "source": {"path": str(source), "kind": "huggingface" if from_hf else "gguf",
                   "sha256": src_sha, "bytes": src_bytes},
        "model": {"architecture": facts.architecture, "name": facts.name,
                  "layers": facts.num_layers, "hidden": facts.hidden_size,
                  "vocab": facts.vocab_size, "tokenizer": facts.tokenizer.model,
                  "add_bos": add_bos, "bos_id": facts.tokenizer.bos_id,
                  "eog_ids": list(eog), "chat_template": facts.tokenizer.chat_template
                  is not None, "sliding_window": facts.sliding_window},
        "tokenizer_check": tokenizer_check,
        "tools": versions, "converter_code": toolchain.code_hash(), "artifacts": artifacts,
        "mlx_config_checked": mlx_checked, "coreml_checked": coreml_checked,
        "stages": runner.summary(),
    }
    if plan.verify:
        from .verify import verify_bundle_parity

        vkey = (tuple(stage_keys), toolchain.runtime_code_hash(), versions,
                toolchain.code_hash("verify"))

        def build_verify(d: Path) -> None:
            parity = verify_bundle_parity(root, hf_dir, f32_gguf, facts, log=runner.say,
                                          threads=plan.threads)
            text = json.dumps(parity, indent=1) + "\n"
            failed = {k: v["error"] for k, v in parity["artifacts"].items() if "error" in v}
            if failed:  # left in the bundle for a look; the stage stays unfinished
                (root / "parity.json").write_text(text)
                raise BackendRuntimeError(f"--verify could not run every artifact: {failed}")
            (d / "parity.json").write_text(text)

        st = runner.run("verify", vkey, build_verify)
        shutil.copy2(st.directory / "parity.json", root / "parity.json")
        report["parity"] = "parity.json"
    report["seconds"] = round(sum(r.seconds for r in runner.records), 1)
    (root / "convert.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    runner.say(f"bundle {root} ready")
    return report


def _confirmed(facts: Any, gguf_path: Path) -> Any:
    """``facts`` with the end-of-generation ids and BOS behaviour llama.cpp reads from
    ``gguf_path`` (it also knows end-of-turn tokens by their text)."""
    import dataclasses

    eog, add_bos = llamacpp_token_facts(gguf_path)
    return dataclasses.replace(facts, tokenizer=dataclasses.replace(
        facts.tokenizer, eog_ids=eog, add_bos=add_bos))


def _mlx_expected(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
            "head_dim", "rms_norm_eps", "vocab_size", "num_key_value_heads", "rope_theta",
            "rope_local_base_freq", "query_pre_attn_scalar", "sliding_window",
            "sliding_window_pattern", "max_position_embeddings", "rope_scaling",
            "tie_word_embeddings", "attention_bias", "mlp_bias", "layer_types", "model_type")
    out = {k: cfg[k] for k in keys if k in cfg}
    if cfg.get("model_type") == "llama":
        out["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]
        out["sliding_window"] = None
        out["rope_traditional"] = False
    else:
        out.pop("layer_types", None)
        out.pop("tie_word_embeddings", None)
        out.pop("attention_bias", None)
    return out


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _stage_time(stage: Any) -> float:
    from .stages import stage_seconds

    return float(stage.seconds if not stage.cached else (stage_seconds(stage.directory) or 0.0))


__all__ = ["DEFAULT_PRECISION", "FORMAT_NAMES", "PRECISIONS", "ConvertPlan", "convert",
           "default_cache_dir", "host_formats", "parse_plan"]
