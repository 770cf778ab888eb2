"""Progress of a read in finished model calls, with an estimate before a long run.

Why calls and not bytes: the time goes into model calls. Bytes read run ahead of them (the document
streams in blocks, the skip gate reads a chunk ahead and passes chunks without a call), so a byte bar
reached 100% in a second while minutes of calls remained. So we count finished calls, and project
the total as the calls made + (chunks left x questions) + the final answers; a skipped chunk or an early
exit shrinks the projection instead of stalling the bar.

Where it shows: a bar on a terminal; off a terminal (logs, CI, `nohup`), plain lines on stderr at every
tenth of a long run and at least every `HEARTBEAT` seconds, so a log is never silent for minutes.
Before a run of `LONG_RUN` calls or more, one line says how many (chunks x questions + answers),
estimated from the tokens in the file's first 64 KB.
"""
from __future__ import annotations

import math
import os
import sys
import time

LONG_RUN = 20  # estimated calls from which the estimate is printed and tenths are logged
HEARTBEAT = 15.0  # seconds between plain lines at the latest
HEAD_BYTES = 1 << 16


def estimate_chunks(path, tokenizer, chunk_tokens: int) -> int | None:
    """Chunks of `chunk_tokens` a regular file will give, from its first 64 KB; None when not a file."""
    try:
        if path is None or not os.path.isfile(path):
            return None
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return None
    text = head.decode("utf-8", errors="ignore")
    if not text.strip():
        return None
    tokens = max(1, len(tokenizer.encode(text)))
    total = tokens if size <= len(head) else tokens * size / len(head)
    return max(1, math.ceil(total / chunk_tokens))


class CallCounter:
    """A backend that counts its finished calls (failed ones too) for a progress display."""

    def __init__(self, backend, progress: "ReadProgress"):
        self._inner, self._progress = backend, progress

    @property
    def name(self) -> str:
        return getattr(self._inner, "name", type(self._inner).__name__)

    async def generate(self, request):
        try:
            return await self._inner.generate(request)
        finally:
            self._progress.call_done(final=str(getattr(request, "cache_key", "") or "").startswith("f:"))

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class ReadProgress:
    def __init__(self, questions: int, chunks: int | None, stream=None, tty: bool | None = None, clock=time.monotonic):
        self.questions, self.chunks = questions, chunks
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock, self.t0 = clock, clock()
        self.updates = self.finals = self.chunks_done = 0
        self._updates_before = 0  # update calls made when the last chunk finished (the rest are in flight)
        self._last_line, self._last_tenth, self._printed = self.t0, 0, None  # _printed: `done` at the last line
        self._bar = self._task = None

    # ---- numbers -----------------------------------------------------------------------------------
    @property
    def done(self) -> int:
        return self.updates + self.finals

    @property
    def total(self) -> int | None:
        """Projected calls: made so far + chunks left x questions + answers still to come."""
        if self.chunks is None:
            return None
        in_flight = self.updates - self._updates_before  # calls already made for the chunk being read
        left = max(0, max(0, self.chunks - self.chunks_done) * self.questions - in_flight)
        return self.updates + left + self.questions

    def estimate_line(self) -> str | None:
        if self.chunks is None or self.total < LONG_RUN:
            return None
        return (f"memagent: about {self.chunks} chunk{'s' * (self.chunks != 1)} x {self.questions} "
                f"question{'s' * (self.questions != 1)} + {self.questions} answer{'s' * (self.questions != 1)} "
                f"= ~{self.total} model calls")

    # ---- events ------------------------------------------------------------------------------------
    def call_done(self, final: bool = False) -> None:
        if final:
            self.finals += 1
        else:
            self.updates += 1
        self._show()

    def chunk_done(self, *_) -> None:
        """The driver's per-chunk hook: (chunk, bytes read)."""
        self.chunks_done += 1
        self._updates_before = self.updates
        self._show()

    # ---- display -----------------------------------------------------------------------------------
    def line(self) -> str:
        elapsed = self.clock() - self.t0
        total = self.total
        of = f"/{total}" if total else ""
        chunk = f", chunk {self.chunks_done}" + (f" of ~{self.chunks}" if self.chunks else "")
        left = ""
        if total and self.done:
            left = f", ~{max(0.0, elapsed * (total - self.done) / self.done):.0f} s left"
        return f"memagent: {self.done}{of} model calls{chunk}, {elapsed:.0f} s{left}"

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, total=self.total, chunks=self.chunks_done)
            return
        if self.tty:
            return
        now, total = self.clock(), self.total
        tenth = int(10 * self.done / total) if total and total >= LONG_RUN else 0
        if tenth > self._last_tenth or now - self._last_line >= HEARTBEAT:
            self._last_tenth, self._last_line = max(tenth, self._last_tenth), now
            self._print()

    def _print(self) -> None:
        self._printed = self.done
        print(self.line(), file=self.stream, flush=True)

    def __enter__(self):
        est = self.estimate_line()
        if est:
            print(est, file=self.stream, flush=True)
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]reading"), BarColumn(), MofNCompleteColumn(), TextColumn("calls"),
                                 TextColumn("chunk {task.fields[chunks]}"), TimeElapsedColumn(), TextColumn("eta"),
                                 TimeRemainingColumn(), transient=True, console=Console(file=self.stream))
            self._task = self._bar.add_task("read", total=self.total, chunks=0)
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
        elif self._printed is not None and self._printed != self.done:  # a log that showed progress shows the end
            self._print()
