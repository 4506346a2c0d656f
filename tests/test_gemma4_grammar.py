"""The grammar of a Gemma 4 reply that must call a tool
(:mod:`eliza_backends.openai.gemma4_grammar`), checked over the tiny Gemma 4 bundle's real
vocabulary (its ``tokenizer.json``, Gemma 4's markers as the single tokens they are): what the
template would write for schema-valid arguments is accepted to the end, anything else is
refused at the first wrong token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eliza_backends.openai.gemma4_grammar import gemma4_call_grammar
from eliza_backends.prompt.hf_tokenizer import HFTokenizer
from eliza_backends.structured.constraint import Constraint, ConstraintMatcher, TokenVocabulary

pytest.importorskip("llguidance")

TOKENIZER = (Path(__file__).resolve().parent.parent / "examples" / "bundles" / "gemma4-tiny" /
             "text" / "gemma4-tiny-mlx" / "tokenizer.json")
Q = '<|"|>'
SCHEMA: dict[str, Any] = {"type": "object", "required": ["b_city", "Alpha"], "properties": {
    "b_city": {"type": "string", "maxLength": 5},
    "Alpha": {"type": "integer"},
    "units": {"enum": ["c", "f", 3]},
    "ratio": {"type": "number"},
    "on": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "where": {"type": "object", "required": ["x"],
              "properties": {"x": {"type": "number"}, "note": {"type": ["string", "null"]}}},
    "extra": {"type": "object"},
    "any": {}}}
TOOLS = [("f", SCHEMA), ("g", {"type": "object", "properties": {}})]


@pytest.fixture(scope="module")
def vocab() -> tuple[HFTokenizer, TokenVocabulary]:
    tok = HFTokenizer.from_file(TOKENIZER)
    pieces = [tok.piece(i) for i in range(tok.vocab_size)]
    control = {i: str(tok.token_text(i)) for i in tok.special_ids if not pieces[i]}
    return tok, TokenVocabulary(pieces, control, [1, 6])


def _accepts(vocab: tuple[HFTokenizer, TokenVocabulary], text: str, *,
             parallel: bool = False) -> bool:
    """True when the grammar takes all of ``text``'s tokens and then may end."""
    tok, vocabulary = vocab
    matcher = ConstraintMatcher(Constraint.grammar(gemma4_call_grammar(TOOLS, parallel=parallel)),
                                vocabulary)
    ids = tok.encode(text, add_special=False)
    if matcher.valid_prefix(ids) != len(ids):
        return False
    for token in ids:
        matcher.consume(token)
    return bool(matcher.fill_mask()[1])


def _call(args: str, name: str = "f") -> str:
    return f"<|tool_call>call:{name}{{{args}}}<tool_call|>"


def test_markers_are_single_tokens_of_the_vocabulary(vocab: Any) -> None:
    tok, _ = vocab
    for marker in ("<|tool_call>", "<tool_call|>", Q):
        assert len(tok.encode(marker, add_special=False)) == 1
        assert tok.piece(tok.encode(marker, add_special=False)[0]) == marker.encode()


@pytest.mark.parametrize("args", [
    f"Alpha:7,b_city:{Q}Paris{Q}",  # required only, keys sorted without case
    f"Alpha:-7,any:{Q}x{Q},b_city:{Q}{Q},extra:{{k:[1,{Q}y{Q}]}},on:true,ratio:1.5e3,"
    f"tags:[{Q}a b{Q},{Q}c{Q}],units:3,where:{{note:null,x:0.25}}",  # every member
    f"Alpha:0,b_city:{Q}ab{Q},units:{Q}f{Q},where:{{x:1}}",
    f"Alpha:1,b_city:{Q}a\"b'{Q}",  # quotes are plain text inside <|"|>
])
def test_schema_valid_calls_are_accepted(vocab: Any, args: str) -> None:
    assert _accepts(vocab, _call(args))


@pytest.mark.parametrize("args", [
    f"b_city:{Q}Paris{Q}",  # a required member missing
    f"b_city:{Q}Paris{Q},Alpha:7",  # keys out of the template's order
    f"Alpha:7,b_city:{Q}Parisx{Q}",  # longer than maxLength
    f"Alpha:7.5,b_city:{Q}P{Q}",  # not an integer
    f"Alpha:7,b_city:{Q}P{Q},units:{Q}k{Q}",  # not in the enum
    f"Alpha:7,b_city:{Q}P{Q},tags:[]",  # fewer than minItems
    f"Alpha:7,b_city:{Q}P{Q},where:{{note:{Q}n{Q}}}",  # a nested required member missing
    f"Alpha:7,b_city:{Q}P{Q},extra:3",  # not an object
    '"Alpha":7,"b_city":"P"',  # JSON, not Gemma 4's notation
    f"Alpha:7,b_city:{Q}P{Q},zzz:1",  # a member the schema does not have
])
def test_everything_else_is_refused(vocab: Any, args: str) -> None:
    assert not _accepts(vocab, _call(args))


def test_one_call_or_several(vocab: Any) -> None:
    one = _call(f"Alpha:1,b_city:{Q}a{Q}")
    assert _accepts(vocab, one) and _accepts(vocab, _call("", "g"))
    assert not _accepts(vocab, one + one)  # parallel calls not allowed
    assert _accepts(vocab, one + _call("", "g"), parallel=True)
    assert not _accepts(vocab, "Sure." + one)  # no text before the call
    assert not _accepts(vocab, _call("", "h"))  # only the tools given
