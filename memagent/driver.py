"""The driver: owns I/O around the pure reader.

It streams chunks from a document (each chunk read and tokenized once, whatever the number of
questions), advances every question's state on that chunk concurrently (so a batching backend sees them
together), writes the trace and the resumable state, and collects answers. Several documents run as
concurrent tasks under one bound, which is what keeps a continuous-batching server busy.

A question whose call fails is recorded with its error and stops; the other questions go on.

With the gates on (memagent/gates.py), a question whose skip gate rejects a chunk passes it without a
call (traced as a `skip` step, counted in `skipped_chunks`), and a question that exits stops taking
chunks; once every question still running has exited, the document is not read any further (so
`doc_tokens` then counts the tokens read up to the exit, not the whole document).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .chunking import Chunk, DocumentError, iter_chunks, open_document
from .prompts import Template, load_template
from .protocol import Backend, Generation, enter_document, leave_document
from .reader import Reader, ReaderConfig, ReadState
from .quality import memory_warnings
from .redact import scrub
from .state import StateFile
from . import checks
from .fileio import Appender, check_writable, exclusive, same_file
from .tokenizer import Tokenizer


@dataclass
class Answer:
    question: str
    answer: str | None
    reply: str | None = None
    memory: str = ""
    chunks: int = 0
    doc_tokens: int = 0
    seconds: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    capped_updates: int = 0
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    skipped_chunks: int = 0  # chunks passed without a call (skip gate)
    exit_chunk: int | None = None  # 0-based chunk after which reading stopped (exit gate); None: read to the end

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class _Q:
    """One question's running state inside the driver."""

    state: ReadState
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    seconds: float = 0.0


class Trace:
    """Appends one JSON line per model call; flushed each line so a crash loses nothing written."""

    def __init__(self, path: str | Path | None):
        # opened now (an unwritable path fails before any call); a torn last line is cut first, so the
        # first line of a resumed run never glues onto it; a full disk is one line naming the file
        self.out = Appender(path, "trace file") if path else None
        self.f = self.out.f if self.out else None

    def write(self, **rec):
        if self.out:
            self.out.write_line(json.dumps(rec, ensure_ascii=False))

    def close(self):
        if self.out:
            self.out.close()


ProgressHook = Callable[[Chunk, int], None]  # (chunk just finished, bytes of the document read so far)


def rolling_digest(previous: str, chunk: Chunk) -> str:
    """A digest of every chunk read so far, in order: what binds a state file to the document's text."""
    return hashlib.sha256(f"{previous}:{chunk.digest}".encode()).hexdigest()[:32]


def check_outputs(document, trace, state) -> None:
    """Refuse, before a model loads or a call is spent: a file of only whitespace, and output files that
    would overwrite the document or each other or cannot be written. (A Trace object passed in is the
    caller's own and is not checked.) aread calls it; the CLI calls it earlier, before loading a model."""
    document.refuse_blank = True  # blank text would cost a call per chunk for nothing
    if document.blank:
        raise DocumentError(f"{document.name}: the document holds only whitespace")
    paths = [("--trace", trace)] if isinstance(trace, (str, Path)) else []
    paths += [("--state", state)] if state else []
    for flag, path in paths:
        if document.path is not None and same_file(path, document.path):
            raise ValueError(f"{flag} {path} is the document being read; choose another file")
    if len(paths) == 2 and same_file(trace, state):
        raise ValueError(f"--trace and --state are the same file ({state}); give two files")
    if state:
        check_writable(state, "state file")


def _run_sync(coro):
    """Run a coroutine to completion from synchronous code, also where an event loop already runs
    (Jupyter, an async web app): there it runs on a fresh loop in a helper thread, since asyncio.run
    refuses to nest. From async code, `await agent.aread(...)` is the direct way."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="memagent-sync", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _in_daemon_thread(fn):
    """`await fn()` run in a daemon thread of its own. For reads that may block forever (a FIFO with
    no writer yet, a terminal): asyncio's default executor is joined at shutdown, so Ctrl-C would wait
    on such a read; a daemon thread is left behind instead."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(value, error):
        if not fut.done():
            fut.set_exception(error) if error is not None else fut.set_result(value)

    def target():
        try:
            value, error = fn(), None
        except BaseException as e:
            value, error = None, e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is gone (interrupted): nobody waits any more
            pass

    threading.Thread(target=target, name="memagent-read", daemon=True).start()
    return await fut


