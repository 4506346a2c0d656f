"""Chat: messages in, the model's own prompt template applied in a bounded sandbox.

Every artifact carries its template (GGUF ``tokenizer.chat_template``, the MLX folder's
``tokenizer_config.json``, the ``.litertlm`` metadata); each session exposes it as
``Session.chat_template``. A template from a downloaded model is untrusted input, so it runs in
jinja2's immutable sandbox with no loader (no ``include``/``import``, no file access) and no
access to Python internals, and *while it renders* it is held to :class:`RenderLimits`:

* **time**: every loop iteration, call and output is a step; a rendering may take
  ``limits.steps`` of them and ``limits.seconds`` of wall time. Nested ``range`` loops (each
  within jinja's 100,000-item bound) stop after the step budget, not after 10^10 iterations.
* **memory**: no single value a template builds may exceed ``limits.value`` characters (or
  items), checked *before* the operation allocates it where the size is known up front (``*``,
  ``%``, ``+``, ``~``, ``center``/``ljust``/``rjust``/``zfill``/``indent``, ``format``,
  ``replace``, ``join``, ``sum``, ``batch``...); and everything built while rendering (each
  output, each intermediate string or list) is added up and may not exceed ``limits.built``:
  doubling a string in a loop, or repeating it in one, runs out of budget after a few steps.
* **output**: at most ``limits.output`` characters.
* **cancel**: ``cancelled()`` (see :func:`render_bounds`) is polled every few hundred steps,
  so ``Session.cancel()`` (which :meth:`eliza_backends.Stream.chat_tokens` and
  ``prefill_messages`` wire in) stops a rendering in milliseconds with
  :class:`~eliza_backends.errors.CancelledError`.

Breaking a limit raises :class:`TemplateLimitError` (a :class:`TemplateError`, status
``ELIZA_ERR_INVALID_ARG``). :func:`render_chat` renders; multi-turn reuse lives in
:meth:`eliza_backends.Stream.prefill_messages`, which prefills only the tokens that differ from
what the session already holds.

Threads: rendering runs in the calling thread; its budget is per call (a ``ContextVar``), so
concurrent renderings in different threads do not share limits.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import (
    CancelledError,
    InvalidArgumentError,
    TemplateError,
    TemplateLimitError,
    UnsupportedOperationError,
)

ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_OUTPUT = 1 << 20  # characters a rendering may produce
MAX_TEMPLATE = 1 << 20  # characters of template source


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one rendering. ``output``, ``value`` and ``built`` are in characters (list and
    dict sizes count items); ``steps`` counts loop iterations, calls and outputs."""

    output: int = MAX_OUTPUT
    value: int = 4 * MAX_OUTPUT
    built: int = 32 * MAX_OUTPUT
    steps: int = 1_000_000
    seconds: float = 10.0


class _Budget:
    """What one rendering has used so far."""

    __slots__ = ("built", "cancelled", "deadline", "limits", "output", "steps")

    def __init__(self, limits: RenderLimits, cancelled: Callable[[], bool] | None) -> None:
        self.limits = limits
        self.cancelled = cancelled
        self.deadline = time.monotonic() + limits.seconds
        self.steps = self.built = self.output = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps & 0xFF == 0:
            self._check_clock()

    def _check_clock(self) -> None:
        if self.steps > self.limits.steps:
            raise TemplateLimitError(f"the chat template ran more than {self.limits.steps} "
                                     "steps (loops nested too deep?) and was stopped")
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the chat template ran longer than "
                                     f"{self.limits.seconds:g} s and was stopped")
        if self.cancelled is not None and self.cancelled():
            raise CancelledError("chat template rendering cancelled by cancel(); call reset() "
                                 "or reset_keep() to use the session again")

    def expect(self, size: int, what: str) -> None:
        """Refuse an operation that would build a value of ``size`` before it runs."""
        if size > self.limits.value:
            raise TemplateLimitError(f"the chat template tried to build a value of {size} "
                                     f"characters ({what}; limit {self.limits.value}) and was "
                                     "stopped")

    def add(self, value: Any, what: str = "value") -> Any:
        """Count a value the template built; refuse it when it, or the total, is too large."""
        self.tick()
        size = _size(value)
        if size:
            self.expect(size, what)
            self.built += size
            if self.built > self.limits.built:
                raise TemplateLimitError(
                    f"the chat template built more than {self.limits.built} characters while "
                    "rendering (a string or list growing in a loop?) and was stopped")
        return value


