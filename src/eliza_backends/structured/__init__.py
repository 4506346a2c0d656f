"""Structured output: grammar constraints on the next token (:mod:`.constraint`), the per-turn
output spec and logits guide (:mod:`.logits`) and token logprobs (:mod:`.logprobs`)."""
