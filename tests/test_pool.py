"""A pool of OpenAI-compatible replicas: document affinity, least-loaded placement, failover, recovery.

In-process replicas test the placement logic in milliseconds; the last tests run real
`python -m memagent.server --backend instant` processes and SIGKILL one mid-read.
"""
import asyncio
import io
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from memagent.backends import make_backend
from memagent.backends.instant import InstantBackend
from memagent.backends.openai_http import OpenAIBackend
from memagent.backends.pool import PoolBackend, read_url_file, split_urls
from memagent.protocol import _DOCUMENT
from memagent.driver import MemoryAgent
from memagent.protocol import BackendError, GenerationRequest
from memagent.tokenizer import load_tokenizer
from servers import ROOT, servers  # noqa: F401  (fixture)


def docs(n: int, words: int = 600) -> list[str]:
    return [" ".join(f"doc{d} word{i}." for i in range(words)) for d in range(n)]


class Recording(InstantBackend):
    """An instant replica that notes which document (pool key) each call belonged to."""

    def __init__(self, fail_after: int | None = None, delay: float = 0.002):
        super().__init__(delay=delay)
        self.keys: list[int] = []
        self.fail_after = fail_after

    async def generate(self, request):
        if self.fail_after is not None and len(self.keys) >= self.fail_after:
            raise ConnectionError("replica gone")
        self.keys.append(id(_DOCUMENT.get()))
        return await super().generate(request)


def agent(backend) -> MemoryAgent:
    return MemoryAgent(backend, load_tokenizer("cl100k_base"), template="notes", chunk_tokens=300,
                       memory_tokens=64)


def read_all(backend, texts, concurrency=6):
    return asyncio.run(agent(backend).aread_many([(io.StringIO(t), ["What is said?"]) for t in texts],
                                                 concurrency=concurrency))


def test_urls_from_flags_and_file(tmp_path):
    assert split_urls(["http://a:1/v1", "http://b:2/v1,http://a:1/v1"]) == ["http://a:1/v1", "http://b:2/v1"]
    f = tmp_path / "urls.txt"
    f.write_text("# replicas\nhttp://a:1/v1\n\nhttp://b:2/v1  # second\n")
    assert read_url_file(f) == ["http://a:1/v1", "http://b:2/v1"]
    pool = make_backend("openai", base_url=["http://a:1/v1"], base_url_file=str(f), model="m")
    assert isinstance(pool, PoolBackend) and [r.url for r in pool.replicas] == ["http://a:1/v1", "http://b:2/v1"]
    assert all(r.backend.max_retries == 0 for r in pool.replicas)  # the pool retries, on another replica
    assert isinstance(make_backend("openai", base_url=["http://a:1/v1"], model="m"), OpenAIBackend)
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(BackendError, match="lists no URL"):
        read_url_file(tmp_path / "empty.txt")


def test_each_document_sticks_to_one_replica_and_documents_spread_evenly():
    reps = [Recording() for _ in range(3)]
    pool = PoolBackend(reps)
    texts = docs(6)
    answers = read_all(pool, texts, concurrency=6)
    single = read_all(InstantBackend(), texts)
    assert [a[0].memory for a in answers] == [a[0].memory for a in single]
    sets = [set(r.keys) for r in reps]
    assert all(len(s) == 2 for s in sets)  # 6 documents in flight over 3 replicas: 2 each
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])  # never split
    assert sum(len(r.keys) for r in reps) == sum(a[0].calls for a in answers)
    assert all(r.documents == 0 for r in pool.replicas)  # released when each read ended


def test_a_dead_replica_hands_its_documents_over_and_nothing_is_redone():
    reps = [Recording(), Recording(fail_after=3), Recording()]
    pool = PoolBackend(reps, probe=None, probe_interval=3600)  # no recovery inside this test
    texts = docs(6)
    answers = read_all(pool, texts, concurrency=6)
    single = read_all(InstantBackend(), texts)
    assert [a[0].answer for a in answers] == [a[0].answer for a in single]
    assert [a[0].memory for a in answers] == [a[0].memory for a in single]
    assert all(a[0].error is None for a in answers)
    # every call that succeeded was made exactly once: the totals equal the undisturbed run's
    assert sum(len(r.keys) for r in reps) == sum(a[0].calls for a in single)
    moved = set(reps[1].keys)
    assert pool.stats["moved_documents"] >= len(moved) >= 1 and pool.replicas[1].healthy is False
    assert moved and moved <= set(reps[0].keys) | set(reps[2].keys)  # continued elsewhere


