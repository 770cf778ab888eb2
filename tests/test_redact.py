"""Secrets (issue 11 item 8): API keys and URL credentials never reach a file or a terminal."""
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memagent import redact
from memagent.backends.openai_http import OpenAIBackend, normalise_base_url
from memagent.protocol import BackendError

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-live-Q7rT2vX9pL4mN8bK3cZ6"


def run(*args, env=None):
    e = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    e.pop("OPENAI_API_KEY", None) if "OPENAI_API_KEY" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "memagent", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=e)


def test_scrub_whole_other_case_and_truncated():
    redact.register(KEY)
    for echoed in (KEY, KEY.upper(), KEY.lower(), KEY[:12] + "...", "..." + KEY[-9:], KEY[5:15]):
        out = redact.scrub(f"HTTP 401: Incorrect API key provided: {echoed}. See the docs.")
        assert echoed not in out and "***" in out, out
        assert out.startswith("HTTP 401: Incorrect API key provided: ") and out.endswith("See the docs.")
    assert redact.scrub("an ordinary sentence about keys") == "an ordinary sentence about keys"


def test_short_keys_are_not_searched_in_free_text():
    redact.register("K")
    assert redact.scrub("Kilo Kelvin") == "Kilo Kelvin"  # masked only where known to be a key (argv)
    assert redact.redact_argv(["memagent", "eval", "--api-key", "K", "--n", "2"]) == \
        ["memagent", "eval", "--api-key", "***", "--n", "2"]


def test_redact_argv_both_spellings_and_urls():
    argv = ["memagent", "ask", "d.txt", "Q?", "--api-key=abcdefgh12345", "--base-url", "http://bob:hunter22@h:8/v1"]
    out = " ".join(redact.redact_argv(argv))
    assert "abcdefgh12345" not in out and "hunter22" not in out and "bob" not in out
    assert "--api-key=***" in out and "http://***@h:8/v1" in out


def test_url_credentials_are_refused_without_showing_them():
    with pytest.raises(BackendError, match="must not hold credentials") as e:
        normalise_base_url("http://alice:s3cretpass@127.0.0.1:8000/v1")
    assert "s3cretpass" not in str(e.value) and "alice" not in str(e.value)
    with pytest.raises(BackendError) as e:  # a malformed URL's message hides them too
        normalise_base_url("alice:s3cretpass@127.0.0.1")
    assert "s3cretpass" not in str(e.value)


def test_cli_refuses_url_credentials_in_one_line(tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text("text " * 50)
    p = run("ask", str(doc), "Q?", "--backend", "openai", "--tokenizer", "cl100k_base",
            "--base-url", "http://alice:s3cretpass@127.0.0.1:9/v1")
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "credentials" in lines[0] and "s3cretpass" not in p.stderr + p.stdout


class _EchoKey(BaseHTTPRequestHandler):
    """A server that refuses the key and echoes it back upper-cased and truncated, as some proxies do."""

    def do_GET(self):
        self._refuse()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._refuse()

    def _refuse(self):
        key = self.headers.get("authorization", "").split()[-1]
        body = json.dumps({"error": {"message": f"Invalid key {key.upper()[:14]}... (full: {key})"}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def echo_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _EchoKey)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_echoed_key_never_reaches_trace_state_or_output(tmp_path, echo_server):
    key = "sk-echo-Zz81Yy72Xx63Ww54"
    doc, trace, state = tmp_path / "d.txt", tmp_path / "t.jsonl", tmp_path / "s.json"
    doc.write_text("The lamp was lit at dusk. " * 40)
    p = run("ask", str(doc), "Q?", "--backend", "openai", "--base-url", echo_server, "--model", "m",
            "--tokenizer", "cl100k_base", "--trace", str(trace), "--state", str(state), "--json",
            env={"OPENAI_API_KEY": key})
    assert p.returncode == 1, p.stderr  # the question failed (401), and says so
    written = p.stdout + p.stderr + trace.read_text() + (state.read_text() if state.exists() else "")
    assert "HTTP 401" in written and "***" in written
    for piece in (key, key.upper()[:14], key[3:12]):
        assert piece.lower() not in written.lower(), piece


def test_eval_summary_records_no_key(tmp_path):
    out = tmp_path / "run"
    p = run("eval", "--task", "vt", "--lengths", "1k", "--n", "1", "--backend", "instant", "--api-key", "K",
            "--out", str(out), "--no-plot")
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert "--api-key ***" in summary["command"] and " K" not in summary["command"]
    for f in out.iterdir():
        assert "--api-key K" not in f.read_text(errors="replace")


def test_backend_registers_its_key():
    OpenAIBackend("http://127.0.0.1:9/v1", api_key="sk-registered-0000aaaa")
    assert "sk-registered" not in redact.scrub("echo sk-registered-0000aaaa")
