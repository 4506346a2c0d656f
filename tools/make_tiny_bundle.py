#!/usr/bin/env python
"""Make the tiny real model bundle (examples/bundles/tiny) in every runtime format.

Usage:
    /work/toolvenv/bin/python tools/make_tiny_bundle.py OUT [--steps N] [--no-coreml]

What it does, deterministically (fixed seeds, one torch thread):

1. builds a byte-level BPE tokenizer (vocab 384, GPT-2 style pre-tokenizer) from
   tools/tiny_corpus/, with special tokens <|bos|> <|eos|> <|user|> <|assistant|>
   <|system|> <|end|>;
2. trains a llama-architecture model (transformers LlamaForCausalLM, 2 layers,
   hidden 128) and a 1-layer draft model with the same tokenizer, on CPU;
3. writes OUT/oracle.json: greedy continuations from the float32 torch model;
4. exports the same weights to
       OUT/text/tiny-f16.gguf              (gguf GGUFWriter, llama arch, f16)
       OUT/text/tiny-mlx/                  (mlx_lm convert, float16)
       OUT/text/tiny.tflite                (litert-torch export_hf, unquantized)
       OUT/text/tiny.litertlm              (same export, LiteRT-LM bundle)
       OUT/text/tiny.mlpackage/            (coremltools, if it converts)
       OUT/text/draft/tiny-draft-f16.gguf
       OUT/text/draft/tiny-draft-mlx/
5. writes OUT/manifest.json with eliza_backends.manifest.write_manifest.

Tool-time dependencies only: see tools/requirements.txt and tools/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
CORPUS_DIR = TOOLS_DIR / "tiny_corpus"
SHIM_DIR = TOOLS_DIR / "litert_shim"

SEED = 1234
N_ORACLE_TOKENS = 32

# ---------------------------------------------------------------------------
# Tokenizer facts
# ---------------------------------------------------------------------------
VOCAB_SIZE = 384
BOS, EOS = "<|bos|>", "<|eos|>"
USER, ASSISTANT, SYSTEM, END = "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"
SPECIAL_TOKENS = [BOS, EOS, USER, ASSISTANT, SYSTEM, END]  # ids 0..5, in this order

# The one chat template, stored in every format. A message renders as
# <|role|>content<|end|>; the prompt starts with the BOS token and, for
# generation, ends with <|assistant|>. The model learned to close a reply
# with <|end|> (the end-of-turn / EOG token). Content may be a string or a list
# of {"type": "text", "text": ...} parts (LiteRT-LM's Conversation API passes
# lists); only text parts are rendered.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# ---------------------------------------------------------------------------
# Model shapes
# ---------------------------------------------------------------------------
MAIN_SHAPE = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)
DRAFT_SHAPE = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
)
MAX_POSITIONS = 512  # context length written to every format
ROPE_THETA = 10000.0
RMS_EPS = 1e-5

TRAIN_SEQ_LEN = 128
TRAIN_BATCH = 16
LITERT_PREFILL_LENGTHS = "32,128"
LITERT_CACHE_LENGTH = 512

# ---------------------------------------------------------------------------
# Oracle prompts: (name, kind, text-or-messages). "train" prompts start a
# paragraph or dialogue of the corpus, "unseen" ones do not occur in it, "chat"
# ones are rendered with CHAT_TEMPLATE (add_generation_prompt=True).
# Unseen prompts were picked among candidates whose greedy continuation keeps a
# top-1/top-2 logit gap >= MIN_ORACLE_GAP at every one of the 32 steps, so that
# float16 runtimes reproduce them; make_oracle() enforces that margin.
# ---------------------------------------------------------------------------
ORACLE_PROMPTS = [
    ("gettysburg", "train", "Four score and seven years ago"),
    ("declaration", "train", "We hold these truths to be self-evident,"),
    ("preamble", "train", "We the People of the United States,"),
    ("lighthouse", "train", "Ships that passed in the dark"),
    ("baker", "train", "Every morning before the sun came up, the baker"),
    ("garden", "train", "In summer the garden is"),
    ("river", "train", "The river does not hurry"),
    ("unseen_dog", "unseen", "The old dog slept by the fire"),
    ("unseen_once", "unseen", "Once upon a time"),
    ("unseen_market", "unseen", "Yesterday I went to the market"),
    ("unseen_hello", "unseen", "Hello"),
    ("chat_math", "chat", [{"role": "user", "content": "What is two plus two?"}]),
    (
        "chat_system",
        "chat",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colors."},
        ],
    ),
    ("chat_unseen_math", "chat", [{"role": "user", "content": "What is four plus four?"}]),
    ("chat_unseen_fish", "chat", [{"role": "user", "content": "Where do fish live?"}]),
]
MIN_ORACLE_GAP = 0.1


def log(msg: str) -> None:
    print(f"[make_tiny_bundle] {msg}", flush=True)


# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------
def read_prose_documents() -> list[str]:
    """Every *.txt but the dialogues, split into paragraphs (one document each).

    A title line (one short line without final punctuation) is kept together
    with the paragraph that follows it.
    """
    docs: list[str] = []
    for path in sorted(CORPUS_DIR.glob("*.txt")):
        if path.name == "chat_dialogues.txt":
            continue
        paras = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
        paras = [p for p in paras if p]
        pending_title = None
        for para in paras:
            is_title = "\n" not in para and len(para) < 40 and para[-1] not in ".,;:!?"
            if is_title:
                pending_title = para
                continue
            if pending_title is not None:
                para = pending_title + "\n\n" + para
                pending_title = None
            docs.append(para)
    return docs


def read_dialogues() -> list[list[dict]]:
    text = (CORPUS_DIR / "chat_dialogues.txt").read_text(encoding="utf-8")
    dialogues: list[list[dict]] = []
    for block in text.split("\n\n"):
        msgs = []
        for line in block.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            role, _, content = line.partition(": ")
            if role not in ("system", "user", "assistant"):
                raise ValueError(f"bad dialogue line: {line!r}")
            msgs.append({"role": role, "content": content})
        if msgs:
            dialogues.append(msgs)
    return dialogues


def render_chat(messages: list[dict], add_generation_prompt: bool) -> str:
    import jinja2

    env = jinja2.Environment()
    return env.from_string(CHAT_TEMPLATE).render(
        messages=messages, bos_token=BOS, add_generation_prompt=add_generation_prompt
    )


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------
def build_tokenizer(prose: list[str], dialogues: list[list[dict]]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = list(prose) + [m["content"] for d in dialogues for m in d]
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer vocab is {tok.get_vocab_size()}, wanted {VOCAB_SIZE}")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"{s} got id {tok.token_to_id(s)}, wanted {i}")
    # Plain encode() prepends <|bos|> (like llama.cpp's add_bos_token).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, 0)],
    )
    return tok


def tokenizer_config() -> dict:
    """tokenizer_config.json, written by hand so that transformers 4.x and 5.x both load it."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "additional_special_tokens": [USER, ASSISTANT, SYSTEM, END],
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_hf_tokenizer(tok, out_dir: Path):
    """Write tokenizer.json, tokenizer_config.json, chat_template.jinja; return the HF tokenizer."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    )
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    hf_tok = AutoTokenizer.from_pretrained(str(out_dir))
    assert hf_tok.bos_token_id == 0 and hf_tok.eos_token_id == 1
    assert hf_tok.all_special_ids == list(range(len(SPECIAL_TOKENS))), hf_tok.all_special_ids
    return hf_tok


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
def make_config(shape: dict):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=[1, 5],
        pad_token_id=None,
        torch_dtype="float32",
        **shape,
    )


def build_training_stream(tok, prose: list[str], dialogues: list[list[dict]]):
    """Token stream of documents, each <|bos|> ... <|eos|>; returns (ids, doc_starts)."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    docs: list[list[int]] = []
    for p in prose:
        docs.append([bos, *tok.encode(p, add_special_tokens=False).ids, eos])
    for d in dialogues:
        rendered = render_chat(d, add_generation_prompt=False)
        ids = tok.encode(rendered, add_special_tokens=False).ids
        assert ids[0] == bos
        docs.append([*ids, eos])
    rng = random.Random(SEED)
    order = list(range(len(docs)))
    rng.shuffle(order)
    stream: list[int] = []
    starts: list[int] = []
    for i in order:
        starts.append(len(stream))
        stream.extend(docs[i])
    return stream, starts


