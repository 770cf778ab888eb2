"""`memagent serve` for people: reading jobs over HTTP, the memory model for OpenAI clients, and the
server's defences (docs/serve.md), against real server processes with the model-free instant backend."""
import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from memagent.backends import resolve_tokenizer
from memagent.backends.instant import InstantBackend
from memagent.driver import MemoryAgent
from servers import ServerProcess, servers  # noqa: F401  (fixture)

KEY = "sk-jobs-test"
DOC = "\n".join(f"Entry {i}: the keeper trimmed lamp {i % 5}; wind from the {'NESW'[i % 4]}." for i in range(120))


def call(server, method: str, path: str, body=None, key: str | None = KEY, raw: bytes | None = None,
         headers: dict | None = None, timeout: float = 30):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(server.root_url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if r.headers.get_content_type() == "application/json" else raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def upload(server, text: str, key=KEY) -> str:
    status, meta = call(server, "POST", "/api/documents", raw=text.encode(), key=key)
    assert status == 201, meta
    return meta["id"]


def events(server, job_id: str, key=KEY) -> list[tuple[str, dict]]:
    """The whole SSE stream of a job (blocks until the job ends)."""
    status, raw = call(server, "GET", f"/api/jobs/{job_id}/events", key=key, timeout=60)
    assert status == 200
    out = []
    for block in raw.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "data" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def direct_read(questions, chunk_tokens, chunk_snap=0):
    """The same read through the library, for the answers an uninterrupted read gives."""
    agent = MemoryAgent(InstantBackend(), resolve_tokenizer("instant", None, None), template="memagent",
                        chunk_tokens=chunk_tokens, memory_tokens=1024, chunk_snap=chunk_snap)
    return agent.ask_questions(DOC, questions)


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--backend", "instant", "--api-key", KEY, "--max-upload-mb", "0.05") as s:
        yield s


# ---------------------------------------------------------------- the jobs API

def test_job_streams_chunks_memories_and_the_answers_of_a_direct_read(server):
    doc_id = upload(server, DOC)
    assert upload(server, DOC) == doc_id and len(doc_id) == 64  # content-addressed: the same id again
    questions = ["Which lamp?", "Which wind?"]
    status, job = call(server, "POST", "/api/jobs", {"document": doc_id, "questions": questions, "chunk_tokens": 100})
    assert status == 201 and job["status"] == "running"
    stream = events(server, job["id"])
    kinds = [k for k, _ in stream]
    assert kinds[0] == "start" and kinds[-2:] == ["done", "end"]
    chunks = [e for k, e in stream if k == "chunk"]
    expected = direct_read(questions, 100)
    assert len(chunks) == expected[0].chunks >= 10
    assert [c["chunk"] for c in chunks] == list(range(len(chunks)))
    assert all(len(c["questions"]) == 2 and c["questions"][0]["step"] == "update" for c in chunks)
    assert chunks[-1]["fraction"] == 1.0 and chunks[-1]["end_char"] == len(DOC)
    done = stream[-2][1]
    assert [a["answer"] for a in done["answers"]] == [a.answer for a in expected]
    assert [a["memory"] for a in done["answers"]] == [a.memory for a in expected]
    assert [c["questions"][1]["memory"] for c in chunks][-1] == expected[1].memory
    status, summary = call(server, "GET", f"/api/jobs/{job['id']}")
    assert summary["status"] == "done" and summary["answers"] == done["answers"]
    # replay from any point; the chunk text for the page; the trace download
    assert [k for k, _ in events(server, job["id"])] == kinds
    start, end = chunks[1]["start_char"], chunks[1]["end_char"]
    status, text = call(server, "GET", f"/api/documents/{doc_id}/text?start={start}&end={end}")
    assert text["text"] == DOC[start:end]
    status, trace = call(server, "GET", f"/api/jobs/{job['id']}/trace")
    assert status == 200 and sum(1 for line in trace.splitlines() if b'"final"' in line) == 2


def test_a_job_with_chunk_snap_ends_its_chunks_at_line_ends_as_the_library_does(server):
    doc_id = upload(server, DOC)
    status, job = call(server, "POST", "/api/jobs", {"document": doc_id, "questions": ["Which lamp?"],
                                                     "chunk_tokens": 100, "chunk_snap": 40})
    assert status == 201 and job["settings"]["chunk_snap"] == 40
    stream = events(server, job["id"])
    chunks = [e for k, e in stream if k == "chunk"]
    ends = [c["end_char"] for c in chunks]
    assert ends[-1] == len(DOC) and all(DOC[e - 1] == "\n" for e in ends[:-1])  # every cut after a whole line
    exact = [e for k, e in events(server, call(server, "POST", "/api/jobs", {
        "document": doc_id, "questions": ["Which lamp?"], "chunk_tokens": 100})[1]["id"]) if k == "chunk"]
    assert any(DOC[c["end_char"] - 1] != "\n" for c in exact[:-1])  # token-exact cuts do fall mid-line here
    expected = direct_read(["Which lamp?"], 100, chunk_snap=40)[0]
    assert len(chunks) == expected.chunks and stream[-2][1]["answers"][0]["answer"] == expected.answer
    for bad in (100, -1, "40", True):
        status, reply = call(server, "POST", "/api/jobs", {"document": doc_id, "questions": ["q"],
                                                           "chunk_tokens": 100, "chunk_snap": bad})
        assert status == 400 and reply["error"]["param"] == "chunk_snap", (bad, reply)
    status, reply = call(server, "POST", "/v1/chat/completions", {
        "model": "memagent", "messages": [{"role": "user", "content": "Which lamp?"}],
        "memagent": {"document": doc_id, "chunk_tokens": 100, "chunk_snap": 40}})
    assert status == 200 and reply["memagent"]["chunks"] == expected.chunks


def test_serve_chunk_snap_is_the_default_of_requests_that_do_not_set_it(tmp_path):
    from memagent.server.jobs import ReadSettings
    from memagent.server.router import _reading_options, add_arguments
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    defaults = _reading_options(p.parse_args(["--backend", "instant", "--chunk-snap", "30"]))["defaults"]
    assert defaults.chunk_snap == 30
    assert ReadSettings.parse({}, defaults).chunk_snap == 30
    assert ReadSettings.parse({"chunk_tokens": 20}, defaults).chunk_snap == 19  # shrunk to fit smaller chunks
    assert ReadSettings.parse({"chunk_snap": 0}, defaults).chunk_snap == 0
    with pytest.raises(ValueError, match="--chunk-snap"):
        _reading_options(p.parse_args(["--backend", "instant", "--chunk-tokens", "64", "--chunk-snap", "64"]))


def test_upload_limit_is_a_413_and_bad_requests_are_json_4xx(server):
    status, reply = call(server, "POST", "/api/documents", raw=b"x" * 60_000)
    assert status == 413 and reply["error"]["code"] == "too_large"
    doc_id = upload(server, "short")
    for body, param in (({"document": doc_id}, "questions"), ({"document": doc_id, "questions": [""]}, "questions"),
                        ({"document": "../../etc/passwd", "questions": ["q"]}, "document"),
                        ({"document": doc_id, "questions": ["q"], "template": "/etc/passwd"}, "template"),
                        ({"document": doc_id, "questions": ["q"], "chunk_tokens": "big"}, "chunk_tokens"),
                        ({"document": doc_id, "questions": ["\ud800"]}, "questions")):
        status, reply = call(server, "POST", "/api/jobs", body)
        assert status == 400 and reply["error"]["param"] == param, (body, reply)
    assert call(server, "POST", "/api/jobs", raw=b"{not json")[0] == 400
    assert call(server, "POST", "/api/jobs", raw=b"[" * 100_000)[0] == 400  # deeply nested: 400, not 500
    assert call(server, "GET", "/api/jobs/" + "0" * 32)[0] == 404
    assert call(server, "GET", "/api/documents/" + "0" * 64)[0] == 404
    assert call(server, "GET", "/static/..%2Frouter.py", key=None)[0] == 404
    status, reply = call(server, "GET", "/v1/completions")
    assert status == 404 and "no route" in reply["error"]["message"]


def test_api_key_guards_the_api_not_the_page(server):
    assert call(server, "GET", "/api/jobs", key=None)[0] == 401
    assert call(server, "GET", "/api/jobs", key="wrong")[0] == 401
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert call(server, "GET", "/api/jobs", key=None, headers={"Authorization": f"{scheme} {KEY}"})[0] == 200
    status, page = call(server, "GET", "/", key=None)
    assert status == 200 and b"<title>memagent" in page
    status, reply = call(server, "POST", "/api/documents", raw=b"x", headers={"Origin": "http://evil.example"})
    assert status == 403 and reply["error"]["code"] == "cross_origin"  # another site's page: refused
    assert call(server, "GET", "/api/jobs", headers={"Origin": server.root_url})[0] == 200  # the page itself


def test_cancel_and_the_429_of_a_full_server(servers):
    s = servers("--backend", "instant", "--instant-delay", "0.05", "--max-jobs", "1")
    doc_id = upload(s, DOC, key=None)
    status, job = call(s, "POST", "/api/jobs", {"document": doc_id, "questions": ["q"], "chunk_tokens": 32}, key=None)
    assert status == 201
    status, reply = call(s, "POST", "/api/jobs", {"document": doc_id, "questions": ["q"]}, key=None)
    assert status == 429 and "--max-jobs" in reply["error"]["message"]
    deadline = time.monotonic() + 20
    while call(s, "GET", f"/api/jobs/{job['id']}", key=None)[1]["chunks_done"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert call(s, "POST", f"/api/jobs/{job['id']}/cancel", key=None)[1]["status"] == "cancelled"
    kinds = [k for k, _ in events(s, job["id"], key=None)]
    assert kinds[-2:] == ["cancelled", "end"] and "chunk" in kinds
    assert call(s, "POST", "/api/jobs", {"document": doc_id, "questions": ["q"]}, key=None)[0] == 201  # room again


def test_kill_9_mid_read_resumes_after_restart_with_the_same_answers(servers, tmp_path):
    state = str(tmp_path / "serve-state")
    args = ("--backend", "instant", "--instant-delay", "0.03", "--state", state)
    s = servers(*args)
    doc_id = upload(s, DOC, key=None)
    questions = ["Which lamp?", "Which wind?"]
    status, job = call(s, "POST", "/api/jobs", {"document": doc_id, "questions": questions, "chunk_tokens": 32},
                       key=None)
    deadline = time.monotonic() + 20
    while call(s, "GET", f"/api/jobs/{job['id']}", key=None)[1]["chunks_done"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s.stop()  # SIGKILL mid-read
    s2 = servers(*args, port=s.port)
    assert "resumed 1 unfinished" in s2.output()
    stream = events(s2, job["id"], key=None)
    starts = [e for k, e in stream if k == "start"]
    assert len(starts) == 2 and starts[1]["resumed"] and starts[1]["chunks_done"] >= 5
    chunks = [e["chunk"] for k, e in stream if k == "chunk"]
    assert sorted(set(chunks)) == list(range(max(chunks) + 1))  # nothing lost across the kill
    expected = direct_read(questions, 32)
    done = stream[-2][1]
    assert [a["answer"] for a in done["answers"]] == [a.answer for a in expected]
    assert [a["memory"] for a in done["answers"]] == [a.memory for a in expected]
    assert done["answers"][0]["calls"] == expected[0].calls  # no finished chunk was read twice
    s2.stop()
    s3 = servers(*args, port=s.port)  # finished results survive restarts
    status, summary = call(s3, "GET", f"/api/jobs/{job['id']}", key=None)
    assert summary["status"] == "done" and summary["answers"] == done["answers"]


# ---------------------------------------------------------------- the memory model for OpenAI clients

def test_openai_client_reads_a_long_prompt_through_the_memory(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY)
    assert {"memagent", "memagent/instant"} <= {m.id for m in client.models.list()}
    messages = [{"role": "user", "content": DOC}, {"role": "user", "content": "Which lamp?"}]
    reply = client.chat.completions.create(model="memagent", messages=messages,
                                           extra_body={"memagent": {"chunk_tokens": 100}})
    expected = direct_read(["Which lamp?"], 100)[0]
    assert reply.choices[0].message.content == expected.answer
    assert reply.model_extra["memagent"]["chunks"] == expected.chunks and reply.usage.completion_tokens > 0
    # streamed: progress chunks (empty delta) while reading, then the answer
    parts = list(client.chat.completions.create(model="memagent", messages=messages, stream=True,
                                                extra_body={"memagent": {"chunk_tokens": 100}}))
    progress = [p.model_extra["memagent"]["chunk"] for p in parts if (p.model_extra or {}).get("memagent")
                and "chunk" in p.model_extra["memagent"]]
    assert progress == list(range(expected.chunks))
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == expected.answer
    # stream=true on the plain model too
    parts = list(client.chat.completions.create(model="instant", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices).startswith("notes ")
    assert parts[-1].choices == [] and parts[-1].usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError, match="document"):  # one message: no document to read
        client.chat.completions.create(model="memagent", messages=[{"role": "user", "content": "Which lamp?"}])


def test_memory_model_reads_an_uploaded_document(server):
    doc_id = upload(server, DOC)
    status, reply = call(server, "POST", "/v1/chat/completions",
                         {"model": "memagent", "messages": [{"role": "user", "content": "Which lamp?"}],
                          "memagent": {"document": doc_id, "chunk_tokens": 100}})
    assert status == 200 and reply["choices"][0]["message"]["content"] == direct_read(["Which lamp?"], 100)[0].answer


# ---------------------------------------------------------------- the server's defences (issue 11 item 9)

@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": 10**40}, "seed"),
])
def test_client_mistakes_are_400_not_500(server, body, param):
    status, reply = call(server, "POST", "/v1/chat/completions", body)
    assert status == 400 and reply["error"]["param"] == param


def test_prompt_over_the_window_is_a_400():
    from aiohttp.test_utils import TestClient, TestServer

    from memagent.protocol import PromptTooLongError
    from memagent.server.router import build_app

    class Small(InstantBackend):
        async def generate(self, request):
            raise PromptTooLongError("prompt is 9000 tokens but the model's context window is 8192")

    async def go():
        async with TestClient(TestServer(build_app(Small(), "small"))) as client:
            r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            return r.status, await r.json()

    status, reply = asyncio.run(go())
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"


def test_slow_headers_time_out_connections_are_capped_and_each_failure_is_one_log_line(servers):
    s = servers("--backend", "instant", "--header-timeout", "1.5", "--max-connections", "8")
    slow = socket.create_connection(("127.0.0.1", s.port))
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    t0 = time.monotonic()
    slow.settimeout(5)
    assert slow.recv(100) == b"" and 1 < time.monotonic() - t0 < 5  # closed by the server
    # at the cap, idle sockets (no headers yet) make room for new clients: /health still answers
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(12)]
    assert s.health()["status"] == "ok"
    idle[0].settimeout(5)
    assert idle[0].recv(100) == b""  # the oldest was evicted
    for c in idle:
        c.close()
    # when every connection is busy with a request (here: bodies that never come), a new one is refused
    busy = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(8)]
    for c in busy:
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    time.sleep(0.3)
    over = socket.create_connection(("127.0.0.1", s.port))
    over.settimeout(5)
    assert over.recv(100) == b""
    for c in busy + [over]:
        c.close()
    time.sleep(0.3)
    for _ in range(20):  # garbage requests: aiohttp would log a traceback for each
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
            c.settimeout(5)
            c.recv(1000)
    failures = s.health()["failures"]
    assert failures["header timeout"] >= 1 and failures["connection evicted"] >= 4
    assert failures["connection refused"] >= 1
    assert sum(v for k, v in failures.items() if "badhttpmessage" in k.lower()) >= 20
    log = s.output()
    assert "Traceback" not in log
    for kind in ("header timeout", "connection evicted", "connection refused", "BadHttpMessage"):
        assert log.count(kind) == 1, (kind, log)