async def _all(coros: list) -> None:
    """await every coroutine; one (the common single question) is awaited directly, without a Task."""
    if len(coros) == 1:
        await coros[0]
    elif coros:
        await asyncio.gather(*coros)


class _Prefetch:
    """A document's chunks, tokenized in a worker thread so the event loop keeps serving other reads.

    Why in batches: a thread hop costs ~0.1 ms of futures, locks and wake-ups, about what a short
    chunk's HTTP call costs in Python; with 256 documents in flight one hop per chunk was a third of our
    overhead (benchmarks/bench_overhead.py). So each hop takes chunks until ~PREFETCH_TOKENS tokens or
    the document's end: a short document is one hop, a long one holds at most that much text ahead.
    A tokenizer that says `tokenize_in_thread = False` runs inline: memagent.fasttok holds the GIL
    anyway, and memagent.nativebpe is so fast that the hand-off (up to the 5 ms switch interval per
    hop) costs about what it would hide.
    """

    PREFETCH_TOKENS = 32_768

    def __init__(self, chunks, chunk_tokens: int, in_thread: bool = True, daemon: bool = False):
        self._chunks, self._ready, self._daemon = chunks, [], daemon
        self._per_hop = max(1, self.PREFETCH_TOKENS // max(1, chunk_tokens))
        self._done, self._in_thread = False, in_thread

    def _take(self) -> list[Chunk]:
        out = []
        for c in self._chunks:
            out.append(c)
            if len(out) >= self._per_hop:
                break
        return out[::-1]  # popped from the end

    async def next(self) -> Chunk | None:
        if not self._ready and not self._done:
            if self._daemon:  # a pipe may block: never inline, never in the executor (see _in_daemon_thread)
                self._ready = await _in_daemon_thread(self._take)
            else:
                self._ready = await asyncio.to_thread(self._take) if self._in_thread else self._take()
            self._done = not self._ready
        return self._ready.pop() if self._ready else None


class MemoryAgent:
    """Reads documents through a capped, overwritten memory and answers questions about them.

    >>> agent = MemoryAgent(backend, tokenizer, template="notes", chunk_tokens=512, memory_tokens=128)
    >>> agent.ask(Path("book.txt"), "Who wrote the letter?").answer
    """

    def __init__(self, backend: Backend, tokenizer: Tokenizer, template: Template | str = "memagent",
                 chunk_tokens: int = 5000, memory_tokens: int = 1024, answer_tokens: int = 256,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 reader_config: ReaderConfig | None = None, skip_update: str = "off", early_exit: str = "off",
                 chunk_snap: int = 0):
        checks.positive_int("chunk_tokens", chunk_tokens)
        if not isinstance(chunk_snap, int) or isinstance(chunk_snap, bool) or not 0 <= chunk_snap < chunk_tokens:
            raise ValueError(f"chunk_snap (--chunk-snap) must be a whole number of tokens from 0 to chunk_tokens - 1 "
                             f"({chunk_tokens - 1}), got {chunk_snap!r}")
        self.chunk_snap = chunk_snap  # chunking.iter_chunks: end chunks at sentence ends within this many tokens
        if reader_config is None:
            checks.positive_int("memory_tokens", memory_tokens)
            checks.positive_int("answer_tokens", answer_tokens)
            checks.finite("temperature", temperature, 0.0, 100.0)
            checks.finite("top_p", top_p, 0.0, 1.0, strict=True)
        self.backend, self.tokenizer, self.chunk_tokens = backend, tokenizer, chunk_tokens
        self.template = load_template(template) if isinstance(template, str) else template
        cfg = reader_config or ReaderConfig(memory_tokens=memory_tokens, answer_tokens=answer_tokens,
                                            temperature=temperature, top_p=top_p, seed=seed,
                                            skip_update=skip_update, early_exit=early_exit)
        self.reader = Reader(self.template, tokenizer, cfg)

    # ---- public API -------------------------------------------------------------------------------
    def ask(self, doc, question: str, **kw) -> Answer:
        """`doc`: a Path (a file), text (any str, "-" included), or a stream such as `sys.stdin.buffer`."""
        if not isinstance(question, str):
            raise TypeError(f"question must be a str, got {type(question).__name__} (ask_questions takes a list)")
        return _run_sync(self.aread(doc, [question], **kw))[0]

    def ask_questions(self, doc, questions: list[str], **kw) -> list[Answer]:
        return _run_sync(self.aread(doc, questions, **kw))

    def ask_many(self, items: list[tuple[object, list[str]]], concurrency: int = 16,
                 done: Callable[[], None] | None = None) -> list[list[Answer]]:
        """Several (document, questions) pairs read concurrently, answers in input order; `done()` is called
        as each document finishes (a progress bar's advance)."""
        return _run_sync(self.aread_many(items, concurrency, done))

    async def aread_many(self, items, concurrency: int = 16, done: Callable[[], None] | None = None) -> list[list[Answer]]:
        sem = asyncio.Semaphore(max(1, concurrency))

        async def one(doc, qs):
            async with sem:
                answers = await self.aread(doc, qs)
            if done is not None:
                done()
            return answers

        return await asyncio.gather(*(one(d, qs) for d, qs in items))

    def settings(self) -> dict:
        out = {"chunk_tokens": self.chunk_tokens, "memory_tokens": self.reader.config.memory_tokens,
               "template": self.template.digest, "tokenizer": self.tokenizer.name,
               "backend": getattr(self.backend, "name", type(self.backend).__name__)}
        if self.reader.gates_id:  # only when on, so state files written before the gates still resume
            out["gates"] = self.reader.gates_id
        if self.chunk_snap:  # likewise: other chunks are another read
            out["chunk_snap"] = self.chunk_snap
        return out

    async def aread(self, doc, questions: list[str], *, trace: str | Path | None = None,
                    state: str | Path | None = None, progress: ProgressHook | None = None) -> list[Answer]:
        """Read `doc` once for all `questions`; returns one Answer per question, in order.

        Everything checkable is checked before the first model call: the questions, the output files
        (writable, not the document, not each other) and the state file's lock (a second process on one
        state file is refused instead of both writing it)."""
        document = open_document(doc)
        questions = checks.questions(questions)
        check_outputs(document, trace, state)
        if not state:
            return await self._aread(document, questions, trace=trace, state=None, progress=progress)
        with exclusive(state, "state file"):
            return await self._aread(document, questions, trace=trace, state=state, progress=progress)

    async def _aread(self, doc, questions: list[str], *, trace, state, progress) -> list[Answer]:
        document = open_document(doc)
        # The settings are taken once, before any call: what a backend learns on its first call (the
        # model a server reports) must not make the state written after it differ from a rerun's.
        settings = self.settings()
        t0 = time.perf_counter()
        qs = [_Q(self.reader.start(q)) for q in questions]
        if not qs:
            raise ValueError("no question given")
        store = StateFile(state) if state else None
        resume, doc_tokens, done_answers = 0, 0, None
        if store:
            saved = store.load(document.name, questions, settings)
            if saved:
                resume, doc_tokens, done_answers = saved["chunks_done"], saved["doc_tokens"], saved.get("answers")
                for q, s in zip(qs, saved["states"]):
                    q.state = ReadState(**s["state"])
                    q.calls, q.prompt_tokens, q.completion_tokens = s["calls"], s["prompt_tokens"], s["completion_tokens"]
                    q.error, q.seconds = s.get("error"), s.get("seconds", 0.0)
        if done_answers:  # finished: bound to the text exactly as an unfinished state is (read, not called)
            await self._verify_read(document, store, resume, saved.get("complete"))
            return [Answer(**a) for a in done_answers]
        tracer = trace if isinstance(trace, Trace) else Trace(trace)  # a Trace: e.g. the server's live events
        pinned = enter_document()  # a pool of servers keeps this document's calls on one replica
        try:
            chunks = self._chunks(document)
            # The skip gate looks at a chunk's neighbours' edges, so it reads one chunk ahead; without it
            # a chunk is tokenized only when its turn comes.
            ahead = self.reader.config.skip_update != "off"
            n_chunks, previous, rolling = 0, None, ""
            following = await chunks.next() if ahead else None
            while True:
                if ahead:
                    chunk = following
                    following = await chunks.next() if chunk is not None else None
                else:
                    chunk = await chunks.next()
                if chunk is None:
                    break
                if chunk.index < resume:
                    n_chunks += 1
                    previous = chunk
                    rolling = rolling_digest(rolling, chunk)
                    if chunk.index == resume - 1 and store and (
                            store.last_digest not in (None, chunk.digest)
                            or store.read_digest not in (None, rolling)):
                        raise ValueError(f"state file {store.path} was written for a different document text")
                    continue
                if any(q.state.exited for q in qs) and all(q.error or q.state.exited for q in qs):
                    break  # every question still running has exited: the rest of the document is not read
                n_chunks += 1
                doc_tokens += chunk.n_tokens
                near = (previous.text if previous else None, following.text if following else None)
                await _all([self._update(q, i, chunk, tracer, near) for i, q in enumerate(qs) if not q.error])
                previous = chunk
                if store:
                    rolling = rolling_digest(rolling, chunk)
                    store.save(document.name, questions, settings, chunk.index + 1, doc_tokens,
                               chunk.digest, [self._dump(q) for q in qs], read_digest=rolling)
                if progress:
                    progress(chunk, document.bytes_read)
            if n_chunks < resume:  # the text is now shorter than what the state has read
                raise ValueError(f"state file {store.path} was written for a different document text")
            await _all([self._final(q, i, tracer) for i, q in enumerate(qs) if not q.error])
        finally:
            leave_document(self.backend, pinned)
            tracer.close()
        answers = [self._answer(q, doc_tokens, time.perf_counter() - t0) for q in qs]
        for q, a in zip(qs, answers):  # a memory that cannot hold the evidence says so (memagent/quality.py)
            if not q.error:
                a.warnings += memory_warnings(q.state.memory, q.state.chunks_read - q.state.skipped,
                                              q.state.capped_updates, self.reader.config.memory_tokens)
        if store:
            store.save(document.name, questions, settings, n_chunks, doc_tokens, None,
                       [self._dump(q) for q in qs], answers=[a.to_json() for a in answers], read_digest=rolling,
                       complete=chunk is None)
        if self.tokenizer_warning:
            for a in answers:
                a.warnings.append(self.tokenizer_warning)
        if document.invalid_utf8:
            for a in answers:
                a.warnings.append(f"{document.invalid_utf8} invalid UTF-8 sequence(s) replaced with U+FFFD")
        return answers

    # ---- internals --------------------------------------------------------------------------------
    def _chunks(self, document) -> "_Prefetch":
        chunks = iter_chunks(document, self.tokenizer, self.chunk_tokens, self.chunk_snap)
        return _Prefetch(chunks, self.chunk_tokens,
                         getattr(self.tokenizer, "tokenize_in_thread", True), daemon=document.blocking)

    async def _verify_read(self, document, store: StateFile, chunks_done: int, complete: bool | None) -> None:
        """A finished state's answers are returned only for the text they were read from: its first
        `chunks_done` chunks must hash to the saved digest and, when it was read to the end, nothing may
        follow. Costs one tokenization of the document, no model call."""
        chunks, rolling, n = self._chunks(document), "", 0
        while (chunk := await chunks.next()) is not None:
            if n == chunks_done:
                if complete:
                    n += 1  # the text goes on past what was read
                break
            rolling, n = rolling_digest(rolling, chunk), n + 1
        if n != chunks_done or rolling != store.read_digest:
            raise ValueError(f"state file {store.path} holds answers for a different document text; "
                             f"delete it (or use another --state) to read this one")

    async def _call(self, q: _Q, request) -> Generation | None:
        t = time.perf_counter()
        try:
            gen = await self.backend.generate(request)
        except Exception as e:  # recorded on the question, never dropped
            q.error = scrub(f"{type(e).__name__}: {e}")  # it goes to trace, state and output: no key in it
            return None
        finally:
            q.seconds += time.perf_counter() - t
        q.calls += 1
        q.prompt_tokens += gen.prompt_tokens
        q.completion_tokens += gen.completion_tokens
        return gen

    async def _update(self, q: _Q, qi: int, chunk: Chunk, tracer: Trace, near: tuple = (None, None)):
        if q.state.exited:
            return
        if not self.reader.needs_update(q.state, chunk.text, *near):
            q.state = self.reader.skip(q.state)
            tracer.write(step="skip", question=qi, chunk=chunk.index, chunk_tokens=chunk.n_tokens)
            return
        t = time.perf_counter()
        gen = await self._call(q, self.reader.update_request(q.state, chunk.text))
        if gen is None:
            tracer.write(step="update", question=qi, chunk=chunk.index, error=q.error)
            return
        q.state = self.reader.apply_update(q.state, gen)
        self._check_tokenizer(chunk, gen)
        extra = {"exit": True} if q.state.exit_chunk == chunk.index else {}
        tracer.write(step="update", question=qi, chunk=chunk.index, chunk_tokens=chunk.n_tokens,
                     prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens,
                     finish_reason=gen.finish_reason, memory=q.state.memory,
                     seconds=round(time.perf_counter() - t, 4), **extra)

    async def _final(self, q: _Q, qi: int, tracer: Trace):
        t = time.perf_counter()
        gen = await self._call(q, self.reader.final_request(q.state))
        if gen is None:
            tracer.write(step="final", question=qi, error=q.error)
            return
        q.state = self.reader.apply_final(q.state, gen)
        tracer.write(step="final", question=qi, prompt_tokens=gen.prompt_tokens,
                     completion_tokens=gen.completion_tokens, reply=gen.text, answer=q.state.answer,
                     seconds=round(time.perf_counter() - t, 4))

    tokenizer_warning: str | None = None

    def _check_tokenizer(self, chunk: Chunk, gen: Generation) -> None:
        """A server counts the prompt in its own tokens. If that count cannot contain our chunk (far fewer
        tokens) or is far larger than chunk + memory + template, our tokenizer is not the served model's."""
        if self.tokenizer_warning is not None or not gen.prompt_tokens or chunk.n_tokens < 256:
            return
        upper = 2 * (chunk.n_tokens + self.reader.config.memory_tokens + 1024)
        if gen.prompt_tokens < 0.6 * chunk.n_tokens or gen.prompt_tokens > upper:
            self.tokenizer_warning = (
                f"the backend counted {gen.prompt_tokens} prompt tokens for a {chunk.n_tokens}-token chunk: "
                f"the tokenizer ({self.tokenizer.name}) probably does not match the model; chunk sizes are off")
        else:
            self.tokenizer_warning = ""

    @staticmethod
    def _dump(q: _Q) -> dict:
        return {"state": asdict(q.state), "calls": q.calls, "prompt_tokens": q.prompt_tokens,
                "completion_tokens": q.completion_tokens, "error": q.error, "seconds": q.seconds}

    @staticmethod
    def _answer(q: _Q, doc_tokens: int, seconds: float) -> Answer:
        s = q.state
        return Answer(question=s.question, answer=s.answer, reply=s.reply, memory=s.memory, chunks=s.chunks_read,
                      doc_tokens=doc_tokens, seconds=round(seconds, 3), calls=q.calls, prompt_tokens=q.prompt_tokens,
                      completion_tokens=q.completion_tokens, capped_updates=s.capped_updates, error=q.error,
                      skipped_chunks=s.skipped, exit_chunk=s.exit_chunk)
