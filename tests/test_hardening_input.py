"""Issue 11, items 3, 10-14: bad input is one line and exit 2 with nothing written, or is read correctly
(named pipes, UTF-16); the Python API takes what it documents and says so when it does not. Model-free."""
import asyncio
import codecs
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memagent import DocumentError, MemoryAgent, open_document
from memagent.backends.instant import InstantBackend
from memagent.backends.scripted import ScriptedBackend
from memagent.prompts import TemplateError, load_template
from memagent.tokenizer import ByteTokenizer
from clicheck import one_error_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The lamp was lit at dusk by the keeper. " * 30


def agent(backend=None, **kw):
    kw = {"template": "notes", "chunk_tokens": 128, "memory_tokens": 32, **kw}
    return MemoryAgent(backend or InstantBackend(), ByteTokenizer(), **kw)


def cli(*args, stdin=None, cwd=ROOT, timeout=60):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "memagent", *args], cwd=cwd, input=stdin, capture_output=True,
                          timeout=timeout, env=env)


@pytest.fixture
def doc(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_text(TEXT)
    return p


# ---- item 3: named pipes --------------------------------------------------------------------------------

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")


@needs_fifo
def test_named_pipe_is_read_whole(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def writer():
        try:
            with open(fifo, "w") as f:  # blocks until memagent opens it for reading
                f.write(TEXT)
        except BrokenPipeError:  # the old code opened and closed the pipe to "check" it
            pass

    threading.Thread(target=writer, daemon=True).start()
    try:
        p = cli("ask", str(fifo), "Q?", "--backend", "instant", "--chunk-tokens", "16", "--json", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the read of a named pipe never finished (its data was taken by a check)")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["doc_tokens"] > 200


@needs_fifo
def test_ctrl_c_while_a_pipe_waits_for_data(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # a test run started in the background of a non-interactive shell inherits SIGINT ignored, as any
    # child would: give the child a terminal user's default disposition
    proc = subprocess.Popen([sys.executable, "-m", "memagent", "ask", str(fifo), "Q?", "--backend", "instant"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    fd = None
    try:
        deadline = time.monotonic() + 60
        while fd is None:  # a non-blocking open succeeds once memagent has opened the pipe for reading
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.05)
        time.sleep(1.0)  # no data ever comes: memagent waits in read()
        proc.send_signal(signal.SIGINT)  # the first Ctrl-C must end it
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("the first Ctrl-C did not stop a read waiting on a pipe")
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    finally:
        if fd is not None:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- item 10: built-in template names win over files in the current folder --------------------------------

def test_builtin_template_name_beats_file_in_cwd(tmp_path, monkeypatch):
    bad = 'update = "{question}{memory}{chunk} EVIL"\nfinal = "{question}{memory} EVIL"\nempty_memory = "-"\n'
    (tmp_path / "notes").write_text(bad)
    (tmp_path / "memagent").write_text(bad)
    monkeypatch.chdir(tmp_path)
    assert "EVIL" not in load_template("notes").update and "EVIL" not in load_template("memagent").update
    assert "EVIL" in load_template("./notes").update  # a path when clearly one
    (tmp_path / "notes.toml").write_text(bad)
    assert "EVIL" in load_template("notes.toml").update


# ---- item 11: bad values are one line ------------------------------------------------------------------

def test_json_template_that_is_a_list(tmp_path):
    t = tmp_path / "t.json"
    t.write_text('["update", "final"]')
    with pytest.raises(TemplateError, match="not a list"):
        load_template(str(t))


@pytest.mark.parametrize("args,pattern", [
    (["--threads", "-3"], "--threads"),
    (["--temperature", "nan"], "--temperature must be a finite"),
    (["--temperature", "-1"], "--temperature must be at least 0"),
    (["--timeout", "nan"], "--timeout must be a finite"),
    (["--answer-tokens", "0"], "--answer-tokens"),
    (["--template", "LIST"], "not a list"),
])
def test_bad_values_one_line(tmp_path, doc, args, pattern):
    if "LIST" in args:
        (tmp_path / "t.json").write_text("[1, 2]")
        args = ["--template", str(tmp_path / "t.json")]
    state = tmp_path / "s.json"
    one_error_line(cli("ask", str(doc), "Q?", "--backend", "instant", "--state", str(state), *args), pattern)
    assert not state.exists()


def test_undecodable_question_with_state(tmp_path, doc):
    state = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "memagent", "ask", str(doc), b"Who\xff?", "--backend", "instant",
                        "--state", str(state)], cwd=ROOT, capture_output=True, timeout=60)
    one_error_line(p, "not valid UTF-8")
    assert not state.exists()


def test_lone_surrogate_document_and_question_in_api():
    b = ScriptedBackend()
    with pytest.raises(DocumentError, match="lone surrogate U\\+D800"):
        agent(b).ask("text \ud800 more", "Q?")
    with pytest.raises(ValueError, match="question 1 is not valid UTF-8"):
        agent(b).ask(TEXT, "Q\udcff?")
    assert b.requests == []


# ---- item 12: odd documents ----------------------------------------------------------------------------

def test_whitespace_only_document_costs_no_call(tmp_path):
    b = ScriptedBackend()
    for src in (" \n\t " * 500, (tmp_path / "w.txt")):
        if isinstance(src, Path):
            src.write_text(" \n" * 5000)
        with pytest.raises(DocumentError, match="only whitespace"):
            agent(b).ask(src, "Q?")
    assert b.requests == []
    w = tmp_path / "w.txt"
    one_error_line(cli("ask", "-", "Q?", "--backend", "instant", stdin=b" \n" * 5000), "only whitespace")
    one_error_line(cli("ask", str(w), "Q?", "--backend", "instant", "--trace", str(tmp_path / "t")), "only whitespace")
    assert not (tmp_path / "t").exists()


def test_nul_after_8kb_is_binary(tmp_path):
    p = tmp_path / "late.bin"
    p.write_bytes(b"a" * 20_000 + b"\x00" * 10 + b"b" * 100)
    b = ScriptedBackend()
    with pytest.raises(DocumentError, match="binary file .NUL byte at offset 20000"):
        agent(b).ask(p, "Q?")
    assert b.requests == []
    stream = open_document(__import__("io").BytesIO(b"a" * 300_000 + b"\x00"))  # a stream: found when read
    with pytest.raises(DocumentError, match="offset 300000"):
        "".join(stream.blocks())


@pytest.mark.parametrize("bom,codec", [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")])
def test_utf16_with_bom_is_decoded(tmp_path, bom, codec):
    p = tmp_path / "u16.txt"
    text = "Ünïcode lamp 日本 🎉 lit at dusk.\n" * 50
    p.write_bytes(bom + text.encode(codec))
    assert "".join(open_document(p).blocks()) == text
    a = agent().ask(p, "Q?")
    assert a.error is None and a.doc_tokens == len(text.encode("utf-8")) and not a.warnings


def test_utf16_without_bom_is_named(tmp_path):
    p = tmp_path / "u16.txt"
    p.write_bytes("The lamp was lit at dusk.\n".encode("utf-16-le") * 20)
    with pytest.raises(DocumentError, match="UTF-16 text without a byte-order mark.*UTF-16LE"):
        open_document(p)


def test_symlink_loop_is_named(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    with pytest.raises(DocumentError, match="symbolic link loop"):
        open_document(loop)
    with pytest.raises(DocumentError, match="no such file"):
        open_document(tmp_path / "missing.txt")


def test_output_file_is_the_document(tmp_path, doc):
    before = doc.read_text()
    for flag in ("--trace", "--state"):
        one_error_line(cli("ask", str(doc), "Q?", "--backend", "instant", flag, str(doc)), "is the document")
    link = tmp_path / "link.txt"
    os.symlink(doc, link)
    with pytest.raises(ValueError, match="is the document"):
        agent().ask(doc, "Q?", trace=link)
    with pytest.raises(ValueError, match="same file"):
        agent().ask(doc, "Q?", trace=tmp_path / "x", state=tmp_path / "x")
    assert doc.read_text() == before


# ---- item 13: the Python API takes what it documents --------------------------------------------------------

def test_dash_is_text_not_stdin(monkeypatch):
    class NoStdin:
        def __getattr__(self, name):
            raise AssertionError("stdin was read")

    monkeypatch.setattr(sys, "stdin", NoStdin())
    assert "".join(open_document("-").blocks()) == "-"
    a = agent().ask("-", "Q?")
    assert a.error is None and a.doc_tokens == 1


def test_questions_given_as_one_string_and_bad_types():
    b = ScriptedBackend()
    answers = agent(b).ask_questions(TEXT, "Who?")
    assert [a.question for a in answers] == ["Who?"]
    with pytest.raises(TypeError, match="question 2 must be a str, got int"):
        agent(b).ask_questions(TEXT, ["Who?", 7])
    with pytest.raises(TypeError, match="question must be a str"):
        agent(b).ask(TEXT, ["Who?"])
    with pytest.raises(TypeError, match="chunk_tokens must be a whole number, got 1.5"):
        agent(chunk_tokens=1.5)
    with pytest.raises(ValueError, match="memory_tokens must be at least 1"):
        agent(memory_tokens=0)
    with pytest.raises(ValueError, match="temperature must be a finite"):
        agent(temperature=float("nan"))


def test_ask_inside_a_running_event_loop():
    """Jupyter runs an event loop; the synchronous API still works there."""
    async def notebook_cell():
        return agent().ask(TEXT, "Q?")

    a = asyncio.run(notebook_cell())
    assert a.error is None and a.answer == "instant"


# ---- item 14: several documents on one command line ------------------------------------------------------

def test_second_document_is_not_taken_as_a_question(tmp_path, doc):
    other = tmp_path / "b.txt"
    other.write_text(TEXT)
    p = cli("ask", str(doc), str(other), "Q?", "--backend", "instant")
    one_error_line(p, "run ask once per document")
    p = cli("ask", str(doc), "b.txt?", "--backend", "instant", cwd=tmp_path)  # not a file: a question
    assert p.returncode == 0, p.stderr
