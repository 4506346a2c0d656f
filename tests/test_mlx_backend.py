"""The MLX / Core ML backend (plugins/eliza_mlx) on the tiny bundle: the conformance kit (oracle
parity: test_oracle_parity.py), the seam against mlx-lm used directly, Core ML gating off macOS, the
host-aware rank through ``explain()``, honest availability, and MLX folder validation."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import eliza_mlx
from eliza_mlx import MLXFactory
from eliza_mlx.probe import RuntimeStatus, check_mlx_folder

from eliza_backends import (
    BackendSelectionError,
    BundleError,
    CancelledError,
    Factory,
    InferenceContext,
    SlotError,
    Status,
    StreamConfig,
    UnsupportedOperationError,
    explain,
    open_stream,
    select,
)
from eliza_backends.testing import BackendConformance, generated_tokens, run_to_end

ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
MLX_DIR = TINY_BUNDLE / "text" / "tiny-mlx"
LINUX_ONLY = pytest.mark.skipif(sys.platform == "darwin", reason="Core ML gating is off-macOS")


class TestMLXConformance(BackendConformance):
    @pytest.fixture
    def factory(self) -> Factory:
        return MLXFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return TINY_BUNDLE


# ------------------------------------------------------------------------------ parity


def test_seam_equals_mlx_lm_used_directly() -> None:
    from direct_runtimes import mlx_greedy

    with open_stream(TINY_BUNDLE, backend="mlx", max_tokens=20, ignore_eos=True) as stream:
        for case in ORACLE["prompts"][:4]:
            stream.reset()
            stream.prefill(case["prompt_ids"])
            got = [t for step in stream for t in step.tokens]
            assert got == mlx_greedy(MLX_DIR, case["prompt_ids"], 20)


def test_text_prompt_and_chat_template() -> None:
    with open_stream(TINY_BUNDLE, backend="mlx") as stream:
        session = stream.session
        for case in ORACLE["prompts"]:
            if case["kind"] != "chat":
                assert session.tokenize(case["text"]) == case["prompt_ids"]
        assert session.bos_token_id == ORACLE["tokenizer"]["bos_id"]
        assert session.eog_token_ids == frozenset(ORACLE["tokenizer"]["stop_ids"])
        assert session.chat_template == ORACLE["tokenizer"]["chat_template"]
        assert session.template_tokens == {"bos_token": ORACLE["tokenizer"]["bos_token"],
                                           "eos_token": ORACLE["tokenizer"]["eos_token"]}


def test_cancel_between_prefill_chunks_rolls_the_cache_back() -> None:
    case = ORACLE["prompts"][0]
    head, rest = case["prompt_ids"][:5], case["prompt_ids"][5:]
    n = len(case["continuation_ids"])
    with open_stream(TINY_BUNDLE, backend="mlx", context_size=8192, batch_size=8,
                     max_tokens=n, ignore_eos=True) as stream:
        session = stream.session
        session.prefill(head)
        junk = (session.tokenize("lorem ipsum dolor ", add_special=False) * 2000)[:8000]
        timer = threading.Timer(0.05, session.cancel)
        timer.start()
        try:
            session.prefill(junk)
            pytest.skip("the 8000-token prefill beat a 50 ms timer")
        except CancelledError:
            pass
        finally:
            timer.join()
        assert session.history == tuple(head)
        assert session.reset_keep(len(head)) == len(head)
        session.prefill(rest)
        assert generated_tokens(run_to_end(session)) == case["continuation_ids"]


def test_small_prefill_chunks_and_async_iteration_agree() -> None:
    case = ORACLE["prompts"][0]

    async def consume(stream: object) -> list[int]:
        return [t async for step in stream for t in step.tokens]  # type: ignore[attr-defined]

    with open_stream(TINY_BUNDLE, backend="mlx", max_tokens=32, ignore_eos=True,
                     batch_size=3) as stream:
        stream.prefill(case["prompt_ids"])
        got = asyncio.run(consume(stream))
    assert got == case["continuation_ids"]


def test_sessions_share_one_model_load() -> None:
    factory = MLXFactory()
    cfg = StreamConfig(context_size=256, batch_size=64)
    with InferenceContext(TINY_BUNDLE) as ctx:
        a = factory.open(ctx, cfg)
        b = factory.open(ctx, cfg)
        assert a._model is b._model  # type: ignore[attr-defined]


def test_repeat_penalty_and_sampling_run() -> None:
    case = ORACLE["prompts"][0]
    outs = []
    for _ in range(2):
        with open_stream(TINY_BUNDLE, backend="mlx", max_tokens=16, ignore_eos=True,
                         temperature=0.8, top_k=40, top_p=0.9, min_p=0.05,
                         repeat_penalty=1.3, seed=3) as stream:
            stream.prefill(case["prompt_ids"])
            outs.append([t for step in stream for t in step.tokens])
    assert outs[0] == outs[1] and len(outs[0]) == 16
    with open_stream(TINY_BUNDLE, backend="mlx", max_tokens=16, ignore_eos=True,
                     repeat_penalty=5.0, tokens_per_step=4) as stream:
        stream.prefill(case["prompt_ids"])
        penalised = [t for step in stream for t in step.tokens]
    assert penalised != case["continuation_ids"][:16]


def test_slot_is_refused_by_another_backend(tmp_path: Path) -> None:
    slot = tmp_path / "mlx.slot"
    with open_stream(TINY_BUNDLE, backend="mlx") as stream:
        stream.prefill(ORACLE["prompts"][0]["prompt_ids"])
        stream.session.save_slot(slot)
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as other, \
            pytest.raises(SlotError, match="mlx-coreml"):
        other.session.restore_slot(slot)


def test_slot_after_reset_keep_continues_identically(tmp_path: Path) -> None:
    case = ORACLE["prompts"][1]
    ids = case["prompt_ids"]
    slot = tmp_path / "kept.slot"
    with open_stream(TINY_BUNDLE, backend="mlx", max_tokens=8, ignore_eos=True) as stream:
        stream.prefill([*ids, 7, 8, 9])
        run_to_end(stream.session)
        assert stream.reset_keep(len(ids)) == len(ids)
        stream.session.save_slot(slot)
    with open_stream(TINY_BUNDLE, backend="mlx", max_tokens=32, ignore_eos=True) as stream:
        stream.session.restore_slot(slot)
        assert generated_tokens(run_to_end(stream.session)) == case["continuation_ids"]


# ------------------------------------------------------------------------------ selection


def test_rank_rule_prefers_llama_cpp_on_a_cpu_host() -> None:
    if eliza_mlx.mlx_status().device == "metal":
        pytest.skip("this host has Metal: mlx ranks above llama.cpp here")
    factory = MLXFactory()
    assert factory.preference_rank() < 0
    report = explain(TINY_BUNDLE)
    assert report.chosen == "llama.cpp"
    row = next(c for c in report.candidates if c.name == "mlx-coreml")
    assert row.verdict == "below-llama.cpp"
    assert "Metal" in row.reason and "llama.cpp" in row.reason
    assert row.detail["mlx"].startswith("yes")
    assert select(TINY_BUNDLE, backend="mlx").name == "mlx-coreml"
    assert select(TINY_BUNDLE, backend="MLX-CoreML").name == "mlx-coreml"


def test_rank_rule_prefers_mlx_where_metal_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eliza_mlx, "mlx_status",
                        lambda: RuntimeStatus(True, device="metal", detail={"metal": "yes"}))
    assert MLXFactory().preference_rank() > 0
    report = explain(TINY_BUNDLE)
    assert report.chosen == "mlx-coreml"
    row = next(c for c in report.candidates if c.name == "mlx-coreml")
    assert "Metal" in row.reason or "highest rank" in row.reason


def test_mlx_only_bundle_auto_selects_mlx(tmp_path: Path) -> None:
    bundle = tmp_path / "mlx-only"
    shutil.copytree(MLX_DIR, bundle / "text" / "tiny-mlx")
    case = ORACLE["prompts"][2]
    with open_stream(bundle, max_tokens=32, ignore_eos=True) as stream:
        assert stream.backend == "mlx-coreml"
        stream.prefill(case["prompt_ids"])
        assert [t for step in stream for t in step.tokens] == case["continuation_ids"]


# ------------------------------------------------------------------------------ Core ML gating


def _coreml_bundle(root: Path, suffix: str = ".mlpackage") -> Path:
    pkg = root / "text" / f"model{suffix}"
    pkg.mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    return root


@LINUX_ONLY
def test_coreml_is_reported_unavailable_with_the_reason() -> None:
    avail = MLXFactory().available()
    assert avail  # mlx serves here
    assert avail.detail["coreml"].startswith("no:")
    assert "macOS" in avail.detail["coreml"]
    assert "macOS" in MLXFactory().rank_reason()


@LINUX_ONLY
@pytest.mark.parametrize("suffix", [".mlpackage", ".mlmodelc"])
def test_explain_predicts_open_for_a_coreml_only_bundle(tmp_path: Path, suffix: str) -> None:
    """Where Core ML cannot run, a Core-ML-only bundle is not "chosen" (open would fail):
    explain says why, for the auto selection and for every hard request."""
    bundle = _coreml_bundle(tmp_path, suffix)
    assert not MLXFactory().can_serve(bundle)
    assert "macOS" in MLXFactory().cannot_serve_reason(bundle)
    for backend in (None, "mlx", "mlx-coreml", "coreml"):
        report = explain(bundle, backend=backend)
        assert report.chosen is None, (backend, str(report))
        assert report.error is not None and "macOS" in report.error, (backend, report.error)
        mlx = next(c for c in report.candidates if c.name == "mlx-coreml")
        assert mlx.verdict in ("cannot-serve", "unavailable") and "macOS" in mlx.reason


@LINUX_ONLY
def test_a_hard_request_for_coreml_never_opens_mlx() -> None:
    """The tiny bundle has an MLX folder and a .mlpackage: backend="coreml" used to open MLX
    on Linux. It names Core ML, which cannot run here: fail loudly."""
    with pytest.raises(BackendSelectionError, match="Core ML prediction needs macOS") as err:
        open_stream(TINY_BUNDLE, backend="coreml")
    assert err.value.code == Status.ERR_BACKEND_UNAVAILABLE
    assert explain(TINY_BUNDLE, backend="coreml").chosen is None
    with open_stream(TINY_BUNDLE, backend="mlx") as stream:  # the whole backend still opens
        assert stream.backend == "mlx-coreml"


@LINUX_ONLY
@pytest.mark.parametrize("backend", ["coreml", "mlx", None])
def test_coreml_only_bundle_fails_loudly(tmp_path: Path, backend: str | None) -> None:
    bundle = _coreml_bundle(tmp_path)
    with pytest.raises(BackendSelectionError, match="Core ML prediction needs macOS") as err:
        open_stream(bundle, backend=backend)
    assert err.value.code == Status.ERR_BACKEND_UNAVAILABLE


@LINUX_ONLY
def test_engine_option_coreml_fails_loudly_off_macos() -> None:
    with pytest.raises(BackendSelectionError, match="Core ML prediction needs macOS") as err:
        open_stream(TINY_BUNDLE, backend="coreml", options={"coreml": {"engine": "coreml"}})
    assert err.value.code == Status.ERR_BACKEND_UNAVAILABLE


def test_engine_option_coreml_on_an_mlx_only_bundle_is_refused(tmp_path: Path) -> None:
    shutil.copytree(MLX_DIR, tmp_path / "text" / "tiny-mlx")
    with pytest.raises(BackendSelectionError) as err:
        open_stream(tmp_path, backend="mlx", options={"mlx": {"engine": "coreml"}})
    assert ".mlpackage" in err.value.message and err.value.code == Status.ERR_CANNOT_SERVE
    with pytest.raises(BackendSelectionError) as err:  # backend="coreml": Core ML alone
        open_stream(tmp_path, backend="coreml")
    if sys.platform == "darwin":
        assert ".mlpackage" in err.value.message and err.value.code == Status.ERR_CANNOT_SERVE
    else:
        assert "macOS" in err.value.message
        assert err.value.code == Status.ERR_BACKEND_UNAVAILABLE


# ------------------------------------------------------------------------------ availability

_NO_HEAVY = (
    "import sys, eliza_backends as eb\n"
    "rows = {b.name: b for b in eb.list_backends()}\n"
    "eb.explain(sys.argv[1])\n"
    "heavy = [m for m in ('mlx', 'mlx.core', 'mlx_lm', 'coremltools') if m in sys.modules]\n"
    "assert not heavy, heavy\n"
    "print(rows['mlx-coreml'].available, rows['mlx-coreml'].reason)\n"
)


def test_listing_and_explaining_import_no_runtime() -> None:
    out = subprocess.run([sys.executable, "-c", _NO_HEAVY, str(TINY_BUNDLE)],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("True")


def test_plain_mlx_without_a_backend_is_unavailable(tmp_path: Path) -> None:
    fake = tmp_path / "mlx"
    fake.mkdir()
    (fake / "core.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")  # no lib/libmlx.so
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _NO_HEAVY, str(TINY_BUNDLE)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("False")
    assert "without a backend library" in out.stdout and "mlx[cpu]" in out.stdout


def test_a_stray_mlx_directory_does_not_hide_the_real_one(tmp_path: Path) -> None:
    (tmp_path / "mlx" / "0.32.4").mkdir(parents=True)  # e.g. a cache dir in the cwd
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _NO_HEAVY, str(TINY_BUNDLE)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("True")


# ------------------------------------------------------------------------------ MLX folders


def _broken(root: Path, how: str) -> Path:
    folder = root / "text" / "tiny-mlx"
    shutil.copytree(MLX_DIR, folder)
    cfg = folder / "config.json"
    weights = folder / "model.safetensors"
    if how == "invalid-json":
        cfg.write_text("{not json")
    elif how == "json-list":
        cfg.write_text("[1, 2]")
    elif how == "no-model-type":
        data = json.loads(cfg.read_text())
        del data["model_type"]
        cfg.write_text(json.dumps(data))
    elif how == "unknown-architecture":
        data = json.loads(cfg.read_text())
        data["model_type"] = "no_such_architecture"
        cfg.write_text(json.dumps(data))
    elif how == "custom-code":
        data = json.loads(cfg.read_text())
        data["model_file"] = "evil.py"
        cfg.write_text(json.dumps(data))
    elif how == "bad-vocab":
        data = json.loads(cfg.read_text())
        data["vocab_size"] = "many"
        cfg.write_text(json.dumps(data))
    elif how == "wrong-shapes":
        data = json.loads(cfg.read_text())
        data["hidden_size"] = 256
        cfg.write_text(json.dumps(data))
    elif how == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "garbage-weights":
        weights.write_bytes(b"\xff" * 64)
    elif how == "missing-shard":
        index = folder / "model.safetensors.index.json"
        data = json.loads(index.read_text())
        first = next(iter(data["weight_map"]))
        data["weight_map"][first] = "model-00002-of-00002.safetensors"
        index.write_text(json.dumps(data))
    elif how == "no-tokenizer":
        (folder / "tokenizer.json").unlink()
    return root


BROKEN = ["invalid-json", "json-list", "no-model-type", "unknown-architecture", "custom-code",
          "bad-vocab", "wrong-shapes", "truncated-weights", "garbage-weights", "missing-shard",
          "no-tokenizer"]


@pytest.mark.parametrize("how", BROKEN)
def test_broken_mlx_folder_is_a_bundle_error(tmp_path: Path, how: str) -> None:
    bundle = _broken(tmp_path, how)
    with pytest.raises(BundleError) as err:
        open_stream(bundle, backend="mlx")
    assert err.value.code == Status.ERR_BUNDLE
    assert "tiny-mlx" in str(err.value)


def test_folder_without_config_is_not_an_mlx_artifact(tmp_path: Path) -> None:
    folder = tmp_path / "text" / "tiny-mlx"
    shutil.copytree(MLX_DIR, folder)
    (folder / "config.json").unlink()
    assert not MLXFactory().can_serve(tmp_path)
    with pytest.raises(BackendSelectionError, match="cannot serve"):
        open_stream(tmp_path, backend="mlx")
    with pytest.raises(BundleError, match=r"config\.json"):
        check_mlx_folder(folder)


def test_plugin_metadata() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="eliza_backends")}
    assert eps.get("mlx") == "eliza_mlx"
    f = MLXFactory()
    assert (f.name, f.aliases, f.pip_extra) == ("mlx-coreml", ("mlx", "coreml"), "mlx")
    assert f.formats == ("mlx", "mlpackage", "mlmodelc")
    with pytest.raises(Exception, match="engine"):
        f.parse_options(StreamConfig(options={"mlx": {"engine": "metal"}}))


@pytest.mark.parametrize("then", ["prefill", "reset_keep_all", "reset_keep_less", "save_slot"])
def test_chat_turns_after_a_budget_end_continue_the_sequence(tmp_path: Path, then: str) -> None:
    """A stream ended by its budget keeps its last token back (not fed ahead): whatever comes
    next must see exactly the sequence a fresh session would."""
    case = ORACLE["prompts"][3]
    more = ORACLE["prompts"][4]["prompt_ids"][1:6]
    cfg = dict(max_tokens=6, ignore_eos=True, tokens_per_step=4)
    with open_stream(TINY_BUNDLE, backend="mlx", **cfg) as stream:
        s = stream.session
        s.prefill(case["prompt_ids"])
        first = generated_tokens(run_to_end(s))
        seq = [*case["prompt_ids"], *first]
        if then == "reset_keep_all":
            assert s.reset_keep(len(seq)) == len(seq)
        elif then == "reset_keep_less":
            assert s.reset_keep(len(seq) - 2) == len(seq) - 2
            seq = seq[:-2]
        elif then == "save_slot":
            s.save_slot(tmp_path / "s.slot")
            s.reset()
            s.restore_slot(tmp_path / "s.slot")
        s.prefill(more)
        got = generated_tokens(run_to_end(s))
    with open_stream(TINY_BUNDLE, backend="mlx", **cfg) as fresh:
        fresh.prefill([*seq, *more])
        assert generated_tokens(run_to_end(fresh.session)) == got


def test_mlx_folder_is_not_claimed_where_only_core_ml_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Intel Mac on macOS 15: Core ML runs, mlx does not. The factory ranks 10 there, so it
    must not claim a bundle it can only serve through mlx (llama.cpp should get it)."""
    monkeypatch.setattr(eliza_mlx, "mlx_status", lambda: RuntimeStatus(False, "no Apple silicon"))
    monkeypatch.setattr(eliza_mlx, "coreml_status", lambda: RuntimeStatus(True, device="ane"))
    mlx_only = tmp_path / "mlx"
    shutil.copytree(MLX_DIR, mlx_only / "text" / "tiny-mlx")
    factory = MLXFactory()
    assert factory.preference_rank() > 0
    assert not factory.can_serve(mlx_only)
    assert factory.can_serve(_coreml_bundle(tmp_path / "coreml"))


