"""The core's tokenizer discovery: one search order for ``tokenizer.json`` and SentencePiece
``tokenizer.model`` files, the class chosen by the file, the facts read the same way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_convert import _spm_facts

from eliza_backends.convert.tokenizer_build import sentencepiece_model
from eliza_backends.prompt.hf_tokenizer import HFTokenizer
from eliza_backends.prompt.sp_tokenizer import SPTokenizer
from eliza_backends.prompt.tokenizer import tokenizer_facts
from eliza_backends.prompt.tokenizers import find_tokenizer, load_tokenizer


def test_find_tokenizer_searches_one_order_for_both_formats(tmp_path: Path) -> None:
    text = tmp_path / "text"
    (text / "draft").mkdir(parents=True)
    (text / "m-mlx").mkdir()
    art = text / "m.tflite"
    art.write_bytes(b"")
    (text / "draft" / "tokenizer.json").write_text("{}")
    assert find_tokenizer(art) is None  # a draft/ folder is never used
    order = [text / "m-mlx" / "tokenizer.model", text / "m-mlx" / "tokenizer.json",
             text / "tokenizer.model", text / "tokenizer.json",
             text / "m.tokenizer.model", text / "m.tokenizer.json"]
    for path in order:  # each file written wins over every one before it
        path.write_bytes(b"x")
        assert find_tokenizer(art) == path
    folder = text / "m-mlx"
    assert find_tokenizer(folder) == folder / "tokenizer.json"  # inside the artifact first


def test_load_tokenizer_picks_the_class_by_file(tmp_path: Path, tiny_bundle: Path) -> None:
    sp_file = tmp_path / "tokenizer.model"
    sp_file.write_bytes(sentencepiece_model(_spm_facts()))
    assert isinstance(load_tokenizer(sp_file), SPTokenizer)
    hf_file = next((tiny_bundle / "text").rglob("tokenizer.json"))
    shutil.copy(hf_file, tmp_path / "tokenizer.json")
    assert isinstance(load_tokenizer(tmp_path / "tokenizer.json"), HFTokenizer)


def test_sentencepiece_control_texts_and_plain_parsing() -> None:
    sp = SPTokenizer(sentencepiece_model(_spm_facts()))
    assert {"<start_of_turn>", "<end_of_turn>", "<unk>"} <= sp.control_texts
    special = sp.encode("ab<end_of_turn>", add_special=False)
    assert special[-1] == 5
    plain = sp.encode("ab<end_of_turn>", add_special=False, parse_special=False)
    assert 5 not in plain and sp.decode(plain) == "ab<end_of_turn>"
    facts = tokenizer_facts(sp, None, sp.vocab_size)
    assert facts.bos == 2 and facts.add_bos
    assert facts.eog == {1, 5}  # <eos> and <end_of_turn> by their well-known names


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer.model"])
def test_unreadable_tokenizer_files_are_bundle_errors(tmp_path: Path, name: str) -> None:
    from eliza_backends import BundleError

    (tmp_path / name).write_bytes(b"\x00 not a tokenizer")
    with pytest.raises(BundleError):
        load_tokenizer(tmp_path / name)
