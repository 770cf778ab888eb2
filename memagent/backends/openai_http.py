"""Backend for any OpenAI-compatible server: vLLM, SGLang, llama.cpp's server, Ollama, OpenAI.

Why our own retry loop (the SDK's is switched off with max_retries=0): a long document is hundreds of
calls, and one dropped connection must not lose a run, so retries need to cover more than the SDK does
(bodies that are not JSON or carry no reply, which proxies and overloaded servers do send) and must be
counted, so benchmarks and tests can see how many there were. Retried: 5xx, 408, 409, 429, timeouts,
connection errors, malformed bodies, with exponential backoff and jitter (honouring Retry-After).
Everything else 4xx (bad key, unknown model, bad request) fails at once: retrying cannot fix it.

Why aiohttp and not the `openai` SDK's transport: at 256 documents in flight, httpx's connection pool
scans every connection for every request (quadratic in the concurrency); the same 1,311 requests took
4.9 s through the SDK's raw `post` and 0.42 s through a bare aiohttp session on a quiet machine
(benchmarks/results/overhead.json). The wire format
is the same OpenAI chat-completions API, so any server the SDK talks to works here (`base_url`, key).

Concurrency is bounded by a semaphore held only while a request is on the wire, so a call sleeping in
backoff does not block the others. Errors are one line with the status and attempt count, and the API
key is scrubbed from every message we raise.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
from urllib.parse import urlsplit

from ..protocol import BackendError, Generation, GenerationRequest

RETRY_STATUS = {408, 409, 429}  # plus every 5xx


def normalise_base_url(base_url: str) -> str:
    """'http://host:8000' -> 'http://host:8000/v1'; a URL that already has a path is kept as given."""
    from ..redact import has_credentials, redact_url

    url = base_url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BackendError(f"--base-url must look like http://host:port/v1, got {redact_url(base_url)!r}")
    if has_credentials(url):  # they would be printed, recorded, and clash with the key's header
        raise BackendError(f"--base-url must not hold credentials ({redact_url(url)}): give the key with "
                           "--api-key or $OPENAI_API_KEY")
    return url if parts.path not in ("", "/") else url + "/v1"


class _Malformed(Exception):
    """A 2xx response we cannot use; retried like a server error."""


class _HTTPStatus(Exception):
    """A response with status >= 400 (what the SDK would raise as APIStatusError)."""

    def __init__(self, status: int, text: str, retry_after: str | None):
        super().__init__(f"HTTP {status}")
        self.status, self.text, self.retry_after = status, text, retry_after


class OpenAIBackend:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 concurrency: int = 64, timeout: float = 120.0, max_retries: int = 5, backoff: float = 0.5,
                 max_backoff: float = 30.0, name: str | None = None):
        if concurrency < 1:
            raise BackendError(f"concurrency must be at least 1, got {concurrency}")
        if max_retries < 0 or timeout <= 0 or backoff < 0:
            raise BackendError("max_retries and backoff must be >= 0 and timeout > 0")
        self.base_url = normalise_base_url(base_url)
        self.model = model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers want *a* key
        from ..redact import register

        register(self.api_key)  # scrubbed from every error, trace, state and result (memagent/redact.py)
        self.concurrency, self.timeout = concurrency, timeout
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self._name = name
        self.stats = {"requests": 0, "attempts": 0, "retries": 0, "failures": 0, "prompt_tokens": 0,
                      "completion_tokens": 0, "in_flight": 0, "max_in_flight": 0, "retry_reasons": {}}
        self._loop = None  # client, semaphore and lock belong to one event loop; rebuilt for another
        self._session = self._sem = self._model_lock = self._guard = None
        self._token_param = "max_tokens"  # switched to max_completion_tokens if the server insists
        self.reported_model: str | None = None  # the model name in the server's replies

    @property
    def name(self) -> str:
        return self._name or f"openai:{self.model or '?'}@{self.base_url}"

    # ------------------------------------------------------------ plumbing

    def _bind(self):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            import aiohttp  # imported here: `import memagent.backends` must stay light

            self._loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={"Authorization": f"Bearer {self.api_key}"},
                # HTTP(S)_PROXY / NO_PROXY, as the SDK honours them; only when one is set, because
                # trust_env also makes every request look up ~/.netrc in a worker thread
                trust_env=_proxy_configured())
            self._sem = asyncio.Semaphore(self.concurrency)
            self._model_lock = asyncio.Lock()
            self._guard = loop.create_task(_close_at_loop_end(self._session))
        return self._session

    async def _request(self, method: str, path: str, body: dict | None = None) -> str:
        """One HTTP attempt: the body as text, or _HTTPStatus for a status >= 400."""
        async with self._session.request(method, self.base_url + path, json=body) as resp:
            text = await resp.text(errors="replace")
            if resp.status >= 400:
                raise _HTTPStatus(resp.status, text, resp.headers.get("retry-after"))
            return text

    def _scrub(self, text: str) -> str:
        """One line, the key masked: whole, in another case, or echoed truncated (memagent/redact.py)."""
        from ..redact import scrub

        return scrub(" ".join(text.split()))[:300]

    def _fail(self, what: str, attempts: int, detail: str) -> BackendError:
        self.stats["failures"] += 1
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        return BackendError(self._scrub(f"{what} at {self.base_url} failed {tries}: {detail}"))

    def _classify(self, e: Exception) -> tuple[bool, str, str, float | None]:
        """(retryable, reason key for stats, one-line detail, server's Retry-After seconds)."""
        import aiohttp
        if isinstance(e, _Malformed):
            return True, "malformed", f"malformed response ({e})", None
        if isinstance(e, asyncio.TimeoutError):  # aiohttp's ServerTimeoutError is one too
            return True, "timeout", f"no response within {self.timeout:g} s", None
        if isinstance(e, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
            return True, "connection", f"connection failed ({type(e).__name__}: {e})", None
        if isinstance(e, _HTTPStatus):
            retryable = e.status >= 500 or e.status in RETRY_STATUS
            return retryable, f"http_{e.status}", f"HTTP {e.status}: {_error_message(e.text)}", \
                _retry_after(e.retry_after)
        return False, type(e).__name__, f"{type(e).__name__}: {e}", None

    async def _call(self, what: str, send):
        """Run `send()` (one HTTP attempt) with our retries; returns what send returns."""
        attempts = 0
        while True:
            attempts += 1
            self.stats["attempts"] += 1
            try:
                async with self._sem:
                    s = self.stats
                    s["in_flight"] += 1
                    s["max_in_flight"] = max(s["max_in_flight"], s["in_flight"])
                    try:
                        return await send()
                    finally:
                        s["in_flight"] -= 1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # classified below: anything unknown fails fast
                retryable, reason, detail, retry_after = self._classify(e)
                if not retryable or attempts > self.max_retries:
                    err = self._fail(what, attempts, detail)
                    err.retryable = retryable  # a pool (backends/pool.py) fails over only on these
                    raise err from None
                self.stats["retries"] += 1
                reasons = self.stats["retry_reasons"]
                reasons[reason] = reasons.get(reason, 0) + 1
                delay = min(self.max_backoff, self.backoff * 2 ** (attempts - 1)) * (0.5 + random.random() / 2)
                if retry_after is not None:
                    delay = max(delay, min(retry_after, self.max_backoff))
                await asyncio.sleep(delay)

    async def _resolve_model(self) -> str:
        async with self._model_lock:
            if self.model is None:
                async def send():
                    try:
                        ids = [m["id"] for m in json.loads(await self._request("GET", "/models"))["data"]]
                    except (ValueError, KeyError, TypeError):
                        raise _Malformed("the model list is not the OpenAI shape") from None
                    if not ids:
                        raise _Malformed("the server lists no models")
                    return ids[0]

                self.model = await self._call("listing models (GET /v1/models)", send)
        return self.model

    # ------------------------------------------------------------ Backend

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.return_tokens:
            raise BackendError("an HTTP backend cannot return token ids and log-probs; training needs "
                               "the embedded backend")
        if request.max_tokens <= 0:
            raise BackendError(f"max_tokens must be positive, got {request.max_tokens}")
        self._bind()
        model = self.model or await self._resolve_model()
        self.stats["requests"] += 1
        params = {"model": model, "messages": request.messages, "temperature": request.temperature,
                  "top_p": request.top_p}
        if request.seed is not None:
            params["seed"] = request.seed

        async def send():
            body = {**params, self._token_param: request.max_tokens}
            return _parse_completion(await self._request("POST", "/chat/completions", body))

        try:
            return self._account(await self._call("chat completion", send))
        except BackendError as e:
            # Newer OpenAI models refuse max_tokens; switch once, then every later call uses the new name.
            if self._token_param == "max_tokens" and "max_completion_tokens" in str(e) and "HTTP 400" in str(e):
                self.stats["failures"] -= 1
                self.stats["requests"] -= 1
                self._token_param = "max_completion_tokens"
                return await self.generate(request)
            raise

    def _account(self, gen: Generation) -> Generation:
        self.reported_model = gen.extra.get("model") or self.reported_model  # what eval records as served
        self.stats["prompt_tokens"] += gen.prompt_tokens
        self.stats["completion_tokens"] += gen.completion_tokens
        return gen

    async def aclose(self) -> None:
        """Close the connections; the backend stays usable (a later call opens new ones)."""
        session, guard, self._session, self._guard, self._loop = self._session, self._guard, None, None, None
        if guard is not None:
            guard.cancel()
        if session is not None and not session.closed:
            try:
                await session.close()
            except RuntimeError:  # its event loop is gone: nothing left to close
                pass


def _proxy_configured() -> bool:
    return any(os.environ.get(k) for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                                             "https_proxy", "all_proxy"))


async def _close_at_loop_end(session) -> None:
    """Close `session` when its event loop shuts down.

    Why: the sync API (`MemoryAgent.ask`, the trainer's rollouts) runs each call in its own
    `asyncio.run()`, and an aiohttp session cannot be closed once its loop is gone (it would warn about
    unclosed sessions and leak sockets). `asyncio.run` cancels the tasks still pending before it closes
    the loop, so this task's `finally` closes the connections while the loop can still do it.
    """
    try:
        await asyncio.Event().wait()
    finally:
        if not session.closed:
            await session.close()


def _parse_completion(content: str | bytes) -> Generation:
    """Our own parsing of the body: strict about what we need, lenient about everything else."""
    if not content or not content.strip():
        raise _Malformed("empty body")
    try:
        body = json.loads(content)
    except ValueError:
        raise _Malformed(f"not JSON: {content[:60]!r}") from None
    try:
        choice = body["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise _Malformed("no choices in the body") from None
    text = message.get("content")
    finish = choice.get("finish_reason")
    if text is None:
        if finish != "length":  # a reasoning model can spend every token thinking: that is a reply
            raise _Malformed("the reply has no content")
        text = ""
    if not isinstance(text, str):
        raise _Malformed("the reply content is not text")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return Generation(text=text, finish_reason="length" if finish == "length" else "stop",
                      prompt_tokens=_count(usage.get("prompt_tokens")),
                      completion_tokens=_count(usage.get("completion_tokens")),
                      extra={"finish_reason": finish, "id": body.get("id"),
                             "model": body.get("model") if isinstance(body.get("model"), str) else None})


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _error_message(text: str) -> str:
    """The server's own message from an error body ({"error": {"message": ...}} and the variants)."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip() or "no message"
    if isinstance(body, dict):
        inner = body.get("error", body.get("detail", body))
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
    return text.strip() or "no message"


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from model servers; our own backoff applies
