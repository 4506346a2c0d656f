"""How often a real model's JSON is usable, with and without constrained decoding: the same
chat requests (a task, and the JSON schema the answer must follow, stated in the system
message) answered three ways, through the OpenAI-shaped API on one backend:

* ``prompted``: no constraint, the schema only in the prompt (what a runtime without
  constrained decoding gives);
* ``json_object``: ``response_format={"type": "json_object"}`` (any JSON object);
* ``json_schema``: ``response_format`` with the task's schema.

Per mode: the share of replies that parse as JSON as they are (``strict``), that parse once
code fences and text around the first ``{...}`` are dropped (``lenient``), that validate
against the schema (jsonschema, on the lenient parse), that hold the expected values (fields
of the extraction tasks that equal the answer key), that ended on their own (finish ``stop``,
not ``length``), the mean tokens per reply and the median seconds per reply (prefill
included). Greedy, then ``--seeds`` sampled runs
(temperature 0.8) per task.

    python benchmarks/eval_structured.py BUNDLE [--backend llama.cpp] [--seeds 2]
        [--max-tokens 160] [--threads 2] [--json]

BUNDLE: a bundle folder, or a GGUF file (laid out as a one-file bundle in a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema

from eliza_backends import InferenceContext, chat_completion, create_bundle

STR = {"type": "string"}
INT = {"type": "integer"}

#: (task, schema, expected values or None): extraction tasks have an answer key
TASKS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("Extract the person: 'Alice Smith is 34 years old and lives in Paris.'",
     {"type": "object", "properties": {"name": STR, "age": INT, "city": STR},
      "required": ["name", "age", "city"], "additionalProperties": False},
     {"name": "Alice Smith", "age": 34, "city": "Paris"}),
    ("Extract the order: 'Order 5512: 3 blue mugs at 7.50 each.'",
     {"type": "object", "properties": {"order_id": INT, "quantity": INT, "item": STR,
                                       "unit_price": {"type": "number"}},
      "required": ["order_id", "quantity", "item", "unit_price"],
      "additionalProperties": False},
     {"order_id": 5512, "quantity": 3, "unit_price": 7.5}),
    ("What is the sentiment of: 'I loved this film, the music was wonderful.'?",
     {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative",
                                                               "neutral"]}},
      "required": ["sentiment"], "additionalProperties": False},
     {"sentiment": "positive"}),
    ("Is the number 17 prime? Answer with a boolean and the number.",
     {"type": "object", "properties": {"number": INT, "is_prime": {"type": "boolean"}},
      "required": ["number", "is_prime"], "additionalProperties": False},
     {"number": 17, "is_prime": True}),
    ("List three primary colors.",
     {"type": "object", "properties": {"colors": {"type": "array", "items": STR,
                                                  "minItems": 3, "maxItems": 3}},
      "required": ["colors"], "additionalProperties": False}, None),
    ("Extract the date: 'The meeting is on 12 March 2024.'",
     {"type": "object", "properties": {"day": INT, "month": STR, "year": INT},
      "required": ["day", "month", "year"], "additionalProperties": False},
     {"day": 12, "month": "March", "year": 2024}),
    ("Describe a book you like: its title, author and year.",
     {"type": "object", "properties": {"title": STR, "author": STR, "year": INT},
      "required": ["title", "author", "year"], "additionalProperties": False}, None),
    ("Give a user profile with a name and an address (street, city, country).",
     {"type": "object", "properties": {
         "name": STR, "address": {"type": "object", "properties": {
             "street": STR, "city": STR, "country": STR},
             "required": ["street", "city", "country"], "additionalProperties": False}},
      "required": ["name", "address"], "additionalProperties": False}, None),
    ("Extract the product: 'The X200 laptop costs 999 dollars and is in stock.'",
     {"type": "object", "properties": {"model": STR, "price": {"type": "number"},
                                       "in_stock": {"type": "boolean"}},
      "required": ["model", "price", "in_stock"], "additionalProperties": False},
     {"model": "X200", "price": 999, "in_stock": True}),
    ("Give two cities with their countries.",
     {"type": "object", "properties": {"cities": {"type": "array", "minItems": 2,
                                                  "maxItems": 2, "items": {
         "type": "object", "properties": {"city": STR, "country": STR},
         "required": ["city", "country"], "additionalProperties": False}}},
      "required": ["cities"], "additionalProperties": False}, None),
    ("Rate the weather 'sunny and warm' from 1 to 5 and say why.",
     {"type": "object", "properties": {"rating": {"type": "integer", "minimum": 1,
                                                  "maximum": 5}, "reason": STR},
      "required": ["rating", "reason"], "additionalProperties": False}, None),
    ("Extract the contact: 'Call Bob at 555-0142, email bob@example.com.'",
     {"type": "object", "properties": {"name": STR, "phone": STR, "email": STR},
      "required": ["name", "phone", "email"], "additionalProperties": False},
     {"name": "Bob", "phone": "555-0142", "email": "bob@example.com"}),
]
MODES = ("prompted", "json_object", "json_schema")


def messages(task: str, schema: dict[str, Any]) -> list[dict[str, str]]:
    """The request: the schema in the system message, the task as the user's."""
    return [{"role": "system", "content": "Answer with a JSON object only, valid against "
             f"this JSON schema: {json.dumps(schema)}"}, {"role": "user", "content": task}]


