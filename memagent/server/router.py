"""The aiohttp application and the `memagent serve` command.

Routes: POST /v1/chat/completions, GET /v1/models, GET /health, POST /tokenize (when the backend has a
tokenizer). Handlers are thin and do no per-request setup beyond one JSON decode and encode, because
the instant backend is served to measure *our* overhead and the server must not be what it measures.
Access logging is off for the same reason.

Binds 127.0.0.1 unless told otherwise (and warns when bound elsewhere without --api-key). With --api-key
every /v1, /api route and /tokenize require `Authorization: Bearer KEY` (any case of "Bearer"); /health
never does, so a supervisor can probe it without the key, and the page at / holds no data.

Also served (docs/serve.md): the memory model `memagent` on /v1/chat/completions (memchat.py), the
reading-jobs API under /api and the web page at / (api.py, jobs.py, static/), `stream=true` on every
chat route (stream.py), and the connection guard (guard.py: connection cap, header/body timeouts, one
log line per kind of failure). Unknown routes get a JSON 404.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

from aiohttp import web

from ..protocol import Backend
from . import api
from .guard import Limits, guarded_factory, install_log_filter, read_json
from .jobs import JobManager, ReadSettings, temporary_root
from .memchat import MemoryChat, is_memory_model, memory_model_names
from .protocol import RequestError, error_body, model_list
from .serving import FAULT_KINDS, ChatService, FaultPlan
from .stream import ChatStream, open_stream, stream_completion

SERVICE = web.AppKey("service", ChatService)
FAULTS = web.AppKey("faults", object)
API_KEY = web.AppKey("api_key", object)
CREATED = web.AppKey("created", int)
MEMCHAT = web.AppKey("memchat", MemoryChat)
MAX_BODY = 256 * 1024 * 1024  # aiohttp's default (1 MiB) is smaller than one long chunk of a book


def _json(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def _error(e: RequestError) -> web.Response:
    return _json(error_body(e.message, e.type, e.param, e.code), status=e.status)


def _unauthorised(request: web.Request) -> web.Response | None:
    return api.unauthorised(request, request.app[API_KEY])


async def _read_json(request: web.Request):
    """Size limit, stall timeout, ~2x memory, and a 400 for every malformed body (guard.read_json)."""
    return await read_json(request, request.app[api.LIMITS])


async def _inject(request: web.Request, kind: str, plan: FaultPlan) -> web.StreamResponse:
    """Misbehave the way real servers do under load or failure."""
    if kind == "500":
        return _json(error_body("injected fault: internal error", type="server_error"), status=500)
    if kind == "429":
        return _json(error_body("injected fault: rate limited", type="rate_limit_error"), status=429,
                     headers={"Retry-After": "0"})
    if kind == "hang":
        await asyncio.sleep(plan.hang_seconds)
        return _json(error_body("injected fault: hung", type="server_error"), status=500)
    if kind == "malformed":  # a body cut off mid-JSON, as a crashing proxy sends
        return web.Response(body=b'{"id": "chatcmpl-broken", "choices": [{"message": {"content": "tru',
                            content_type="application/json")
    if kind == "empty":  # valid JSON without a reply
        return _json({"id": "chatcmpl-empty", "object": "chat.completion", "choices": []})
    # "close": drop the connection without any response bytes
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    denied = _unauthorised(request)
    if denied is not None:
        return denied
    service = request.app[SERVICE]
    service.stats["requests"] += 1
    plan = request.app[FAULTS]
    if plan is not None:
        kind = plan.next_fault()
        if kind is not None:
            service.stats["faults"] += 1
            return await _inject(request, kind, plan)
    try:
        body = await _read_json(request)
        if isinstance(body, dict) and is_memory_model(body.get("model"), service.model_name):
            return await _memory_chat(request, body)
        completion = await service.complete(body)
        if body.get("stream"):
            return await stream_completion(request, completion, _include_usage(body))
        return _json(completion)
    except RequestError as e:
        return _error(e)


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


async def _memory_chat(request: web.Request, body: dict) -> web.StreamResponse:
    """The memory model: reads the earlier user messages (or an uploaded document) through the memory."""
    chat = request.app[MEMCHAT]
    model = body["model"]
    if not body.get("stream"):
        return _json(await chat.read(body, model))
    chat.parse(body)  # a malformed request is a 400 before the stream (and its 200) begins
    response = await open_stream(request)
    out = ChatStream(response, model, _include_usage(body))
    await out.start()
    try:
        result = await chat.read(body, model, on_chunk=out.progress)
    except RequestError as e:
        await out.error(error_body(e.message, e.type, e.param, e.code))
    else:
        await out.finish(result["choices"][0]["message"]["content"], "stop", result["usage"],
                         memagent=result["memagent"])
    await response.write_eof()
    return response


async def models(request: web.Request) -> web.Response:
    denied = _unauthorised(request)
    if denied is not None:
        return denied
    name = request.app[SERVICE].model_name
    return _json(model_list([name, *memory_model_names(name)], request.app[CREATED]))


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    jobs = request.app[api.JOBS]
    return _json({"status": "ok", "model": service.model_name, **service.stats, "jobs_running": jobs.active(),
                  "connections": request.app[api.LIMITS].open, "failures": dict(request.app[api.LIMITS].failures)})


async def tokenize(request: web.Request) -> web.Response:
    """vLLM-style {"prompt": text} -> {"tokens": [...], "count": n}; only when the backend has a tokenizer."""
    denied = _unauthorised(request)
    if denied is not None:
        return denied
    tokenizer = getattr(request.app[SERVICE].backend, "tokenizer", None)
    try:
        if tokenizer is None:
            raise RequestError("this backend has no tokenizer", status=404, code="not_supported")
        body = await _read_json(request)
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, str):
            raise RequestError("'prompt' must be a string", param="prompt")
    except RequestError as e:
        return _error(e)
    tokens = list(tokenizer.encode(prompt))
    return _json({"tokens": tokens, "count": len(tokens)})


def build_app(backend: Backend, model_name: str, api_key: str | None = None,
              faults: FaultPlan | None = None, *, tokenizer=None, data_dir=None, defaults: ReadSettings | None = None,
              max_jobs: int = 2, max_upload_bytes: int = MAX_BODY, limits: Limits | None = None) -> web.Application:
    """`tokenizer`: what reads count chunks in (or a function loading it on first use; default cl100k_base);
    `data_dir`: where documents and jobs persist (default: a temporary folder, removed at exit)."""
    app = web.Application(client_max_size=MAX_BODY)
    if tokenizer is None:
        from ..backends import resolve_tokenizer
        tokenizer = lambda: resolve_tokenizer("instant", None, None)  # noqa: E731
    from pathlib import Path
    jobs = JobManager(Path(data_dir) if data_dir else temporary_root(), backend, tokenizer,
                      defaults or ReadSettings(chunk_tokens=5000, memory_tokens=1024), max_jobs=max_jobs,
                      max_upload_bytes=max_upload_bytes)
    api.add_routes(app, jobs, limits or Limits(max_body=MAX_BODY), api_key or None)
    jobs.model_name = model_name
    app[MEMCHAT] = MemoryChat(jobs)
    app[SERVICE] = ChatService(backend, model_name)
    app[FAULTS] = faults
    app[API_KEY] = api_key or None
    app[CREATED] = int(time.time())
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    from . import lora  # LoRA load/unload for RL rollouts (vLLM's endpoints)
    app[SERVICE].adapters = lora.Adapters(backend)
    lora.add_routes(app, app[SERVICE].adapters, _unauthorised, _read_json, _json, _error)
    api.add_fallback(app)
    return app


# ---------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["embedded", "instant", "openai"], default="embedded",
                   help="embedded: the bundled small model in-process; instant: no model, immediate "
                        "deterministic replies (measures orchestration overhead); openai: an upstream "
                        "OpenAI-compatible server (--base-url), e.g. vLLM, read through the memory as 'memagent'")
    p.add_argument("--model", default=None, help="embedded: registry name (default: the registry's default); "
                   "openai: the upstream model (default: the one it serves)")
    p.add_argument("--base-url", default=None, help="openai: the upstream server, e.g. http://127.0.0.1:8001/v1")
    p.add_argument("--upstream-api-key", default=None, help="openai: the upstream's key (default: $OPENAI_API_KEY)")
    p.add_argument("--tokenizer", default=None, help="openai: tokenizer.json, HF folder or .gguf of the upstream "
                   "model, for exact chunk sizes (default: cl100k_base, approximate)")
    p.add_argument("--served-model-name", default=None,
                   help="name clients send as 'model' (default: the model name, or 'instant')")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, default=None, help="embedded: torch threads (default: all cores)")
    p.add_argument("--max-batch", type=int, default=8, help="embedded: requests decoded together at most")
    p.add_argument("--engine", default=None, choices=["torch", "llama.cpp"],
                   help="embedded: runtime; llama.cpp runs the Q4 GGUF as is (docs/engines.md) (default: the "
                        "model's own, see `memagent models`; torch for HF folders)")
    p.add_argument("--api-key", default=os.environ.get("MEMAGENT_SERVER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: env MEMAGENT_SERVER_API_KEY, else none)")
    g = p.add_argument_group("reading jobs and the page (docs/serve.md)")
    g.add_argument("--state", default=None, metavar="DIR",
                   help="keep uploaded documents and reading jobs in DIR; a restarted server resumes unfinished "
                        "jobs after their last finished chunk (default: a temporary folder, deleted at exit)")
    g.add_argument("--max-jobs", type=int, default=2, help="reads running at once, jobs and memory-model chats "
                   "together; one more gets 429 (default 2)")
    g.add_argument("--max-upload-mb", type=float, default=256.0, help="largest document upload, MiB (default 256)")
    g.add_argument("--chunk-tokens", type=int, default=None,
                   help="default chunk size of a read (default: the embedded model's own, else 5000)")
    g.add_argument("--memory-tokens", type=int, default=None,
                   help="default memory cap of a read (default: the embedded model's own, else 1024)")
    g.add_argument("--chunk-snap", type=int, default=0, metavar="N",
                   help="default for requests that do not set chunk_snap: end each chunk at the last line or "
                        "sentence end within its final N tokens (0, the default: token-exact chunks)")
    h = p.add_argument_group("connection limits")
    h.add_argument("--max-connections", type=int, default=1024, help="open connections at most (default 1024)")
    h.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has to send its request headers (default 10)")
    h.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body may stall between blocks (default 30)")
    # Hidden: test-only knobs.
    p.add_argument("--faults", default=os.environ.get("MEMAGENT_SERVER_FAULTS"), help=argparse.SUPPRESS)
    p.add_argument("--fault-seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--fault-hang-seconds", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--instant-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--instant-slots", type=int, default=0, help=argparse.SUPPRESS)  # calls delayed at once; 0 = all


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="serve a backend over an OpenAI-compatible HTTP API, with reading "
                                           "jobs and a web page",
                              description="Serve a memagent backend at /v1/chat/completions (OpenAI format), the "
                                          "memory model 'memagent' (reads any-length prompts), the reading-jobs "
                                          "API under /api and a web page at / (docs/serve.md).")
    add_arguments(p)
    p.set_defaults(func=main)
    return p


def _make_backend(args) -> tuple[Backend, str]:
    if args.backend == "instant":
        from ..backends.instant import InstantBackend
        return (InstantBackend(delay=args.instant_delay, slots=args.instant_slots),
                args.served_model_name or "instant")
    if args.backend == "openai":
        from ..backends.openai_http import OpenAIBackend
        if not args.base_url:
            raise ValueError("--backend openai needs --base-url (the upstream server)")
        return (OpenAIBackend(args.base_url, model=args.model, api_key=args.upstream_api_key),
                args.served_model_name or args.model or "upstream")
    from .. import models
    from ..backends import make_backend  # picks the model's own engine unless --engine names one

    name = args.model or models.DEFAULT_MODEL
    return (make_backend("embedded", model=name, engine=getattr(args, "engine", None), threads=args.threads,
                         max_batch=args.max_batch), args.served_model_name or name)


async def _serve(app: web.Application, host: str, port: int, banner: str) -> None:
    # handler_cancellation: a client that gave up (timeout, retry) stops its generation instead of
    # leaving it to compete with the retry for the model. keepalive_timeout: an idle connection is
    # closed after 15 s (aiohttp's 75 s let idle sockets pile up).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                           keepalive_timeout=15.0)
    await runner.setup()
    limits, jobs = app[api.LIMITS], app[api.JOBS]
    install_log_filter(limits)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = None
    try:
        # our own listener instead of web.TCPSite: guard.py wraps each connection (cap, header deadline)
        server = await loop.create_server(guarded_factory(runner.server, limits), host, port, reuse_address=True)
        resumed = jobs.load()
        print(banner + (f"; resumed {resumed} unfinished reading job(s)" if resumed else ""), flush=True)
        await stop.wait()
    finally:
        if server is not None:
            server.close()
        await jobs.close()
        await runner.cleanup()
        await app[SERVICE].backend.aclose()


def _reading_options(args) -> dict:
    """build_app's reading options from the command line; ValueError for a bad value."""
    from pathlib import Path

    for flag, value in (("--max-jobs", args.max_jobs), ("--max-connections", args.max_connections)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    for flag, value in (("--max-upload-mb", args.max_upload_mb), ("--header-timeout", args.header_timeout),
                        ("--body-timeout", args.body_timeout)):
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{flag} must be a positive number, got {value}")
    spec = None
    if args.backend == "embedded":
        from .. import models
        spec = models.MODELS.get(args.model or models.DEFAULT_MODEL)
    defaults = ReadSettings(chunk_tokens=args.chunk_tokens or (spec.chunk_tokens if spec else 5000),
                            memory_tokens=args.memory_tokens or (spec.memory_tokens if spec else 1024),
                            template=spec.default_template if spec else "memagent", chunk_snap=args.chunk_snap)
    if defaults.chunk_tokens < 16 or defaults.memory_tokens < 1:
        raise ValueError("--chunk-tokens must be at least 16 and --memory-tokens at least 1")
    if not 0 <= defaults.chunk_snap < defaults.chunk_tokens:
        raise ValueError(f"--chunk-snap must be from 0 to --chunk-tokens - 1 ({defaults.chunk_tokens - 1}), "
                         f"got {defaults.chunk_snap}")
    if args.state:
        Path(args.state).mkdir(parents=True, exist_ok=True)
    if args.backend in ("embedded", "openai"):
        from ..backends import resolve_tokenizer
        tokenizer = lambda: resolve_tokenizer(args.backend, args.model, args.tokenizer,  # noqa: E731
                                              warn=lambda *a, **k: print(*a, file=sys.stderr))
    else:
        tokenizer = None
    return {"tokenizer": tokenizer, "data_dir": args.state, "defaults": defaults, "max_jobs": args.max_jobs,
            "max_upload_bytes": int(args.max_upload_mb * (1 << 20)),
            "limits": Limits(args.max_connections, args.header_timeout, args.body_timeout, MAX_BODY)}


def main(args) -> int:
    try:
        faults = FaultPlan.parse(args.faults, seed=args.fault_seed, hang_seconds=args.fault_hang_seconds)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"error: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        backend, name = _make_backend(args)
    except Exception as e:  # missing weights, bad model name: one line, not a traceback
        print(f"error: cannot load the {args.backend} backend: {e}", file=sys.stderr)
        return 1
    try:
        app = build_app(backend, name, api_key=args.api_key, faults=faults, **_reading_options(args))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.api_key and args.host not in ("127.0.0.1", "localhost", "::1") and not args.host.startswith("127."):
        print(f"memagent server: warning: listening on {args.host} without --api-key: anyone who can reach this "
              f"port can use the model and read every uploaded document", file=sys.stderr, flush=True)
    auth = "API key required" if args.api_key else "no API key"
    banner = (f"memagent server: http://{args.host}:{args.port}/v1 serving {name!r} ({args.backend} backend, "
              f"{auth}); page at http://{args.host}:{args.port}/")
    if faults is not None:
        banner += f"; injecting faults {args.faults!r} (kinds: {', '.join(FAULT_KINDS)})"
    try:
        asyncio.run(_serve(app, args.host, args.port, banner))
    except OSError as e:  # port in use, address not available
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
