"""Which kept training reads end with notes that copy a chunk's opening, by the kind of document read.

Why: the default's notes copy a chunk's first sentence when it begins "The" and the notes are still empty
(docs/notes-model.md, sessions 17-18). A DAPO round can only unlearn that if its own reads show the copy
beside right reads of the same document. This redraws each read's document from the round's collect
config (the same generator and seed, so the same chunks) and counts, per kind of document (read from the
middle of a text or not, and how many chunks), the reads, the right ones, the groups with both right and
wrong reads, and the wrong reads whose notes hold a chunk's opening words (chunk_snap_cuts.opening_words).

    python benchmarks/reads_copying_openings.py configs/notes-qwen0.5b-dapo29-collect.toml \
        benchmarks/results/dapo29_notes_0.5b/rollouts.jsonl.gz

Writes benchmarks/results/reads_copying_openings.json (command, date, machine).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chunk_snap_cuts import opening_words  # noqa: E402
from common import write_result  # noqa: E402

from memagent.rl.rft import load_rollouts  # noqa: E402


def kind(sample) -> str:
    where = "middle" if sample.meta.get("read_from_middle") else ("titled" if "title" in sample.meta else "plain")
    return f"{where}, {len(sample.chunks)} chunk{'s' if len(sample.chunks) > 1 else ''}"


def count(reads: list[dict], task) -> dict:
    """Per kind of document: reads, right, mixed groups, wrong reads whose last notes quote a chunk's opening."""
    groups = defaultdict(list)
    for r in reads:
        groups[r["sample_id"]].append(r)
    out = {}
    for sid, rs in groups.items():
        s = task.sample(int(sid.rsplit("-", 1)[1]))
        if s.question != rs[0]["question"]:
            raise SystemExit(f"{sid}: the config draws another question than the reads were asked; wrong config?")
        openings = [o for o in map(opening_words, s.chunks) if o]
        t = out.setdefault(kind(s), {"documents": 0, "reads": 0, "right": 0, "mixed_groups": 0,
                                     "wrong_notes_quote_an_opening": 0})
        right = sum(bool(r["correct"]) for r in rs)
        t["documents"] += 1
        t["reads"] += len(rs)
        t["right"] += right
        t["mixed_groups"] += 0 < right < len(rs)
        t["wrong_notes_quote_an_opening"] += sum(not r["correct"] and bool(r["memories"]) and
                                                 any(o in r["memories"][-1] for o in openings) for r in rs)
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="the round's collect config (configs/notes-qwen0.5b-dapoNN-collect.toml)")
    ap.add_argument("reads", help="its kept reads (rollouts.jsonl or .jsonl.gz)")
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/reads_copying_openings.json)")
    args = ap.parse_args(argv)
    from memagent import models
    from memagent.rl.config import ConfigError, load_config
    from memagent.rl.data import make_task
    from memagent.tokenizer import HFTokenizer

    try:
        config = load_config(args.config)
        reads = load_rollouts(Path(args.reads))
    except (OSError, ValueError, ConfigError) as e:
        ap.error(str(e))
    task = make_task(config, HFTokenizer.from_file(models.tokenizer_path(config.model)))
    got = count(reads, task)
    for k, t in got.items():
        print(f"{k}: {t['documents']} documents, {t['right']}/{t['reads']} right, {t['mixed_groups']} groups mixed, "
              f"{t['wrong_notes_quote_an_opening']} of {t['reads'] - t['right']} wrong reads quote an opening")
    path = write_result("reads_copying_openings", path=Path(args.out) if args.out else None, numbers={
        "config": args.config, "reads": args.reads, "by_kind": got})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