def train(config, stream, starts, steps: int, seed: int, label: str):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{label}: {n_params} parameters, {steps} steps, {len(stream)} training tokens")
    # the stream is read as a ring, so every document (also the last ones) is
    # covered equally and every document start can open a window
    data = torch.tensor(stream + stream[: TRAIN_SEQ_LEN + 1], dtype=torch.long)
    rng = random.Random(seed)
    max_start = len(stream) - 1
    doc_starts = list(starts)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = 50
    lr_max, lr_min = 3e-3, 1e-4

    def lr_at(step):
        if step < warmup:
            return lr_max * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * t))

    model.train()
    t0 = time.time()
    for step in range(steps):
        # half the windows start at a document start (so prompts right after
        # <|bos|> are well learned), half anywhere
        idx = [
            rng.choice(doc_starts) if rng.random() < 0.5 else rng.randint(0, max_start)
            for _ in range(TRAIN_BATCH)
        ]
        batch = torch.stack([data[i : i + TRAIN_SEQ_LEN + 1] for i in idx])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"{label}: step {step:5d} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
    model.eval()
    return model


def save_hf_model(model, tok_dir: Path, out_dir: Path):
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=[1, 5], do_sample=False)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(tok_dir / name, out_dir / name)


# ---------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------
def make_oracle(model, hf_tok, tok, allow_small_gaps: bool = False) -> dict:
    import torch

    bos_id, eos_id, end_id = (tok.token_to_id(t) for t in (BOS, EOS, END))
    stop_ids = [eos_id, end_id]
    prompts = []
    for name, kind, spec in ORACLE_PROMPTS:
        entry: dict = {"name": name, "kind": kind}
        if kind == "chat":
            rendered = hf_tok.apply_chat_template(spec, tokenize=False, add_generation_prompt=True)
            assert rendered == render_chat(spec, True), (rendered, render_chat(spec, True))
            assert rendered.startswith(BOS)
            entry["messages"] = spec
            entry["rendered"] = rendered
            text = rendered[len(BOS) :]
        else:
            text = spec
        ids = [bos_id, *tok.encode(text, add_special_tokens=False).ids]
        assert hf_tok(text).input_ids == ids if kind != "chat" else True
        if kind == "chat":
            assert hf_tok(entry["rendered"], add_special_tokens=False).input_ids == ids
        cont, gaps = [], []
        cur = list(ids)
        with torch.no_grad():
            for _ in range(N_ORACLE_TOKENS):
                logits = model(input_ids=torch.tensor([cur])).logits[0, -1].float()
                top = torch.topk(logits, 2)
                nxt = int(top.indices[0])
                gaps.append(float(top.values[0] - top.values[1]))
                cont.append(nxt)
                cur.append(nxt)
        first_stop = next((i for i, t in enumerate(cont) if t in stop_ids), None)
        until_stop = cont if first_stop is None else cont[:first_stop]
        min_gap = min(gaps)
        entry.update(
            text=text,
            prompt_ids=ids,
            continuation_ids=cont,
            continuation_text=hf_tok.decode(cont, skip_special_tokens=False),
            first_stop_index=first_stop,
            text_until_stop=hf_tok.decode(until_stop, skip_special_tokens=False),
            min_logit_gap=round(min_gap, 4),
            min_logit_gap_step=gaps.index(min_gap),
            logit_gaps=[round(g, 4) for g in gaps],
        )
        prompts.append(entry)
        log(f"oracle {name}: gap {min_gap:.3f} -> {entry['text_until_stop']!r}")
    small = [
        (p["name"], p["min_logit_gap"]) for p in prompts if p["min_logit_gap"] < MIN_ORACLE_GAP
    ]
    if small and not allow_small_gaps:
        raise SystemExit(
            f"oracle prompts with a top-1/top-2 logit gap below {MIN_ORACLE_GAP}: {small}; "
            "float16 runtimes may not reproduce them. Train longer, change the prompts, "
            "or pass --allow-small-gaps."
        )
    return {
        "schema_version": 1,
        "generator": "tools/make_tiny_bundle.py",
        "min_gap_required": MIN_ORACLE_GAP,
        "reference": "float32 torch transformers LlamaForCausalLM (the training weights)",
        "n_tokens": N_ORACLE_TOKENS,
        "decoding": (
            "greedy argmax, full recompute each step, no early stop: continuation_ids "
            "always has n_tokens ids; first_stop_index is the index in continuation_ids "
            "of the first eos/end token (null if none) and text_until_stop decodes the "
            "ids before it"
        ),
        "prompt_ids_rule": (
            "prompt_ids == [bos_id] + encode(text, add_special_tokens=False), special-token "
            "strings in text parsed as special tokens; chat prompts: text is the rendered "
            "template without its leading bos_token"
        ),
        "tokenizer": {
            "vocab_size": tok.get_vocab_size(),
            "bos_token": BOS,
            "bos_id": bos_id,
            "eos_token": EOS,
            "eos_id": eos_id,
            "end_token": END,
            "end_id": end_id,
            "stop_ids": stop_ids,
            "special_tokens": {s: tok.token_to_id(s) for s in SPECIAL_TOKENS},
            "add_bos": True,
            "chat_template": CHAT_TEMPLATE,
        },
        "prompts": prompts,
    }


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------
def write_gguf(model, tok, path: Path, name: str):
    """The trained model as an F16 GGUF (norms f32) through the project's GGUF writer."""
    import gguf
    import numpy as np

    from eliza_backends.convert import gguf_writer as gw
    from eliza_backends.convert.hf_checkpoint import permute_rotary

    cfg = model.config
    hp = gw.GGUFHParams(name=name, context_length=cfg.max_position_embeddings,
                        hidden=cfg.hidden_size, layers=cfg.num_hidden_layers,
                        ffn=cfg.intermediate_size, heads=cfg.num_attention_heads,
                        kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                        rms_eps=cfg.rms_norm_eps, vocab_size=cfg.vocab_size,
                        rope_theta=ROPE_THETA)
    # tokenizer: gpt2 BPE, tokens in id order, merges from tokenizer.json
    tj = json.loads(tok.to_str())
    tokens = [None] * len(tj["model"]["vocab"])
    for s, i in tj["model"]["vocab"].items():
        tokens[i] = s
    assert all(t is not None for t in tokens)
    vocab = gw.GGUFVocab(
        model="gpt2", pre="gpt-2", tokens=tokens,
        types=[gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL
               for t in tokens],
        merges=[m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]],
        bos=tok.token_to_id(BOS), eos=tok.token_to_id(EOS), eot=tok.token_to_id(END),
        add_bos=True, add_eos=False, chat_template=CHAT_TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    hf = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}

    def tensors():
        yield "token_embd.weight", np.ascontiguousarray(
            sd["model.embed_tokens.weight"].astype(np.float16))
        yield "output_norm.weight", np.ascontiguousarray(sd["model.norm.weight"])
        yield "output.weight", np.ascontiguousarray(sd["lm_head.weight"].astype(np.float16))
        for i in range(cfg.num_hidden_layers):
            for part in gw.LAYER_TENSORS:
                a = sd[f"model.layers.{i}.{hf[part]}.weight"]
                if part in ("attn_q", "attn_k"):
                    heads = cfg.num_attention_heads if part == "attn_q" else \
                        cfg.num_key_value_heads
                    a = permute_rotary(a, heads)
                dtype = np.float32 if part.endswith("norm") else np.float16
                yield f"blk.{i}.{part}.weight", np.ascontiguousarray(a.astype(dtype))

    gw.write_gguf(path, hp, vocab, tensors(), file_type=gguf.LlamaFileType.MOSTLY_F16)


