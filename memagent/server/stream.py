"""Server-sent events: the wire format of job event streams and of `stream=true` chat completions.

Every event is written and drained the moment it exists (no buffering in the server), so a chunk's event
reaches a browser within milliseconds of the chunk finishing (tests/test_serve_jobs.py measures it).
Chat streams follow OpenAI's format: `data: {chat.completion.chunk}` lines, then `data: [DONE]`. Our
backends return a reply whole, so a plain-model stream is the role, the whole content, and the finish
reason; a memory-model stream also carries reading progress as chunks with an empty delta and a
`memagent` field (ignored by OpenAI clients, readable as `chunk.model_extra["memagent"]`).
"""
from __future__ import annotations

import json
import time
import uuid

from aiohttp import web

HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=HEADERS)
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, data, event: str | None = None, id: int | None = None) -> None:
    head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event else "")
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    await response.write(f"{head}data: {body}\n\n".encode("utf-8"))


async def comment(response: web.StreamResponse, text: str = "keep-alive") -> None:
    await response.write(f": {text}\n\n".encode())


class ChatStream:
    """One `stream=true` chat completion: role first, progress (memory model), content, finish, [DONE]."""

    def __init__(self, response: web.StreamResponse, model: str, include_usage: bool = False):
        self.response, self.model, self.include_usage = response, model, include_usage
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def _chunk(self, delta: dict, finish=None, **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}

    async def start(self) -> None:
        await send(self.response, self._chunk({"role": "assistant", "content": ""}))

    async def progress(self, info: dict) -> None:
        await send(self.response, self._chunk({}, memagent=info))

    async def finish(self, content: str, finish_reason: str, usage: dict | None, **extra) -> None:
        if content:
            await send(self.response, self._chunk({"content": content}))
        await send(self.response, self._chunk({}, finish_reason, **extra))
        if self.include_usage and usage is not None:
            chunk = self._chunk({})
            chunk["choices"], chunk["usage"] = [], usage
            await send(self.response, chunk)
        await send(self.response, "[DONE]")

    async def error(self, body: dict) -> None:
        """An error after the stream began: OpenAI clients raise on a `data: {"error": ...}` event."""
        await send(self.response, body)
        await send(self.response, "[DONE]")


async def stream_completion(request: web.Request, completion: dict, include_usage: bool) -> web.StreamResponse:
    """A finished plain chat.completion sent as a stream (the backend returns whole replies)."""
    response = await open_stream(request)
    out = ChatStream(response, completion["model"], include_usage)
    out.id, out.created = completion["id"], completion["created"]
    await out.start()
    choice = completion["choices"][0]
    await out.finish(choice["message"]["content"], choice["finish_reason"], completion.get("usage"))
    await response.write_eof()
    return response
