"""The aiohttp application and the `memagent serve` command.

Routes: POST /v1/chat/completions, GET /v1/models, GET /health, POST /tokenize (when the backend has a
tokenizer). Handlers are thin and do no per-request setup beyond one JSON decode and encode, because
the instant backend is served to measure *our* overhead and the server must not be what it measures.
Access logging is off for the same reason.

Binds 127.0.0.1 unless told otherwise: the server has no rate limiting and is meant for one machine.
With --api-key every /v1 route and /tokenize require `Authorization: Bearer KEY`; /health never does,
so a supervisor can probe it without the key.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import signal
import sys
import time

from aiohttp import web

from ..protocol import Backend
from .protocol import RequestError, error_body, model_list
from .serving import FAULT_KINDS, ChatService, FaultPlan

SERVICE = web.AppKey("service", ChatService)
FAULTS = web.AppKey("faults", object)
API_KEY = web.AppKey("api_key", object)
CREATED = web.AppKey("created", int)
MAX_BODY = 256 * 1024 * 1024  # aiohttp's default (1 MiB) is smaller than one long chunk of a book


def _json(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def _error(e: RequestError) -> web.Response:
    return _json(error_body(e.message, e.type, e.param, e.code), status=e.status)


def _unauthorised(request: web.Request) -> web.Response | None:
    key = request.app[API_KEY]
    if key is None:
        return None
    given = request.headers.get("Authorization", "")
    if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), key.encode()):
        return None
    return _json(error_body("Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                            code="invalid_api_key"), status=401)


async def _read_json(request: web.Request):
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError:
        raise RequestError("the request body is not valid JSON") from None


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
        return _json(await service.complete(await _read_json(request)))
    except RequestError as e:
        return _error(e)


async def models(request: web.Request) -> web.Response:
    denied = _unauthorised(request)
    if denied is not None:
        return denied
    return _json(model_list([request.app[SERVICE].model_name], request.app[CREATED]))


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json({"status": "ok", "model": service.model_name, **service.stats})


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
              faults: FaultPlan | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[SERVICE] = ChatService(backend, model_name)
    app[FAULTS] = faults
    app[API_KEY] = api_key or None
    app[CREATED] = int(time.time())
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    return app


# ---------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["embedded", "instant"], default="embedded",
                   help="embedded: the bundled small model in-process; instant: no model, immediate "
                        "deterministic replies (measures orchestration overhead)")
    p.add_argument("--model", default=None, help="model for the embedded backend (default: the registry's default)")
    p.add_argument("--served-model-name", default=None,
                   help="name clients send as 'model' (default: the model name, or 'instant')")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, default=None, help="embedded: torch threads (default: all cores)")
    p.add_argument("--max-batch", type=int, default=8, help="embedded: requests decoded together at most")
    p.add_argument("--api-key", default=os.environ.get("MEMAGENT_SERVER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: env MEMAGENT_SERVER_API_KEY, else none)")
    # Hidden: test-only knobs.
    p.add_argument("--faults", default=os.environ.get("MEMAGENT_SERVER_FAULTS"), help=argparse.SUPPRESS)
    p.add_argument("--fault-seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--fault-hang-seconds", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--instant-delay", type=float, default=0.0, help=argparse.SUPPRESS)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="serve a backend over an OpenAI-compatible HTTP API",
                              description="Serve a memagent backend at /v1/chat/completions (OpenAI format).")
    add_arguments(p)
    p.set_defaults(func=main)
    return p


def _make_backend(args) -> tuple[Backend, str]:
    if args.backend == "instant":
        from ..backends.instant import InstantBackend
        return InstantBackend(delay=args.instant_delay), args.served_model_name or "instant"
    from .. import models
    from ..backends.embedded import EmbeddedBackend  # imports torch: only when asked for
    name = args.model or models.DEFAULT_MODEL
    return (EmbeddedBackend.load(name, threads=args.threads, max_batch=args.max_batch),
            args.served_model_name or name)


async def _serve(app: web.Application, host: str, port: int, banner: str) -> None:
    # handler_cancellation: a client that gave up (timeout, retry) stops its generation instead of
    # leaving it to compete with the retry for the model.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        print(banner, flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        await app[SERVICE].backend.aclose()


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
    app = build_app(backend, name, api_key=args.api_key, faults=faults)
    auth = "API key required" if args.api_key else "no API key"
    banner = f"memagent server: http://{args.host}:{args.port}/v1 serving {name!r} ({args.backend} backend, {auth})"
    if faults is not None:
        banner += f"; injecting faults {args.faults!r} (kinds: {', '.join(FAULT_KINDS)})"
    try:
        asyncio.run(_serve(app, args.host, args.port, banner))
    except OSError as e:  # port in use, address not available
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
