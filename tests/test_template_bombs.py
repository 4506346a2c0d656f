"""Chat-template bombs are stopped *while* they render, typed, and cancellable (issue 15, 5).

Each bomb would run for hours or allocate gigabytes on 98aaa27 (there the output cap is checked
only after rendering); here it raises TemplateLimitError quickly with memory growth far below
the bomb's size, and Session.cancel() from another thread stops a rendering in progress. The
bombs run in a child process with an address-space limit, so a regression fails the test
instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import (
    CancelledError,
    RenderLimits,
    TemplateError,
    TemplateLimitError,
    open_stream,
    render_chat,
)
from eliza_backends.prompt.chat import render_bounds

MSGS = [{"role": "user", "content": "hi"}]
NESTED = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
          "{% endfor %}{% endfor %}{% endfor %}")
BOMBS = {
    "nested_range_loops": NESTED,
    "nested_loops_with_output": "{% for a in range(100000) %}{% for b in range(100000) %}x"
                                "{% endfor %}{% endfor %}",
    "repetition_in_loop": "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}",
    "repetition_kept_in_loop": "{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                               "{% set ns.s = ns.s + 'x' * 1000000 %}{% endfor %}{{ ns.s|length }}",
    "many_large_values": "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                         "{% set ns.l = ns.l + ['x' * 1000000] %}{% endfor %}{{ ns.l|length }}",
    "center_2e9": "{{ 'x'.center(2000000000) }}",
    "center_2e9_float": "{{ 'x'.center(2e9|int) }}",
    "center_filter": "{{ 'x'|center(2000000000) }}",
    "ljust": "{{ 'x'.ljust(2000000000) }}",
    "zfill": "{{ '1'.zfill(2000000000) }}",
    "doubling_concat": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling_plus": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling_capture": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                        "{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}"
                        "{% endfor %}{{ ns.s|length }}",
    "doubling_list": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                     "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    "replace_growth": "{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s.replace('x', 'xx') %}{% endfor %}{{ ns.s|length }}",
    "replace_filter_growth": "{{ ('x' * 100000)|replace('x', 'y' * 100000) }}",
    "join_growth": "{{ range(100000)|join('x' * 1000000) }}",
    "join_method_growth": "{{ ('x' * 1000000).join(['a'] * 100000) }}",
    "percent_width": "{{ '%999999999d' % 1 }}",
    "percent_precision": "{{ '%.999999999f' % 1.0 }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "format_filter_width": "{{ '%999999999s'|format('x') }}",
    "indent_bomb": "{{ ('\\n' * 1000000)|indent(1000) }}",
    "expandtabs": "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "batch_fill": "{{ [1]|batch(1000000000, 0)|list }}",
    "recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "output_flood": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
}


BOMB_RUNNER = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a bomb fails, not the host
    from eliza_backends import TemplateError, render_chat
    out = {}
    for name, template in json.loads(sys.stdin.read()).items():
        t0 = time.perf_counter()
        try:
            render_chat(template, [{"role": "user", "content": "hi"}])
            verdict = "rendered"
        except TemplateError as exc:
            verdict = type(exc).__name__
        except BaseException as exc:
            verdict = f"raw {type(exc).__name__}: {exc}"[:200]
        with open("/proc/self/status") as f:
            peak = next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) // 1024
        out[name] = [verdict, round(time.perf_counter() - t0, 2), peak]
    print(json.dumps(out))
""")


def test_template_bombs_stop_while_rendering() -> None:
    out = subprocess.run([sys.executable, "-c", BOMB_RUNNER], input=json.dumps(BOMBS),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    assert set(results) == set(BOMBS)
    slow = {n: r for n, r in results.items() if r[1] > 15}
    wrong = {n: r for n, r in results.items() if r[0] not in ("TemplateLimitError",
                                                             "TemplateError")}
    assert not wrong and not slow, results
    assert max(r[2] for r in results.values()) < 400, results  # peak RSS (MiB), all bombs


def test_the_limits_are_typed_and_say_which() -> None:
    with pytest.raises(TemplateLimitError, match="steps"):
        render_chat(NESTED, MSGS)
    with pytest.raises(TemplateLimitError, match="characters"):
        render_chat(BOMBS["center_2e9"], MSGS)
    with pytest.raises(TemplateLimitError, match="built more than"):
        render_chat(BOMBS["many_large_values"], MSGS)
    with pytest.raises(TemplateError) as caught:
        render_chat(BOMBS["percent_width"], MSGS)
    assert isinstance(caught.value, TemplateLimitError)
    assert caught.value.code.symbol == "ELIZA_ERR_INVALID_ARG"


def test_limits_are_adjustable_and_ordinary_templates_fit() -> None:
    template = json.loads((TINY_BUNDLE / "oracle.json").read_text())["tokenizer"]["chat_template"]
    long_chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 200}
                 for i in range(200)]
    assert len(render_chat(template, long_chat)) > 200_000
    with render_bounds(RenderLimits(output=1000)), pytest.raises(TemplateLimitError):
        render_chat(template, long_chat)
    with render_bounds(RenderLimits(steps=1000)), pytest.raises(TemplateLimitError):
        render_chat("{% for i in range(5000) %}{% endfor %}", MSGS)
    assert len(render_chat(template, long_chat)) > 200_000  # the bounds end with the block


def test_cancel_stops_a_rendering_in_progress() -> None:
    flag = threading.Event()
    threading.Timer(0.2, flag.set).start()
    t0 = time.perf_counter()
    with render_bounds(RenderLimits(steps=10**12, seconds=600), cancelled=flag.is_set), \
            pytest.raises(CancelledError):
        render_chat(NESTED, MSGS)
    assert time.perf_counter() - t0 < 5


def _bundle_with_template(tmp_path: Path, template: str) -> Path:
    gguf_fuzz = pytest.importorskip("gguf_fuzz")
    bundle = tmp_path / "bomb"
    (bundle / "text").mkdir(parents=True)
    (bundle / "text" / "m.gguf").write_bytes(gguf_fuzz.build(
        [{"op": "set", "key": "tokenizer.chat_template", "type": 8, "value": template}]))
    return bundle


def test_a_bomb_in_a_gguf_chat_template_is_stopped_and_cancellable(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    bundle = _bundle_with_template(tmp_path, NESTED)
    with open_stream(bundle, backend="llama.cpp", threads=1) as stream:
        assert stream.session.chat_template == NESTED
        with pytest.raises(TemplateLimitError):
            stream.prefill_messages(MSGS)
        stream.prefill("Four score")  # the session is untouched and still serves
        assert stream.next(2).tokens
        # Session.cancel() (the stream's cancel) from another thread stops the rendering
        stream.reset()
        timer = threading.Timer(0.2, stream.cancel)
        timer.start()
        t0 = time.perf_counter()
        with pytest.raises(CancelledError):
            stream.prefill_messages(MSGS)
        assert time.perf_counter() - t0 < 5
        timer.join()
        stream.reset()
        stream.prefill("Four score")
        assert stream.next(2).tokens