# ---------------------------------------------------------------------------
# MLX, LiteRT, Core ML
# ---------------------------------------------------------------------------
def _tool_env(extra_pythonpath: Path | None = None) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONHASHSEED"] = "0"
    if extra_pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(extra_pythonpath)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    return env


def export_mlx(hf_dir: Path, out_dir: Path):
    if out_dir.exists():
        shutil.rmtree(out_dir)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_lm",
            "convert",
            "--hf-path",
            str(hf_dir),
            "--mlx-path",
            str(out_dir),
            "--dtype",
            "float16",
        ],
        check=True,
        env=_tool_env(),
    )
    # mlx_lm re-saves the tokenizer through transformers (dropping the template from
    # tokenizer_config.json and adding load-time keys) and writes a hub model card:
    # put the original tokenizer files and generation config back, drop the card,
    # and record the dtype the weights now have.
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        shutil.copy2(hf_dir / name, out_dir / name)
    (out_dir / "README.md").unlink(missing_ok=True)
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["dtype"] = "float16"
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")


def write_litert_metadata(path: Path) -> None:
    """LlmMetadata for the .litertlm, written here instead of litert-torch's guess.

    litert-torch derives stop strings from the template and adds punctuation-prefixed
    variants (".<|end|>", " <|end|>", ...) meant for SentencePiece merges; with this
    byte-level BPE those are two-token sequences and the engine then drops the "."
    before <|end|> from its output. Here: start token <|bos|>, stop token ids
    <|eos|> and <|end|>, the jinja chat template plus the equivalent prefix/suffix
    prompt templates, greedy default sampler, generic model type.
    """
    from litert_lm_builder.runtime.proto import (
        llm_metadata_pb2,
        llm_model_type_pb2,
        sampler_params_pb2,
    )

    md = llm_metadata_pb2.LlmMetadata()
    md.start_token.token_ids.ids.append(SPECIAL_TOKENS.index(BOS))
    for stop in (EOS, END):
        md.stop_tokens.add().token_ids.ids.append(SPECIAL_TOKENS.index(stop))
    for field, tag in (("system", SYSTEM), ("user", USER), ("model", ASSISTANT)):
        tpl = getattr(md.prompt_templates, field)
        tpl.prefix = tag
        tpl.suffix = END
    md.jinja_prompt_template = CHAT_TEMPLATE
    md.sampler_params.type = sampler_params_pb2.SamplerParameters.GREEDY
    md.sampler_params.k = 1
    md.max_num_tokens = LITERT_CACHE_LENGTH
    md.llm_model_type.CopyFrom(
        llm_model_type_pb2.LlmModelType(generic_model=llm_model_type_pb2.GenericModel())
    )
    path.write_bytes(md.SerializeToString(deterministic=True))