def lenient(text: str) -> Any:
    """The JSON of ``text`` once fences and text around the first object are dropped."""
    text = re.sub(r"```(?:json)?", "", text)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object")
    return json.loads(text[start:end + 1])


def score(text: str, finish: str, tokens: int, schema: dict[str, Any],
          expected: dict[str, Any] | None) -> dict[str, Any]:
    """One reply's marks."""
    row: dict[str, Any] = {"strict": False, "lenient": False, "schema": False,
                           "stopped": finish != "length", "tokens": tokens,
                           "fields": None}
    try:
        json.loads(text)
        row["strict"] = True
    except ValueError:
        pass
    try:
        data = lenient(text)
        row["lenient"] = True
    except ValueError:
        return row
    try:
        jsonschema.validate(data, schema)
        row["schema"] = True
    except jsonschema.ValidationError:
        pass
    if expected is not None:
        got = data if isinstance(data, dict) else {}
        row["fields"] = sum(_same(got.get(k), v) for k, v in expected.items()) / len(expected)
    return row


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().lower() == want.lower()
    if isinstance(want, bool):
        return got is want
    return isinstance(got, int | float) and not isinstance(got, bool) and got == want


def run(bundle: Path, backend: str, seeds: int, max_tokens: int, threads: int
        ) -> dict[str, Any]:
    """Every task in every mode: the rows and the per-mode summary."""
    rows: list[dict[str, Any]] = []
    with InferenceContext(bundle) as ctx:
        for task, schema, expected in TASKS:
            msgs = messages(task, schema)
            for sample in range(seeds + 1):
                sampling = {"temperature": 0.8, "seed": sample} if sample else {}
                for mode in MODES:  # interleaved, so load drift hits every mode alike
                    extra: dict[str, Any] = {}
                    if mode == "json_object":
                        extra["response_format"] = {"type": "json_object"}
                    elif mode == "json_schema":
                        extra["response_format"] = {"type": "json_schema", "json_schema": {
                            "name": "answer", "schema": schema}}
                    t0 = time.perf_counter()
                    reply = chat_completion(ctx, msgs, backend=backend, max_tokens=max_tokens,
                                            config={"threads": threads, "context_size": 1024},
                                            **sampling, **extra)
                    wall = time.perf_counter() - t0
                    choice = reply.choices[0]
                    tokens = reply.usage.completion_tokens
                    row = score(choice.message.content or "", choice.finish_reason, tokens,
                                schema, expected)
                    rows.append({"task": task[:40], "sample": sample, "mode": mode,
                                 "text": choice.message.content, "seconds": wall, **row})
                    print(f"{len(rows)}: {mode} {task[:30]!r} sample {sample}: "
                          f"{tokens} tokens in {wall:.1f} s, schema-valid {row['schema']}",
                          file=sys.stderr, flush=True)
    return {"bundle": str(bundle), "backend": backend, "rows": rows,
            "summary": {mode: summary([r for r in rows if r["mode"] == mode])
                        for mode in MODES}}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The shares and means of ``rows``."""
    n = len(rows)
    keyed = [r["fields"] for r in rows if r["fields"] is not None]
    return {"n": n, **{k: sum(r[k] for r in rows) / n
                       for k in ("strict", "lenient", "schema", "stopped")},
            "fields": sum(keyed) / len(keyed) if keyed else None,
            "tokens": sum(r["tokens"] for r in rows) / n,
            "seconds": statistics.median(r["seconds"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--backend", default="llama.cpp")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="every reply, as JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle
        if bundle.is_file():
            bundle = _bundle_of(bundle, Path(tmp))
        result = run(bundle, args.backend, args.seeds, args.max_tokens, args.threads)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.bundle.name} on {args.backend}: {len(TASKS)} tasks x {args.seeds + 1} runs "
          f"(greedy + {args.seeds} sampled at T=0.8), max_tokens {args.max_tokens}")
    print("| mode | valid JSON (as is) | valid JSON (lenient) | schema-valid | expected "
          "values | ended (not cut) | tokens/reply | s/reply (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, s in result["summary"].items():
        fields = "-" if s["fields"] is None else f"{100 * s['fields']:.0f}%"
        print(f"| {mode} | {100 * s['strict']:.0f}% | {100 * s['lenient']:.0f}% | "
              f"{100 * s['schema']:.0f}% | {fields} | {100 * s['stopped']:.0f}% | "
              f"{s['tokens']:.1f} | {s['seconds']:.1f} |")
    return 0


def _bundle_of(gguf: Path, tmp: Path) -> Path:
    out = tmp / "bundle"
    create_bundle(out, [gguf], name=gguf.stem)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
