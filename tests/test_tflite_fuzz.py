"""Malformed .tflite models on both LiteRT runtimes (and inside a .litertlm on the engine):
refused before the runtime sees them, or a typed error; never a crash (issue 15, item 3).

``tests/corpus/tflite/`` keeps the issue's case (a signature naming a subgraph that does not
exist: ai-edge-litert's ``get_input_details()`` segfaults on it) on all three runtimes, and what
``tests/tflite_fuzz.py`` found on 98aaa27 (each file says what that build did).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("tokenizers")

import tflite_fuzz

CORPUS = Path(__file__).parent / "corpus" / "tflite"


def test_tflite_corpus_is_refused_or_typed_never_fatal() -> None:
    files = sorted(CORPUS.glob("*.json"))
    assert len(files) >= 10
    report = tflite_fuzz.run([json.loads(p.read_text())["recipe"] for p in files])
    assert report.findings == [], report.describe_findings()
    verdicts = dict(zip((p.name for p in files), report.verdicts, strict=True))
    for name, (_, outcome, detail) in verdicts.items():
        if name.startswith("issue15_"):
            assert outcome == "error" and "names subgraph 20 of 14" in detail, (name, detail)


def test_fuzz_tflite_quick() -> None:
    report = tflite_fuzz.run(list(tflite_fuzz.cases(seed=0, n=300)))
    assert report.findings == [], report.describe_findings()
    assert report.outcomes.get("ok", 0) > 10  # not everything is refused


@pytest.mark.slow
def test_fuzz_tflite_2000() -> None:
    report = tflite_fuzz.run(list(tflite_fuzz.cases(seed=5, n=2000)))
    print(f"tflite fuzz: {report.cases} cases in {report.seconds:.0f} s: {report.outcomes}")
    assert report.findings == [], report.describe_findings()


def test_validation_accepts_the_real_exports_and_reads_no_weights() -> None:
    """The bundle's own .tflite and the .litertlm's section pass; the check touches the tables,
    not the weight bytes (it runs over a memory map)."""
    from eliza_litert.container import check_tflite, read_container

    root = tflite_fuzz.TEXT
    assert check_tflite(root / "tiny.tflite") == (root / "tiny.tflite").stat().st_size
    read_container(root / "tiny.litertlm").check_tflite_section()
