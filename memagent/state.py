"""Resumable reading state, written atomically after every chunk.

Why atomic + checksummed: a run over a 3.5M-token book takes hours; a kill at any instant must leave
either the previous state or the new one on disk, never half a file, and a file damaged some other way
(truncated copy, disk full) must be refused with a clear message instead of resuming from garbage.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .fileio import atomic_write  # noqa: F401  (re-exported: older imports)

VERSION = 1


class StateError(ValueError):
    pass


class StateFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.last_digest: str | None = None
        self.read_digest: str | None = None  # digest of every chunk read so far (driver.rolling_digest)

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
        self.read_digest = body.get("read_digest")
        if body.get("answers") and self.read_digest is None:
            raise StateError(f"state file {self.path} holds answers without a digest of the text they were read "
                             f"from (an older memagent); delete it to read the document again")
        return body

    def save(self, doc_name: str, questions: list[str], settings: dict, chunks_done: int, doc_tokens: int,
             last_digest: str | None, states: list[dict], answers: list[dict] | None = None,
             read_digest: str | None = None, complete: bool | None = None) -> None:
        """`read_digest` binds the state to the text of the chunks read so far (unfinished and finished
        alike); `complete`: the answers were given after reading to the document's end."""
        body = {"version": VERSION, "doc": doc_name, "questions": list(questions), "settings": settings,
                "chunks_done": chunks_done, "doc_tokens": doc_tokens, "last_digest": last_digest,
                "read_digest": read_digest, "complete": complete, "states": states, "answers": answers}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        atomic_write(self.path, json.dumps({"sha256": digest, "body": body}, ensure_ascii=False), "state file")
