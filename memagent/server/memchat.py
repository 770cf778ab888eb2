"""The memory model: a chat completion that reads an arbitrarily long prompt through the memory.

Served as `memagent` (and `memagent/<served model>`, listed by /v1/models). How a request is read:

- the **last user message is the question**; every earlier user message, in order and joined by a blank
  line, is **the document**. System and assistant messages are ignored (the reader uses its template's
  own wording). A request with a single user message is refused (400): there is no way to tell a
  question from a document inside one message, and reading the whole message as both would be wrong.
- instead of (or before) those messages, `extra_body={"memagent": {"document": ID}}` reads a document
  uploaded to POST /api/documents (streamed to disk; the way to send a book without holding it in one
  request body). The same object may set `chunk_tokens`, `memory_tokens`, `template`, `skip_update`,
  `early_exit`, `chunk_snap` (validated as for a reading job; the server's defaults otherwise).
- `max_tokens` bounds the final answer; the reply's content is the extracted answer and the response has
  a `memagent` field with chunks, tokens read, calls, the final memory and the raw reply.
- `stream=true` sends reading progress (one chunk per document chunk, empty delta, `memagent` field)
  while reading, then the answer.
"""
from __future__ import annotations

import asyncio
import time
import uuid

from .jobs import JobManager, ReadSettings
from .protocol import RequestError, parse_messages

PREFIX = "memagent"


def is_memory_model(model, served: str) -> bool:
    return isinstance(model, str) and (model == PREFIX or model == f"{PREFIX}/{served}")


def memory_model_names(served: str) -> list[str]:
    return [PREFIX, f"{PREFIX}/{served}"]


class MemoryChat:
    """Parses a memory-model request and reads it; shares the job manager's backend, tokenizer, limits."""

    def __init__(self, jobs: JobManager):
        self.jobs = jobs

    def parse(self, body: dict) -> tuple[object, str, ReadSettings, int | None]:
        messages = parse_messages(body.get("messages"))
        opts = body.get("memagent") or {}
        if not isinstance(opts, dict):
            raise RequestError("'memagent' must be an object", param="memagent")
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise RequestError("the memory model needs a user message with the question", param="messages")
        question, texts = users[-1], users[:-1]
        if not question.strip():
            raise RequestError("the last user message (the question) is empty", param="messages")
        settings = ReadSettings.parse(opts, self.jobs.defaults)
        if "document" in opts:
            if texts:
                raise RequestError("give the document either as memagent.document or as earlier user "
                                   "messages, not both", param="memagent")
            document = self.jobs.docs.path(opts["document"])
        elif texts:
            document = "\n\n".join(texts)  # every message was checked for lone surrogates already
        else:
            raise RequestError("the memory model reads a document: send it as earlier user message(s) and the "
                               "question as the last one, or upload it and pass extra_body={'memagent': "
                               "{'document': ID}}", param="messages")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens <= 0):
            raise RequestError("'max_tokens' must be a positive integer", param="max_tokens")
        return document, question.strip(), settings, max_tokens

    async def read(self, body: dict, model: str, on_chunk=None) -> dict:
        """Read and answer; `on_chunk(info)` (a coroutine function) is awaited after each chunk."""
        document, question, s, max_tokens = self.parse(body)
        if self.jobs.active() + self.jobs.chats >= self.jobs.max_jobs:
            raise RequestError(f"this server already runs {self.jobs.max_jobs} read(s) (--max-jobs); retry later",
                               status=429, type="rate_limit_error")
        from ..driver import MemoryAgent

        events = []

        def progress(chunk, _bytes):
            events.append({"chunk": chunk.index, "tokens": chunk.n_tokens})

        self.jobs.chats += 1  # before any await: the bound holds for requests arriving together
        t0 = time.perf_counter()
        try:
            tokenizer = await asyncio.to_thread(lambda: self.jobs.tokenizer)  # loaded on first use, off the loop
            agent = MemoryAgent(self.jobs.backend, tokenizer, template=s.template, chunk_tokens=s.chunk_tokens,
                                memory_tokens=s.memory_tokens, answer_tokens=max_tokens or s.answer_tokens,
                                skip_update=s.skip_update, early_exit=s.early_exit, chunk_snap=s.chunk_snap)
            if on_chunk is None:
                answer = (await agent.aread(document, [question], progress=progress))[0]
            else:
                answer = await self._read_streaming(agent, document, question, progress, events, on_chunk)
        finally:
            self.jobs.chats -= 1
        if answer.error:
            raise RequestError(f"reading failed: {answer.error}", status=502, type="server_error")
        text = answer.answer if answer.answer is not None else (answer.reply or "")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
                      "total_tokens": answer.prompt_tokens + answer.completion_tokens},
            "memagent": {"chunks": answer.chunks, "doc_tokens": answer.doc_tokens, "calls": answer.calls,
                         "skipped_chunks": answer.skipped_chunks, "memory": answer.memory, "reply": answer.reply,
                         "warnings": answer.warnings, "seconds": round(time.perf_counter() - t0, 3)},
        }

    @staticmethod
    async def _read_streaming(agent, document, question, progress, events, on_chunk):
        """The read as a task; progress events are forwarded as they come (the hook itself is sync)."""
        wake = asyncio.Event()

        def hook(chunk, b):
            progress(chunk, b)
            wake.set()

        task = asyncio.ensure_future(agent.aread(document, [question], progress=hook))
        sent = 0
        try:
            while True:
                waiter = asyncio.ensure_future(wake.wait())
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                wake.clear()
                while sent < len(events):
                    await on_chunk(events[sent])
                    sent += 1
                if task.done():
                    return task.result()[0]
        finally:
            if not task.done():  # the client went away: stop reading
                task.cancel()
