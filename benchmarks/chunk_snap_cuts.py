"""How often a chunk boundary cuts a RULER needle in two, with and without `--chunk-snap`, and what a cut costs.

Why: token-exact chunks end anywhere, also inside "One of the special magic uuids for brief-restroom is:
75726996-4c8" | "4-4afe-...". The update that sees the first half writes half a value (or none), and the
next chunk's half is not joined to it. This script counts, on the grid's own documents (eval seed 42, the
0.5B's tokenizer, 512-token chunks), the needle sentences that no single chunk holds whole, for each snap
window; then, from committed `memagent eval` folders, how often a document was answered right when
token-exact chunks cut its needle sentence and when they did not: in the token-exact reads, and in the
same rows read with snapped chunks (ROW+snapN folders), where the cut documents are whole. Model-free:
tokenizing only.

    python benchmarks/chunk_snap_cuts.py                      # 5 needle tasks x 4K/16K/64K, n = 32
    python benchmarks/chunk_snap_cuts.py --lengths 4k --n 4   # a quick look

Writes benchmarks/results/chunk_snap.json (command, date, machine).
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, write_result  # noqa: E402
from notes_grid import sign_test  # noqa: E402

from memagent import models  # noqa: E402
from memagent.chunking import iter_chunks  # noqa: E402
from memagent.eval import read_records  # noqa: E402
from memagent.tasks import iter_samples  # noqa: E402
from memagent.tokenizer import load_tokenizer  # noqa: E402

NEEDLES = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2")
RUNS = ROOT / "benchmarks" / "results" / "eval_runs" / "notes"
# RULER's needle sentence, from its opening words to the end of the asked value
OPENING = re.compile(r"One of the special magic (?:number|word|uuid)s? for ", re.I)


def needle_sentence(document: str, gold: str) -> str:
    """The sentence that states the asked key's value: from the last needle opening before it to its end."""
    at = document.index(gold)
    starts = [m.start() for m in OPENING.finditer(document, 0, at)]
    return document[(starts[-1] if starts else at):at + len(gold)]


def cut_ids(task: str, length: int, n: int, tok, chunk: int, snap: int, seed: int = 42) -> tuple[set[str], set[str], int]:
    """(ids of samples whose needle sentence no chunk holds whole, every sample id, chunks over all samples)."""
    cut, ids, chunks = set(), set(), 0
    for s in iter_samples([task], [length], n, tok, seed):
        ids.add(s.id)
        sentence = needle_sentence(s.document, s.gold[0])
        texts = [c.text for c in iter_chunks(io.StringIO(s.document), tok, chunk, snap)]
        chunks += len(texts)
        if not any(sentence in t for t in texts):
            cut.add(s.id)
    return cut, ids, chunks


def outcome_by_cut(folder: Path, cut: set[str], ids: set[str]) -> dict | None:
    """Right reads among cut and whole needles of the samples `ids` in one committed eval folder (None when
    it is absent)."""
    samples = folder / "samples.jsonl"
    if not samples.is_file():
        return None
    recs = [r for r in read_records(samples).values() if r.get("correct") is not None and r["id"] in ids]
    cut_recs = [r for r in recs if r["id"] in cut]
    whole = [r for r in recs if r["id"] not in cut]
    return {"n": len(recs), "cut": len(cut_recs), "cut_right": sum(r["correct"] == 1 for r in cut_recs),
            "whole": len(whole), "whole_right": sum(r["correct"] == 1 for r in whole)}