# ------------------------------------------------------------------------------ speculative

SPEC = dict(ignore_eos=True, max_tokens=32)


@pytest.fixture(scope="module")
def tiny_ctx() -> Iterator[InferenceContext]:
    ctx = InferenceContext(TINY_BUNDLE)
    yield ctx
    ctx.close()


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_drafter_stops_at_end_of_generation(tiny_ctx: InferenceContext, drafter: str) -> None:
    """Without ignore_eos: the same tokens and the same ending as without a drafter."""
    for case in ORACLE["prompts"]:
        with open_stream(tiny_ctx, backend="mlx", max_tokens=48) as plain:
            plain.prefill(case["prompt_ids"])
            want = list(plain)
        with open_stream(tiny_ctx, backend="mlx", max_tokens=48, drafter=drafter) as s:
            s.prefill(case["prompt_ids"])
            steps = list(s)
        assert [t for st in steps for t in st.tokens] == [t for st in want for t in st.tokens]
        assert steps[-1].final and steps[-1].finish_reason == want[-1].finish_reason


@pytest.mark.parametrize("kw", [dict(temperature=0.8), dict(temperature=0.8, top_k=5)])
def test_speculative_sampling_is_refused_loudly(kw: dict) -> None:
    with pytest.raises(UnsupportedOperationError, match="greedy-only"):
        open_stream(TINY_BUNDLE, backend="mlx", drafter="ngram", **kw)


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_drafter_survives_rewinds(tiny_ctx: InferenceContext, drafter: str) -> None:
    case = ORACLE["prompts"][0]
    ids = case["prompt_ids"]
    with open_stream(tiny_ctx, backend="mlx", drafter=drafter, draft_length=4, **SPEC) as s:
        s.prefill(ids)
        s.text()
        keep = s.reset_keep(len(ids) - 2)
        assert keep == len(ids) - 2
        s.prefill(ids[keep:])
        assert [t for st in s for t in st.tokens] == case["continuation_ids"]
        s.reset()
        s.prefill(ids)
        assert [t for st in s for t in st.tokens] == case["continuation_ids"]


