"""The one small interface every model backend implements (core: no HTTP, no torch).

Why this shape: the reader loop only ever needs "turn these chat messages into a reply of at most N
tokens". Everything else (batching, KV reuse, HTTP retries) is the backend's business, so a backend is a
single async method. Many coroutines call `generate` at once; a backend that can batch (the embedded
model) gathers concurrent calls into one forward, one that cannot (HTTP) just bounds its concurrency.

Training needs more than text: the exact prompt/response token ids and the sampling log-probs. Those
are optional fields of `Generation`, filled when the request asks for them (`return_tokens=True`).
"""
from __future__ import annotations

import contextvars

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class BackendError(RuntimeError):
    """A call failed for a reason the user should see in one line (server down, bad key, ...)."""


class PromptTooLongError(BackendError):
    """The prompt does not fit the model's context window: the caller's mistake (a server answers 400)."""


@dataclass
class GenerationRequest:
    messages: list[dict]  # OpenAI-style chat messages: [{"role": "user", "content": "..."}]
    max_tokens: int
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    return_tokens: bool = False  # fill Generation.prompt_ids/response_ids/logprobs (training)
    # Requests sharing `cache_key` share a long prompt prefix (instruction + question); a backend may
    # keep that prefix's KV cache between calls. Purely a hint: results must not depend on it.
    cache_key: str | None = None


@dataclass
class Generation:
    text: str
    finish_reason: str = "stop"  # "stop" (ended by EOS/stop) or "length" (hit max_tokens)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    logprobs: list[float] | None = None  # log-prob of each response token under the sampling policy
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """What the driver needs from a model. `name` goes into traces and results."""

    name: str

    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def aclose(self) -> None: ...


# ---- which document a call belongs to ---------------------------------------------------------------
# The driver marks each read (`enter_document`); every call made inside it, in its task and the tasks it
# starts, carries the mark without a new argument. A backend that cares (a pool of servers keeps one
# document's calls on one replica, so its prefix stays in that server's cache) reads `_DOCUMENT`; the
# others never look. It lives here, in the core protocol, so the driver needs no backend module.
_DOCUMENT: contextvars.ContextVar[object | None] = contextvars.ContextVar("memagent_document", default=None)


class _DocumentKey:
    __slots__ = ()


def enter_document() -> contextvars.Token:
    """Mark the calls made from here on (in this task and the tasks it starts) as one document's."""
    return _DOCUMENT.set(_DocumentKey())


def leave_document(backend, token: contextvars.Token) -> None:
    """End the mark; a backend with `release_document` (a pool) frees the document's replica."""
    key = _DOCUMENT.get()
    _DOCUMENT.reset(token)
    release = getattr(backend, "release_document", None)
    if release is not None and key is not None:
        release(key)