def test_listening_beyond_loopback_without_a_key_warns(servers):
    s = servers("--backend", "instant", "--host", "0.0.0.0")
    assert "warning: listening on 0.0.0.0 without --api-key" in s.output()


def test_json_body_needs_about_twice_its_size():
    import tracemalloc

    from memagent.server.guard import Limits, read_json

    body = json.dumps({"messages": [{"role": "user", "content": "word " * 2_000_000}]}).encode()

    class Content:
        def __init__(self):
            self.blocks = [body[i:i + 65536] for i in range(0, len(body), 65536)][::-1]

        async def readany(self):
            return self.blocks.pop() if self.blocks else b""

    class Request:
        content_length, content = len(body), Content()

    tracemalloc.start()
    parsed = asyncio.run(read_json(Request(), Limits()))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(parsed["messages"][0]["content"]) == 10_000_000
    assert peak < 2.6 * len(body), peak / len(body)


def test_serving_an_upstream_openai_server(servers):
    """--backend openai: the memory model and the jobs in front of another OpenAI-compatible server."""
    upstream = servers("--backend", "instant")
    s = servers("--backend", "openai", "--base-url", upstream.base_url, "--model", "instant")
    doc_id = upload(s, DOC, key=None)
    status, job = call(s, "POST", "/api/jobs", {"document": doc_id, "questions": ["Which lamp?"], "chunk_tokens": 100},
                       key=None)
    done = events(s, job["id"], key=None)[-2][1]
    expected = direct_read(["Which lamp?"], 100)[0]
    assert done["answers"][0]["answer"] == expected.answer and done["answers"][0]["memory"] == expected.memory
    assert upstream.health()["completed"] == expected.calls
    status, reply = call(s, "POST", "/v1/chat/completions", {"model": "instant", "messages": [{"role": "user",
                                                                                              "content": "hi"}]},
                         key=None)
    assert status == 200 and reply["choices"][0]["message"]["content"].startswith("notes ")


