"""Backend for any OpenAI-compatible server: vLLM, SGLang, llama.cpp's server, Ollama, OpenAI.

Why our own retry loop (the SDK's is switched off with max_retries=0): a long document is hundreds of
calls, and one dropped connection must not lose a run, so retries need to cover more than the SDK does
(bodies that are not JSON or carry no reply, which proxies and overloaded servers do send) and must be
counted, so benchmarks and tests can see how many there were. Retried: 5xx, 408, 409, 429, timeouts,
connection errors, malformed bodies, with exponential backoff and jitter (honouring Retry-After).
Everything else 4xx (bad key, unknown model, bad request) fails at once: retrying cannot fix it.

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
    url = base_url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BackendError(f"--base-url must look like http://host:port/v1, got {base_url!r}")
    return url if parts.path not in ("", "/") else url + "/v1"


class _Malformed(Exception):
    """A 2xx response we cannot use; retried like a server error."""


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
        self.concurrency, self.timeout = concurrency, timeout
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self._name = name
        self.stats = {"requests": 0, "attempts": 0, "retries": 0, "failures": 0, "prompt_tokens": 0,
                      "completion_tokens": 0, "in_flight": 0, "max_in_flight": 0, "retry_reasons": {}}
        self._loop = None  # client, semaphore and lock belong to one event loop; rebuilt for another
        self._client = self._sem = self._model_lock = None
        self._token_param = "max_tokens"  # switched to max_completion_tokens if the server insists

    @property
    def name(self) -> str:
        return self._name or f"openai:{self.model or '?'}@{self.base_url}"

    # ------------------------------------------------------------ plumbing

    def _bind(self):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            import openai  # imported here: `import memagent.backends` must stay light
            self._loop = loop
            self._client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                                              max_retries=0, http_client=_http_client(openai, self.timeout))
            self._sem = asyncio.Semaphore(self.concurrency)
            self._model_lock = asyncio.Lock()
        return self._client

    def _scrub(self, text: str) -> str:
        if self.api_key and self.api_key != "EMPTY" and len(self.api_key) >= 4:
            text = text.replace(self.api_key, "***")
        return " ".join(text.split())[:300]

    def _fail(self, what: str, attempts: int, detail: str) -> BackendError:
        self.stats["failures"] += 1
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        return BackendError(self._scrub(f"{what} at {self.base_url} failed {tries}: {detail}"))

    def _classify(self, e: Exception) -> tuple[bool, str, str, float | None]:
        """(retryable, reason key for stats, one-line detail, server's Retry-After seconds)."""
        import openai
        if isinstance(e, _Malformed):
            return True, "malformed", f"malformed response ({e})", None
        if isinstance(e, openai.APITimeoutError):
            return True, "timeout", f"no response within {self.timeout:g} s", None
        if isinstance(e, openai.APIConnectionError):
            cause = e.__cause__ or e.__context__
            why = f"{type(cause).__name__}: {cause}" if cause else str(e)
            return True, "connection", f"connection failed ({why})", None
        if isinstance(e, openai.APIStatusError):
            status = e.status_code
            message = _error_message(e)
            retry_after = _retry_after(e.response.headers.get("retry-after"))
            retryable = status >= 500 or status in RETRY_STATUS
            return retryable, f"http_{status}", f"HTTP {status}: {message}", retry_after
        if isinstance(e, openai.APIResponseValidationError):
            return True, "malformed", f"malformed response ({e})", None
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
                    raise self._fail(what, attempts, detail) from None
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
                client = self._client

                async def send():
                    page = await client.models.list()
                    ids = [m.id for m in page.data]
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
        client = self._bind()
        model = self.model or await self._resolve_model()
        self.stats["requests"] += 1
        params = {"model": model, "messages": request.messages, "temperature": request.temperature,
                  "top_p": request.top_p}
        if request.seed is not None:
            params["seed"] = request.seed

        async def send():
            # The SDK's generic post: its auth, headers, timeouts and error types, without the typed
            # `create()` layer, whose per-call parameter walk and model parsing tripled our overhead.
            body = {**params, self._token_param: request.max_tokens}
            return _parse_completion(await client.post("/chat/completions", body=body, cast_to=str))

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
        self.stats["prompt_tokens"] += gen.prompt_tokens
        self.stats["completion_tokens"] += gen.completion_tokens
        return gen

    async def aclose(self) -> None:
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            try:
                await client.close()
            except RuntimeError:  # its event loop is gone: nothing left to close
                pass


def _http_client(openai, timeout: float):
    """The SDK's default httpx client, passed explicitly: the implicit one closes itself from __del__
    on whatever loop is running, which fails (noisily) once a later asyncio.run() holds a new loop.
    (The SDK's aiohttp transport is about twice as fast on loopback, but it reports a dropped
    connection as a timeout and warns about unclosed sessions at exit; not worth it yet.)"""
    return openai.DefaultAsyncHttpxClient(timeout=timeout)


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
                      extra={"finish_reason": finish, "id": body.get("id")})


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _error_message(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
    try:
        text = e.response.text
    except Exception:
        text = ""
    return text.strip() or getattr(e, "message", "") or "no message"


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from model servers; our own backoff applies