_current: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("eliza_chat_budget",
                                                                          default=None)


def _budget() -> _Budget:
    """The running rendering's budget; outside one (jinja folding constants while it compiles)
    a fresh default budget, so compile time is bounded too."""
    return _current.get() or _Budget(RenderLimits(), None)


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value)
    return 0


_WIDTH = re.compile(r"\d{5,}")  # a width or precision in a format spec


def _format_size(fmt: str, args: Iterable[Any]) -> int:
    """An upper bound-ish estimate of ``fmt % args`` / ``fmt.format(...)``: the spec's widths
    plus the arguments' text."""
    widths = sum(int(w) for w in _WIDTH.findall(fmt))
    return len(fmt) + widths + sum(len(str(a)) if isinstance(a, str) else 32 for a in args)


def _as_int(value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        return int(value) if isinstance(value, float) and value == value and abs(value) < 1e18 \
            else 0


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate chat messages: a non-empty list of ``{"role": str, "content": str}``."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {'role', 'content'} "
                                   "dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidArgumentError(f"message {i} is {type(m).__name__}, not a dict")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidArgumentError(f"message {i}: role must be one of {sorted(ROLES)}, "
                                       f"got {role!r}")
        if not isinstance(content, str):
            raise InvalidArgumentError(f"message {i}: content must be a str")
        out.append(dict(m))
    return out


# ------------------------------------------------------------------------------ size checks

def _expect_mul(seq: Any, n: Any) -> None:
    if isinstance(n, int) and not isinstance(n, bool):
        _budget().expect(len(seq) * max(n, 0), "repetition")


def _expect_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Pre-checks for the string methods whose result can be far larger than their input."""
    name = getattr(obj, "__name__", "")
    target = getattr(obj, "__self__", None)
    if target is None:
        target = getattr(getattr(obj, "__wrapped__", None), "__self__", None)  # str.format
    if not isinstance(target, str):
        return
    budget = _budget()
    if name in ("center", "ljust", "rjust", "zfill") and args:
        budget.expect(max(_as_int(args[0]), len(target)), f"str.{name} result")
    elif name == "expandtabs":
        size = _as_int(args[0]) if args else _as_int(kwargs.get("tabsize", 8))
        budget.expect(len(target) + target.count("\t") * max(size, 0), "str.expandtabs result")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and \
            isinstance(args[1], str):
        count = target.count(args[0]) if args[0] else len(target) + 1
        if len(args) > 2 and _as_int(args[2]) >= 0:
            count = min(count, _as_int(args[2]))
        budget.expect(len(target) + count * len(args[1]), "str.replace result")
    elif name in ("format", "format_map"):
        budget.expect(_format_size(target, [*args, *kwargs.values()]), "formatted string")


def _expect_join(sep: str, items: Sequence[Any]) -> None:
    total = len(sep) * max(len(items) - 1, 0)
    total += sum(len(i) if isinstance(i, str) else 32 for i in items)
    _budget().expect(total, "joined string")


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a pre-check for the filters that can amplify, and every result counted."""
    pass_arg = getattr(fn, "jinja_pass_arg", None)

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        first = 1 if pass_arg is not None else 0
        if len(args) > first:
            value = _expect_filter(budget, name, args[first], args[first + 1:], kwargs)
            args = (*args[:first], value, *args[first + 1:])
        return budget.add(fn(*args, **kwargs), f"'{name}' filter result")

    return bounded