def export_litert(hf_dir: Path, work_dir: Path, tflite_out: Path, litertlm_out: Path):
    out = work_dir / "litert_export"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    metadata = work_dir / "llm_metadata.pb"
    write_litert_metadata(metadata)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "litert_torch.generative.export_hf",
            f"--model={hf_dir}",
            f"--output_dir={out}",
            f"--prefill_lengths={LITERT_PREFILL_LENGTHS}",
            f"--cache_length={LITERT_CACHE_LENGTH}",
            "--quantization_recipe=none",
            "--keep_temporary_files=True",
            f"--litert_lm_llm_metadata_override={metadata}",
        ],
        check=True,
        env=_tool_env(SHIM_DIR),
    )
    tfl = sorted(out.glob("*.tflite"))
    lm = sorted(out.glob("*.litertlm"))
    if len(tfl) != 1 or len(lm) != 1:
        raise RuntimeError(
            f"unexpected litert export output: {sorted(p.name for p in out.iterdir())}"
        )
    shutil.copy2(tfl[0], tflite_out)
    litertlm_out.write_bytes(_fix_litertlm_system_metadata(lm[0].read_bytes(), litertlm_out.name))


def _fix_litertlm_system_metadata(data: bytes, name: str) -> bytes:
    """litert_lm_builder stamps every file with a random uuid4 and the current time;
    overwrite both in place (same lengths, so no flatbuffer offset moves) with a
    name-derived uuid5 and a fixed time (SOURCE_DATE_EPOCH, default 0)."""
    import datetime
    import uuid

    uuid_re = rb"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    time_re = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00"
    new_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, "eliza-backends/tiny/" + name)).encode()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    new_time = (
        datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
        .strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
        .encode()
    )
    head = data[:4096]  # the system metadata sits in the header
    for pattern, new in ((uuid_re, new_uuid), (time_re, new_time)):
        found = re.findall(pattern, head)
        if len(found) != 1 or len(found[0]) != len(new):
            raise RuntimeError(f"unexpected .litertlm header: {pattern!r} matched {found!r}")
        data = data.replace(found[0], new, 1)
    return data


