"""LiteRT-LM's Gemma 4 audio front end in numpy: the log-mel features LiteRT-LM 0.18.1's
``AudioPreprocessorMiniAudio`` computes from a clip (its ``audio_preprocessor_miniaudio.cc``,
``mel_filterbank.cc``; Gemma 4's configuration), for the LiteRT-LM oracle of
tools/make_gemma4_mm_litert.py.

What it does, and where transformers' ``Gemma4AudioFeatureExtractor`` (the reference oracle's)
differs:

- framing: 320-sample windows every 160 samples, semicausal (160 zeros first) on both sides;
  LiteRT-LM makes **one frame per full hop, ``n // 160``** (100 for 1 s); transformers 5.24
  needs ``frame_length + 1`` = 321 samples a window (its pre-emphasis unfold) and makes
  ``(n + 160 - 321) // 160 + 1`` (**99** for 1 s): one frame less at the end of a clip.
- window and FFT: periodic Hann, a 512-point real FFT (LiteRT-LM: float32 kissfft with centre
  zero padding, a phase shift only; transformers: ``np.fft.rfft(n=512)``).
- mel filterbank: 128 HTK-mel channels over 0-8000 Hz on magnitudes on both sides; LiteRT-LM's
  is TFLite-micro style (each FFT bin split between two channels, weights linear in mel, bin 0
  dropped), transformers' ``mel_filter_bank(norm=None, mel_scale="htk")`` triangles are linear
  in Hz.
- log: ``log(mel + 0.001)`` (LiteRT-LM in float32, transformers in float64).

Measured on examples/bundles/gemma4-mm-tiny-litert (tools/make_gemma4_mm_litert.py rebuilds its
torch model): fed to the torch model, these features give exactly the engine's greedy replies
(audio_chirp 16/16 tokens, audio_tones 13/13, to the engine's stop), transformers' features
give the reference's; the filterbank alone moves the features by up to 0.007 (log units) and
changes no token; the extra last frame alone changes the last audio soft token, and with it
the replies (after 14 and 3 tokens). Where the parameters come from: the algorithm is
LiteRT-LM's source (``audio_preprocessor_miniaudio.cc``, ``mel_filterbank.cc``; the Gemma 4
data processor builds it from ``AudioPreprocessorConfig::CreateDefaultGemma4Config``, whose
body the stored LiteRT-LM sources did not show); the values are the Gemma 4 audio settings a
third-party port of the same front end reads from an EmbeddingGemma 2 bundle's metadata
(frame 320, hop 160, FFT 512, 128 bins over 0-8000 Hz, floor 0.001 added before the log,
semicausal, periodic Hann), which are also transformers'. The token-exact agreement above is
what confirms them for LiteRT-LM 0.18.1.
"""

from __future__ import annotations

import math
from typing import Any

SAMPLE_RATE = 16000
FRAME_LENGTH = 320
HOP_LENGTH = 160
FFT_LENGTH = 512
MEL_BINS = 128
MEL_LOW_HZ = 0.0
MEL_HIGH_HZ = 8000.0
MEL_FLOOR = 1e-3


def _hz_to_mel(hz: Any) -> Any:
    import numpy as np

    return 1127.0 * np.log1p(np.asarray(hz, dtype=np.float64) / 700.0)


def mel_weights() -> Any:
    """LiteRT-LM's filterbank as a dense ``[FFT_LENGTH // 2 + 1, MEL_BINS]`` matrix over FFT
    magnitudes: bin ``i`` in ``start..end`` goes to channel ``c`` with weight ``w`` and to
    ``c + 1`` with ``1 - w``, ``w`` linear in mel between the mel-spaced channel centres."""
    import numpy as np

    bins = FFT_LENGTH // 2 + 1
    mel_low, mel_high = float(_hz_to_mel(MEL_LOW_HZ)), float(_hz_to_mel(MEL_HIGH_HZ))
    spacing = (mel_high - mel_low) / (MEL_BINS + 1)
    hz_per_bin = SAMPLE_RATE / (2.0 * (bins - 1))
    start, end = int(1.5 + MEL_LOW_HZ / hz_per_bin), int(MEL_HIGH_HZ / hz_per_bin)
    weights = np.zeros((bins, MEL_BINS))
    for i in range(start, end + 1):
        pos = (float(_hz_to_mel(i * hz_per_bin)) - mel_low) / spacing - 1
        channel = math.ceil(pos) - 1
        w = 1.0 - (pos - channel)
        if channel >= 0:
            weights[i, channel] += w
        if channel + 1 < MEL_BINS:
            weights[i, channel + 1] += 1.0 - w
    return weights


def log_mel(pcm: Any) -> Any:
    """``[frames, MEL_BINS]`` float32 log-mel features of float32 16 kHz mono ``pcm`` (one
    clip, from a fresh preprocessor: ``max(len // HOP_LENGTH, 1)`` frames)."""
    import numpy as np

    x = np.asarray(pcm, dtype=np.float32)
    padded = np.concatenate([np.zeros(HOP_LENGTH, np.float32), x,
                             np.zeros(FRAME_LENGTH, np.float32)])
    frames = max(len(x) // HOP_LENGTH, 1)
    windows = np.stack([padded[k * HOP_LENGTH:k * HOP_LENGTH + FRAME_LENGTH]
                        for k in range(frames)])
    n = np.arange(FRAME_LENGTH, dtype=np.float32)
    hann = (0.5 - 0.5 * np.cos(np.float32(2 * np.pi / FRAME_LENGTH) * n)).astype(np.float32)
    spectrum = np.fft.rfft(windows * hann, n=FFT_LENGTH, axis=-1).astype(np.complex64)
    mel = np.abs(spectrum).astype(np.float64) @ mel_weights()
    return np.log(mel.astype(np.float32) + np.float32(MEL_FLOOR)).astype(np.float32)