@pytest.mark.parametrize("drafter", ["ngram", "model"])
@pytest.mark.parametrize("then", ["prefill", "reset_keep_all", "reset_keep_less", "save_slot",
                                  "cancel"])
def test_drafter_chat_turns_continue_the_sequence(tiny_ctx: InferenceContext, tmp_path: Path,
                                                  drafter: str, then: str) -> None:
    """Whatever follows a speculative stream (another turn, a rewind, a slot round trip, a
    cancel) must see exactly the sequence a fresh plain session would."""
    case = ORACLE["prompts"][3]
    more = ORACLE["prompts"][4]["prompt_ids"][1:6]
    cfg = dict(max_tokens=9, ignore_eos=True)
    with open_stream(tiny_ctx, backend="mlx", drafter=drafter, draft_length=3, **cfg) as stream:
        s = stream.session
        s.prefill(case["prompt_ids"])
        first = generated_tokens(run_to_end(s))
        seq = [*case["prompt_ids"], *first]
        if then == "reset_keep_all":
            assert s.reset_keep(len(seq)) == len(seq)
        elif then == "reset_keep_less":
            assert s.reset_keep(len(seq) - 2) == len(seq) - 2
            seq = seq[:-2]
        elif then == "save_slot":
            s.save_slot(tmp_path / "s.slot")
            s.reset()
            s.restore_slot(tmp_path / "s.slot")
        elif then == "cancel":
            s.cancel()
            with pytest.raises(CancelledError):
                s.prefill(more)
            assert s.reset_keep(len(seq)) == len(seq)
        s.prefill(more)
        got = generated_tokens(run_to_end(s))
    with open_stream(tiny_ctx, backend="mlx", **cfg) as fresh:
        fresh.prefill([*seq, *more])
        assert generated_tokens(run_to_end(fresh.session)) == got


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_drafter_continues_after_a_mid_stream_slot(tiny_ctx: InferenceContext, tmp_path: Path,
                                                   drafter: str) -> None:
    case = ORACLE["prompts"][1]
    with open_stream(tiny_ctx, backend="mlx", drafter=drafter, **SPEC) as s:
        s.prefill(case["prompt_ids"])
        head = generated_tokens([s.session.next(5)])
        s.session.save_slot(tmp_path / "mid.slot")
        rest = [t for st in s for t in st.tokens]
        assert head + rest == case["continuation_ids"]
    with open_stream(tiny_ctx, backend="mlx", drafter=drafter, max_tokens=32 - len(head),
                     ignore_eos=True) as s:
        s.session.restore_slot(tmp_path / "mid.slot")
        assert [t for st in s for t in st.tokens] == case["continuation_ids"][len(head):]