def _plain_llama(hf_model):
    """The same network as hf_model, written with plain torch ops that coremltools converts.

    (Tracing transformers' LlamaForCausalLM fails in coremltools 9.0: its mask code
    uses aten::diff, and shape-derived ints trip the converter.) Stateless: input
    ids [1, T] -> logits [1, T, vocab], causal attention over the T positions 0..T-1.
    """
    import torch

    c = hf_model.config
    rep = c.num_attention_heads // c.num_key_value_heads
    half = c.head_dim // 2

    class PlainLlama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = hf_model
            inv = 1.0 / (
                ROPE_THETA ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
            )
            freqs = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.float32), inv)
            emb = torch.cat([freqs, freqs], dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)

        @staticmethod
        def rms(x, w):
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps))

        @staticmethod
        def rotate(t):
            return torch.cat([-t[..., half:], t[..., :half]], dim=-1)

        def forward(self, input_ids):
            m = self.hf.model
            x = m.embed_tokens(input_ids)
            pos = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
            cos = torch.nn.functional.embedding(pos, self.cos)[:, None]
            sin = torch.nn.functional.embedding(pos, self.sin)[:, None]
            p0 = pos[0]
            mask = torch.where(p0[None, :] > p0[:, None], torch.tensor(-1e9), torch.tensor(0.0))
            for layer in m.layers:
                a = layer.self_attn
                h = self.rms(x, layer.input_layernorm.weight)
                q = a.q_proj(h).view(1, -1, c.num_attention_heads, c.head_dim).transpose(1, 2)
                k = a.k_proj(h).view(1, -1, c.num_key_value_heads, c.head_dim).transpose(1, 2)
                v = a.v_proj(h).view(1, -1, c.num_key_value_heads, c.head_dim).transpose(1, 2)
                q = q * cos + self.rotate(q) * sin
                k = k * cos + self.rotate(k) * sin
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
                scores = (q @ k.transpose(-1, -2)) * (c.head_dim**-0.5) + mask
                o = torch.softmax(scores, dim=-1) @ v
                x = x + a.o_proj(
                    o.transpose(1, 2).reshape(1, -1, c.num_attention_heads * c.head_dim)
                )
                h = self.rms(x, layer.post_attention_layernorm.weight)
                mlp = layer.mlp
                x = x + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
            return self.hf.lm_head(self.rms(x, m.norm.weight))

    return PlainLlama().eval()


