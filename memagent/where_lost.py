"""Where a read lost the answer: in the notes, or only in the final answer.

Why: an eval scores only the final answer, so a wrong sample does not say which half of the memory agent
failed. A read can fail in three different ways, and each asks for a different fix:
- **never in notes**: no update ever wrote the gold into the notes (the reader did not recognise the
  evidence, or never reached it);
- **lost in notes**: some update wrote it and a later one dropped it (an overwrite by a look-alike, or a
  rewrite on a chunk that had nothing to add);
- **answer missed**: the last notes still hold it and the answering call did not use it.

So `memagent eval` follows the notes after every update of each sample (a `Trace` kept in memory, never
written) and records `read_outcome`, the chunk where the notes first held the gold (`notes_first_held`)
and every chunk whose update dropped it (`notes_lost_at`); the summary counts the outcomes per task and
length. The test for "holds" is the task's own metric applied to the notes as written (all gold strings
for RULER's string_match_all, any for string_match_part and sub_em), so a sample is never counted as
"held" on a weaker test than the one that scores its answer.
"""
from __future__ import annotations

from .driver import Trace
from .tasks.scoring import notes_hold

OUTCOMES = ("right", "answer_missed", "lost_in_notes", "never_in_notes", "failed")


class NotesTrail(Trace):
    """A trace that writes nothing and keeps (chunk, notes) of every completed update, in order."""

    def __init__(self):
        super().__init__(None)
        self.notes: list[tuple[int, str]] = []

    def write(self, **rec):
        if rec.get("step") == "update" and "memory" in rec:  # a failed call carries no notes
            self.notes.append((rec["chunk"], rec["memory"] or ""))


def attribute(notes: list[tuple[int, str]], metric: str, golds: list[str], correct: float,
              error: str | None) -> dict:
    """The record fields for one sample: read_outcome, notes_first_held, notes_lost_at."""
    first, lost, was = None, [], False
    for chunk, text in notes:
        now = notes_hold(metric, text, golds)
        if now and first is None:
            first = chunk
        if was and not now:
            lost.append(chunk)
        was = now
    if error:
        outcome = "failed"
    elif correct >= 1.0:  # a partial string_match_all is a wrong answer, as the accuracy counts it
        outcome = "right"
    elif was:
        outcome = "answer_missed"
    elif first is not None:
        outcome = "lost_in_notes"
    else:
        outcome = "never_in_notes"
    return {"read_outcome": outcome, "notes_first_held": first, "notes_lost_at": lost}


def count_outcomes(records: list[dict]) -> dict | None:
    """Outcome counts over records (None when none has one: a direct run, or a folder written before)."""
    if not any("read_outcome" in r for r in records):
        return None
    counts = {k: 0 for k in OUTCOMES}
    for r in records:
        key = r.get("read_outcome", "not_recorded")  # a resumed folder's older samples
        counts[key] = counts.get(key, 0) + 1
    return counts


def describe_outcomes(counts: dict | None) -> str:
    """'lost in notes 5, never in notes 1, answer missed 0' for the wrong samples; '' when not recorded."""
    if not counts:
        return ""
    parts = [f"{k.replace('_', ' ')} {counts[k]}" for k in ("lost_in_notes", "never_in_notes", "answer_missed")]
    extra = [f"not recorded {counts['not_recorded']}"] if counts.get("not_recorded") else []
    return "wrong: " + ", ".join(parts + extra)
