#!/usr/bin/env python
"""Write tests/fixtures/templates/gemma4-llama-server.json: conversations with tools, tool calls
and tool results, and the prompt llama.cpp's own template engine renders for each with Google's
Gemma 4 template (llama-server's ``POST /apply-template``, which applies the template as chat
completions do; ``--jinja`` and the server's default ``enable_thinking`` on).

Usage: start a llama-server built from the llama.cpp vendored in llama-cpp-python 0.3.36 with
any Gemma 4 GGUF and the fixture template, then run this with the project's venv:

    llama-server -m examples/bundles/gemma4-tiny/text/gemma4-tiny-f32.gguf --jinja \\
        --chat-template-file tests/fixtures/templates/google-gemma-4-31B-it.jinja --port 18931
    .venv/bin/python tools/gemma4_template_reference.py http://127.0.0.1:18931
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "templates" / \
    "gemma4-llama-server.json"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "set_config", "description": "Set options",
        "parameters": {"type": "object", "properties": {"config": {"type": "object"}}}}},
]
NESTED = {"config": {"theme": "dark", "sizes": [1, 2.5, -3], "on": True, "tags": ["a b", "c"]}}
ASK = [{"role": "system", "content": "Be brief."},
       {"role": "user", "content": "Weather in Paris, and set dark mode?"}]
CALLS = [*ASK,
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "c0", "type": "function", "function": {
                 "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}},
             {"id": "c1", "type": "function", "function": {
                 "name": "set_config", "arguments": json.dumps(NESTED)}}]},
         {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
         {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
CASES: dict[str, list[dict[str, Any]]] = {
    "ask": ASK,
    "calls_and_results": CALLS,
    "answer_then_user": [*CALLS, {"role": "assistant", "content": "Sunny; dark mode on."},
                         {"role": "user", "content": "Thanks"}],
    "null_float_json_result": [
        ASK[1],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c9", "type": "function", "function": {
                "name": "set_config",
                "arguments": json.dumps({"config": {"x": None, "f": 1.5e10, "b": False}})}}]},
        {"role": "tool", "tool_call_id": "c9", "content": '{"r": "ok"}'}],
}


def main(argv: list[str]) -> int:
    url = argv[0].rstrip("/") if argv else "http://127.0.0.1:18931"
    cases = []
    for name, messages in CASES.items():
        body = json.dumps({"messages": messages, "tools": TOOLS}).encode()
        request = urllib.request.Request(f"{url}/apply-template", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            prompt = json.loads(reply.read())["prompt"]
        cases.append({"name": name, "messages": messages, "prompt": prompt})
    OUT.write_text(json.dumps({"source": "llama-server /apply-template (llama.cpp vendored in "
                                         "llama-cpp-python 0.3.36), enable_thinking on",
                               "tools": TOOLS, "cases": cases}, indent=1) + "\n",
                   encoding="utf-8")
    print(f"wrote {OUT} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