def test_a_kill_between_state_and_event_loses_no_chunk_event(tmp_path):
    """The driver saves its state after a chunk, then the job publishes the chunk's event; a kill in
    between is recovered on restart from the state (in-process, to place the kill exactly there)."""
    from memagent.server.jobs import JobManager, ReadSettings

    tokenizer = resolve_tokenizer("instant", None, None)
    defaults = ReadSettings(chunk_tokens=100, memory_tokens=1024)
    questions = ["Which lamp?", "Which wind?"]

    async def first_run():
        jobs = JobManager(tmp_path, InstantBackend(delay=0.01), tokenizer, defaults)
        doc = await jobs.docs.save_text(DOC)
        job = jobs.create({"document": doc["id"], "questions": questions})
        while job.chunks_done < 3:
            await asyncio.sleep(0.005)
        await jobs.close()  # like a server stop: the job stays "running" on disk
        return job.id

    job_id = asyncio.run(first_run())
    log = tmp_path / "jobs" / job_id / "events.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["type"] == "chunk"
    lost = json.loads(lines[-1])["chunk"]
    log.write_text("".join(lines[:-1]))  # the event of the last saved chunk never made it to disk

    async def second_run():
        jobs = JobManager(tmp_path, InstantBackend(), tokenizer, defaults)
        assert jobs.load() == 1
        job = jobs.jobs[job_id]
        await job.task
        return job

    job = asyncio.run(second_run())
    chunks = [e for e in job.events if e["type"] == "chunk"]
    assert [e["chunk"] for e in chunks] == list(range(len(chunks)))
    assert [e for e in chunks if e.get("recovered")][0]["chunk"] == lost
    expected = direct_read(questions, 100)
    assert [a["memory"] for a in job.answers] == [a.memory for a in expected]
    assert [q["memory"] for q in chunks[-1]["questions"]] == [a.memory for a in expected]
