"""The OpenAI-compatible server: validation, error format, auth, routes, fault plan, process lifecycle."""
import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from memagent.backends.instant import InstantBackend
from memagent.protocol import GenerationRequest
from memagent.server.protocol import DEFAULT_MAX_TOKENS, RequestError, parse_chat_request
from memagent.server.serving import FaultPlan
from servers import ROOT, ServerProcess, servers  # noqa: F401  (fixture)

KEY = "sk-server-test-key"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--backend", "instant", "--api-key", KEY) as s:
        yield s


def call(server, path: str, body=None, key: str | None = KEY, raw: bytes | None = None, method=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(server.root_url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ---------------------------------------------------------------- pure validation

def test_parse_defaults_and_fields():
    r = parse_chat_request({"messages": USER})
    g = r.generation
    assert r.model is None and g.messages == USER and g.max_tokens == DEFAULT_MAX_TOKENS
    assert (g.temperature, g.top_p, g.seed) == (1.0, 1.0, None)  # OpenAI's defaults
    r = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                      {"type": "text", "text": "b"}]}],
                            "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": 3})
    assert r.generation.messages[0]["content"] == "ab"
    assert (r.generation.max_tokens, r.generation.temperature, r.generation.top_p, r.generation.seed) == (7, 0.0, 0.5, 3)


@pytest.mark.parametrize("body, param", [
    ([], None),
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": -3}, "max_tokens"),
    ({"messages": USER, "max_tokens": "10"}, "max_tokens"),
    ({"messages": USER, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": USER, "max_tokens": True}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "temperature": 3}, "temperature"),
    ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "seed": 1.5}, "seed"),
    ({"messages": USER, "model": 3}, "model"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": USER, "seed": 10**40}, "seed"),
    ({"messages": [{"role": "user", "content": "a\ud800"}]}, "messages"),
])
def test_parse_rejects(body, param):
    with pytest.raises(RequestError) as info:
        parse_chat_request(body)
    assert info.value.status == 400 and info.value.param == param and info.value.message


def test_fault_plan_counts_then_chances():
    plan = FaultPlan.parse("hang:1, 500:2", seed=0)
    assert [plan.next_fault() for _ in range(5)] == ["hang", "500", "500", None, None]
    draws = [FaultPlan.parse("close@0.3,malformed@0.2", seed=7) for _ in range(2)]
    a, b = ([p.next_fault() for _ in range(400)] for p in draws)
    assert a == b  # the same seed gives the same faults
    assert 0.2 < a.count("close") / 400 < 0.4 and 0.1 < a.count("malformed") / 400 < 0.3
    assert FaultPlan.parse("") is None and FaultPlan.parse(None) is None
    for bad in ("oops:1", "500", "500:x", "500@2", "500:-1"):
        with pytest.raises(ValueError, match="fault"):
            FaultPlan.parse(bad)


def test_instant_backend_is_deterministic_and_honours_max_tokens():
    backend = InstantBackend(answer="42")
    run = lambda text, n=32: asyncio.run(backend.generate(GenerationRequest([{"role": "user", "content": text}], n)))
    assert run("chunk one").text == run("chunk one").text != run("chunk two").text
    assert run("Give \\boxed{} answer").text == "The answer is \\boxed{42}"
    cut = run("Give \\boxed{} answer", 2)
    assert cut.finish_reason == "length" and cut.completion_tokens == 2


# ---------------------------------------------------------------- over HTTP

def test_chat_completion_format(server):
    status, body = call(server, "/v1/chat/completions", {"model": "instant", "messages": USER, "max_tokens": 8})
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == "instant" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].startswith("notes ")
    assert choice["finish_reason"] == "stop"
    u = body["usage"]
    assert u["prompt_tokens"] >= 1 and u["completion_tokens"] == 2 and u["total_tokens"] == u["prompt_tokens"] + 2


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 5}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "temperature": "x"}, "temperature"),
])
def test_bad_requests_get_openai_errors(server, body, param):
    status, reply = call(server, "/v1/chat/completions", body)
    assert status == 400
    err = reply["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_invalid_json_and_unknown_model(server):
    status, reply = call(server, "/v1/chat/completions", raw=b'{"messages": [')
    assert status == 400 and "JSON" in reply["error"]["message"]
    status, reply = call(server, "/v1/chat/completions", {"model": "gpt-9", "messages": USER})
    assert status == 404 and reply["error"]["code"] == "model_not_found" and "gpt-9" in reply["error"]["message"]


def test_api_key_required(server):
    for key in (None, "wrong"):
        for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/models", None)):
            status, reply = call(server, path, body, key=key)
            assert status == 401 and reply["error"]["code"] == "invalid_api_key"
            assert KEY not in json.dumps(reply)
    status, _ = call(server, "/health", key=None)  # probes need no key
    assert status == 200


def test_models_and_health(server):
    status, reply = call(server, "/v1/models")
    assert status == 200 and reply["object"] == "list"
    assert [m["id"] for m in reply["data"]] == ["instant", "memagent", "memagent/instant"]  # + the memory model
    # one completion of its own, so the count does not depend on which tests ran before (`-k` runs)
    status, _ = call(server, "/v1/chat/completions", {"model": "instant", "messages": USER, "max_tokens": 8})
    assert status == 200
    health = server.health()
    assert health["status"] == "ok" and health["model"] == "instant" and health["completed"] >= 1


def test_tokenize_needs_a_tokenizer(server):
    status, reply = call(server, "/tokenize", {"prompt": "hello"})
    assert status == 404 and "tokenizer" in reply["error"]["message"]


def test_tokenize_with_backend_tokenizer(smol_tokenizer):
    """In-process app with a backend that has a tokenizer: /tokenize answers with its ids."""
    from aiohttp.test_utils import TestClient, TestServer

    from memagent.server.router import build_app

    backend = InstantBackend()
    backend.tokenizer = smol_tokenizer

    async def go():
        async with TestClient(TestServer(build_app(backend, "instant"))) as client:
            r = await client.post("/tokenize", json={"prompt": "hello world"})
            ok = (r.status, await r.json())
            r = await client.post("/tokenize", json={"prompt": 3})
            return ok, r.status

    (status, reply), bad = asyncio.run(go())
    assert status == 200 and reply["tokens"] == list(smol_tokenizer.encode("hello world"))
    assert reply["count"] == len(reply["tokens"]) and bad == 400


# ---------------------------------------------------------------- process lifecycle

def test_sigterm_shuts_down_cleanly(servers):
    s = servers("--backend", "instant")
    assert s.terminate() == 0
    assert "memagent server: http://127.0.0.1:" in s.output()


def _run(*args):
    return subprocess.run([sys.executable, "-m", "memagent.server", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_bad_flags_give_one_line_errors(servers):
    r = _run("--backend", "instant", "--faults", "explode:1")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "explode" in r.stderr
    busy = servers("--backend", "instant")
    r = _run("--backend", "instant", "--port", str(busy.port))
    assert r.returncode == 1 and "cannot listen" in r.stderr and "Traceback" not in r.stderr
