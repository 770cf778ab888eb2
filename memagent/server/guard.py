"""What keeps `memagent serve` up under slow, hostile or broken clients.

- **Connection cap**: at most `max_connections` open at once, so thousands of idle sockets cannot
  exhaust the file limit. At the cap a new connection takes the place of the oldest one that has not
  yet sent its headers (a slow client loses, /health still answers); when every open connection is
  busy with a request, the new one is closed at once.
- **Header timeout**: a connection must deliver its request headers within `header_timeout` seconds,
  or it is closed (a slow-loris client otherwise holds its socket for aiohttp's keep-alive time). Idle
  keep-alive connections are closed by aiohttp's `keepalive_timeout`, which `serve` sets low.
- **Body timeout and size**: a body must keep arriving (`body_timeout` seconds at most between blocks)
  and stay under the size limit (413). It is read into one buffer, decoded once and the buffer dropped
  before parsing, so a JSON body needs ~2x its size at the peak, not the 3-4x of read() + loads(bytes).
- **One log line per kind of failure**: aiohttp logs a full traceback for every bad request or dropped
  connection; a flood of them once wrote 243 MB of log in 10 s. The first of each kind is logged as one
  line, later ones are only counted (`/health` reports the counts under `failures`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter

from aiohttp import web

from .protocol import RequestError


class Limits:
    def __init__(self, max_connections: int = 1024, header_timeout: float = 10.0, body_timeout: float = 30.0,
                 max_body: int = 256 << 20):
        self.max_connections, self.header_timeout = max_connections, header_timeout
        self.body_timeout, self.max_body = body_timeout, max_body
        self.open = 0
        self.waiting: dict = {}  # connections still sending their headers, oldest first
        self.failures: Counter = Counter()

    def failure(self, kind: str, detail: str = "") -> None:
        """Count a failure; print one line the first time this kind happens."""
        self.failures[kind] += 1
        if self.failures[kind] == 1:
            more = f": {detail}" if detail else ""
            print(f"memagent server: {kind}{more} (logged once; /health counts them)", file=sys.stderr, flush=True)


class _Guarded(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: counts connections, enforces the header deadline."""

    def __init__(self, inner: asyncio.Protocol, limits: Limits):
        self.inner, self.limits = inner, limits
        self.timer, self.tail, self.counted, self.transport = None, b"", False, None

    def connection_made(self, transport):
        limits = self.limits
        if limits.open >= limits.max_connections:
            if limits.waiting:  # evict the oldest connection that has not sent its headers yet
                oldest = next(iter(limits.waiting))
                limits.failure("connection evicted", f"{limits.max_connections} open connections; the oldest "
                                                     f"without complete headers was closed for a new one")
                oldest.abort()
            else:
                limits.failure("connection refused", f"{limits.max_connections} open connections, all busy")
                transport.abort()
                self.inner = None
                return
        limits.open += 1
        self.counted, self.transport = True, transport
        limits.waiting[self] = None
        self.timer = asyncio.get_running_loop().call_later(limits.header_timeout, self._headers_too_slow)
        self.inner.connection_made(transport)

    def abort(self):
        self.limits.waiting.pop(self, None)
        if self.transport is not None:
            self.transport.abort()

    def _headers_too_slow(self):
        self.timer = None
        self.limits.failure("header timeout", f"request headers not complete within {self.limits.header_timeout:g} s")
        self.abort()

    def data_received(self, data):
        if self.inner is None:
            return
        if self.timer is not None:
            if b"\r\n\r\n" in self.tail + data[:3] or b"\r\n\r\n" in data:
                self.timer.cancel()
                self.timer = None
                self.limits.waiting.pop(self, None)
            else:
                self.tail = data[-3:]
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc):
        self.limits.waiting.pop(self, None)
        if self.timer is not None:
            self.timer.cancel()
        if self.counted:
            self.limits.open -= 1
            self.counted = False
        if self.inner is not None:
            self.inner.connection_lost(exc)
        self.transport = None

    def pause_writing(self):
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self):
        if self.inner is not None:
            self.inner.resume_writing()


def guarded_factory(server, limits: Limits):
    """A protocol factory for loop.create_server around aiohttp's `runner.server`."""
    return lambda: _Guarded(server(), limits)


class OncePerKind(logging.Filter):
    """Turns aiohttp's per-request tracebacks into one line per kind of failure."""

    def __init__(self, limits: Limits):
        super().__init__()
        self.limits = limits

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        kind = type(exc).__name__ if exc is not None else record.getMessage().split(" from ")[0]
        detail = str(exc).splitlines()[0][:200] if exc is not None and str(exc) else ""
        self.limits.failure(f"{record.getMessage().split(' from ')[0].lower()} ({kind})", detail)
        return False


def install_log_filter(limits: Limits) -> None:
    for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access"):
        logger = logging.getLogger(name)
        for f in list(logger.filters):
            if isinstance(f, OncePerKind):
                logger.removeFilter(f)
        logger.addFilter(OncePerKind(limits))


async def read_body(request: web.Request, limits: Limits) -> bytearray:
    """The whole body, with the size limit (413) and the between-blocks timeout (408)."""
    if request.content_length is not None and request.content_length > limits.max_body:
        raise RequestError(f"the request body is larger than this server's limit of {limits.max_body} bytes",
                           status=413, code="too_large")
    buf = bytearray()
    while True:
        try:
            block = await asyncio.wait_for(request.content.readany(), limits.body_timeout)
        except asyncio.TimeoutError:
            limits.failure("body timeout", f"no body bytes for {limits.body_timeout:g} s")
            raise RequestError(f"the request body stalled for {limits.body_timeout:g} s", status=408) from None
        if not block:
            return buf
        buf += block
        if len(buf) > limits.max_body:
            raise RequestError(f"the request body is larger than this server's limit of {limits.max_body} "
                               f"bytes", status=413, code="too_large")


async def read_json(request: web.Request, limits: Limits):
    """Decode a JSON body; every malformed body is a 400 (never a 500 or a traceback)."""
    raw = await read_body(request, limits)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the request body is not UTF-8") from None
    del raw  # the bytes go before parsing: the peak is ~2x the body, not bytes + str + objects
    try:
        return json.loads(text)
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except ValueError:
        raise RequestError("the request body is not valid JSON") from None
