"""Progress counts finished model calls (issue 11 item 15): plain lines off a terminal, an estimate first."""
import io
import os
import subprocess
import sys
from pathlib import Path

from memagent.progress import LONG_RUN, ReadProgress, estimate_chunks
from memagent.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_estimate_counts_chunks_times_questions(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("x" * 100_000)  # one byte-token per byte, past the 64 KB head
    assert estimate_chunks(p, ByteTokenizer(), 1000) == 100
    assert estimate_chunks(tmp_path / "missing", ByteTokenizer(), 1000) is None
    pr = ReadProgress(3, 100, stream=io.StringIO(), tty=False)
    assert pr.total == 303 and "100 chunks x 3 questions + 3 answers = ~303 model calls" in pr.estimate_line()
    assert ReadProgress(1, 2, stream=io.StringIO(), tty=False).estimate_line() is None  # short: no estimate


def test_plain_lines_count_calls_not_chunks_read():
    out, clock = io.StringIO(), Clock()
    pr = ReadProgress(2, 20, stream=out, tty=False, clock=clock)
    with pr:
        for _ in range(20):  # the skip gate passes every chunk at once: no call made yet
            pr.chunk_done()
        assert pr.done == 0 and pr.total == 2  # only the two answers are left, not "100% done"
        clock.t = 20
        pr.call_done(final=True)
        pr.call_done(final=True)
    assert pr.done == pr.total == 2
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("memagent: about 20 chunks x 2 questions")
    assert lines[-1].startswith("memagent: 2/2 model calls")


def test_tenths_of_a_long_run_are_logged():
    out, clock = io.StringIO(), Clock()
    pr = ReadProgress(1, 40, stream=out, tty=False, clock=clock)
    with pr:
        for i in range(40):
            pr.call_done()
            pr.chunk_done()
            clock.t += 0.01
        pr.call_done(final=True)
    progress = [x for x in out.getvalue().splitlines() if "model calls," in x]
    assert 9 <= len(progress) <= 11 and progress[-1].startswith("memagent: 41/41 model calls")


def test_ask_off_a_terminal_prints_progress_and_estimate(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The lamp was lit at dusk by the keeper of the light. " * 300)
    p = subprocess.run([sys.executable, "-m", "memagent", "ask", str(doc), "Who lit it?", "--backend", "instant",
                        "--chunk-tokens", "64", "--memory-tokens", "16"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert p.returncode == 0, p.stderr
    err = p.stderr.splitlines()
    assert any(x.startswith("memagent: about ") and "model calls" in x for x in err), p.stderr
    assert sum("model calls, chunk" in x for x in err) >= 5, p.stderr
    assert LONG_RUN <= 60


def test_projection_does_not_count_a_chunk_in_flight_twice():
    pr = ReadProgress(2, 3, stream=io.StringIO(), tty=False)
    assert pr.total == 8  # 3 chunks x 2 questions + 2 answers
    for _ in range(3):
        pr.call_done()
        assert pr.total == 8  # the first question's call for this chunk is one of the chunk's two
        pr.call_done()
        pr.chunk_done()
        assert pr.total == 8
    pr.call_done(final=True)
    pr.call_done(final=True)
    assert pr.done == pr.total == 8
