"""The converter's tokenizer check: every tokenizer file of the Hugging Face folder
(``tokenizer.json``, and ``tokenizer.model`` where there is one) must give llama.cpp's ids on
the float32 GGUF for a set of tricky strings (digits, CJK, emoji, code, runs of spaces, control
tokens) and decode them to llama.cpp's text. A difference stops the conversion: the formats
would not agree with each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import BundleError

TRICKY = (
    "Hello world", "1234567890 and 3.14159", "  leading and   runs of   spaces  ",
    "日本語のテキストと中文", "emoji 😀🎉👍🏽 ok", "def f(x):\n\treturn x**2  # code\n",
    "mixed\n\n\nnewlines\r\n", "ünïcödé façade naïve", "x = [1,2,3]; y = {'k': 'v'}",
    "a" * 50, "tabs\tand\u00a0nbsp", "\uff46\uff55\uff4c\uff4c\u3000width", "",
    "<start_of_turn>user\nhi<end_of_turn>\n", "<|im_start|>user\nhi<|im_end|>\n",
)


def check_tokenizers(gguf_path: Path, hf_dir: Path) -> dict[str, Any]:
    """Compare the tokenizers of ``hf_dir`` with llama.cpp on ``gguf_path`` (special tokens
    parsed, no BOS); returns ``{file: {"strings": n, "agree": n}}``, :class:`BundleError` on
    the first difference."""
    import llama_cpp

    from ..prompt.hf_tokenizer import HFTokenizer
    from ..prompt.sp_tokenizer import SPTokenizer
    from ..prompt.tokenizer import Tokenizer

    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    found: dict[str, Tokenizer] = {"tokenizer.json": HFTokenizer.from_file(
        hf_dir / "tokenizer.json")}
    if (hf_dir / "tokenizer.model").is_file():
        found["tokenizer.model"] = SPTokenizer.from_file(hf_dir / "tokenizer.model")
    report = {}
    for name, tok in found.items():
        for text in TRICKY:
            want = list(llm.tokenize(text.encode(), add_bos=False, special=True))
            got = tok.encode(text, add_special=False)
            if got != want:
                raise BundleError(f"{hf_dir / name} tokenizes {text!r} as {got[:12]}... but "
                                  f"llama.cpp on the GGUF as {want[:12]}...: the formats would "
                                  "not see the same ids")
            want_text = llm.detokenize(want).decode("utf-8", "replace")
            if tok.decode(want) != want_text:
                raise BundleError(f"{hf_dir / name} decodes {want[:12]}... as "
                                  f"{tok.decode(want)!r}, llama.cpp as {want_text!r}")
        report[name] = {"strings": len(TRICKY), "agree": len(TRICKY)}
    return report


__all__ = ["TRICKY", "check_tokenizers"]
