"""Reading jobs for `memagent serve`: uploaded documents, reads in the background, live events, resume.

Layout under the server's data folder (`--state DIR`; a temporary folder when not given):

    docs/<sha256>.txt      an uploaded document, named by its content: the same text uploaded twice is one
                           file, and a request names a document only by this digest, never by a path
    jobs/<id>/job.json     the job: document, questions, settings, status, answers (rewritten atomically)
    jobs/<id>/state.json   the driver's own resumable state (memagent.state.StateFile, as `ask --state`)
    jobs/<id>/events.jsonl every event the job published, so a page opened later replays the whole reading
    jobs/<id>/trace.jsonl  the driver's trace (`ask --trace`), offered for download

Why the driver's --state mechanism and not a job-specific one: a server killed with SIGKILL mid-read must
continue after the last finished chunk and end with the answer an uninterrupted read gives, which is
exactly what a resumed `ask --state` already guarantees (same checks of document, questions, settings).
On start the manager resumes every job whose status is still `running`.

Events (`Job.events`, each with a sequence number `seq`): `start`, one `chunk` per finished chunk (each
question's step there: `update` with the new memory and whether it changed, `skip` when the skip gate
passed the chunk without a call, `error`, or `idle` once a question has stopped), then one of `done`
(with the answers), `failed` or `cancelled`.
"""
from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..driver import MemoryAgent, Trace
from ..state import atomic_write
from .protocol import RequestError, check_text

DOC_ID = re.compile(r"^[0-9a-f]{64}$")
JOB_ID = re.compile(r"^[0-9a-f]{32}$")
ACTIVE = ("running",)
FINISHED = ("done", "failed", "cancelled")


@dataclass
class ReadSettings:
    """What a job request may set; every field is validated (no paths: templates by built-in name)."""

    chunk_tokens: int
    memory_tokens: int
    answer_tokens: int = 256
    template: str = "memagent"
    skip_update: str = "off"
    early_exit: str = "off"
    chunk_snap: int = 0  # chunking.iter_chunks: end chunks at a sentence end within this many tokens; 0 = exact

    @classmethod
    def parse(cls, body: dict, defaults: "ReadSettings") -> "ReadSettings":
        from ..gates import EXIT_MODES, SKIP_MODES
        from ..prompts import builtin_templates

        out = {}
        for key, lo, hi in (("chunk_tokens", 16, 1_000_000), ("memory_tokens", 1, 100_000),
                            ("answer_tokens", 1, 100_000)):
            v = body.get(key)
            if v is None:
                out[key] = getattr(defaults, key)
            elif isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise RequestError(f"'{key}' must be an integer in [{lo}, {hi}]", param=key)
            else:
                out[key] = v
        for key, allowed in (("template", builtin_templates()), ("skip_update", SKIP_MODES),
                             ("early_exit", EXIT_MODES)):
            v = body.get(key, getattr(defaults, key))
            if v not in allowed:
                raise RequestError(f"'{key}' must be one of {', '.join(allowed)}", param=key)
            out[key] = v
        # the server's default snap (serve --chunk-snap) shrinks to fit a request's smaller chunks; a request's
        # own value must fit as given
        v = body.get("chunk_snap", min(defaults.chunk_snap, out["chunk_tokens"] - 1))
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < out["chunk_tokens"]:
            raise RequestError(f"'chunk_snap' must be an integer in [0, chunk_tokens - 1 = {out['chunk_tokens'] - 1}]",
                               param="chunk_snap")
        out["chunk_snap"] = v
        return cls(**out)


def parse_questions(value) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or len(value) > 32:
        raise RequestError("'questions' must be a list of 1 to 32 non-empty strings", param="questions")
    out = []
    for q in value:
        if not isinstance(q, str) or not q.strip() or len(q) > 10_000:
            raise RequestError("each question must be a non-empty string of at most 10000 characters",
                               param="questions")
        check_text(q, "questions")
        out.append(q.strip())
    return out


