"""What was in the chunk where a RULER needle read dropped the gold: another key's needle, or nothing.

Why: `memagent eval` records, per sample, the chunks whose update dropped the gold from the notes
(`notes_lost_at`, memagent/where_lost.py), but not what those chunks held. For the needle tasks the two
answers call for different training: a drop at a chunk that brings another key's needle is an overwrite
by a look-alike (learn to bind a value to its own key); a drop at a chunk with no needle at all is drift
(learn to leave the notes alone when a chunk has nothing to add). This script rebuilds each sample's
document from the run's own config (same seed, tokenizer and chunk size), finds the needle sentences in
every chunk, and sorts each drop into one of the two.

    python benchmarks/where_lost_niah.py benchmarks/results/where_lost/r16-niah_multikey_1-16k ...

Prints one line per folder and writes benchmarks/results/where_lost_niah.json (command, date, machine).
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from memagent import models  # noqa: E402
from memagent.chunking import iter_chunks  # noqa: E402
from memagent.eval import read_records  # noqa: E402
from memagent.tasks import iter_samples  # noqa: E402
from memagent.tokenizer import load_tokenizer  # noqa: E402

# RULER's needle sentence: "One of the special magic numbers for KEY is: VALUE." (numbers, words, uuids)
NEEDLE = re.compile(r"special magic (?:number|word|uuid)s? for\s+(\S+?)\s+(?:is|are):?\s", re.I)


def needle_keys(text: str) -> list[str]:
    return [m.group(1) for m in NEEDLE.finditer(text)]


def classify_drops(record: dict, chunk_keys: list[list[str]], asked_key: str) -> dict:
    """Counts of this record's drops by what the dropping chunk held: the asked key's own needle, another
    key's (a look-alike), or no needle."""
    out = {"look_alike": 0, "no_needle": 0, "own_needle": 0}
    for c in record.get("notes_lost_at", []):
        keys = chunk_keys[c] if c < len(chunk_keys) else []
        out["own_needle" if asked_key in keys else "look_alike" if keys else "no_needle"] += 1
    return out


def asked_key(question: str) -> str | None:
    m = re.search(r"for\s+(\S+?)\s+mentioned in the provided text", question)
    return m.group(1) if m else None


def run_tokenizer(cfg: dict) -> str:
    """The run's tokenizer.json, or its model's when that cache file is gone.

    A run records the absolute cache path it counted tokens with; on another machine (or after the
    cache was cleared) that file is missing, and the model's tokenizer rebuilds the same chunks.
    """
    if Path(cfg["tokenizer"]).is_file():
        return cfg["tokenizer"]
    if not cfg.get("model"):
        raise SystemExit(f"the run's tokenizer {cfg['tokenizer']} is gone and its config names no model")
    try:
        path = str(models.tokenizer_path(cfg["model"]))
    except models.ModelError as e:
        raise SystemExit(f"the run's tokenizer {cfg['tokenizer']} is gone and {cfg['model']}'s failed: {e}")
    print(f"where_lost_niah: {cfg['tokenizer']} is gone; using {cfg['model']}'s {path}", file=sys.stderr)
    return path


def folder_report(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())["config"]
    records = read_records(folder / "samples.jsonl")
    if not records or any("read_outcome" not in r for r in records.values()):
        raise SystemExit(f"{folder}: no read_outcome in its samples (run it with this memagent's eval)")
    tok = load_tokenizer(run_tokenizer(cfg))
    samples = {s.id: s for s in iter_samples(cfg["tasks"], cfg["lengths"], cfg["n"], tok, cfg["seed"],
                                             skip=lambda i: i not in records)}
    outcomes, drops, per_sample = {}, {"look_alike": 0, "no_needle": 0, "own_needle": 0}, []
    for sid, rec in sorted(records.items()):
        s = samples[sid]
        chunk_keys = [needle_keys(ch.text) for ch in iter_chunks(io.StringIO(s.document), tok, cfg["chunk_tokens"],
                                                                    cfg.get("chunk_snap", 0))]
        key = asked_key(s.question)
        got = classify_drops(rec, chunk_keys, key)
        for k, v in got.items():
            drops[k] += v
        outcomes[rec["read_outcome"]] = outcomes.get(rec["read_outcome"], 0) + 1
        per_sample.append({"id": sid, "read_outcome": rec["read_outcome"], "chunks": len(chunk_keys),
                           "gold_chunks": [i for i, ks in enumerate(chunk_keys) if key in ks],
                           "look_alike_chunks": [i for i, ks in enumerate(chunk_keys) if ks and key not in ks],
                           "notes_first_held": rec["notes_first_held"], "notes_lost_at": rec["notes_lost_at"],
                           "drops": got, "final_notes": (rec.get("memory") or "")[:200]})
    return {"folder": str(folder), "task": cfg["tasks"], "lengths": cfg["lengths"], "adapter": cfg.get("adapter"),
            "n": len(records), "outcomes": outcomes, "drops": drops, "samples": per_sample}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="memagent eval --out folders of RULER needle tasks")
    args = ap.parse_args(argv)
    reports = [folder_report(f) for f in args.folders]
    for r in reports:
        print(f"{r['folder']}: n={r['n']} outcomes {r['outcomes']}; drops at a look-alike's chunk "
              f"{r['drops']['look_alike']}, at a chunk with no needle {r['drops']['no_needle']}, "
              f"at the asked key's own chunk {r['drops']['own_needle']}")
    print(write_result("where_lost_niah", {"reports": reports}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
