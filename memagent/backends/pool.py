"""A pool of model servers behind one Backend: `--base-url A --base-url B ...` (or `--base-url-file`).

Why document affinity: a reader sends every chunk of a document with the same instruction + question
prefix, so the replica that read chunk k has that prefix in its KV cache for chunk k+1 (vLLM/SGLang
prefix caching, llama.cpp slots). The driver marks each read with a key (`protocol.enter_document`, a
contextvar, so every call of that read carries it without a new argument); the pool pins the key to
one replica for the whole read and releases it when the read ends.

Placement: a new document goes to the healthy replica with the fewest documents pinned (ties: fewest
requests on the wire, then the lowest index), so documents spread evenly whatever their lengths.
Calls without a key (rollouts, direct prompts) go to the least-busy healthy replica, one by one.

Failover: replicas are called with no retries of their own; a retryable failure (connection refused or
dropped, timeout, 5xx, 429, malformed body) marks the replica down and re-sends *that* call to another
replica, and the document's key moves with it. The reader's state (memory, chunk position) lives in
the client, so the new replica simply continues with the chunk whose call failed: nothing finished is
redone, nothing is lost. A failure that retrying cannot fix (4xx: bad key, unknown model) is raised at
once. A down replica is probed (GET /v1/models) at most every `probe_interval` seconds while the pool
is in use; once it answers it takes new documents again. When every replica is down, calls wait for
one to come back, up to `wait_healthy` seconds, then fail with one line.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol import _DOCUMENT, Backend, BackendError, Generation, GenerationRequest, enter_document, leave_document

def read_url_file(path: str | Path) -> list[str]:
    """One URL a line; blank lines and # comments are ignored."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise BackendError(f"--base-url-file not found: {p}")
    urls = [line.split("#", 1)[0].strip() for line in p.read_text().splitlines()]
    urls = [u for u in urls if u]
    if not urls:
        raise BackendError(f"{p} lists no URL")
    return urls


