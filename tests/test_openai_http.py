"""OpenAIBackend against a real `python -m memagent.server` process on loopback.

The instant backend makes the server answer at once, so these tests measure the client's behaviour
(concurrency, retries, errors) rather than a model. Short timeouts and backoffs keep them fast.
"""
import asyncio
import threading
import time

import pytest

from memagent.backends.instant import InstantBackend
from memagent.backends.openai_http import OpenAIBackend, normalise_base_url
from memagent.protocol import BackendError, GenerationRequest
from servers import ServerProcess, free_port, servers  # noqa: F401  (fixture)

KEY = "sk-test-secret-7f3a9c"


def req(text: str = "hello", max_tokens: int = 16, **kw) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], max_tokens=max_tokens, **kw)


def expected(request: GenerationRequest):
    return asyncio.run(InstantBackend().generate(request))


def fast(url: str, **kw) -> OpenAIBackend:
    kw = {"timeout": 5.0, "max_retries": 3, "backoff": 0.01, **kw}
    return OpenAIBackend(url, **kw)


def test_base_url_normalised():
    assert normalise_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalise_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert normalise_base_url("https://openrouter.ai/api/v1") == "https://openrouter.ai/api/v1"
    with pytest.raises(BackendError, match="base-url"):
        normalise_base_url("localhost:8000")


def test_plain_call_round_trips_and_discovers_model(servers):
    server = servers("--backend", "instant")
    backend = fast(server.root_url)  # no /v1 and no model: both found by the client
    update, final = req("section text"), req("Put the answer in \\boxed{}.", max_tokens=64)
    gen = asyncio.run(backend.generate(update))
    want = expected(update)
    assert backend.model == "instant"
    assert (gen.text, gen.finish_reason, gen.prompt_tokens, gen.completion_tokens) == \
        (want.text, "stop", want.prompt_tokens, want.completion_tokens)
    # A second event loop (a second asyncio.run) must work with the same backend object.
    gen = asyncio.run(backend.generate(final))
    assert gen.text == "The answer is \\boxed{instant}"
    cut = asyncio.run(backend.generate(req("Put the answer in \\boxed{}.", max_tokens=2)))
    assert cut.finish_reason == "length" and cut.completion_tokens == 2
    s = backend.stats
    assert s["requests"] == 3 and s["retries"] == 0 and s["failures"] == 0
    assert s["prompt_tokens"] > 0 and s["completion_tokens"] == want.completion_tokens + gen.completion_tokens + 2
    assert server.health()["completed"] == 3


def test_many_calls_in_flight(servers):
    server = servers("--backend", "instant", "--instant-delay", "0.2")
    backend = fast(server.base_url, model="instant", concurrency=8)
    requests = [req(f"prompt {i}") for i in range(32)]

    async def run_all():
        try:
            return await asyncio.gather(*(backend.generate(r) for r in requests))
        finally:
            await backend.aclose()

    start = time.monotonic()
    gens = asyncio.run(run_all())
    elapsed = time.monotonic() - start
    assert [g.text for g in gens] == [expected(r).text for r in requests]  # in order, none mixed up
    assert elapsed < 32 * 0.2 / 2, f"32 calls of 0.2 s took {elapsed:.1f} s: not concurrent"
    assert backend.stats["max_in_flight"] == 8  # bounded by `concurrency`, and reached
    assert server.health()["max_in_flight"] == 8


REASONS = {"500": "http_500", "429": "http_429", "hang": "timeout", "close": "connection",
           "malformed": "malformed", "empty": "malformed"}


@pytest.mark.parametrize("kind", list(REASONS))
def test_each_fault_is_retried(servers, kind):
    server = servers("--backend", "instant", "--faults", f"{kind}:2", "--fault-hang-seconds", "30")
    backend = fast(server.base_url, model="instant", timeout=1.0 if kind == "hang" else 5.0)
    gen = asyncio.run(backend.generate(req("after faults")))
    assert gen.text == expected(req("after faults")).text
    assert backend.stats["retries"] == 2 and backend.stats["attempts"] == 3
    assert backend.stats["retry_reasons"] == {REASONS[kind]: 2}
    health = server.health()
    assert health["faults"] == 2 and health["completed"] == 1


def test_random_faults_under_concurrency(servers):
    """Mixed faults at random (seeded) while many calls are in flight: every call still succeeds."""
    server = servers("--backend", "instant", "--faults", "500@0.2,close@0.1,malformed@0.1", "--fault-seed", "3")
    backend = fast(server.base_url, model="instant", max_retries=10, concurrency=16)
    requests = [req(f"doc {i}") for i in range(60)]

    async def run_all():
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    gens = asyncio.run(run_all())
    assert [g.text for g in gens] == [expected(r).text for r in requests]
    faults = server.health()["faults"]
    assert faults > 0 and backend.stats["retries"] == faults  # every injected fault cost exactly one retry


def test_persistent_500_gives_clear_error(servers):
    server = servers("--backend", "instant", "--faults", "500@1", "--api-key", KEY)
    backend = fast(server.base_url, model="instant", api_key=KEY, max_retries=2)
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.generate(req()))
    msg = str(info.value)
    assert "HTTP 500" in msg and "after 3 attempts" in msg and server.base_url in msg
    assert KEY not in msg and "\n" not in msg
    assert backend.stats["attempts"] == 3 and backend.stats["failures"] == 1
    assert server.health()["faults"] == 3


