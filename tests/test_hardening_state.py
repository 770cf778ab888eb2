"""Issue 11, items 1, 2, 4, 5: a state file is bound to the document's text whether finished or not, resumes
against a server whose model is discovered, has one owner at a time, and output files fail early, by name,
without temp files or glued trace lines. Model-free (instant backend, byte tokenizer): milliseconds each."""
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from memagent import MemoryAgent
from memagent.backends.instant import InstantBackend
from memagent.backends.scripted import ScriptedBackend
from memagent.fileio import FileError, exclusive
from memagent.tokenizer import ByteTokenizer
from clicheck import one_error_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The lamp was lit at dusk by the keeper. " * 30  # ~1200 bytes: 10 chunks of 128 byte-tokens


def agent(backend=None, **kw):
    return MemoryAgent(backend or InstantBackend(), ByteTokenizer(), template="notes", chunk_tokens=128,
                       memory_tokens=32, **kw)


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "memagent", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, HF_HUB_OFFLINE="1"))


# ---- item 1: a finished state is bound to the text -------------------------------------------------------

def test_finished_state_refuses_other_text(tmp_path):
    doc, state = tmp_path / "doc.txt", tmp_path / "s.json"
    doc.write_text(TEXT)
    first = agent().ask(doc, "Q?", state=state)
    b = InstantBackend()
    again = agent(b).ask(doc, "Q?", state=state)  # same text: the saved answers, no call
    assert again.answer == first.answer and b.calls == 0
    for changed in (TEXT.replace("dusk", "dawn"), TEXT + "More text after the end. ", TEXT[:-200]):
        doc.write_text(changed)
        with pytest.raises(ValueError, match="different document text"):
            agent(b).ask(doc, "Q?", state=state)
    assert b.calls == 0


def test_finished_state_from_stdin_refuses_other_text(tmp_path):
    state = tmp_path / "s.json"
    args = ["ask", "-", "Q?", "--backend", "instant", "--chunk-tokens", "16", "--state", str(state), "--json"]
    assert cli(*args, stdin=TEXT).returncode == 0
    assert cli(*args, stdin=TEXT).returncode == 0  # same text again: fine
    one_error_line(cli(*args, stdin=TEXT.replace("keeper", "thief")), "different document text")


def test_unfinished_state_checks_every_chunk_read(tmp_path):
    """Not only the last chunk read: an edit in an earlier chunk is refused too, and so is a text now
    shorter than what was read."""
    doc, state = tmp_path / "doc.txt", tmp_path / "s.json"
    doc.write_text(TEXT)
    def killed_after_five(chunk, read):
        if chunk.index == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        agent().ask(doc, "Q?", state=state, progress=killed_after_five)
    body = json.loads(state.read_text())["body"]
    assert body["chunks_done"] == 5 and body["read_digest"] and not body["answers"]
    doc.write_text("X" + TEXT[1:])  # first chunk edited, chunk 5 unchanged
    with pytest.raises(ValueError, match="different document text"):
        agent().ask(doc, "Q?", state=state)
    doc.write_text(TEXT[:300])  # shorter than the 5 chunks read
    with pytest.raises(ValueError, match="different document text"):
        agent().ask(doc, "Q?", state=state)
    doc.write_text(TEXT)
    assert agent().ask(doc, "Q?", state=state).error is None


# ---- item 2: resume with a backend that learns its model on the first call -------------------------------

class DiscoveringBackend(InstantBackend):
    """Named like OpenAIBackend: `openai:?@url` until the first call asks the server for its model."""

    @property
    def name(self):
        return f"openai:{'served-model' if self.calls else '?'}@http://127.0.0.1:1/v1"

    @name.setter
    def name(self, value):
        pass


def test_resume_with_discovered_model(tmp_path):
    doc, state = tmp_path / "doc.txt", tmp_path / "s.json"
    doc.write_text(TEXT)
    first = agent(DiscoveringBackend()).ask(doc, "Q?", state=state)
    b = DiscoveringBackend()
    assert agent(b).ask(doc, "Q?", state=state).answer == first.answer and b.calls == 0