class DocumentStore:
    """Content-addressed documents: streamed to disk in blocks, hashed on the way, size-limited."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = root / "docs", max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, doc_id) -> Path:
        if not isinstance(doc_id, str) or not DOC_ID.match(doc_id):
            raise RequestError("'document' must be the 64-hex-digit id an upload returned", param="document")
        p = self.root / f"{doc_id}.txt"
        if not p.exists():
            raise RequestError(f"no document {doc_id}; upload it first", status=404, param="document")
        return p

    def meta(self, doc_id: str) -> dict:
        p = self.path(doc_id)
        info = self.root / f"{doc_id}.json"
        chars = json.loads(info.read_text())["chars"] if info.exists() else None
        return {"id": doc_id, "bytes": p.stat().st_size, "chars": chars}

    async def save_stream(self, read_block, timeout: float) -> dict:
        """Write blocks from `read_block()` (b'' at the end) to a temporary file, then rename it to its digest.
        Refuses (413) as soon as more than max_bytes arrived; never holds the document in memory."""
        sha, size, chars = hashlib.sha256(), 0, 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                while True:
                    try:
                        block = await asyncio.wait_for(read_block(), timeout)
                    except asyncio.TimeoutError:
                        raise RequestError(f"the upload stalled for {timeout:g} s", status=408) from None
                    if not block:
                        break
                    size += len(block)
                    if size > self.max_bytes:
                        raise RequestError(f"the document is larger than this server's limit of {self.max_bytes} "
                                           f"bytes (--max-upload-mb)", status=413, code="too_large")
                    sha.update(block)
                    chars += len(decoder.decode(block))
                    f.write(block)
                chars += len(decoder.decode(b"", final=True))
            if size == 0:
                raise RequestError("the document is empty", param="document")
            doc_id = sha.hexdigest()
            os.replace(tmp, self.root / f"{doc_id}.txt")
            atomic_write(self.root / f"{doc_id}.json", json.dumps({"chars": chars}))
            return {"id": doc_id, "bytes": size, "chars": chars}
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    async def save_text(self, text: str) -> dict:
        data = text.encode("utf-8")
        step = 1 << 20
        blocks = [data[i:i + step] for i in range(0, len(data), step)] + [b""]
        blocks.reverse()

        async def read():
            return blocks.pop()

        return await self.save_stream(read, 60.0)


class JobTrace(Trace):
    """The driver's trace file, plus one `chunk` event per finished chunk built from the trace records."""

    def __init__(self, path: Path, job: "Job"):
        super().__init__(path)
        self.job, self.pending = job, {}

    def write(self, **rec):
        super().write(**rec)
        if rec.get("step") in ("update", "skip"):
            self.pending[rec["question"]] = rec


@dataclass
class Job:
    id: str
    document: str
    questions: list[str]
    settings: ReadSettings
    chars: int | None = None
    status: str = "running"
    created: float = field(default_factory=time.time)
    finished: float | None = None
    answers: list[dict] | None = None
    error: str | None = None
    events: list[dict] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)
    chunks_done: int = 0
    listeners: set = field(default_factory=set)
    task: asyncio.Task | None = None
    dir: Path | None = None
    t0: float = 0.0

    def summary(self) -> dict:
        return {"id": self.id, "status": self.status, "document": self.document, "questions": self.questions,
                "settings": self.settings.__dict__, "chars": self.chars, "created": self.created,
                "finished": self.finished, "chunks_done": self.chunks_done, "answers": self.answers,
                "error": self.error, "events": len(self.events)}

    def save(self) -> None:
        atomic_write(self.dir / "job.json", json.dumps(self.summary(), ensure_ascii=False))

    def publish(self, event: dict, log) -> None:
        event = {"seq": len(self.events), "time": round(time.time(), 4), **event}
        self.events.append(event)
        log.write(json.dumps(event, ensure_ascii=False) + "\n")
        log.flush()
        for queue in list(self.listeners):
            queue.put_nowait(event)


