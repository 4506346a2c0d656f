"""MLX artifact: ``mlx_lm convert`` on the HF checkpoint, then every field mlx-lm's model
reads made explicit in ``config.json`` and checked.

The trap this closes: a config without a top-level ``rope_theta`` (transformers 5.x writes
``rope_parameters`` instead) makes mlx-lm's llama silently use 10000 instead of the model's
base, and greedy parity drops to nothing. Here every ``ModelArgs`` field of the architecture
is written with the model's value (or, where the GGUF says nothing about it, mlx-lm's default,
written out), and :func:`check_config` proves mlx-lm parses back exactly the expected numbers.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import BundleError

#: precision name -> mlx_lm convert flags
PRECISIONS: dict[str, list[str]] = {
    "f32": ["--dtype", "float32"], "f16": ["--dtype", "float16"],
    "bf16": ["--dtype", "bfloat16"], "q8": ["-q", "--q-bits", "8"], "q4": ["-q", "--q-bits", "4"],
}
_COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
           "generation_config.json", "tokenizer.model")


def model_args_class(config: dict[str, Any]) -> Any:
    """mlx-lm's ``ModelArgs`` dataclass for ``config["model_type"]``."""
    from mlx_lm.utils import _get_classes

    _model, args = _get_classes(config=config)
    return args


def explicit_config(mlx_config: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """``mlx_config`` with every ModelArgs field present: the expected value where known,
    else mlx-lm's default written out."""
    cls = model_args_class(mlx_config)
    out = dict(mlx_config)
    for f in dataclasses.fields(cls):
        if f.name in expected:
            out[f.name] = expected[f.name]
        elif f.name not in out:
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out


def check_config(config: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """Parse ``config`` as mlx-lm does and compare every ModelArgs field with ``expected``;
    returns {field: value} as mlx-lm sees it. :class:`BundleError` lists any difference."""
    cls = model_args_class(config)
    args = cls.from_dict(config)
    seen = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    wrong = {k: (seen[k], expected[k]) for k in seen if k in expected and seen[k] != expected[k]
             and not (isinstance(expected[k], float) and seen[k] == float(expected[k]))}
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in config]
    if wrong or missing:
        raise BundleError(f"mlx-lm would read this config differently from the model: "
                          f"{wrong} (read, expected); not explicit: {missing}")
    return seen


def _run_convert(tool: str, hf_path: Path, out_dir: Path, precision: str,
                 log_path: Path) -> None:
    """``python -m <tool> convert`` (mlx_lm / mlx_vlm) of ``hf_path`` into a fresh ``out_dir``
    at ``precision``; :class:`BundleError` with the log's tail when it fails."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    cmd = [sys.executable, "-m", tool, "convert", "--hf-path", str(hf_path),
           "--mlx-path", str(out_dir), *PRECISIONS[precision]]
    with open(log_path, "wb") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise BundleError(f"{tool} convert failed (exit {done.returncode}): "
                          f"{log_path.read_text(errors='replace')[-1500:]}")


def convert_mlx(hf_dir: Path, out_dir: Path, precision: str, expected: dict[str, Any],
                log_path: Path) -> dict[str, Any]:
    """Make the MLX folder ``out_dir`` from ``hf_dir``; returns the checked ModelArgs."""
    _run_convert("mlx_lm", hf_dir, out_dir, precision, log_path)
    # mlx_lm re-saves the tokenizer through transformers and writes a hub model card: put the
    # rebuilt tokenizer files back and drop the card
    for name in _COPIED:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, out_dir / name)
    (out_dir / "README.md").unlink(missing_ok=True)
    cfg_path = out_dir / "config.json"
    config = explicit_config(json.loads(cfg_path.read_text()), expected)
    if precision in ("f32", "f16", "bf16"):
        config["dtype"] = config["torch_dtype"] = {"f32": "float32", "f16": "float16",
                                                   "bf16": "bfloat16"}[precision]
    cfg_path.write_text(json.dumps(config, indent=2) + "\n")
    return check_config(config, expected)


def convert_mlx_vlm(source: Path, out_dir: Path, precision: str, text_fields: dict[str, Any],
                    log_path: Path) -> dict[str, Any]:
    """Make the MLX folder ``out_dir`` of a multimodal model with ``mlx_vlm convert`` from the
    source folder itself (towers, processor and tokenizer files included), with
    ``text_fields`` written into its ``text_config``; returns the text_config fields checked."""
    _run_convert("mlx_vlm", source, out_dir, precision, log_path)
    (out_dir / "README.md").unlink(missing_ok=True)
    cfg_path = out_dir / "config.json"
    config = json.loads(cfg_path.read_text())
    config["text_config"] = {**config.get("text_config", {}), **text_fields}
    cfg_path.write_text(json.dumps(config, indent=2) + "\n")
    seen = json.loads(cfg_path.read_text())["text_config"]
    wrong = {k: (seen.get(k), v) for k, v in text_fields.items() if seen.get(k) != v}
    if wrong:
        raise BundleError(f"mlx-vlm's folder reads its text_config differently: {wrong}")
    return {k: seen[k] for k in text_fields}


__all__ = ["PRECISIONS", "check_config", "convert_mlx", "convert_mlx_vlm", "explicit_config"]