def paired(exact: Path, snapped: Path, ids: set[str]) -> dict | None:
    """Documents right only with snapped chunks, right only token-exact, and the exact sign test on those
    (both folders read the same seed's documents); None unless both hold every one of `ids`."""
    def right(folder):
        samples = folder / "samples.jsonl"
        recs = read_records(samples) if samples.is_file() else {}
        got = {r["id"]: r.get("correct") == 1 for r in recs.values() if r["id"] in ids}
        return got if len(got) == len(ids) else None

    a, b = right(exact), right(snapped)
    if a is None or b is None:
        return None
    only_snap = sum(b[i] and not a[i] for i in ids)
    only_exact = sum(a[i] and not b[i] for i in ids)
    return {"n": len(ids), "right_exact": sum(a.values()), "right_snapped": sum(b.values()),
            "only_snapped": only_snap, "only_exact": only_exact, "p": round(sign_test(only_snap, only_snap + only_exact), 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4k,16k,64k")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--snaps", default="0,32,64", help="snap windows to count, in tokens (0: token-exact)")
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="whose tokenizer cuts the chunks")
    ap.add_argument("--rows", default="qwen2.5-coder-0.5b+notes-qwen0.5b-dapo16+llama.cpp,qwen2.5-coder-0.5b+llama.cpp",
                    help="bench_notes_model rows whose token-exact reads are split by cut / whole needle")
    args = ap.parse_args(argv)
    tok = load_tokenizer(str(models.tokenizer_path(args.model)))
    lengths = [int(x[:-1]) * 1024 if x.lower().endswith("k") else int(x) for x in args.lengths.split(",")]
    snaps = [int(x) for x in args.snaps.split(",")]
    cells, totals = [], {}
    for task in NEEDLES:
        for length in lengths:
            cell = {"task": task, "length": length, "n": args.n, "snaps": {}}
            for snap in snaps:
                cut, ids, chunks = cut_ids(task, length, args.n, tok, args.chunk_tokens, snap)
                cell["snaps"][str(snap)] = {"cut": len(cut), "chunks": chunks}
                if snap == 0:
                    cell["reads"] = {}
                    # the same rows read with snapped chunks (bench_notes_model.py --chunk-snap N: ROW+snapN),
                    # split by whether token-exact chunks cut their needle: were the cut ones answered now?
                    suffixes = [""] + [f"+snap{x}" for x in snaps if x]
                    rows = [r + suffix for r in args.rows.split(",") for suffix in suffixes]
                    for row in rows:
                        for gate in ("off", "lexical"):
                            got = outcome_by_cut(RUNS / row / gate / f"{task}-{length // 1024}k", cut, ids)
                            if got:
                                cell["reads"][f"{row}/{gate}"] = got
                                t = totals.setdefault(f"{row}/{gate}", {"cut": 0, "cut_right": 0, "whole": 0,
                                                                        "whole_right": 0})
                                for k in t:
                                    t[k] += got[k]
            print(f"{task}@{length // 1024}K: " + ", ".join(
                f"snap {s}: {v['cut']}/{args.n} cut, {v['chunks']} chunks" for s, v in cell["snaps"].items()))
            cell["paired"] = {}
            for row in args.rows.split(","):
                for gate in ("off", "lexical"):
                    for x in (x for x in snaps if x):
                        name = f"{task}-{length // 1024}k"
                        got = paired(RUNS / row / gate / name, RUNS / f"{row}+snap{x}" / gate / name, ids)
                        if got:
                            cell["paired"][f"{row}+snap{x}/{gate}"] = got
                            print(f"  {row}+snap{x}/{gate}: {got}")
            cells.append(cell)
    for row, t in totals.items():
        print(f"{row}: cut needles {t['cut_right']}/{t['cut']} right, whole {t['whole_right']}/{t['whole']}")
    pooled = {}  # every cell's paired documents together: is the snapped row better overall?
    for cell in cells:
        for row, got in cell["paired"].items():
            t = pooled.setdefault(row, {"n": 0, "right_exact": 0, "right_snapped": 0, "only_snapped": 0, "only_exact": 0})
            for k in t:
                t[k] += got[k]
    for row, t in pooled.items():
        t["p"] = round(sign_test(t["only_snapped"], t["only_snapped"] + t["only_exact"]), 4)
        print(f"{row} against token-exact, all cells: {t}")
    print(write_result("chunk_snap", {"what": "needle sentences no single chunk holds whole (cut), per snap "
                                              "window; and right reads of committed eval folders (token-exact, "
                                              "and ROW+snapN) split by whether token-exact chunks cut the needle",
                                      "chunk_tokens": args.chunk_tokens, "tokenizer": args.model,
                                      "cells": cells, "reads_by_cut": totals, "paired_all_cells": pooled}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
