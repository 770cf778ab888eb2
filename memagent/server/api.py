"""Routes of the reading-jobs API (/api/...) and the web page (/, /static/...).

    GET  /                          the page (static, no key needed: it holds no data; its calls send the key)
    GET  /api/config                server defaults and limits, for the page and for clients
    POST /api/documents             the raw document as the body (streamed to disk) -> {id, bytes, chars}
    GET  /api/documents/{id}        {id, bytes, chars}
    GET  /api/documents/{id}/text   ?start=&end= -> {"text": characters [start, end)}
    POST /api/jobs                  {document, questions, chunk_tokens?, memory_tokens?, answer_tokens?,
                                     template?, skip_update?, early_exit?, chunk_snap?} -> 201 {job};
                                    429 when full
    GET  /api/jobs                  every job's summary
    GET  /api/jobs/{id}             one job's summary (status, answers)
    GET  /api/jobs/{id}/events      server-sent events: every past event, then live ones until the end;
                                    `?after=SEQ` or a Last-Event-ID header resumes after that event
    POST /api/jobs/{id}/cancel      (also DELETE /api/jobs/{id})
    GET  /api/jobs/{id}/trace       the trace (JSON lines) as a download

Errors are OpenAI-style JSON bodies. With --api-key every /api route needs `Authorization: Bearer KEY`.
No request names a server-side path: documents are named by their sha256, jobs by a random id,
templates by built-in name, static files from a fixed list.
"""
from __future__ import annotations

import asyncio
import hmac
import json
from importlib import resources

from aiohttp import web

from .guard import Limits, read_json
from .jobs import JobManager
from .protocol import RequestError, error_body
from .stream import comment, open_stream, send

JOBS = web.AppKey("jobs", JobManager)
LIMITS = web.AppKey("limits", Limits)
KEY = web.AppKey("key", object)
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
# The page loads only its own files; an injected <script> or inline handler cannot run even if some
# text ever reached the DOM as HTML (it never should: app.js sets textContent only).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def json_response(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json", headers=headers)


def error_response(e: RequestError) -> web.Response:
    headers = {"Retry-After": "5"} if e.status == 429 else None
    return json_response(error_body(e.message, e.type, e.param, e.code), status=e.status, headers=headers)


