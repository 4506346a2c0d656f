"""The tiny Gemma 4 family's parts: tokenizer, chat template, configs, training and the
assistant's distillation. Used by tools/make_gemma4_tiny.py (tool-time only: torch,
transformers 5.24, tokenizers).

Everything here is deterministic on one torch thread with fixed seeds.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import make_tiny_bundle as tiny  # the tiny bundle's corpus readers (tools/ is on sys.path)

SEED = 4321

# ---------------------------------------------------------------------------
# Tokenizer: Gemma-style SentencePiece BPE (spaces as U+2581, byte fallback), laid out as
# llama.cpp's Gemma 4 converter reads it (<pad> <eos> <bos> <unk> at ids 0-3, then the
# Gemma 4 control tokens, then the 256 <0xNN> byte tokens, then the learned pieces).
# ---------------------------------------------------------------------------
VOCAB_SIZE = 512
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
TURN_OPEN, TURN_CLOSE = "<|turn>", "<turn|>"
CONTROL_TOKENS = [
    PAD, EOS, BOS, UNK, "<mask>",
    TURN_OPEN, TURN_CLOSE, "<|think|>", "<|channel>", "<channel|>",
    "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
    "<tool_response|>", '<|"|>',
]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
SPACE = "\u2581"

# Gemma 4's turn format (the shape of google/gemma-4-*-it's template, text only): the prompt
# starts with <bos>; each message is <|turn>ROLE\nCONTENT<turn|>\n with the assistant's role
# written "model"; a generation prompt is <|turn>model\n and the model closes its reply with
# <turn|> (an end-of-generation token in llama.cpp's Gemma 4 vocabulary).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<turn|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}"
)
STOP_TOKENS = [EOS, TURN_CLOSE]


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    import jinja2

    return jinja2.Environment().from_string(CHAT_TEMPLATE).render(
        messages=messages, bos_token=BOS, add_generation_prompt=add_generation_prompt)


def corpus() -> tuple[list[str], list[list[dict[str, Any]]]]:
    return tiny.read_prose_documents(), tiny.read_dialogues()


def build_tokenizer(prose: list[str], dialogues: list[list[dict[str, Any]]]) -> Any:
    """A byte-fallback BPE over whole lines (llama.cpp's Gemma 4 pre-tokenizer splits only at
    newlines), trained on the corpus with spaces written as U+2581."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    texts = list(prose) + [m["content"] for d in dialogues for m in d]
    texts += [render_chat(d, False) for d in dialogues]
    split = pre_tokenizers.Split(Regex("[^\\n]+|[\\n]+"), behavior="isolated")
    norm = normalizers.Replace(" ", SPACE)
    # 1. learn merges on the normalized corpus
    fixed = CONTROL_TOKENS + BYTE_TOKENS
    alphabet = sorted({c for t in texts for c in norm.normalize_str(t)} - {"\n"} | {"\n"})
    probe = Tokenizer(models.BPE())
    probe.normalizer = norm
    # merges are learned inside "\u2581word" chunks (as SentencePiece splits by whitespace), so
    # no merge spans a word boundary: whole-line BPE (llama.cpp, and the final tokenizer) then
    # tokenizes a prompt's end the same way as that text inside a longer line
    probe.pre_tokenizer = pre_tokenizers.Sequence([
        split, pre_tokenizers.Split(SPACE, behavior="merged_with_next")])
    n_learned = VOCAB_SIZE - len(fixed)
    trainer = trainers.BpeTrainer(vocab_size=n_learned + len(CONTROL_TOKENS), min_frequency=2,
                                  special_tokens=CONTROL_TOKENS,
                                  initial_alphabet=alphabet, show_progress=False,
                                  limit_alphabet=len(alphabet))
    probe.train_from_iterator([t for t in texts], trainer=trainer)
    learned = json.loads(probe.to_str())["model"]
    pieces = sorted(((p, i) for p, i in learned["vocab"].items() if p not in CONTROL_TOKENS),
                    key=lambda kv: kv[1])
    if len(pieces) != n_learned:
        raise RuntimeError(f"BPE learned {len(pieces)} pieces, wanted {n_learned}")
    # 2. the final vocabulary: control tokens, byte tokens, learned pieces
    vocab = {t: i for i, t in enumerate(fixed)}
    for piece, _ in pieces:
        vocab[piece] = len(vocab)
    merges = [tuple(m) if not isinstance(m, str) else tuple(m.split(" ", 1))
              for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True,
                               unk_token=UNK, fuse_unk=True))
    tok.normalizer = norm
    tok.pre_tokenizer = split
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in CONTROL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 2)])
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer vocab is {tok.get_vocab_size()}, wanted {VOCAB_SIZE}")
    return tok


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tokenizer_config(max_len: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK,
        "additional_special_tokens": [t for t in CONTROL_TOKENS if t not in
                                      (PAD, EOS, BOS, UNK)],
        "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok: Any, out_dir: Path, max_len: int) -> Any:
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(max_len), indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    hf = AutoTokenizer.from_pretrained(str(out_dir))
    assert (hf.pad_token_id, hf.eos_token_id, hf.bos_token_id) == (0, 1, 2)
    assert hf.vocab_size == VOCAB_SIZE, hf.vocab_size
    return hf


# ---------------------------------------------------------------------------
# Model shapes
# ---------------------------------------------------------------------------
MAX_POSITIONS = 1024
SLIDING_WINDOW = 32
TARGET = dict(
    hidden_size=128, intermediate_size=384, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB_SIZE,
    num_kv_shared_layers=2, final_logit_softcapping=30.0,
)
ASSISTANT = dict(
    hidden_size=96, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
    layer_types=["sliding_attention", "full_attention"],
    hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, num_kv_shared_layers=2,
    final_logit_softcapping=None,
)


def text_config(shape: dict[str, Any]) -> Any:
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS,
        sliding_window=SLIDING_WINDOW, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, attention_k_eq_v=False, use_double_wide_mlp=False,
        enable_moe_block=False, pad_token_id=0, bos_token_id=2, eos_token_id=[1, 6],
        dtype="float32", **shape)