def test_resume_against_a_real_http_server_without_model(tmp_path):
    """The same through OpenAIBackend and HTTP: no --model, the server's model is listed on the first call."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from memagent.backends.openai_http import OpenAIBackend

    doc, state, calls = tmp_path / "doc.txt", tmp_path / "s.json", []

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    async def chat(request):
        calls.append(1)
        return web.json_response({"choices": [{"message": {"content": "\\boxed{dusk}"}, "finish_reason": "stop"}]})

    async def read_twice():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app, host="127.0.0.1") as server:
            out = []
            for _ in range(2):  # a fresh backend each time, as a rerun of the command has
                backend = OpenAIBackend(f"http://127.0.0.1:{server.port}/v1", max_retries=0)
                out.append((await agent(backend).aread(doc, ["When?"], state=state))[0])
                await backend.aclose()
            return out

    doc.write_text(TEXT)
    first, again = asyncio.run(read_twice())
    assert first.answer == again.answer == "dusk" and len(calls) == first.calls  # the rerun made no call


# ---- item 4: one process per state file / eval folder ----------------------------------------------------

def test_second_process_on_state_is_refused(tmp_path):
    doc, state = tmp_path / "doc.txt", tmp_path / "s.json"
    doc.write_text(TEXT)
    with exclusive(state, "state file"):  # another memagent holds it (flock: a second open conflicts too)
        p = cli("ask", str(doc), "Q?", "--backend", "instant", "--state", str(state), "--chunk-tokens", "200")
        one_error_line(p, "in use by another memagent process")
        with pytest.raises(FileError, match="in use"):
            agent().ask(doc, "Q?", state=state)
    assert not state.exists()  # the refused runs wrote nothing
    assert agent().ask(doc, "Q?", state=state).error is None  # released: free again
    assert sorted(x.name for x in tmp_path.iterdir()) == ["doc.txt", "s.json"]  # no lock file left


def test_two_concurrent_reads_on_one_state(tmp_path):
    """Two reads on one state at once in one process: exactly one runs, the other is refused."""
    doc, state = tmp_path / "doc.txt", tmp_path / "s.json"
    doc.write_text(TEXT)

    async def both():
        a = agent(InstantBackend(delay=0.01))
        return await asyncio.gather(a.aread(doc, ["Q?"], state=state), a.aread(doc, ["Q?"], state=state),
                                    return_exceptions=True)

    results = asyncio.run(both())
    assert sum(isinstance(r, FileError) for r in results) == 1
    assert sum(isinstance(r, list) for r in results) == 1


# ---- item 5: full disk, unwritable folder, torn trace line ---------------------------------------------

def test_unwritable_state_or_trace_fails_before_any_call(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    blocker = tmp_path / "file"
    blocker.write_text("")
    for kw in ({"state": blocker / "s.json"}, {"trace": blocker / "t.jsonl"},
               {"state": tmp_path / "missing" / "s.json"}):
        b = ScriptedBackend()
        with pytest.raises(FileError, match="cannot write (state|trace) file .*(file|missing)"):
            agent(b).ask(doc, "Q?", **kw)
        assert b.requests == []
    p = cli("ask", str(doc), "Q?", "--backend", "instant", "--state", str(tmp_path / "nodir" / "s.json"))
    one_error_line(p, f"cannot write state file {tmp_path / 'nodir' / 's.json'}")


def test_full_disk_names_the_file_and_leaves_no_temp(tmp_path):
    doc, state = tmp_path / "doc.txt", tmp_path / "s.json"
    doc.write_text(TEXT)

    def full(fd):
        raise OSError(28, "No space left on device")

    with mock.patch("memagent.fileio.os.fsync", full):
        with pytest.raises(FileError, match=f"cannot write state file {state}: No space left"):
            agent().ask(doc, "Q?", state=state)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["doc.txt"]  # no s.json.tmpPID, no lock


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_trace_on_full_device_is_one_line():
    doc = ROOT / "memagent" / "examples" / "keeper_log.txt"
    p = cli("ask", str(doc), "Q?", "--backend", "instant", "--trace", "/dev/full")
    one_error_line(p, "cannot write trace file /dev/full: No space left")


def test_torn_trace_line_is_cut_before_appending(tmp_path):
    doc, trace = tmp_path / "doc.txt", tmp_path / "t.jsonl"
    doc.write_text(TEXT)
    trace.write_text(json.dumps({"step": "update", "chunk": 0}) + "\n" + '{"step": "updat')  # killed mid-line
    agent().ask(doc, "Q?", trace=trace)
    lines = trace.read_text().splitlines()
    assert all(json.loads(x) for x in lines)  # every line parses: nothing glued onto the torn one
    assert lines[0] == json.dumps({"step": "update", "chunk": 0}) and len(lines) == 1 + 10 + 1