def split_urls(values) -> list[str]:
    """--base-url values (repeated, or comma separated) as one list, in order, without duplicates."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        for u in str(v).split(","):
            u = u.strip()
            if u and u not in out:
                out.append(u)
    return out


@dataclass
class Replica:
    backend: Backend
    index: int
    url: str | None = None
    healthy: bool = True
    documents: int = 0  # documents pinned to it now
    in_flight: int = 0
    next_probe: float = 0.0
    stats: dict = field(default_factory=lambda: {"calls": 0, "failures": 0, "down": 0, "recovered": 0})


def _retryable(e: Exception) -> bool:
    flag = getattr(e, "retryable", None)
    if flag is not None:
        return bool(flag)
    if isinstance(e, (ConnectionError, asyncio.TimeoutError, OSError)):
        return True
    text = str(e)
    return any(s in text for s in ("connection failed", "no response within", "malformed", "HTTP 5",
                                   "HTTP 429", "HTTP 408", "HTTP 409"))


class PoolBackend:
    """Many replicas of one model as one Backend (see the module docstring)."""

    def __init__(self, replicas: list[Backend], urls: list[str] | None = None, *, probe=None,
                 probe_interval: float = 0.5, wait_healthy: float = 120.0, max_failovers: int = 8,
                 name: str | None = None):
        if not replicas:
            raise BackendError("a pool needs at least one replica")
        urls = urls or [None] * len(replicas)
        self.replicas = [Replica(b, i, u) for i, (b, u) in enumerate(zip(replicas, urls))]
        self._probe_fn = probe  # async (replica) -> bool; None: a down replica is simply tried again later
        self.probe_interval, self.wait_healthy, self.max_failovers = probe_interval, wait_healthy, max_failovers
        self._name = name
        self._pinned: dict[object, Replica] = {}
        self._probing: set = set()
        self._changed: asyncio.Event | None = None
        self._loop = None
        self.stats = {"requests": 0, "failovers": 0, "moved_documents": 0, "down_events": 0, "recoveries": 0}

    @classmethod
    def from_urls(cls, urls: list[str], model: str | None = None, api_key: str | None = None,
                  max_retries: int = 5, probe_interval: float = 0.5, wait_healthy: float = 120.0,
                  name: str | None = None, **replica_kw) -> "PoolBackend":
        """One OpenAIBackend per URL (`replica_kw`: its concurrency, timeout, ...; concurrency is per replica)."""
        from .openai_http import OpenAIBackend

        urls = split_urls(urls)
        if not urls:
            raise BackendError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        # no retries inside a replica: the pool retries on another one (max_retries failovers at most)
        replica_kw["max_retries"] = 0
        backends = [OpenAIBackend(u, model=model, api_key=api_key, **replica_kw) for u in urls]
        return cls(backends, [b.base_url for b in backends], probe=_http_probe, max_failovers=max(max_retries, 1),
                   probe_interval=probe_interval, wait_healthy=wait_healthy, name=name)

    @property
    def name(self) -> str:
        if self._name:
            return self._name
        # no replica count or URL in the name: a --state file written with 3 replicas resumes with 2
        return f"openai-pool:{getattr(self.replicas[0].backend, 'model', None) or '?'}"

    @property
    def model(self):
        return getattr(self.replicas[0].backend, "model", None)

    @model.setter
    def model(self, value) -> None:  # the trainer names the adapter to sample from after each sync
        for r in self.replicas:
            r.backend.model = value

    # ------------------------------------------------------------ placement

    def _event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # the sync API runs each call in its own asyncio.run
            self._loop, self._changed, self._probing = loop, asyncio.Event(), set()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _least_loaded(self, by_documents: bool) -> Replica | None:
        live = [r for r in self.replicas if r.healthy]
        if not live:
            return None
        key = (lambda r: (r.documents, r.in_flight, r.index)) if by_documents else \
            (lambda r: (r.in_flight, r.documents, r.index))
        return min(live, key=key)

    def _pick(self, key) -> Replica | None:
        self._probe_down()
        if key is None:
            return self._least_loaded(by_documents=False)
        r = self._pinned.get(key)
        if r is not None and r.healthy:
            return r
        new = self._least_loaded(by_documents=True)
        if new is None:
            return None
        if r is not None:
            r.documents -= 1
            self.stats["moved_documents"] += 1
        new.documents += 1
        self._pinned[key] = new
        return new

    def release_document(self, key) -> None:
        r = self._pinned.pop(key, None)
        if r is not None:
            r.documents -= 1

    def placement(self) -> list[dict]:
        """Per replica: url, healthy, documents pinned, requests on the wire, counters (for tests and logs)."""
        return [{"url": r.url, "healthy": r.healthy, "documents": r.documents, "in_flight": r.in_flight, **r.stats}
                for r in self.replicas]

    # ------------------------------------------------------------ health

    def set_healthy(self, index: int, healthy: bool) -> None:
        """Mark replica `index` up or down from outside (the trainer's weight sync does)."""
        r = self.replicas[index]
        if not healthy:
            self._mark_down(r)
        elif not r.healthy:
            r.healthy = True
            r.stats["recovered"] += 1
            self.stats["recoveries"] += 1
            self._notify()

    def _mark_down(self, r: Replica) -> None:
        if r.healthy:
            r.healthy = False
            r.stats["down"] += 1
            self.stats["down_events"] += 1
            r.next_probe = time.monotonic() + self.probe_interval

    def _probe_down(self) -> None:
        now = time.monotonic()
        for r in self.replicas:
            if not r.healthy and now >= r.next_probe and r.index not in self._probing:
                r.next_probe = now + self.probe_interval
                self._probing.add(r.index)
                asyncio.get_running_loop().create_task(self._probe(r))

    async def _probe(self, r: Replica) -> None:
        try:
            ok = True if self._probe_fn is None else bool(await self._probe_fn(r))
        except Exception:  # any failure to answer is "still down"
            ok = False
        finally:
            self._probing.discard(r.index)
        if ok and not r.healthy:
            r.healthy = True
            r.stats["recovered"] += 1
            self.stats["recoveries"] += 1
            self._notify()

    async def _wait_for_replica(self, key, deadline: float) -> Replica:
        while True:
            r = self._pick(key)
            if r is not None:
                return r
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendError(f"all {len(self.replicas)} replicas are down "
                                   f"(waited {self.wait_healthy:g} s for one to come back): "
                                   + ", ".join(str(x.url or x.index) for x in self.replicas))
            try:
                await asyncio.wait_for(self._event().wait(), timeout=min(left, self.probe_interval))
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------ Backend

    async def generate(self, request: GenerationRequest) -> Generation:
        self._event()
        key = _DOCUMENT.get()
        self.stats["requests"] += 1
        failovers = 0
        deadline = time.monotonic() + self.wait_healthy
        while True:
            r = await self._wait_for_replica(key, deadline)
            r.in_flight += 1
            try:
                gen = await r.backend.generate(request)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                r.stats["failures"] += 1
                if not _retryable(e) or failovers >= self.max_failovers:
                    raise
                failovers += 1
                self.stats["failovers"] += 1
                self._mark_down(r)
                continue
            finally:
                r.in_flight -= 1
            r.stats["calls"] += 1
            gen.extra["replica"] = r.index
            return gen

    async def aclose(self) -> None:
        for r in self.replicas:
            await r.backend.aclose()


async def _http_probe(r: Replica) -> bool:
    """GET <base_url>/models with the replica's key: what every OpenAI-compatible server answers."""
    import aiohttp

    b = r.backend
    headers = {"Authorization": f"Bearer {getattr(b, 'api_key', 'EMPTY')}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as s:
        async with s.get(r.url.rstrip("/") + "/models", headers=headers) as resp:
            return resp.status < 500


__all__ = ["PoolBackend", "enter_document", "leave_document", "read_url_file", "split_urls"]