def unauthorised(request: web.Request, key: str | None) -> web.Response | None:
    """None when allowed. The scheme is case-insensitive (RFC 7235): 'Bearer', 'bearer', 'BEARER'."""
    if key is None:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode()):
        return None
    return json_response(error_body("Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                                    code="invalid_api_key"), status=401)


def cross_origin(request: web.Request) -> web.Response | None:
    """A browser sends Origin with its calls; one from another site's page is refused (a page elsewhere
    must not start reads on, or upload to, a server on this machine). Clients other than browsers send
    no Origin and are not affected."""
    origin = request.headers.get("Origin")
    if origin is None or origin.partition("://")[2] == request.host:
        return None
    return json_response(error_body(f"requests from pages of other origins ({origin}) are refused",
                                    code="cross_origin"), status=403)


def api(handler):
    """Origin and key checks, and RequestError -> JSON error, for every /api route."""
    async def wrapped(request: web.Request):
        denied = cross_origin(request) or unauthorised(request, request.app[KEY])
        if denied is not None:
            return denied
        try:
            return await handler(request, request.app[JOBS])
        except RequestError as e:
            return error_response(e)
    wrapped.__name__ = handler.__name__
    return wrapped


# ---------------------------------------------------------------- the page

def _static(name: str) -> bytes:
    return (resources.files("memagent.server") / "static" / name).read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8", headers=PAGE_HEADERS)


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:  # a fixed list: no path from a request ever reaches the file system
        return json_response(error_body(f"no static file {name!r}", code="not_found"), status=404)
    return web.Response(body=_static(name), content_type=STATIC[name], charset="utf-8", headers=PAGE_HEADERS)


# ---------------------------------------------------------------- documents

@api
async def config(request, jobs: JobManager):
    from ..gates import EXIT_MODES, SKIP_MODES
    from ..prompts import builtin_templates

    return json_response({"defaults": jobs.defaults.__dict__, "templates": builtin_templates(),
                          "skip_update": list(SKIP_MODES), "early_exit": list(EXIT_MODES),
                          "max_jobs": jobs.max_jobs, "max_upload_bytes": jobs.docs.max_bytes,
                          "model": getattr(jobs, "model_name", None), "memory_model": "memagent"})


@api
async def upload(request, jobs: JobManager):
    limits = request.app[LIMITS]
    if request.content_length is not None and request.content_length > jobs.docs.max_bytes:
        raise RequestError(f"the document is larger than this server's limit of {jobs.docs.max_bytes} bytes "
                           f"(--max-upload-mb)", status=413, code="too_large")
    meta = await jobs.docs.save_stream(request.content.readany, limits.body_timeout)
    return json_response(meta, status=201)


@api
async def document(request, jobs: JobManager):
    return json_response(jobs.docs.meta(request.match_info["id"]))


@api
async def document_text(request, jobs: JobManager):
    try:
        start, end = int(request.query.get("start", "0")), int(request.query.get("end", "0"))
    except ValueError:
        raise RequestError("'start' and 'end' must be integers", param="start") from None
    text = await asyncio.to_thread(jobs.document_slice, request.match_info["id"], start, end)
    return json_response({"text": text, "start": start, "end": start + len(text)})


# ---------------------------------------------------------------- jobs

@api
async def create_job(request, jobs: JobManager):
    body = await read_json(request, request.app[LIMITS])
    return json_response(jobs.create(body).summary(), status=201)


@api
async def list_jobs(request, jobs: JobManager):
    return json_response({"jobs": [j.summary() for j in jobs.jobs.values()]})


@api
async def get_job(request, jobs: JobManager):
    return json_response(jobs.get(request.match_info["id"]).summary())


@api
async def cancel_job(request, jobs: JobManager):
    job = jobs.get(request.match_info["id"])
    jobs.cancel(job)
    return json_response(job.summary())


@api
async def trace(request, jobs: JobManager):
    job = jobs.get(request.match_info["id"])
    path = job.dir / "trace.jsonl"
    return web.FileResponse(path, headers={"Content-Type": "application/x-ndjson",
                                           "Content-Disposition": f'attachment; filename="trace-{job.id}.jsonl"'}) \
        if path.exists() else json_response(error_body("no trace yet", code="not_found"), status=404)


@api
async def events(request, jobs: JobManager):
    job = jobs.get(request.match_info["id"])
    try:
        after = int(request.query.get("after", request.headers.get("Last-Event-ID", "-1")))
    except ValueError:
        raise RequestError("'after' must be an integer event number", param="after") from None
    queue: asyncio.Queue = asyncio.Queue()
    job.listeners.add(queue)  # before the replay: nothing published in between is lost
    try:
        response = await open_stream(request)
        sent = after
        for e in list(job.events):
            if e["seq"] > sent:
                await send(response, e, event=e["type"], id=e["seq"])
                sent = e["seq"]
        while job.status == "running":
            try:
                e = await asyncio.wait_for(queue.get(), 15.0)
            except asyncio.TimeoutError:
                await comment(response)  # keeps proxies from closing a quiet stream
                continue
            if e is None:
                break
            if e["seq"] > sent:
                await send(response, e, event=e["type"], id=e["seq"])
                sent = e["seq"]
        while not queue.empty():  # the final event may have arrived with the end marker
            e = queue.get_nowait()
            if e is not None and e["seq"] > sent:
                await send(response, e, event=e["type"], id=e["seq"])
                sent = e["seq"]
        await send(response, {"status": job.status}, event="end")
        await response.write_eof()
        return response
    finally:
        job.listeners.discard(queue)


async def not_found(request: web.Request) -> web.Response:
    """Every unknown route is a JSON 404 (an OpenAI client parses error bodies as JSON)."""
    return json_response(error_body(f"no route {request.method} {request.path}", code="not_found"), status=404)


def add_routes(app: web.Application, jobs: JobManager, limits: Limits, key: str | None) -> None:
    app[JOBS], app[LIMITS], app[KEY] = jobs, limits, key
    r = app.router
    r.add_get("/", page)
    r.add_get("/static/{name}", static)
    r.add_get("/api/config", config)
    r.add_post("/api/documents", upload)
    r.add_get("/api/documents/{id}", document)
    r.add_get("/api/documents/{id}/text", document_text)
    r.add_post("/api/jobs", create_job)
    r.add_get("/api/jobs", list_jobs)
    r.add_get("/api/jobs/{id}", get_job)
    r.add_delete("/api/jobs/{id}", cancel_job)
    r.add_post("/api/jobs/{id}/cancel", cancel_job)
    r.add_get("/api/jobs/{id}/events", events)
    r.add_get("/api/jobs/{id}/trace", trace)


def add_fallback(app: web.Application) -> None:
    """Last: a catch-all so that unknown paths and methods get JSON, not aiohttp's plain text."""
    app.router.add_route("*", "/{tail:.*}", not_found)


__all__ = ["add_routes", "add_fallback", "unauthorised", "JOBS", "LIMITS"]
