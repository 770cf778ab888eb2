"""Resumable reading state, written atomically after every chunk.

Why atomic + checksummed: a run over a 3.5M-token book takes hours; a kill at any instant must leave
either the previous state or the new one on disk, never half a file, and a file damaged some other way
(truncated copy, disk full) must be refused with a clear message instead of resuming from garbage.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VERSION = 1


class StateError(ValueError):
    pass


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class StateFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.last_digest: str | None = None

    def load(self, doc_name: str, questions: list[str], settings: dict) -> dict | None:
        """The saved state for this exact (document, questions, settings), None for a fresh start."""
        if not self.path.exists():
            return None
        raw = self.path.read_text(encoding="utf-8")
        try:
            outer = json.loads(raw)
            body = outer["body"]
            ok = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() == outer["sha256"]
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise StateError(f"state file {self.path} is damaged (truncated or edited); delete it to start over")
        if body.get("version") != VERSION:
            raise StateError(f"state file {self.path} has version {body.get('version')}, expected {VERSION}")
        if body["questions"] != list(questions):
            raise StateError(f"state file {self.path} was written for other questions; use another --state file")
        # both ways: a setting present on one side only (e.g. the optional "gates") is a difference too
        keys = list(settings) + [k for k in body["settings"] if k not in settings]
        diff = [k for k in keys if body["settings"].get(k) != settings.get(k)]
        if diff:
            raise StateError(f"state file {self.path} was written with other settings ({', '.join(diff)})")
        if body["doc"] != doc_name:
            raise StateError(f"state file {self.path} belongs to document {body['doc']!r}, not {doc_name!r}")
        self.last_digest = body.get("last_digest")
        return body

    def save(self, doc_name: str, questions: list[str], settings: dict, chunks_done: int, doc_tokens: int,
             last_digest: str | None, states: list[dict], answers: list[dict] | None = None) -> None:
        body = {"version": VERSION, "doc": doc_name, "questions": list(questions), "settings": settings,
                "chunks_done": chunks_done, "doc_tokens": doc_tokens, "last_digest": last_digest,
                "states": states, "answers": answers}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        atomic_write(self.path, json.dumps({"sha256": digest, "body": body}, ensure_ascii=False))
