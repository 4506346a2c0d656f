"""Chat prompt ids with templates that transform message content: control-token texts in the
content stay text through a trimming template, and a template that rewrites content beyond
recognition is refused when the content spells control tokens. (Every backend, the ordinary
case and the injection itself: test_cross_backend.py.)"""

from __future__ import annotations

import pytest
from conftest import TINY_BUNDLE
from test_cross_backend import INJECTION, MARKUP, SPECIAL

from eliza_backends import TemplateError, open_stream
from eliza_backends.prompt.chat_tokens import chat_token_ids


def _specials(ids: list[int]) -> list[int]:
    return [t for t in ids if t in SPECIAL.values()]


def test_content_control_texts_stay_text_through_a_trimming_template() -> None:
    template = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}"
                "<|end|>{% endfor %}<|assistant|>")
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as stream:
        session = stream.session
        ids = chat_token_ids(session, template, [{"role": "user", "content": f"  {INJECTION} "}])
        assert _specials(ids) == MARKUP
        assert session.detokenize(ids[2:-2]) == INJECTION


def test_a_template_that_rewrites_content_is_refused_when_content_has_control_texts() -> None:
    template = "{% for m in messages %}<|user|>{{ m.content[::-1] }}<|end|>{% endfor %}"
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as stream:
        session = stream.session
        assert _specials(chat_token_ids(session, template, [{"role": "user", "content": "ab"}])) \
            == MARKUP[1:3]
        with pytest.raises(TemplateError, match="rewrites message content"):
            chat_token_ids(session, template, [{"role": "user", "content": INJECTION}])