def export_coreml(model, out_path: Path, precision: str) -> str | None:
    """Stateless Core ML ML Program: input_ids int32 [1, 1..512] -> logits [1, T, vocab].

    Returns None on success or the reason it could not be made. coremltools can
    convert on Linux but not run the model (prediction is macOS only), so the
    package is checked here only through the torch module it was traced from.
    """
    try:
        import coremltools as ct
        import numpy as np
        import torch
    except Exception as exc:  # pragma: no cover
        return f"coremltools import failed: {exc!r}"
    try:
        plain = _plain_llama(model)
        probe = torch.tensor([[0, *list(range(10, 60))]])
        with torch.no_grad():
            diff = (plain(probe) - model(input_ids=probe).logits).abs().max().item()
            if diff > 1e-3:
                return f"plain-torch llama differs from transformers by {diff}"
            traced = torch.jit.trace(plain, torch.zeros((1, 8), dtype=torch.long))
        seq = ct.RangeDim(lower_bound=1, upper_bound=MAX_POSITIONS, default=8)
        mlmodel = ct.convert(
            traced,
            inputs=[ct.TensorType(name="input_ids", shape=(1, seq), dtype=np.int32)],
            outputs=[ct.TensorType(name="logits")],
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT32
            if precision == "float32"
            else ct.precision.FLOAT16,
            minimum_deployment_target=ct.target.macOS13,
        )
        mlmodel.short_description = (
            "tiny llama test model (eliza-backends); stateless: "
            "input_ids [1, T] -> logits [1, T, 384]"
        )
        if out_path.exists():
            shutil.rmtree(out_path)
        mlmodel.save(str(out_path))
    except Exception as exc:
        if out_path.exists():
            shutil.rmtree(out_path)
        return f"{type(exc).__name__}: {exc}"
    _make_mlpackage_deterministic(out_path)
    return None


