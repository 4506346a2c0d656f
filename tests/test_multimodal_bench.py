"""``eliza-backends bench`` on a bundle that takes media: image and audio prefill times through
the seam beside llama-cpp-python's own libmtmd path (``eliza_llamacpp.mtmd_reference``), on
the tiny multimodal Gemma 4 (``examples/bundles/gemma4-mm-tiny``), and none on a text bundle.

The numbers themselves are not asserted (a shared machine); what is: both sides ran every
round, on the same prompt (the positions agree), the report and table carry them, and the
media files are the ones asked for (or the bundle's, or generated ones that decode).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("llama_cpp")

from eliza_backends.bench import BenchReport, bench
from eliza_backends.bench.media import media_samples, synthetic_audio, synthetic_image
from eliza_backends.media import audio_from_bytes, image_from_bytes

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-mm-tiny"


@pytest.fixture(scope="module")
def report() -> BenchReport:
    return bench(str(BUNDLE), ["llama.cpp"], prompt_tokens=8, gen_tokens=4, repeat=1,
                 config={"threads": 1}, progress=None, media_rounds=2,
                 media_files={"image": str(BUNDLE / "media" / "image-portrait.png")})


def test_bench_times_image_and_audio_beside_libmtmd_direct(report: BenchReport) -> None:
    assert not report.errors
    media = report.media_summary()["llama.cpp"]
    assert set(media) == {"image", "audio"}
    assert media["image"]["file"] == "image-portrait.png"  # the one asked for
    assert media["audio"]["file"] == "audio-chirp.wav"  # the bundle's first
    for row in media.values():
        assert row["reference"] == "llama-cpp-python mtmd_helper_eval_chunks"
        assert row["positions_agree"]
        for key in ("seam_wall_s", "seam_cpu_s", "reference_wall_s", "reference_cpu_s",
                    "ratio_wall", "ratio_cpu"):
            assert row[key] > 0, key
        assert row["first_token_s"] >= row["seam_wall_s"]
        assert 0 <= row["load"][0] <= row["load"][1]
    run = report.runs["llama.cpp"][0]["media"]["image"]
    assert len(run["seam"]) == len(run["reference"]) == 2
    assert media["image"]["positions"] == 70 + 13  # 70 soft tokens, markers, the text


def test_the_table_and_json_carry_the_media_rows(report: BenchReport) -> None:
    table = report.table()
    assert "media prefill (direct: llama-cpp-python mtmd_helper_eval_chunks" in table
    assert "image (image-portrait.png, 83 pos)" in table
    assert "audio (audio-chirp.wav, 38 pos)" in table
    assert json.loads(json.dumps(report.to_dict()))["media"]["llama.cpp"]["audio"]


def test_a_text_bundle_reports_no_media() -> None:
    report = bench(str(TINY_BUNDLE), ["llama.cpp"], prompt_tokens=8, gen_tokens=4, repeat=1,
                   progress=None, media_rounds=2)
    assert report.runs["llama.cpp"][0]["media"] is None
    assert report.media_summary() == {} and "media prefill" not in report.table()


def test_media_samples_fall_back_to_generated_files(tmp_path: Path) -> None:
    samples = {s.kind: s for s in media_samples(str(tmp_path), {"image", "audio"})}
    assert samples["image"].name == "generated image"
    image = image_from_bytes(samples["image"].data)
    assert (image.width, image.height) == (480, 336)
    assert audio_from_bytes(samples["audio"].data).seconds == 1.0
    assert samples["image"].data == synthetic_image()  # byte-identical between runs
    assert samples["audio"].data == synthetic_audio()
    assert [s.kind for s in media_samples(str(BUNDLE), {"audio"})] == ["audio"]


def test_the_cli_takes_the_media_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "eliza_backends", "bench", str(BUNDLE), "--backend",
         "llama.cpp", "--repeat", "1", "--prompt-tokens", "8", "--gen-tokens", "4",
         "--threads", "1", "--media-rounds", "1", "--audio",
         str(BUNDLE / "media" / "audio-tones.wav"), "--json"],
        capture_output=True, text=True, timeout=600, check=True)
    media = json.loads(out.stdout)["media"]["llama.cpp"]
    assert media["audio"]["file"] == "audio-tones.wav" and media["audio"]["positions_agree"]