def test_draft_model_from_config_and_missing_drafts(tiny_ctx: InferenceContext,
                                                    tmp_path: Path) -> None:
    case = ORACLE["prompts"][2]
    with open_stream(tiny_ctx, backend="mlx", drafter="model",
                     draft_model="text/draft/tiny-draft-mlx", **SPEC) as s:
        s.prefill(case["prompt_ids"])
        assert [t for st in s for t in st.tokens] == case["continuation_ids"]
        assert s.metrics.drafted > 0
    with pytest.raises(BundleError, match="draft_model"):
        open_stream(tiny_ctx, backend="mlx", drafter="model", draft_model="text/tiny-f16.gguf")
    with pytest.raises(BundleError, match="draft_model"):
        open_stream(tiny_ctx, backend="mlx", drafter="model", draft_model="../tiny")
    bundle = tmp_path / "no-draft"
    shutil.copytree(MLX_DIR, bundle / "text" / "tiny-mlx")
    with pytest.raises(BundleError, match="text/draft/"):
        open_stream(bundle, backend="mlx", drafter="model")
    with open_stream(bundle, backend="mlx", drafter="ngram", **SPEC) as s:  # ngram needs none
        s.prefill(case["prompt_ids"])
        assert [t for st in s for t in st.tokens] == case["continuation_ids"]


