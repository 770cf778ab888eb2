"""Where stored reads lose the answer: in the notes after each chunk, or only in the final answer.

Why: only the final answer is scored, so a wrong read says nothing about which update went wrong. The
notes after every chunk are stored with each read (`memories` in a rollouts.jsonl(.gz) that `memagent
train` / `memagent rft` write), so counting, per read, the first chunk whose notes hold a gold answer and
whether a later update dropped it separates the two failures a round can aim at: never finding the fact,
and rewriting it away (or answering past notes that hold it).

    python benchmarks/reads_where_lost.py benchmarks/results/dapo19_notes_0.5b/rollouts.jsonl.gz

Prints one line per file and writes benchmarks/results/reads_where_lost.json (command, date, machine).
A gold counts as held by the reward's own test (sub_em, `memagent.tasks.scoring.holds_answers`) applied to
the notes: it occurs in them after SQuAD normalisation, so "1,288" and "1288" match; for a read with
several answers any one counts (`match` "any") or all must (`match` "all").
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from memagent.tasks.scoring import holds_answers  # noqa: E402  (the reward's sub_em test, on the notes as written)


def tally(reads) -> dict:
    """Counts over reads: held after chunk 1; of those, dropped by a later update or kept to the end;
    never held by any notes; kept to the end but answered wrong; right."""
    out = {"reads": 0, "right": 0, "held_after_chunk_1": 0, "dropped_later": 0, "kept_to_end": 0,
           "never_held": 0, "final_notes_hold_but_answer_wrong": 0}
    for r in reads:
        held = [holds_answers(m, r["answers"], r.get("match", "any")) for m in r.get("memories", [])]
        out["reads"] += 1
        out["right"] += bool(r.get("correct"))
        if held and held[0]:
            out["held_after_chunk_1"] += 1
            out["kept_to_end" if all(held) else "dropped_later"] += 1
        if not any(held):
            out["never_held"] += 1
        if held and held[-1] and not r.get("correct"):
            out["final_notes_hold_but_answer_wrong"] += 1
    return out


def load(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"reads_where_lost: {path}:{n}: not a JSON line ({e.msg})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="rollouts.jsonl or rollouts.jsonl.gz")
    ap.add_argument("--smoke", action="store_true", help="write reads_where_lost.smoke.json (for the tests)")
    args = ap.parse_args(argv)
    results = {}
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            raise SystemExit(f"reads_where_lost: {path} not found")
        t = results[str(path)] = tally(load(path))
        print(f"{path}: {t['right']}/{t['reads']} right; held after chunk 1: {t['held_after_chunk_1']} "
              f"(dropped later {t['dropped_later']}, kept {t['kept_to_end']}); never held {t['never_held']}; "
              f"final notes hold it but the answer is wrong: {t['final_notes_hold_but_answer_wrong']}")
    write_result("reads_where_lost", {"files": results}, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
