"""The plugin's options model: what ``StreamConfig.options`` may say for it (no runtime import)."""

from __future__ import annotations

from typing import Literal

from eliza_backends.backend import Field, FrozenModel

from .ladder import ACCELERATOR_ENV, RUNG_NAMES


class LiteRTOptions(FrozenModel):
    """``StreamConfig.options["litert-lm"]``."""

    session: Literal["auto", "interpreter", "engine"] = Field(
        "auto", description="interpreter (token-exact), engine (litert_lm.Engine), or auto: "
        "interpreter on the CPU rung, engine on an NPU/GPU rung.")
    runtime: Literal["interpreter", "compiled"] = Field(
        "compiled", description="Token-exact session runtime: the ai-edge-litert CompiledModel "
        "(KV cache in TensorBuffers updated in place; runs on the ladder's rung; the default, "
        "measured 1.3-1.5x faster here) or the Interpreter (KV cache in numpy, copied through "
        "each call; CPU).")
    artifact: str | None = Field(None, description="File name under text/ (default: first "
                                 ".litertlm, else first .tflite).")
    accelerator: str | None = Field(
        None, description=f"Force a ladder rung ({', '.join(RUNG_NAMES)}); overrides "
        f"{ACCELERATOR_ENV}. Absent = loud error.")
    cache_dir: str | None = Field(
        None, description="Cache dir (must exist): the engine's caches; for the token-exact "
        "session the .litertlm's TFLite section (copied out to be memory-mapped) and XNNPACK's "
        "packed weights (compiled runtime), reused by later loads. Default: a temporary dir "
        "owned by the inference context.")