def assistant_config(target_hidden: int) -> Any:
    from transformers import Gemma4AssistantConfig

    return Gemma4AssistantConfig(text_config=text_config(ASSISTANT),
                                 backbone_hidden_size=target_hidden,
                                 use_ordered_embeddings=False, tie_word_embeddings=True)


# ---------------------------------------------------------------------------
# Training data: documents <bos> ... <eos>, dialogues in the chat template
# ---------------------------------------------------------------------------
TRAIN_SEQ_LEN = 128
TRAIN_BATCH = 16


def training_stream(tok: Any, prose: list[str],
                    dialogues: list[list[dict[str, Any]]]) -> tuple[list[int], list[int]]:
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    docs = [[bos, *tok.encode(p, add_special_tokens=False).ids, eos] for p in prose]
    for d in dialogues:
        ids = tok.encode(render_chat(d, False), add_special_tokens=False).ids
        assert ids[0] == bos
        docs.append(ids)
    rng = random.Random(SEED)
    order = list(range(len(docs)))
    rng.shuffle(order)
    stream: list[int] = []
    starts: list[int] = []
    for i in order:
        starts.append(len(stream))
        stream.extend(docs[i])
    return stream, starts


def _batches(stream: list[int], starts: list[int], seed: int) -> Any:
    import torch

    data = torch.tensor(stream + stream[: TRAIN_SEQ_LEN + 1], dtype=torch.long)
    rng = random.Random(seed)
    while True:
        idx = [rng.choice(starts) if rng.random() < 0.5 else rng.randint(0, len(stream) - 1)
               for _ in range(TRAIN_BATCH)]
        yield torch.stack([data[i: i + TRAIN_SEQ_LEN + 1] for i in idx])


def _lr(step: int, steps: int, lr_max: float = 3e-3, lr_min: float = 1e-4,
        warmup: int = 50) -> float:
    if step < warmup:
        return lr_max * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * t))


def log(msg: str) -> None:
    print(f"[gemma4-tiny] {msg}", flush=True)