def test_a_client_error_is_not_failed_over():
    class Refuses(InstantBackend):
        async def generate(self, request):
            e = BackendError("HTTP 404: no such model")
            e.retryable = False
            raise e

    other = Recording()
    pool = PoolBackend([Refuses(), other])
    req = GenerationRequest(messages=[{"role": "user", "content": "x"}], max_tokens=4)
    with pytest.raises(BackendError, match="404"):
        asyncio.run(pool.generate(req))
    assert other.keys == [] and pool.stats["failovers"] == 0


def test_all_down_waits_for_one_to_come_back_then_fails_with_one_line():
    class Down(InstantBackend):
        async def generate(self, request):
            raise ConnectionError("refused")

    async def never(replica):
        return False

    pool = PoolBackend([Down(), Down()], probe=never, probe_interval=0.01, wait_healthy=0.2)
    req = GenerationRequest(messages=[{"role": "user", "content": "x"}], max_tokens=4)
    with pytest.raises(BackendError, match="all 2 replicas are down"):
        asyncio.run(pool.generate(req))


def test_real_servers_kill_one_mid_read_restart_it_and_it_is_used_again(servers):
    """3 instant server processes; SIGKILL one while documents are being read, restart it on its port.
    Every document finishes, answers equal an undisturbed single-server run, the revived one takes work."""
    reps = [servers("--backend", "instant", "--instant-delay", "0.03") for _ in range(3)]
    pool = make_backend("openai", base_url=[r.base_url for r in reps], model="instant", timeout=10.0)
    pool.probe_interval = 0.05
    texts = docs(48, words=900)
    victim = reps[1]
    revived = {}

    def chaos():
        while victim.health()["completed"] < 10:
            time.sleep(0.01)
        victim.stop()  # SIGKILL mid-read
        time.sleep(0.3)
        revived["server"] = servers("--backend", "instant", "--instant-delay", "0.03", port=victim.port)

    thread = threading.Thread(target=chaos)
    thread.start()
    answers = read_all(pool, texts, concurrency=12)
    thread.join()
    reference = read_all(InstantBackend(), texts)
    assert all(a[0].error is None for a in answers)
    assert [a[0].answer for a in answers] == [a[0].answer for a in reference]
    assert [a[0].memory for a in answers] == [a[0].memory for a in reference]
    assert [a[0].calls for a in answers] == [a[0].calls for a in reference]
    assert pool.stats["down_events"] >= 1 and pool.stats["moved_documents"] >= 1
    assert pool.stats["recoveries"] >= 1
    # the revived replica served the documents that started after it came back
    assert revived["server"].health()["completed"] > 0


def test_cli_ask_with_two_base_urls_reads_the_document_on_one_of_them(servers, tmp_path):
    reps = [servers("--backend", "instant") for _ in range(2)]
    doc = tmp_path / "doc.txt"
    doc.write_text(docs(1, words=800)[0])
    urls = tmp_path / "urls.txt"
    urls.write_text(reps[1].base_url + "\n")
    cmd = [sys.executable, "-m", "memagent", "ask", str(doc), "What is said?", "Anything else?", "--backend", "openai",
           "--base-url", reps[0].base_url, "--base-url-file", str(urls), "--model", "instant",
           "--tokenizer", "cl100k_base", "--chunk-tokens", "300", "--json"]
    out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                         timeout=120, check=True).stdout
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    calls = sum(a["calls"] for a in answers)
    assert len(answers) == 2 and all(a["answer"] == "instant" for a in answers) and calls >= 10
    served = sorted(r.health()["completed"] for r in reps)
    assert served == [0, calls]  # one document: all its calls (both questions) on one replica


def test_instant_slots_bound_the_calls_on_the_model_at_once():
    backend = InstantBackend(delay=0.05, slots=2)
    req = GenerationRequest(messages=[{"role": "user", "content": "x"}], max_tokens=4)

    async def six():
        t = time.perf_counter()
        await asyncio.gather(*(backend.generate(req) for _ in range(6)))
        return time.perf_counter() - t

    assert asyncio.run(six()) >= 0.15  # 6 calls, 2 at a time, 50 ms each
