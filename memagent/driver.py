"""The driver: owns I/O around the pure reader.

It streams chunks from a document (each chunk read and tokenized once, whatever the number of
questions), advances every question's state on that chunk concurrently (so a batching backend sees them
together), writes the trace and the resumable state, and collects answers. Several documents run as
concurrent tasks under one bound, which is what keeps a continuous-batching server busy.

A question whose call fails is recorded with its error and stops; the other questions go on.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .chunking import Chunk, iter_chunks, open_document
from .prompts import Template, load_template
from .protocol import Backend, Generation
from .reader import Reader, ReaderConfig, ReadState
from .state import StateFile
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
        self.f = open(path, "a", encoding="utf-8") if path else None

    def write(self, **rec):
        if self.f:
            self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


ProgressHook = Callable[[Chunk, int], None]  # (chunk just finished, bytes of the document read so far)


class MemoryAgent:
    """Reads documents through a capped, overwritten memory and answers questions about them.

    >>> agent = MemoryAgent(backend, tokenizer, template="notes", chunk_tokens=512, memory_tokens=128)
    >>> agent.ask(Path("book.txt"), "Who wrote the letter?").answer
    """

    def __init__(self, backend: Backend, tokenizer: Tokenizer, template: Template | str = "memagent",
                 chunk_tokens: int = 5000, memory_tokens: int = 1024, answer_tokens: int = 256,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 reader_config: ReaderConfig | None = None):
        if chunk_tokens <= 0:
            raise ValueError(f"chunk size must be a positive number of tokens, got {chunk_tokens}")
        self.backend, self.tokenizer, self.chunk_tokens = backend, tokenizer, chunk_tokens
        self.template = load_template(template) if isinstance(template, str) else template
        cfg = reader_config or ReaderConfig(memory_tokens=memory_tokens, answer_tokens=answer_tokens,
                                            temperature=temperature, top_p=top_p, seed=seed)
        self.reader = Reader(self.template, tokenizer, cfg)

    # ---- public API -------------------------------------------------------------------------------
    def ask(self, doc, question: str, **kw) -> Answer:
        return asyncio.run(self.aread(doc, [question], **kw))[0]

    def ask_questions(self, doc, questions: list[str], **kw) -> list[Answer]:
        return asyncio.run(self.aread(doc, questions, **kw))

    def ask_many(self, items: list[tuple[object, list[str]]], concurrency: int = 16) -> list[list[Answer]]:
        """Several (document, questions) pairs read concurrently, answers in input order."""
        return asyncio.run(self.aread_many(items, concurrency))

    async def aread_many(self, items, concurrency: int = 16) -> list[list[Answer]]:
        sem = asyncio.Semaphore(max(1, concurrency))

        async def one(doc, qs):
            async with sem:
                return await self.aread(doc, qs)

        return await asyncio.gather(*(one(d, qs) for d, qs in items))

    def settings(self) -> dict:
        return {"chunk_tokens": self.chunk_tokens, "memory_tokens": self.reader.config.memory_tokens,
                "template": self.template.digest, "tokenizer": self.tokenizer.name,
                "backend": getattr(self.backend, "name", type(self.backend).__name__)}

    async def aread(self, doc, questions: list[str], *, trace: str | Path | None = None,
                    state: str | Path | None = None, progress: ProgressHook | None = None) -> list[Answer]:
        """Read `doc` once for all `questions`; returns one Answer per question, in order."""
        document = open_document(doc)
        t0 = time.perf_counter()
        qs = [_Q(self.reader.start(q)) for q in questions]
        if not qs:
            raise ValueError("no question given")
        store = StateFile(state) if state else None
        skip, doc_tokens, done_answers = 0, 0, None
        if store:
            saved = store.load(document.name, questions, self.settings())
            if saved:
                skip, doc_tokens, done_answers = saved["chunks_done"], saved["doc_tokens"], saved.get("answers")
                for q, s in zip(qs, saved["states"]):
                    q.state = ReadState(**s["state"])
                    q.calls, q.prompt_tokens, q.completion_tokens = s["calls"], s["prompt_tokens"], s["completion_tokens"]
                    q.error, q.seconds = s.get("error"), s.get("seconds", 0.0)
        if done_answers:
            return [Answer(**a) for a in done_answers]
        tracer = Trace(trace)
        try:
            chunks = iter_chunks(document, self.tokenizer, self.chunk_tokens)
            n_chunks = 0
            while True:
                chunk = await asyncio.to_thread(next, chunks, None)  # tokenizing overlaps model calls
                if chunk is None:
                    break
                n_chunks += 1
                if chunk.index < skip:
                    if chunk.index == skip - 1 and store and store.last_digest not in (None, chunk.digest):
                        raise ValueError(f"state file {store.path} was written for a different document text")
                    continue
                doc_tokens += chunk.n_tokens
                await asyncio.gather(*(self._update(q, i, chunk, tracer) for i, q in enumerate(qs) if not q.error))
                if store:
                    store.save(document.name, questions, self.settings(), chunk.index + 1, doc_tokens,
                               chunk.digest, [self._dump(q) for q in qs])
                if progress:
                    progress(chunk, document.bytes_read)
            await asyncio.gather(*(self._final(q, i, tracer) for i, q in enumerate(qs) if not q.error))
        finally:
            tracer.close()
        answers = [self._answer(q, doc_tokens, time.perf_counter() - t0) for q in qs]
        if store:
            store.save(document.name, questions, self.settings(), n_chunks, doc_tokens, None,
                       [self._dump(q) for q in qs], answers=[a.to_json() for a in answers])
        if self.tokenizer_warning:
            for a in answers:
                a.warnings.append(self.tokenizer_warning)
        if document.invalid_utf8:
            for a in answers:
                a.warnings.append(f"{document.invalid_utf8} invalid UTF-8 sequence(s) replaced with U+FFFD")
        return answers

    # ---- internals --------------------------------------------------------------------------------
    async def _call(self, q: _Q, request) -> Generation | None:
        t = time.perf_counter()
        try:
            gen = await self.backend.generate(request)
        except Exception as e:  # recorded on the question, never dropped
            q.error = f"{type(e).__name__}: {e}"
            return None
        finally:
            q.seconds += time.perf_counter() - t
        q.calls += 1
        q.prompt_tokens += gen.prompt_tokens
        q.completion_tokens += gen.completion_tokens
        return gen

    async def _update(self, q: _Q, qi: int, chunk: Chunk, tracer: Trace):
        t = time.perf_counter()
        gen = await self._call(q, self.reader.update_request(q.state, chunk.text))
        if gen is None:
            tracer.write(step="update", question=qi, chunk=chunk.index, error=q.error)
            return
        q.state = self.reader.apply_update(q.state, gen)
        self._check_tokenizer(chunk, gen)
        tracer.write(step="update", question=qi, chunk=chunk.index, chunk_tokens=chunk.n_tokens,
                     prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens,
                     finish_reason=gen.finish_reason, memory=q.state.memory,
                     seconds=round(time.perf_counter() - t, 4))

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
                      completion_tokens=q.completion_tokens, capped_updates=s.capped_updates, error=q.error)