def train_target(stream: list[int], starts: list[int], steps: int) -> Any:
    import torch
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(SEED)
    model = Gemma4ForCausalLM(text_config(TARGET)).float()
    log(f"target: {sum(p.numel() for p in model.parameters())} parameters, {steps} steps")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    batches = _batches(stream, starts, SEED)
    model.train()
    t0 = time.time()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = next(batches)
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log(f"target: step {step:5d} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
    model.eval()
    model.train_stats = {"steps": steps, "final_loss": round(float(loss.item()), 4),
                         "seconds": round(time.time() - t0, 1)}
    return model


# ---------------------------------------------------------------------------
# The assistant: distilled from the target's own hidden states and KV
# ---------------------------------------------------------------------------
def _masks(n: int, window: int) -> dict[str, Any]:
    """Additive masks [1, 1, n, n] for a draft at position p reading the target's KV: keys at
    positions < p (full), and within the sliding window of p (sliding)."""
    import torch

    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    neg = torch.finfo(torch.float32).min
    full = torch.where(k < q, 0.0, neg)
    swa = torch.where((k < q) & (q - k < window), 0.0, neg)
    # position 0 has no earlier key: let it see itself (its loss is not counted)
    full[0, 0] = 0.0
    swa[0, 0] = 0.0
    return {"full_attention": full[None, None], "sliding_attention": swa[None, None]}


def target_features(target: Any, ids: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The target on ``ids`` [B, T]: (post-norm last hidden [B, T, H], logits [B, T, V],
    shared KV per layer type)."""
    import torch

    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True, return_shared_kv_states=True,
                     use_cache=False)
    kv = {k: (v[0].detach(), v[1].detach()) for k, v in out.shared_kv_states.items()}
    return out.hidden_states[-1].detach(), out.logits.detach(), kv


def assistant_forward(assistant: Any, target: Any, tokens: Any, h: Any, kv: dict[str, Any],
                      masks: dict[str, Any]) -> tuple[Any, Any]:
    """One draft step at every position p in parallel: input = [scaled target embedding of
    tokens[:, p], h[:, p]], position p, attending to the target's KV of positions < p.
    Returns (logits [B, T, V], projected hidden [B, T, H_target])."""
    import torch

    emb = target.get_input_embeddings()(tokens)
    x = assistant.pre_projection(torch.cat([emb, h], dim=-1))
    pos = torch.arange(tokens.shape[1])[None].expand(tokens.shape[0], -1)
    out = assistant.model(inputs_embeds=x, attention_mask=masks, position_ids=pos,
                          shared_kv_states=kv, use_cache=False,
                          output_hidden_states=True)  # (no slicing before shared layers)
    last = out.last_hidden_state
    return assistant.lm_head(last), assistant.post_projection(last)


def train_assistant(target: Any, stream: list[int], starts: list[int], steps: int,
                    chain: int = 3) -> Any:
    """Distillation: at position p the assistant sees token x_p and the target's hidden state
    h_{p-1} and must predict the target's greedy token after x_p (its argmax at p); chained
    steps (same position, as Gemma 4's drafter runs) see the next true token and the
    assistant's own projected hidden state and predict the target's argmax further on."""
    import torch
    from transformers import Gemma4AssistantForCausalLM

    torch.manual_seed(SEED + 1)
    cfg = assistant_config(target.config.hidden_size)
    assistant = Gemma4AssistantForCausalLM(cfg).float()
    log(f"assistant: {sum(p.numel() for p in assistant.parameters())} parameters, "
        f"{steps} steps, chain {chain}")
    opt = torch.optim.AdamW(assistant.parameters(), lr=3e-3, betas=(0.9, 0.95),
                            weight_decay=0.0)
    batches = _batches(stream, starts, SEED + 1)
    masks = _masks(TRAIN_SEQ_LEN, SLIDING_WINDOW)
    assistant.train()
    t0 = time.time()
    stats: dict[str, Any] = {}
    for step in range(steps):
        batch = next(batches)[:, :-1]  # [B, T]
        h, logits, kv = target_features(target, batch)
        greedy = logits.argmax(-1)  # target's prediction after position p
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps)
        # step 1: token x_p with h_{p-1} predicts greedy[p]
        h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        total = torch.tensor(0.0)
        tokens = batch
        hid = h_prev
        accs = []
        for j in range(chain):
            lg, proj = assistant_forward(assistant, target, tokens, hid, kv, masks)
            # valid positions: p >= 1 and p + j < T
            n = TRAIN_SEQ_LEN - j
            want = greedy[:, j:]  # greedy[p + j]
            pred = lg[:, 1:n]
            lbl = want[:, 1:n]
            total = total + torch.nn.functional.cross_entropy(
                pred.reshape(-1, pred.shape[-1]), lbl.reshape(-1))
            accs.append(float((pred.argmax(-1) == lbl).float().mean()))
            # next chained step: the next true token (the target accepted it) at the same
            # position, with the assistant's own projected hidden state
            tokens = torch.cat([batch[:, j + 1:], batch[:, -1:].expand(-1, j + 1)], dim=1)
            hid = proj
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(assistant.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log(f"assistant: step {step:5d} loss {total.item() / chain:.4f} top-1 "
                + " ".join(f"{a:.3f}" for a in accs) + f" ({time.time() - t0:.0f}s)")
        stats = {"steps": steps, "chain": chain, "final_loss": round(total.item() / chain, 4),
                 "final_top1_per_chain_step": [round(a, 4) for a in accs],
                 "seconds": round(time.time() - t0, 1)}
    assistant.eval()
    assistant.train_stats = stats
    return assistant


# ---------------------------------------------------------------------------
# Measuring: greedy speculative decoding with the assistant, as llama.cpp runs it
# ---------------------------------------------------------------------------
def greedy(target: Any, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens by full recompute; also the top-1/top-2 logit gap of each step."""
    import torch

    cur = list(ids)
    out: list[int] = []
    gaps: list[float] = []
    with torch.no_grad():
        for _ in range(n):
            logits = target(input_ids=torch.tensor([cur])).logits[0, -1].float()
            top = torch.topk(logits, 2)
            out.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            cur.append(out[-1])
    return out, gaps


def speculative_acceptance(target: Any, assistant: Any, ids: list[int], n: int,
                           k: int) -> dict[str, int]:
    """Greedy drafting of up to k tokens per round (the assistant at one position, chained on
    its own hidden state), verified against the target's greedy tokens (full recompute)."""
    import torch

    seq = list(ids)
    drafted = accepted = 0
    produced = 0
    with torch.no_grad():
        while produced < n:
            t = torch.tensor([seq])
            h, logits, kv = target_features(target, t)
            nxt = int(logits[0, -1].argmax())
            seq.append(nxt)
            produced += 1
            if produced >= n:
                break
            # draft from token nxt at position len(seq)-1 with h of the previous position
            p = len(seq) - 1
            tok, hid = nxt, h[:, -1:]
            draft: list[int] = []
            for _ in range(min(k, n - produced)):
                emb = target.get_input_embeddings()(torch.tensor([[tok]]))
                x = assistant.pre_projection(torch.cat([emb, hid], dim=-1))
                q = torch.arange(p, p + 1)[None]
                kpos = torch.arange(p)[None, :]
                neg = torch.finfo(torch.float32).min
                full = torch.where(kpos < p, 0.0, neg)[None, None]
                swa = torch.where((p - kpos) < SLIDING_WINDOW, 0.0, neg)[None, None]
                o = assistant.model(inputs_embeds=x, position_ids=q, shared_kv_states=kv,
                                    attention_mask={"full_attention": full,
                                                    "sliding_attention": swa},
                                    use_cache=False)
                tok = int(assistant.lm_head(o.last_hidden_state)[0, -1].argmax())
                hid = assistant.post_projection(o.last_hidden_state)
                draft.append(tok)
            drafted += len(draft)
            # verify: the target's greedy continuation over the drafts
            _, vlog, _ = target_features(target, torch.tensor([seq + draft]))
            base = len(seq) - 1
            for i, d in enumerate(draft):
                want = int(vlog[0, base + i].argmax())
                if d != want:
                    break
                accepted += 1
                seq.append(d)
                produced += 1
    return {"drafted": drafted, "accepted": accepted}
