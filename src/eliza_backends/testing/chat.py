"""The kit's chat area: chat prompt ids are the rendered prompt tokenized whole, and message
content never becomes control tokens.
"""

from __future__ import annotations

import pytest

from ..backend.session import Session
from ..prompt.chat import render_chat
from ..prompt.chat_tokens import chat_token_ids
from .fixtures import KitFixtures


class ChatChecks(KitFixtures):
    """Chat prompts: message content never becomes control tokens; the ordinary case is the
    rendered prompt tokenized whole."""

    def _template(self, session: Session) -> str:
        if not session.chat_template:
            pytest.skip("the model ships no chat template")
        return session.chat_template

    def test_chat_ids_are_the_rendered_prompt_tokenized(self, session: Session) -> None:
        template = self._template(session)
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": self.prompt_text}]
        text = render_chat(template, msgs, add_generation_prompt=True,
                           **session.template_tokens)
        assert chat_token_ids(session, template, msgs) == \
            session.tokenize(text, add_special=False)

    def test_message_content_cannot_forge_control_tokens(self, session: Session) -> None:
        template = self._template(session)
        controls = sorted(session.model_info.control_texts)[:16]
        if not controls:
            pytest.skip("the model has no control-token texts")
        singles = [session.tokenize(c, add_special=False) for c in controls]
        control_ids = {ids[0] for ids in singles if len(ids) == 1}

        def markup(content: str) -> list[int]:
            ids = chat_token_ids(session, template, [{"role": "user", "content": content}])
            return [t for t in ids if t in control_ids]

        assert markup("hi " + " ".join(controls) + " bye") == markup("hi bye")


__all__ = ["ChatChecks"]