@pytest.mark.parametrize("model", ["instant", None])  # None: the failure happens listing models
def test_wrong_api_key_fails_fast(servers, model):
    server = servers("--backend", "instant", "--api-key", KEY)
    wrong = "sk-wrong-key-0000"
    backend = fast(server.base_url, model=model, api_key=wrong, max_retries=5, backoff=2.0)
    start = time.monotonic()
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.generate(req()))
    assert time.monotonic() - start < 2.0  # no backoff sleeps: 401 is not retried
    msg = str(info.value)
    assert "HTTP 401" in msg and "after 1 attempt:" in msg
    assert wrong not in msg and KEY not in msg
    assert backend.stats["retries"] == 0
    # ... and the right key works against the same server.
    assert asyncio.run(fast(server.base_url, api_key=KEY).generate(req())).text == expected(req()).text


def test_api_key_from_environment(servers, monkeypatch):
    server = servers("--backend", "instant", "--api-key", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert asyncio.run(fast(server.base_url).generate(req())).text == expected(req()).text


def test_unknown_model_fails_fast(servers):
    server = servers("--backend", "instant")
    backend = fast(server.base_url, model="no-such-model", backoff=2.0)
    with pytest.raises(BackendError, match=r"HTTP 404.*no-such-model") as info:
        asyncio.run(backend.generate(req()))
    assert "after 1 attempt:" in str(info.value)


def test_unreachable_server_gives_clear_error():
    port = free_port()  # nothing listens there
    backend = fast(f"http://127.0.0.1:{port}/v1", model="m", max_retries=2)
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.generate(req()))
    msg = str(info.value)
    assert "after 3 attempts" in msg and "connection failed" in msg and f"127.0.0.1:{port}" in msg
    assert backend.stats["retry_reasons"] == {"connection": 2}


def test_server_killed_and_restarted_mid_run(servers):
    """Calls in flight while the server is down succeed once it is back on the same port."""
    first = servers("--backend", "instant")
    backend = OpenAIBackend(first.base_url, model="instant", timeout=5.0, max_retries=40, backoff=0.05,
                            max_backoff=0.25)

    async def run():
        before = await backend.generate(req("before"))
        first.stop()  # SIGKILL: pooled keep-alive connections die with it
        restarted = {}

        def restart():
            time.sleep(0.5)
            restarted["server"] = servers("--backend", "instant", port=first.port)

        thread = threading.Thread(target=restart)
        thread.start()
        during = await asyncio.gather(*(backend.generate(req(f"during {i}")) for i in range(5)))
        thread.join()
        after = [await backend.generate(req(f"after {i}")) for i in range(3)]
        await backend.aclose()
        return before, during, after, restarted["server"]

    before, during, after, second = asyncio.run(run())
    assert before.text == expected(req("before")).text
    assert [g.text for g in during] == [expected(req(f"during {i}")).text for i in range(5)]
    assert [g.text for g in after] == [expected(req(f"after {i}")).text for i in range(3)]
    assert backend.stats["retry_reasons"].get("connection", 0) >= 5  # each call in the gap retried
    assert backend.stats["failures"] == 0
    assert second.health()["completed"] == 8


def test_token_ids_are_refused_clearly():
    backend = fast("http://127.0.0.1:9/v1", model="m")
    with pytest.raises(BackendError, match="embedded backend"):
        asyncio.run(backend.generate(req(return_tokens=True)))


@pytest.fixture(scope="module")
def smol_server():
    """The real embedded SmolLM2-135M behind the HTTP server (one thread: the CPUs are shared)."""
    with ServerProcess("--backend", "embedded", "--model", "smollm2-135m", "--threads", "1",
                       ready_timeout=180.0) as server:
        yield server


def test_real_model_over_http_reads_planted_fact(smol_server, smol_tokenizer):
    """The whole MemAgent loop, model served over HTTP: memory updates through the server, then the answer."""
    from memagent import MemoryAgent

    filler = "The weather was calm and the sea was grey. "
    doc = filler * 12 + "The secret code is 73412. " + filler * 12
    backend = OpenAIBackend(smol_server.base_url, timeout=300.0, max_retries=1)
    agent = MemoryAgent(backend, smol_tokenizer, template="notes", chunk_tokens=160, memory_tokens=48,
                        answer_tokens=24)
    answer = agent.ask(doc, "What is the secret code?")
    assert answer.error is None, answer.error
    assert answer.chunks >= 2 and answer.calls == answer.chunks + 1
    assert backend.model == "smollm2-135m" and backend.stats["retries"] == 0
    assert answer.prompt_tokens > 0 and answer.completion_tokens > 0  # usage came back through HTTP
    assert "73412" in answer.answer, answer


def test_switches_to_max_completion_tokens_when_refused():
    """Newer OpenAI models answer 400 to `max_tokens`; the client switches names once and remembers."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    seen = []

    async def chat(request):
        body = await request.json()
        seen.append(sorted(k for k in body if "tokens" in k))
        if "max_tokens" in body:
            return web.json_response({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported "
                                                "with this model. Use 'max_completion_tokens' instead.",
                                                "type": "invalid_request_error", "param": "max_tokens"}}, status=400)
        return web.json_response({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app, host="127.0.0.1") as server:
            backend = fast(f"http://127.0.0.1:{server.port}/v1", model="m")
            gens = [await backend.generate(req()) for _ in range(2)]
            await backend.aclose()
            return gens, backend.stats

    gens, stats = asyncio.run(go())
    assert [g.text for g in gens] == ["ok", "ok"] and (gens[0].prompt_tokens, gens[0].completion_tokens) == (0, 0)
    assert seen == [["max_tokens"], ["max_completion_tokens"], ["max_completion_tokens"]]
    assert stats["failures"] == 0 and stats["requests"] == 2