def test_draft_model_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "bad-draft"
    shutil.copytree(MLX_DIR, bundle / "text" / "tiny-mlx")
    draft = bundle / "text" / "draft" / "other-mlx"
    shutil.copytree(TINY_BUNDLE / "text" / "draft" / "tiny-draft-mlx", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["vocab_size"] = 512
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BundleError):
        open_stream(bundle, backend="mlx", drafter="model")


def test_untrimmable_cache_offers_no_drafter(monkeypatch: pytest.MonkeyPatch) -> None:
    import eliza_mlx.session as ms

    monkeypatch.setattr(ms, "can_trim_prompt_cache", lambda cache: False)
    with open_stream(TINY_BUNDLE, backend="mlx") as s:
        assert s.session.capabilities.drafters == frozenset({"none"})
    with pytest.raises(UnsupportedOperationError, match="trimmed"):
        open_stream(TINY_BUNDLE, backend="mlx", drafter="ngram")


def _tiny_gemma3(dtype: Any) -> Any:
    """A random two-layer Gemma 3 text model built by mlx-lm itself (hidden size 40: sqrt(40)
    is not a bfloat16 number, so mlx-lm's bfloat16 scale differs from the exact one)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import gemma3_text

    args = gemma3_text.ModelArgs(model_type="gemma3_text", hidden_size=40, num_hidden_layers=2,
                                 intermediate_size=64, num_attention_heads=2, head_dim=16,
                                 vocab_size=97, sliding_window_pattern=2)
    model = gemma3_text.Model(args)
    model.tie_word_embeddings = True
    model.pop("lm_head")
    model.update(tree_map(lambda a: a.astype(dtype), model.parameters()))
    mx.eval(model.parameters())
    return model


def test_gemma3_embedding_scale_is_rounded_to_the_weights_dtype() -> None:
    """mlx-lm multiplies Gemma 3's embeddings by sqrt(hidden_size) rounded to bfloat16 for every
    dtype; Hugging Face (and llama.cpp, LiteRT) round it to the weights' dtype. The loader fixes
    the scale of a float32 model, leaves a bfloat16 one alone, and keeps the tied head unscaled."""
    import mlx.core as mx
    import numpy as np
    from eliza_mlx.model import scale_embeddings_in_weight_dtype

    ids = mx.array([[3, 14, 15, 92, 65]], dtype=mx.uint32)
    model = _tiny_gemma3(mx.float32)
    raw = model.model.embed_tokens
    before = np.array(model(ids))
    x = mx.random.normal((1, 40))
    assert scale_embeddings_in_weight_dtype(model) is True
    assert scale_embeddings_in_weight_dtype(model) is False  # once only
    applied = mx.array(40 ** 0.5, mx.bfloat16).astype(mx.float32)  # what mlx-lm multiplies by
    effective = np.array(model.model.embed_tokens(ids) * applied)
    np.testing.assert_allclose(effective, np.array(raw(ids)) * np.float32(40 ** 0.5), rtol=3e-7)
    np.testing.assert_array_equal(np.array(model.model.embed_tokens.as_linear(x)),
                                  np.array(raw.as_linear(x)))
    after = np.array(model(ids))
    assert np.abs(after - before).max() > 1e-4  # the scale moved the logits: it is on the path
    assert scale_embeddings_in_weight_dtype(_tiny_gemma3(mx.bfloat16)) is False