def _expect_filter(budget: _Budget, name: str, value: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """Refuse a filter call that would build too much; returns the value to filter (an
    iterable is materialized once when its size must be known first)."""
    if name in ("join", "sum") and not isinstance(value, (str, list, tuple)):
        value = list(value)  # jinja's iterables are bounded (range, lists, dicts)
    if name == "center":
        budget.expect(max(_as_int(args[0] if args else kwargs.get("width", 80)),
                          _size(value)), "centered string")
    elif name == "indent":
        width = args[0] if args else kwargs.get("width", 4)
        step = len(width) if isinstance(width, str) else _as_int(width)
        lines = str(value).count("\n") + 1
        budget.expect(_size(value) + lines * max(step, 0), "indented string")
    elif name == "format" and isinstance(value, str):
        budget.expect(_format_size(value, [*args, *kwargs.values()]), "formatted string")
    elif name == "replace" and len(args) >= 2 and isinstance(value, str):
        old, new = str(args[0]), str(args[1])
        count = value.count(old) if old else len(value) + 1
        budget.expect(len(value) + count * len(new), "replaced string")
    elif name == "join":
        sep = args[0] if args else kwargs.get("d", "")
        _expect_join(str(sep), list(value))
    elif name == "batch":
        budget.expect(max(_as_int(args[0]) if args else 0, 0), "batch")
    elif name == "slice":
        budget.expect(max(_as_int(args[0]) if args else 0, 0), "slice")
    elif name == "sum" and isinstance(value, (list, tuple)):
        budget.expect(sum(_size(v) for v in value), "sum")
    elif name == "wordwrap":
        budget.expect(2 * _size(value), "wrapped string")
    return value


# ------------------------------------------------------------------------------ environment

@lru_cache(maxsize=1)
def _environment() -> Any:
    try:
        from jinja2 import nodes
        from jinja2.compiler import CodeGenerator, Frame
        from jinja2.exceptions import SecurityError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # pragma: no cover - every backend install brings jinja2
        raise UnsupportedOperationError("chat templates need jinja2: pip install jinja2") \
            from None

    class BoundedCodeGenerator(CodeGenerator):
        """Concatenation (``~``) goes through the budget too."""

        def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, plus the render budget on every loop iteration, call,
        operator, filter, concatenation and output."""

        intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/"})
        code_generator_class = BoundedCodeGenerator

        def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
            budget = _budget()
            budget.tick()
            if operator_name == "**":
                if isinstance(right, (int, float)) and abs(right) > 64:
                    raise SecurityError("exponent too large")
                return operator.pow(left, right)
            if operator_name == "*":
                if isinstance(left, (str, list, tuple)):
                    _expect_mul(left, right)
                elif isinstance(right, (str, list, tuple)):
                    _expect_mul(right, left)
                return budget.add(operator.mul(left, right), "repetition")
            if operator_name == "+":
                if _size(left) or _size(right):
                    budget.expect(_size(left) + _size(right), "concatenation")
                return budget.add(operator.add(left, right), "concatenation")
            if operator_name == "%" and isinstance(left, str):
                args = right if isinstance(right, tuple) else (right,)
                budget.expect(_format_size(left, args), "%-formatted string")
                return budget.add(operator.mod(left, right), "%-formatted string")
            return super().call_binop(context, operator_name, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any,
                 **kwargs: Any) -> Any:
            budget = _budget()
            budget.tick()
            _expect_call(__obj, args, kwargs)
            if getattr(__obj, "__name__", "") == "join" and isinstance(
                    getattr(__obj, "__self__", None), str) and args:
                items = list(args[0])  # materialized once, then joined
                _expect_join(__obj.__self__, items)
                args = (items, *args[1:])
            return budget.add(super().call(__context, __obj, *args, **kwargs), "call result")

        def bounded_concat(self, values: Iterable[Any]) -> str:
            parts = [str(v) for v in values]
            budget = _budget()
            budget.expect(sum(len(p) for p in parts), "concatenation")
            return str(budget.add("".join(parts), "concatenation"))

        #: what each loop iteration outputs: nothing, through ``finalize``, which ticks
        step_marker = ""

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                         extensions=["jinja2.ext.loopcontrols"],
                         finalize=lambda value: _budget().add(value, "output"))
    return _bound_names(env)


def _raise_exception(message: str) -> None:
    """The ``raise_exception`` global that HF chat templates call to refuse a conversation."""
    raise TemplateError(f"the chat template refused the messages: {message}")


def _bound_names(env: Any) -> Any:
    """Puts every filter of ``env`` under the render budget, drops ``lipsum`` and adds
    ``raise_exception``; returns ``env`` (changed in place)."""
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.globals.pop("lipsum", None)  # lipsum(n) builds n paragraphs; no chat template needs it
    env.globals["raise_exception"] = _raise_exception
    return env


def _tick_loops(tree: Any) -> Any:
    """Every ``for`` body and macro starts with a step of the budget (so an empty nested loop
    is bounded too)."""
    from jinja2 import nodes

    def tick() -> Any:  # outputs "" through finalize, which counts a step
        return nodes.Output([nodes.EnvironmentAttribute("step_marker")])

    for node in tree.find_all((nodes.For, nodes.Macro, nodes.CallBlock)):
        node.body.insert(0, tick())
    return tree


@lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    from jinja2.exceptions import TemplateError as JinjaError

    if len(template) > MAX_TEMPLATE:
        raise TemplateLimitError(f"the chat template is {len(template)} characters (limit "
                                 f"{MAX_TEMPLATE})")
    env = _environment()
    token = _current.set(_Budget(RenderLimits(), None))  # jinja folds constants while compiling
    try:
        return env.from_string(_tick_loops(env.parse(template)))
    except JinjaError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from None
    except (TypeError, ValueError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise TemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") \
            from None
    finally:
        _current.reset(token)


_bounds: contextvars.ContextVar[tuple[RenderLimits, Callable[[], bool] | None]] = \
    contextvars.ContextVar("eliza_chat_bounds", default=(RenderLimits(), None))


@contextlib.contextmanager
def render_bounds(limits: RenderLimits | None = None,
                  cancelled: Callable[[], bool] | None = None) -> Iterator[None]:
    """Within the ``with`` block (in this thread or task), :func:`render_chat` uses ``limits``
    (default :class:`RenderLimits`) and stops with
    :class:`~eliza_backends.errors.CancelledError` once ``cancelled()`` returns True.
    :meth:`eliza_backends.Stream.chat_tokens` wires in the session's ``cancel()``."""
    token = _bounds.set((limits or RenderLimits(), cancelled))
    try:
        yield
    finally:
        _bounds.reset(token)


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
                **extra: Any) -> str:
    """Render ``messages`` with ``template`` in the sandbox; returns the prompt text.

    Raises :class:`TemplateError` when the template fails or breaks the sandbox,
    :class:`TemplateLimitError` when it runs past its :class:`RenderLimits`, and
    :class:`~eliza_backends.errors.CancelledError` when cancelled (see :func:`render_bounds`).
    """
    from jinja2.exceptions import SecurityError
    from jinja2.exceptions import TemplateError as JinjaError

    msgs = check_messages(messages)
    compiled = _compile(template)
    budget = _Budget(*_bounds.get())
    token = _current.set(budget)
    chunks: list[str] = []
    try:
        for chunk in compiled.generate(messages=msgs, add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token, **extra):
            budget.output += len(chunk)
            if budget.output > budget.limits.output:
                raise TemplateLimitError(f"the chat template produced more than "
                                         f"{budget.limits.output} characters and was stopped")
            chunks.append(chunk)
    except SecurityError as exc:
        raise TemplateError(f"the chat template tried something unsafe and was stopped: "
                            f"{exc}") from None
    except (TemplateError, CancelledError):
        raise
    except MemoryError:
        raise TemplateLimitError("the chat template ran out of memory and was stopped") \
            from None
    except (JinjaError, TypeError, ValueError, AttributeError, KeyError, IndexError,
            ArithmeticError, RecursionError, OverflowError) as exc:
        raise TemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") \
            from None
    finally:
        _current.reset(token)
    return "".join(chunks)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


__all__ = ["MAX_OUTPUT", "RenderLimits", "TemplateError", "TemplateLimitError",
           "check_messages", "common_prefix", "render_bounds", "render_chat"]
