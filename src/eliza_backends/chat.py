"""Chat: messages in, the model's own prompt template applied in a sandbox.

Every artifact carries its template (GGUF ``tokenizer.chat_template``, the MLX folder's
``tokenizer_config.json``, the ``.litertlm`` metadata); each session exposes it as
``Session.chat_template``. A template from a downloaded model is untrusted input, so it runs in
jinja2's immutable sandbox with no loader (no ``include``/``import``, no file access), no access
to Python internals, bounded ``range`` and bounded string/list repetition.

:func:`render_chat` renders; multi-turn reuse lives in
:meth:`eliza_backends.Stream.prefill_messages`, which prefills only the tokens that differ from
what the session already holds.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from .errors import InvalidArgumentError, UnsupportedOperationError

ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_OUTPUT = 1 << 20  # characters a rendering may produce


class TemplateError(InvalidArgumentError):
    """A chat template failed to compile or render, or tried something the sandbox forbids."""


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


@lru_cache(maxsize=1)
def _environment() -> Any:
    try:
        from jinja2.exceptions import SecurityError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # pragma: no cover - every backend install brings jinja2
        raise UnsupportedOperationError("chat templates need jinja2: pip install jinja2") \
            from None

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, plus limits on ``*`` and ``**`` so a template cannot ask for
        gigabytes."""

        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
            if operator_name == "**":
                if isinstance(right, (int, float)) and abs(right) > 64:
                    raise SecurityError("exponent too large")
                return operator.pow(left, right)
            if isinstance(left, (str, list, tuple)) or isinstance(right, (str, list, tuple)):
                seq, n = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
                if isinstance(n, int) and len(seq) * n > MAX_OUTPUT:
                    raise SecurityError("repetition too large")
            return operator.mul(left, right)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                         extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused the messages: {message}")

    env.globals["raise_exception"] = raise_exception
    return env


@lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    from jinja2.exceptions import TemplateError as JinjaError

    try:
        return _environment().from_string(template)
    except JinjaError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from None


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
                **extra: Any) -> str:
    """Render ``messages`` with ``template`` in the sandbox; returns the prompt text."""
    from jinja2.exceptions import SecurityError
    from jinja2.exceptions import TemplateError as JinjaError

    msgs = check_messages(messages)
    compiled = _compile(template)
    try:
        text = compiled.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except SecurityError as exc:
        raise TemplateError(f"the chat template tried something unsafe and was stopped: "
                            f"{exc}") from None
    except TemplateError:
        raise
    except (JinjaError, TypeError, ValueError, AttributeError, KeyError, IndexError,
            ArithmeticError, RecursionError) as exc:
        raise TemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") \
            from None
    if not isinstance(text, str) or len(text) > MAX_OUTPUT:
        raise TemplateError("chat template produced an oversized prompt")
    return text


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


__all__ = ["TemplateError", "check_messages", "common_prefix", "render_chat"]