class JobManager:
    """Starts, tracks, cancels and resumes reading jobs over one backend and tokenizer."""

    def __init__(self, root: Path, backend, tokenizer, defaults: ReadSettings, max_jobs: int = 2,
                 max_upload_bytes: int = 256 << 20):
        self.root = root
        self.jobs_dir = root / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.docs = DocumentStore(root, max_upload_bytes)
        self.backend, self.defaults, self.max_jobs = backend, defaults, max_jobs
        self._tokenizer = tokenizer  # a Tokenizer, or a function that loads one when the first read needs it
        self.jobs: dict[str, Job] = {}
        self.chats = 0  # memory-model chat reads in progress (memchat.py): they count against max_jobs too

    @property
    def tokenizer(self):
        if callable(self._tokenizer) and not hasattr(self._tokenizer, "encode"):
            self._tokenizer = self._tokenizer()
        return self._tokenizer

    # ---- lifecycle --------------------------------------------------------------------------------
    def load(self) -> int:
        """Read every saved job; resume those that were running when the server stopped. Returns how many."""
        resumed = 0
        for d in sorted(self.jobs_dir.iterdir()):
            try:
                raw = json.loads((d / "job.json").read_text(encoding="utf-8"))
                job = Job(id=raw["id"], document=raw["document"], questions=raw["questions"],
                          settings=ReadSettings(**raw["settings"]), chars=raw.get("chars"), status=raw["status"],
                          created=raw["created"], finished=raw.get("finished"), answers=raw.get("answers"),
                          error=raw.get("error"), chunks_done=raw.get("chunks_done", 0), dir=d)
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not a job folder, or one torn before its first save: nothing to resume
            job.events = _read_events(d / "events.jsonl")
            for e in job.events:
                if e["type"] == "chunk":
                    job.memory = [q.get("memory", "") for q in e["questions"]]
                    job.chunks_done = e["chunk"] + 1
            self.jobs[job.id] = job
            if job.status == "running":
                self._recover_last_chunk(job)
                self._start(job, resumed=True)
                resumed += 1
        return resumed

    @staticmethod
    def _recover_last_chunk(job: Job) -> None:
        """A kill between the driver saving its state after chunk k and the job publishing chunk k's event
        leaves the state one chunk ahead of the events; the resumed read starts after k, so k's event is
        written here from the state (its memories are exact; its sizes are not known any more)."""
        try:
            body = json.loads((job.dir / "state.json").read_text(encoding="utf-8"))["body"]
            done, states = body["chunks_done"], [s["state"]["memory"] for s in body["states"]]
        except (OSError, ValueError, KeyError, TypeError):
            return  # no state yet (or a damaged one: the read itself will say so)
        if body.get("answers") is None and done == job.chunks_done + 1 and len(states) == len(job.questions):
            steps = [{"step": "update", "memory": m, "changed": m != old} for m, old in zip(states, job.memory)]
            job.memory, job.chunks_done = list(states), done
            with open(job.dir / "events.jsonl", "a", encoding="utf-8") as log:
                job.publish({"type": "chunk", "chunk": done - 1, "tokens": None, "start_char": None, "end_char": None,
                             "fraction": None, "chunks_estimate": None, "seconds": 0.0, "questions": steps,
                             "recovered": True}, log)

    async def close(self) -> None:
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for t in tasks:
            t.cancel()  # status stays "running" on disk: the next start resumes them
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in self.jobs.values():  # end open event streams, so that shutdown does not wait on them
            for queue in list(job.listeners):
                queue.put_nowait(None)

    def active(self) -> int:
        return sum(1 for j in self.jobs.values() if j.status in ACTIVE)

    def get(self, job_id: str) -> Job:
        if not isinstance(job_id, str) or not JOB_ID.match(job_id) or job_id not in self.jobs:
            raise RequestError(f"no job {job_id!r}", status=404, code="not_found")
        return self.jobs[job_id]

    def create(self, body) -> Job:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        questions = parse_questions(body.get("questions"))
        settings = ReadSettings.parse(body, self.defaults)
        self.docs.path(body.get("document"))  # a valid id of an uploaded document, or a 400/404
        if self.active() + self.chats >= self.max_jobs:
            raise RequestError(f"this server already runs {self.max_jobs} reading job(s) (--max-jobs); "
                               f"retry when one has finished", status=429, type="rate_limit_error")
        job = Job(id=uuid.uuid4().hex, document=body["document"], questions=questions, settings=settings,
                  chars=self.docs.meta(body["document"])["chars"])
        job.dir = self.jobs_dir / job.id
        job.dir.mkdir()
        job.save()
        self.jobs[job.id] = job
        self._start(job, resumed=False)
        return job

    def cancel(self, job: Job) -> None:
        if job.status in ACTIVE and job.task is not None:
            job.task.cancel()
            job.status = "cancelled"

    def _start(self, job: Job, resumed: bool) -> None:
        job.status = "running"
        job.task = asyncio.get_running_loop().create_task(self._run(job, resumed))

    # ---- one read ---------------------------------------------------------------------------------
    async def _run(self, job: Job, resumed: bool) -> None:
        s = job.settings
        log = open(job.dir / "events.jsonl", "a", encoding="utf-8")
        trace = None
        try:
            trace = JobTrace(job.dir / "trace.jsonl", job)
            tokenizer = await asyncio.to_thread(lambda: self.tokenizer)  # the first read loads it: not on the loop
            agent = MemoryAgent(self.backend, tokenizer, template=s.template, chunk_tokens=s.chunk_tokens,
                                memory_tokens=s.memory_tokens, answer_tokens=s.answer_tokens,
                                skip_update=s.skip_update, early_exit=s.early_exit, chunk_snap=s.chunk_snap)
            if not job.memory:
                job.memory = [agent.template.empty_memory] * len(job.questions)
            job.t0 = time.perf_counter()
            job.publish({"type": "start", "resumed": resumed, "chunks_done": job.chunks_done, "chars": job.chars,
                         "questions": job.questions, "settings": s.__dict__}, log)

            def progress(chunk, _bytes_read):
                job.publish(self._chunk_event(job, chunk, trace.pending), log)
                trace.pending = {}

            answers = await agent.aread(self.docs.root / f"{job.document}.txt", job.questions, trace=trace,
                                        state=job.dir / "state.json", progress=progress)
            job.answers = [a.to_json() for a in answers]
            job.status, job.finished = "done", time.time()
            job.publish({"type": "done", "answers": job.answers,
                         "seconds": round(time.perf_counter() - job.t0, 3)}, log)
        except asyncio.CancelledError:
            if job.status == "cancelled":  # by the user; a server shutdown leaves it "running" to resume
                job.finished = time.time()
                job.publish({"type": "cancelled"}, log)
                job.save()
            raise
        except Exception as e:  # a bad state file, a backend that refuses: the job fails, the server serves on
            job.status, job.finished, job.error = "failed", time.time(), f"{type(e).__name__}: {e}"
            job.publish({"type": "failed", "error": job.error}, log)
        finally:
            if trace is not None:
                trace.close()
            log.close()
            if job.status != "running":
                job.save()
                for queue in list(job.listeners):
                    queue.put_nowait(None)  # end of stream

    def _chunk_event(self, job: Job, chunk, pending: dict) -> dict:
        steps = []
        for qi in range(len(job.questions)):
            rec = pending.get(qi)
            if rec is None:
                steps.append({"step": "idle", "memory": job.memory[qi], "changed": False})
            elif rec.get("error"):
                steps.append({"step": "error", "error": rec["error"], "memory": job.memory[qi], "changed": False})
            elif rec["step"] == "skip":
                steps.append({"step": "skip", "memory": job.memory[qi], "changed": False})
            else:
                changed = rec["memory"] != job.memory[qi]
                job.memory[qi] = rec["memory"]
                steps.append({"step": "update", "memory": rec["memory"], "changed": changed,
                              "seconds": rec.get("seconds"), "exit": bool(rec.get("exit"))})
        job.chunks_done = chunk.index + 1
        end = chunk.start_char + len(chunk.text)
        fraction = min(1.0, end / job.chars) if job.chars else None
        return {"type": "chunk", "chunk": chunk.index, "tokens": chunk.n_tokens, "start_char": chunk.start_char,
                "end_char": end, "fraction": fraction,
                "chunks_estimate": max(chunk.index + 1, round((chunk.index + 1) / fraction)) if fraction else None,
                "seconds": round(time.perf_counter() - job.t0, 3), "questions": steps}

    def document_slice(self, doc_id: str, start: int, end: int) -> str:
        """Characters [start, end) of a stored document (the page shows the chunk that changed a memory)."""
        if end - start > 1 << 20 or start < 0 or end < start:
            raise RequestError("ask for at most 1 MiB characters, 0 <= start <= end", param="start")
        out, pos = [], 0
        with open(self.docs.path(doc_id), encoding="utf-8", errors="replace", newline="") as f:
            while pos < end:
                block = f.read(1 << 20)
                if not block:
                    break
                lo, hi = max(start - pos, 0), min(end - pos, len(block))
                if lo < hi:
                    out.append(block[lo:hi])
                pos += len(block)
        return "".join(out)


def _read_events(path: Path) -> list[dict]:
    """The events written so far; a line torn by a kill is dropped (and cut off the file)."""
    if not path.exists():
        return []
    events, good = [], 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                events.append(json.loads(line))
            except ValueError:
                break
            good += len(line)
    if good != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good)
    for i, e in enumerate(events):
        e["seq"] = i
    return events


def temporary_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="memagent-serve-"))
    import atexit

    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root
