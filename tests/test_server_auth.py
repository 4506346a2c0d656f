"""``eliza-backends serve --api-key``: every endpoint but ``/health`` answers 401 (OpenAI's
error body) without the key or with a wrong one, works with it (``Authorization: Bearer`` or
``x-api-key``), and the key never reaches the logs; a server bound beyond loopback without a
key warns at startup."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess

from eliza_backends.server.auth import exposure_warning, is_loopback

KEY = "sk-eliza-test-7f3a9c1e"
WRONG = "sk-eliza-wrong-0b8d2e44"
ROUTES = [("GET", "/v1/models", None), ("GET", "/v1/models/tiny", None),
          ("POST", "/v1/chat/completions",
           {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
          ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
          ("GET", "/nope", None)]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(TINY_BUNDLE, "--sessions", "1", "--threads", "1",
                       "--api-key", KEY) as proc:
        yield proc


def _call(server: ServerProcess, method: str, path: str, body: object,
          headers: dict[str, str]) -> httpx.Response:
    return httpx.request(method, server.root + path, json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": f"Bearer {WRONG}"}, {"x-api-key": WRONG},
    {"Authorization": KEY},  # no scheme
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Bearer {KEY}x"}, {"Authorization": f"Bearer {KEY[:-1]}"},
], ids=["none", "wrong-bearer", "wrong-x-api-key", "no-scheme", "basic", "longer", "shorter"])
def test_every_endpoint_but_health_needs_the_key(server: ServerProcess,
                                                 headers: dict[str, str]) -> None:
    for method, path, body in ROUTES:
        resp = _call(server, method, path, body, headers)
        assert resp.status_code == 401, (path, resp.text)
        error = resp.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert error["message"] and KEY not in resp.text and WRONG not in resp.text
        assert resp.headers["www-authenticate"] == "Bearer"
    assert _call(server, "GET", "/health", None, headers).status_code == 200


def test_the_key_opens_every_endpoint(server: ServerProcess) -> None:
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY},
                    {"authorization": f"bearer  {KEY}"}):
        for method, path, body in ROUTES:
            resp = _call(server, method, path, body, headers)
            assert resp.status_code == (404 if path == "/nope" else 200), (path, resp.text)
    client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model="tiny", max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.usage is not None and reply.usage.completion_tokens == 4
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key=WRONG, max_retries=0).models.list()


def test_the_key_is_never_logged(server: ServerProcess) -> None:
    for headers in ({"Authorization": f"Bearer {WRONG}"}, {"Authorization": f"Bearer {KEY}"}):
        _call(server, *ROUTES[2][:2], {"model": "tiny", "messages": "bad"}, headers)
        _call(server, *ROUTES[2], headers)
    records = server.access_records()
    assert any(r["status"] == 401 for r in records)
    assert any(r["status"] == 200 and r["path"] == "/v1/chat/completions" for r in records)
    logs = "".join(server.stdout) + "".join(server.stderr)
    assert KEY not in logs and WRONG not in logs
    assert "API key required" in server.announcement


def test_loopback_needs_no_warning_anything_else_does() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host) and exposure_warning(host, None) is None, host
    for host in ("0.0.0.0", "::", "192.168.1.5", "myhost.example"):
        warning = exposure_warning(host, None)
        assert warning is not None and "--api-key" in warning, host
        assert exposure_warning(host, KEY) is None


def test_a_public_server_without_a_key_warns_and_the_env_key_guards() -> None:
    with ServerProcess(TINY_BUNDLE, "--sessions", "1", "--threads", "1",
                       "--host", "0.0.0.0") as open_server:
        deadline = time.monotonic() + 10  # stderr is read by a thread
        while not any("without an API key" in line for line in open_server.stderr):
            assert time.monotonic() < deadline, open_server.stderr
            time.sleep(0.05)
        assert httpx.get(open_server.url + "/models", timeout=30).status_code == 200
    with ServerProcess(TINY_BUNDLE, "--sessions", "1", "--threads", "1", "--host", "0.0.0.0",
                       env={"ELIZA_API_KEY": KEY}) as guarded:
        assert not any("without an API key" in line for line in guarded.stderr)
        assert httpx.get(guarded.url + "/models", timeout=30).status_code == 401
        assert httpx.get(guarded.url + "/models", headers={"x-api-key": KEY},
                         timeout=30).status_code == 200


def test_anthropic_clients_get_their_own_401_and_the_key_by_x_api_key(
        server: ServerProcess) -> None:
    import anthropic

    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        resp = _call(server, "POST", path, body, {"x-api-key": WRONG})
        assert resp.status_code == 401, (path, resp.text)
        assert resp.json()["type"] == "error"
        assert resp.json()["error"]["type"] == "authentication_error"
        assert KEY not in resp.text and WRONG not in resp.text
        assert _call(server, "POST", path, body, {"x-api-key": KEY}).status_code == 200
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.root, api_key=WRONG, max_retries=0).messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    reply = anthropic.Anthropic(base_url=server.root, api_key=KEY, max_retries=0).messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert reply.usage.output_tokens == 2
