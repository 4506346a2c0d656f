"""The plugin's options model: what ``StreamConfig.options`` may say for it (no runtime import)."""

from __future__ import annotations

from typing import Literal

from eliza_backends.backend import Field, FrozenModel


class MLXOptions(FrozenModel):
    """``StreamConfig.options["mlx-coreml"]`` (also accepted under ``mlx`` / ``coreml``)."""

    engine: Literal["auto", "mlx", "coreml"] = Field(
        "auto", description="auto: the MLX folder when mlx runs here, else Core ML (macOS); "
        "mlx / coreml: only that engine.")
    artifact: str | None = Field(
        None, description="Name of the MLX folder / .mlpackage / .mlmodelc under text/ "
        "(default: the first by name).")
    compute_units: Literal["all", "cpu_only", "cpu_and_gpu", "cpu_and_ne"] = Field(
        "all", description="Core ML compute units (coremltools ComputeUnit).")
