"""Orchestration overhead: many documents at once against a server that answers instantly.

256 documents are read concurrently by `MemoryAgent` + `OpenAIBackend` from a loopback
`python -m memagent.server --backend instant`. The baseline is the bare minimum of the same work: the
very same requests (recorded beforehand; the instant replies are deterministic, so the prompts are
identical), sent directly, each document's calls one after another and all documents concurrently, as
the driver does. Two baselines: a bare aiohttp session posting the JSON bodies (the least work the
calls can cost in Python) and the `openai` SDK's raw `post(..., cast_to=str)`. The ratios are against
the aiohttp session (the faster), repeat by repeat, median of the repeats; variants run in rotated order,
each after a garbage collection. Our side also tokenizes and chunks the documents (with a fresh tokenizer each run: no warm
cache carried over); that time is measured alone too, so the ratio with it taken out is reported as
well. Goal: ours / bare <= 1.15.

    python benchmarks/bench_overhead.py              # 256 documents x 4 chunks of 1000 tokens
    python benchmarks/bench_overhead.py --reference-tokenizer   # the plain `tokenizers` encoder
    python benchmarks/bench_overhead.py --smoke
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LoopbackServer, essays, median, smollm2_tokenizer, write_result  # noqa: E402


class Recorder:
    """In-process instant backend that keeps every request (same replies as the served one)."""

    def __init__(self):
        from memagent.backends.instant import InstantBackend

        self.inner, self.requests = InstantBackend(), []

    async def generate(self, request):
        self.requests.append(request)
        return await self.inner.generate(request)

    async def aclose(self):
        return None


class Memo:
    """A tokenizer that remembers every answer: after one pass over the documents, tokenizing costs a
    dict lookup, so a run with it measures the orchestration alone (ours_pretokenized)."""

    def __init__(self, tok):
        self.tok, self.name, self.memo = tok, tok.name, {}
        self.tokenize_in_thread = getattr(tok, "tokenize_in_thread", True)  # as the wrapped one runs

    def _get(self, kind, text, fn):
        key = (kind, text)
        if key not in self.memo:
            self.memo[key] = fn(text)
        return self.memo[key]

    def encode(self, text):
        return self._get("e", text, self.tok.encode)

    def encode_offsets(self, text):
        return self._get("o", text, self.tok.encode_offsets)

    def encode_batch_offsets(self, texts):
        return [self.encode_offsets(t) for t in texts]

    def encode_batch_starts(self, texts):  # what the chunker asks a tokenizer that has it
        starts = getattr(self.tok, "encode_batch_starts", None) or \
            (lambda ts: [__import__("numpy").asarray(o[1]) for o in self.tok.encode_batch_offsets(ts)])
        return [self._get("s", t, lambda x: starts([x])[0]) for t in texts]

    def safe_cut(self, text, before):
        return self._get("c", (text, before), lambda tb: self.tok.safe_cut(*tb))

    def decode(self, ids):
        return self.tok.decode(ids)


def make_docs(n_docs: int, doc_tokens: int, tok) -> list[str]:
    text = essays()
    sample = text[:200_000]
    chars = int(doc_tokens * len(sample) / len(tok.encode(sample)))
    step = max(1, (len(text) - chars) // max(1, n_docs))
    return [text[(i * step) % (len(text) - chars):][:chars] for i in range(n_docs)]


def body_of(request) -> dict:
    body = {"model": "instant", "messages": request.messages, "temperature": request.temperature,
            "top_p": request.top_p, "max_tokens": request.max_tokens}
    if request.seed is not None:
        body["seed"] = request.seed
    return body


async def ours(agent_factory, docs, concurrency) -> tuple[float, int]:
    agent, backend = agent_factory()
    t = time.perf_counter()
    results = await agent.aread_many([(d, ["What is the main point?"]) for d in docs], concurrency=concurrency)
    dt = time.perf_counter() - t
    errors = [a.error for answers in results for a in answers if a.error]
    await backend.aclose()
    if errors:
        raise SystemExit(f"{len(errors)} reads failed, e.g. {errors[0]}")
    return dt, sum(a.calls for answers in results for a in answers)


async def bare(base_url, per_doc_bodies, raw: bool) -> tuple[float, int]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=120)

    async def one_doc(bodies):
        for body in bodies:
            if raw:
                reply = await client.post("/chat/completions", body=body, cast_to=str)
                assert reply
            else:
                reply = await client.chat.completions.create(**body)
                assert reply.choices
        return len(bodies)

    t = time.perf_counter()
    n = sum(await asyncio.gather(*(one_doc(b) for b in per_doc_bodies)))
    dt = time.perf_counter() - t
    await client.close()
    return dt, n


async def bare_aiohttp(base_url, per_doc_bodies) -> tuple[float, int]:
    import json

    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    headers={"Authorization": "Bearer EMPTY", "Content-Type": "application/json"})

    async def one_doc(bodies):
        for body in bodies:
            async with session.post(base_url + "/chat/completions", data=json.dumps(body)) as resp:
                assert resp.status == 200 and await resp.text()
        return len(bodies)

    t = time.perf_counter()
    n = sum(await asyncio.gather(*(one_doc(b) for b in per_doc_bodies)))
    dt = time.perf_counter() - t
    await session.close()
    return dt, n


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a seconds-long version")
    ap.add_argument("--docs", type=int, default=None)
    ap.add_argument("--chunks-per-doc", type=int, default=4)
    ap.add_argument("--chunk-tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--reference-tokenizer", action="store_true",
                    help="chunk with the plain `tokenizers` encoder instead of the exact fast one (the default)")
    ap.add_argument("--fast-tokenizer", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old commands
    args = ap.parse_args(argv)
    n_docs = args.docs or (32 if args.smoke else 256)
    repeats = args.repeats or (2 if args.smoke else 3)

    from memagent.backends.openai_http import OpenAIBackend
    from memagent.chunking import iter_chunks
    from memagent.driver import MemoryAgent

    from memagent.backends import fast

    ref = smollm2_tokenizer()
    new_tokenizer = (lambda: ref) if args.reference_tokenizer else (lambda: fast(ref))  # noqa: E731
    tok = new_tokenizer()
    docs = make_docs(n_docs, args.chunks_per_doc * args.chunk_tokens - 50, ref)

    def agent_for(backend, tokenizer=tok):
        return MemoryAgent(backend, tokenizer, template="memagent", chunk_tokens=args.chunk_tokens, memory_tokens=1024)

    memo = Memo(new_tokenizer())
    per_doc = []  # the exact requests of each document, in order
    for d in docs:
        rec = Recorder()
        asyncio.run(agent_for(rec, memo).aread(d, ["What is the main point?"]))
        per_doc.append([body_of(r) for r in rec.requests])
    n_requests = sum(map(len, per_doc))
    n_updates = n_requests - len(docs)

    runs = {"ours": [], "ours_pretokenized": [], "bare_aiohttp": [], "bare_sdk_raw": [], "chunking_alone": []}
    with LoopbackServer() as server:
        def factory(tokenizer=None):
            backend = OpenAIBackend(server.base_url, model="instant", concurrency=n_docs)
            return agent_for(backend, tokenizer or new_tokenizer()), backend

        def run_ours(tokenizer=None):
            dt, calls = asyncio.run(ours(lambda: factory(tokenizer), docs, n_docs))
            assert calls == n_requests, (calls, n_requests)
            return dt

        def run_chunking():
            fresh = new_tokenizer()  # made before the clock starts, as `ours` makes its agent before
            t = time.perf_counter()
            for d in docs:
                for _ in iter_chunks(d, fresh, args.chunk_tokens):
                    pass
            return time.perf_counter() - t

        variants = {"ours": run_ours, "ours_pretokenized": lambda: run_ours(memo),
                    "bare_aiohttp": lambda: asyncio.run(bare_aiohttp(server.base_url, per_doc))[0],
                    "bare_sdk_raw": lambda: asyncio.run(bare(server.base_url, per_doc, raw=True))[0],
                    "chunking_alone": run_chunking}
        asyncio.run(bare(server.base_url, per_doc[:4], raw=True))  # warm-up: connections, server caches
        run_ours()
        names = list(variants)
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotated: no fixed neighbour
                gc.collect()  # the previous variant's garbage is not collected on this one's clock
                runs[name].append(variants[name]())
        served = server.health()
    m = {k: median(v) for k, v in runs.items()}
    best_bare = min(m["bare_aiohttp"], m["bare_sdk_raw"])
    # Each repeat's ratio against the bare run of the same repeat: a slow spell of the machine then
    # weighs on both sides of the ratio, not on one variant's median.
    paired = {k: median([x / b for x, b in zip(runs[k], runs["bare_aiohttp"])]) for k in ("ours", "ours_pretokenized")}
    result = {
        "docs": n_docs, "chunk_tokens": args.chunk_tokens, "chunks_per_doc": args.chunks_per_doc,
        "concurrency": n_docs, "requests_per_run": n_requests, "tokenizer": type(tok).__name__,
        "median_seconds": m,
        "chunk_requests_per_s": n_updates / m["ours"], "requests_per_s": n_requests / m["ours"],
        "bare_requests_per_s": n_requests / best_bare,
        "ratio_ours_vs_bare": paired["ours"],
        "ratio_of_medians_ours_vs_bare": m["ours"] / best_bare,
        "ratio_ours_minus_chunking_vs_bare": (m["ours"] - m["chunking_alone"]) / best_bare,
        "ratio_pretokenized_vs_bare": paired["ours_pretokenized"],
        "ratio_of_medians_pretokenized_vs_bare": m["ours_pretokenized"] / best_bare,
        "ratio_ours_vs_bare_sdk": m["ours"] / m["bare_sdk_raw"],
        "goal_ratio": 1.15, "server_requests": served.get("requests"),
        "runs_seconds": {k: [round(x, 3) for x in v] for k, v in runs.items()},
    }
    path = write_result("overhead" + ("_reftok" if args.reference_tokenizer else ""), result, smoke=args.smoke)
    print(f"{n_docs} documents x {args.chunks_per_doc} chunks of {args.chunk_tokens} tokens, {n_requests} requests a run")
    for k, v in m.items():
        print(f"  {k:15s} {v:7.3f} s")
    print(f"chunk-requests/s (ours): {result['chunk_requests_per_s']:.0f}; all requests/s: {result['requests_per_s']:.0f} "
          f"(bare: {result['bare_requests_per_s']:.0f})")
    print(f"ratio ours / bare: {result['ratio_ours_vs_bare']:.3f}; pretokenized (orchestration alone): "
          f"{result['ratio_pretokenized_vs_bare']:.3f}; minus chunking time: "
          f"{result['ratio_ours_minus_chunking_vs_bare']:.3f} (goal <= 1.15)")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
