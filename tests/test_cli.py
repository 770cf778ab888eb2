"""The CLI end to end (instant backend, in-process: no model) and its answers to bad input:
one clear line on stderr, a non-zero exit, no traceback, nothing written half."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, stdin=None, env=None):
    e = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "memagent", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=120, env=e)


def assert_clean_error(p, pattern):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("memagent: error:"), p.stderr
    assert pattern.lower() in lines[0].lower(), lines[0]


@pytest.fixture
def doc(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_text("The lamp was lit at dusk. " * 400)
    return p


def test_ask_json_instant(doc):
    p = run("ask", str(doc), "When was the lamp lit?", "Second question?", "--backend", "instant",
            "--chunk-tokens", "200", "--memory-tokens", "50", "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert [r["question"] for r in rows] == ["When was the lamp lit?", "Second question?"]
    for r in rows:
        assert {"question", "answer", "memory", "chunks", "doc_tokens", "seconds"} <= set(r)
        assert r["answer"] == "instant" and r["chunks"] == -(-r["doc_tokens"] // 200)


def test_ask_stdin(doc):
    p = run("ask", "-", "Q?", "--backend", "instant", "--chunk-tokens", "100", "--json", stdin=doc.read_text())
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["chunks"] > 5


def test_trace_and_state_files(tmp_path, doc):
    trace, state = tmp_path / "t.jsonl", tmp_path / "s.json"
    p = run("ask", str(doc), "Q?", "--backend", "instant", "--chunk-tokens", "100", "--trace", str(trace),
            "--state", str(state), "--json")
    assert p.returncode == 0, p.stderr
    n = json.loads(p.stdout)["chunks"]
    assert len(trace.read_text().splitlines()) == n + 1
    assert json.loads(state.read_text())["body"]["chunks_done"] == n


def test_api_key_never_written(tmp_path, doc):
    trace, state = tmp_path / "t.jsonl", tmp_path / "s.json"
    secret = "sk-test-SECRET-123456"
    p = run("ask", str(doc), "Q?", "--backend", "instant", "--api-key", secret, "--chunk-tokens", "100",
            "--trace", str(trace), "--state", str(state), "--json", env={"OPENAI_API_KEY": secret})
    assert p.returncode == 0
    for text in (trace.read_text(), state.read_text(), p.stdout, p.stderr):
        assert secret not in text


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make,args,pattern", [
    (lambda t: t / "missing.txt", [], "no such file"),
    (lambda t: t, [], "directory"),
    (lambda t: _write(t / "e.txt", b""), [], "empty"),
    (lambda t: _write(t / "b.bin", b"\x00\x01\x02" * 99), [], "binary"),
    (None, ["--chunk-tokens", "3"], "too small"),
    (None, ["--memory-tokens", "0"], "memory"),
    (None, ["--memory-tokens", "-5"], "memory"),
])
def test_bad_input(tmp_path, doc, make, args, pattern):
    path = make(tmp_path) if make else doc
    assert_clean_error(run("ask", str(path), "Q?", "--backend", "instant", *args), pattern)


def test_empty_question(doc):
    assert_clean_error(run("ask", str(doc), "  ", "--backend", "instant"), "empty")


def test_template_without_placeholder(tmp_path, doc):
    t = tmp_path / "t.toml"
    t.write_text('update = "{question} {memory}"\nfinal = "{question} {memory}"\nempty_memory = "-"\n')
    assert_clean_error(run("ask", str(doc), "Q?", "--backend", "instant", "--template", str(t)), "{chunk}")


def test_unreachable_server(doc):
    p = run("ask", str(doc), "Q?", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
            "--tokenizer", "cl100k_base", "--max-retries", "1", "--timeout", "5")
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr
    assert "memagent:" in p.stderr


def test_openai_needs_base_url(doc):
    p = run("ask", str(doc), "Q?", "--backend", "openai", "--tokenizer", "cl100k_base", env={"OPENAI_BASE_URL": ""})
    assert_clean_error(p, "--base-url")


def test_invalid_utf8_warns(tmp_path):
    p = tmp_path / "l1.txt"
    p.write_bytes("caf\xe9 ".encode("latin-1") * 300)
    r = run("ask", str(p), "Q?", "--backend", "instant", "--chunk-tokens", "100", "--json")
    assert r.returncode == 0 and "invalid UTF-8" in r.stderr


def test_huge_single_line(tmp_path):
    """One 8 MB line (no newline anywhere) streams like any other document."""
    p = tmp_path / "line.txt"
    p.write_text("token" * 1_600_000)
    r = run("ask", str(p), "Q?", "--backend", "instant", "--chunk-tokens", "5000", "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["chunks"] == -(-row["doc_tokens"] // 5000) and row["doc_tokens"] > 1_000_000