def _make_mlpackage_deterministic(pkg: Path) -> None:
    """Make reruns byte-identical: name-derived item UUIDs in Manifest.json, no
    conversion date, and a deterministic serialization of model.mlmodel (its proto
    maps are otherwise written in varying order)."""
    import uuid

    from coremltools.proto import Model_pb2

    spec_path = pkg / "Data" / "com.apple.CoreML" / "model.mlmodel"
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_path.read_bytes())
    spec.description.metadata.userDefined.pop("com.github.apple.coremltools.conversion_date", None)
    spec_path.write_bytes(spec.SerializeToString(deterministic=True))

    manifest_path = pkg / "Manifest.json"
    manifest = json.loads(manifest_path.read_text())
    mapping = {
        old: str(uuid.uuid5(uuid.NAMESPACE_URL, "eliza-backends/tiny/" + info["path"])).upper()
        for old, info in manifest["itemInfoEntries"].items()
    }
    manifest["itemInfoEntries"] = {mapping[k]: v for k, v in manifest["itemInfoEntries"].items()}
    manifest["rootModelIdentifier"] = mapping[manifest["rootModelIdentifier"]]
    manifest_path.write_text(json.dumps(manifest, indent=4, sort_keys=True) + "\n")
    for f in pkg.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "out", type=Path, help="bundle folder to (re)create, e.g. examples/bundles/tiny"
    )
    ap.add_argument("--steps", type=int, default=1600, help="AdamW steps for the main model")
    ap.add_argument("--draft-steps", type=int, default=1200, help="AdamW steps for the draft model")
    ap.add_argument("--no-coreml", action="store_true", help="skip the .mlpackage")
    ap.add_argument(
        "--coreml-precision",
        choices=("float32", "float16"),
        default="float32",
        help="Core ML weights/compute precision (float32: same numerics as the oracle)",
    )
    ap.add_argument(
        "--allow-small-gaps",
        action="store_true",
        help=f"do not fail when an oracle prompt's logit gap is below {MIN_ORACLE_GAP}",
    )
    ap.add_argument(
        "--keep-work",
        type=Path,
        default=None,
        help="keep intermediate files here (float32 HF folders, tokenizer, LiteRT export)",
    )
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(SEED)
    t_start = time.time()

    out: Path = args.out.resolve()
    text_dir = out / "text"
    draft_dir = text_dir / "draft"
    if text_dir.exists():
        shutil.rmtree(text_dir)
    for stale in ("oracle.json", "manifest.json"):
        (out / stale).unlink(missing_ok=True)
    draft_dir.mkdir(parents=True)

    work_ctx = None
    if args.keep_work is not None:
        work = args.keep_work.resolve()
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
    else:
        work_ctx = tempfile.TemporaryDirectory(prefix="tiny_bundle_")
        work = Path(work_ctx.name)

    prose = read_prose_documents()
    dialogues = read_dialogues()
    log(f"corpus: {len(prose)} prose documents, {len(dialogues)} dialogues")

    tok = build_tokenizer(prose, dialogues)
    tok_dir = work / "tokenizer"
    tok_dir.mkdir()
    hf_tok = save_hf_tokenizer(tok, tok_dir)

    stream, starts = build_training_stream(tok, prose, dialogues)
    main_model = train(make_config(MAIN_SHAPE), stream, starts, args.steps, SEED, "main")
    draft_model = train(
        make_config(DRAFT_SHAPE), stream, starts, args.draft_steps, SEED + 1, "draft"
    )
    t_train = time.time()

    hf_main, hf_draft = work / "hf-main", work / "hf-draft"
    save_hf_model(main_model, tok_dir, hf_main)
    save_hf_model(draft_model, tok_dir, hf_draft)

    oracle = make_oracle(main_model, hf_tok, tok, args.allow_small_gaps)
    (out / "oracle.json").write_text(json.dumps(oracle, indent=1, ensure_ascii=False) + "\n")

    log("GGUF")
    write_gguf(main_model, tok, text_dir / "tiny-f16.gguf", "tiny")
    write_gguf(draft_model, tok, draft_dir / "tiny-draft-f16.gguf", "tiny-draft")

    log("MLX")
    export_mlx(hf_main, text_dir / "tiny-mlx")
    export_mlx(hf_draft, draft_dir / "tiny-draft-mlx")

    log("LiteRT")
    export_litert(hf_main, work, text_dir / "tiny.tflite", text_dir / "tiny.litertlm")

    if not args.no_coreml:
        log("Core ML")
        why = export_coreml(main_model, text_dir / "tiny.mlpackage", args.coreml_precision)
        if why:
            log(f"Core ML skipped: {why}")

    log(f"artifacts done in {time.time() - t_start:.0f}s (training {t_train - t_start:.0f}s)")

    from eliza_backends.manifest import write_manifest

    write_manifest(out, name="tiny")
    log(f"manifest written; total {time.time() - t_start:.0f}s")
    if work_ctx is not None:
        work_ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
