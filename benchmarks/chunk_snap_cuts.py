"""How often a chunk boundary cuts a RULER needle in two, with and without `--chunk-snap`, and what a cut costs.

Why: token-exact chunks end anywhere, also inside "One of the special magic uuids for brief-restroom is:
75726996-4c8" | "4-4afe-...". The update that sees the first half writes half a value (or none), and the
next chunk's half is not joined to it. This script counts, on the grid's own documents (eval seed 42, the
0.5B's tokenizer, 512-token chunks), the needle sentences that no single chunk holds whole, for each snap
window; then, from committed `memagent eval` folders, how often a document was answered right when
token-exact chunks cut its needle sentence and when they did not: in the token-exact reads, and in the
same rows read with snapped chunks (ROW+snapN folders), where the cut documents are whole. Model-free:
tokenizing only.

Two more counts say what else moves with the boundaries. How many chunks end at a line or sentence
end: every chunk of the training documents does (`--train-configs`: the notes task packs whole
sentences and facts), token-exact reads of the grid's documents seldom do. And how many wrong reads end
with notes that quote the opening words of one of the document's chunks, and which openings those
are: the notes of this model open with "The" ("The special magic number for ... is ..."), and the
openings they copy are the ones that begin "The " too (the README demo's title line, "The Keeper's Log
of ..."), far more often than such openings occur; snapped chunks, which start at sentence starts,
begin so more often than token-exact ones. Training chunks are counted the same way.

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
from memagent.rl.config import load_config  # noqa: E402
from memagent.rl.data import make_task  # noqa: E402
from memagent.tasks import format_length, iter_samples, parse_lengths  # noqa: E402
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


def cut_ids(samples: list, tok, chunk: int, snap: int, shape: dict | None = None) -> tuple[set[str], int]:
    """(ids of the samples whose needle sentence no chunk holds whole, chunks over all samples). With
    `shape`, also fills in each sample's chunk openings (opening_words) and how many chunks before the
    last end at a line or sentence end."""
    cut, chunks = set(), 0
    if shape is not None:
        shape.update(openings={}, ends_at_sentence=0, inner_ends=0, openings_begin_with_the=0, openings_counted=0)
    for s in samples:
        sentence = needle_sentence(s.document, s.gold[0])
        texts = [c.text for c in iter_chunks(io.StringIO(s.document), tok, chunk, snap)]
        chunks += len(texts)
        if not any(sentence in t for t in texts):
            cut.add(s.id)
        if shape is not None:
            shape["openings"][s.id] = [w for w in map(opening_words, texts) if w]
            shape["openings_counted"] += len(shape["openings"][s.id])
            shape["openings_begin_with_the"] += sum(w.startswith(THE) for w in shape["openings"][s.id])
            shape["ends_at_sentence"] += sum(map(ends_at_sentence, texts[:-1]))
            shape["inner_ends"] += len(texts) - 1
    return cut, chunks


OPENING_CHARS = 40  # a chunk's first 40 characters: long enough that only a copy of them matches
THE = "The "  # the word this model's notes open with ("The special magic number for ... is ...")


def opening_words(chunk: str) -> str | None:
    """What notes that copied this chunk's first sentence contain ('' -> None for a chunk too short)."""
    text = chunk.strip()
    return text[:OPENING_CHARS] if len(text) > OPENING_CHARS else None


def ends_at_sentence(chunk: str) -> bool:
    """Whether a chunk ends at a line end or a sentence end, as every chunk of the training documents does
    (rl/notes_data.py packs whole sentences and facts)."""
    return chunk.rstrip(" ")[-1:] in ("\n", ".", "!", "?", '"', "'", ")")


def read_folder(folder: Path, ids: set[str]) -> dict[str, dict]:
    """The records of `ids` a committed eval folder holds (a cell left at n = 8 holds the first 8), read
    once for every count below; {} when it has none."""
    samples = folder / "samples.jsonl"
    recs = read_records(samples) if samples.is_file() else {}
    return {r["id"]: r for r in recs.values() if r["id"] in ids and r.get("correct") is not None}


def rights(recs: dict[str, dict]) -> dict[str, bool] | None:
    """Whether each read document was answered right; None when the folder read none of them."""
    return {i: r["correct"] == 1 for i, r in recs.items()} or None


def wrong_quoting_opening(recs: dict[str, dict], openings: dict[str, list[str]]) -> dict | None:
    """Wrong reads, and how many of them end with notes that quote the opening words of one of the
    document's chunks: the notes kept a chunk's first sentence instead of the fact, the failure of the
    README demo's title line. None when the folder read none of the documents."""
    if not recs:
        return None
    wrong = [r for r in recs.values() if r["correct"] == 0]
    quoted = []  # (notes, the openings they quote) of the wrong reads that quote any
    for r in wrong:
        notes = r.get("memory") or ""
        if ws := [w for w in openings[r["id"]] if w in notes]:
            quoted.append((notes, ws))
    # Which openings get copied: if it were any first sentence, those that begin "The " would be about as
    # common among the quoted as among all openings (openings_begin_with_the / openings_counted).
    return {"wrong": len(wrong), "notes_quote_an_opening": len(quoted),
            "quoted_opening_begins_with_the": sum(any(w.startswith(THE) for w in ws) for _, ws in quoted),
            "notes_begin_with_the_quote": sum(any(notes.lstrip().startswith(w) for w in ws) for notes, ws in quoted)}


def by_cut(right: dict[str, bool], cut: set[str]) -> dict:
    """Right reads among the documents whose needle token-exact chunks cut, and among the others."""
    return {"n": len(right), "cut": sum(i in cut for i in right), "cut_right": sum(v and i in cut for i, v in right.items()),
            "whole": sum(i not in cut for i in right), "whole_right": sum(v and i not in cut for i, v in right.items())}


def paired(exact: dict[str, bool], snapped: dict[str, bool]) -> dict:
    """Documents right only with snapped chunks, right only token-exact, and the exact sign test on those,
    over the documents both folders read (the same seed's; a cell grown for one row is paired on the first
    min(n), as notes_grid.py pairs rows)."""
    both = exact.keys() & snapped.keys()
    only_snap = sum(snapped[i] and not exact[i] for i in both)
    only_exact = sum(exact[i] and not snapped[i] for i in both)
    return {"n": len(both), "right_exact": sum(exact[i] for i in both), "right_snapped": sum(snapped[i] for i in both),
            "only_snapped": only_snap, "only_exact": only_exact, "p": round(sign_test(only_snap, only_snap + only_exact), 4)}


def add(totals: dict, key: str, got: dict) -> None:
    t = totals.setdefault(key, dict.fromkeys((k for k in got if k != "p"), 0))
    for k in t:
        t[k] += got[k]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4k,16k,64k")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--snaps", default="0,32,64", help="snap windows to count, in tokens (0: token-exact)")
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="whose tokenizer cuts the chunks")
    ap.add_argument("--rows", default="qwen2.5-coder-0.5b+notes-qwen0.5b-dapo16+llama.cpp,qwen2.5-coder-0.5b+llama.cpp",
                    help="bench_notes_model rows whose reads are split by cut / whole needle (with their +snapN rows)")
    ap.add_argument("--train-configs", default="configs/notes-qwen0.5b-dapo16-collect.toml,"
                                                 "configs/notes-qwen0.5b-mix-gpu.toml,"
                                                 "configs/notes-qwen0.5b-dapo28-collect.toml",
                    help="training configs whose documents' chunk ends are counted too ('' for none)")
    ap.add_argument("--train-docs", type=int, default=60, help="documents drawn from each training config")
    args = ap.parse_args(argv)
    tok = load_tokenizer(str(models.tokenizer_path(args.model)))
    snaps = [int(x) for x in args.snaps.split(",")]
    if 0 not in snaps:
        ap.error("--snaps must include 0: the reads are split by what token-exact chunks cut")
    cells, totals, pooled, by_length, openings_totals, opening_words_by_snap = [], {}, {}, {}, {}, {}
    for task in NEEDLES:
        for length in parse_lengths(args.lengths):
            samples = list(iter_samples([task], [length], args.n, tok, 42))  # eval's seed: the grid's documents
            ids = {s.id for s in samples}
            cell = {"task": task, "length": length, "n": args.n, "snaps": {}, "reads": {}, "paired": {}}
            cuts, openings = {}, {}
            for snap in snaps:
                shape = {}
                cuts[snap], chunks = cut_ids(samples, tok, args.chunk_tokens, snap, shape)
                openings[snap] = shape.pop("openings")
                cell["snaps"][str(snap)] = {"cut": len(cuts[snap]), "chunks": chunks, **shape}
                add(opening_words_by_snap, str(snap), {k: shape[k] for k in ("openings_counted", "openings_begin_with_the")})
            print(f"{task}@{format_length(length)}: " + ", ".join(
                f"snap {s}: {v['cut']}/{args.n} cut, {v['chunks']} chunks" for s, v in cell["snaps"].items()))
            name = f"{task}-{format_length(length).lower()}"  # bench_notes_model.py's folder of the cell
            for row in args.rows.split(","):
                for gate in ("off", "lexical"):
                    folders = {row: 0} | {f"{row}+snap{x}": x for x in snaps if x}
                    recs = {key: read_folder(RUNS / key / gate / name, ids) for key in folders}
                    exact = rights(recs[row])
                    for key, x in folders.items():
                        got = wrong_quoting_opening(recs[key], openings[x])  # notes that kept a chunk's first sentence
                        if got:
                            add(openings_totals, f"{key}/{gate}", got)
                            cell.setdefault("wrong_notes", {})[f"{key}/{gate}"] = got
                        right = rights(recs[key])
                        if right is not None:  # were the needles token-exact chunks cut answered?
                            cell["reads"][f"{key}/{gate}"] = by_cut(right, cuts[0])
                            add(totals, f"{key}/{gate}", cell["reads"][f"{key}/{gate}"])
                        if key != row and right and exact:
                            cell["paired"][f"{key}/{gate}"] = got = paired(exact, right)
                            add(pooled, f"{key}/{gate}", got)
                            add(by_length, f"{key}/{gate}@{format_length(length)}", got)
                            print(f"  {key}/{gate}: {got}")
            cells.append(cell)
    training = {}
    for cfg in filter(None, args.train_configs.split(",")):
        task = make_task(load_config(ROOT / cfg), tok)
        docs = [task.sample(i).chunks for i in range(args.train_docs)]
        chunks, inner = [c for d in docs for c in d], [c for d in docs for c in d[1:]]
        training[cfg] = {"documents": args.train_docs, "chunks": len(chunks),
                         "ends_at_sentence": sum(map(ends_at_sentence, chunks)), "inner_chunks": len(inner),
                         "inner_chunks_open_with_the": sum(c.startswith(THE) for c in inner)}
        print(f"{cfg}: {training[cfg]['ends_at_sentence']} of {len(chunks)} training chunks end at a line or sentence end")
    for key, t in totals.items():
        print(f"{key}: cut needles {t['cut_right']}/{t['cut']} right, whole {t['whole_right']}/{t['whole']}")
    for key, t in openings_totals.items():
        print(f"{key}: {t['notes_quote_an_opening']} of {t['wrong']} wrong reads end with notes that quote a chunk's opening, "
              f"{t['quoted_opening_begins_with_the']} of them one that begins {THE!r}")
    for snap, t in opening_words_by_snap.items():
        print(f"snap {snap}: {t['openings_begin_with_the']} of {t['openings_counted']} chunk openings begin with {THE!r}")
    for label, pool in (("all cells", pooled), ("one length's cells", by_length)):
        for key, t in pool.items():  # the paired documents together: is the snapped row better overall?
            t["p"] = round(sign_test(t["only_snapped"], t["only_snapped"] + t["only_exact"]), 4)
            print(f"{key} against token-exact, {label}: {t}")
    print(write_result("chunk_snap", {"what": "needle sentences no single chunk holds whole (cut), per snap "
                                              "window; and right reads of committed eval folders (token-exact, "
                                              "and ROW+snapN) split by whether token-exact chunks cut the needle",
                                      "chunk_tokens": args.chunk_tokens, "tokenizer": args.model,
                                      "cells": cells, "reads_by_cut": totals, "paired_all_cells": pooled,
                                      "paired_by_length": by_length,
                                      "wrong_reads_quoting_a_chunk_opening": openings_totals,
                                      "chunk_openings_by_snap": opening_words_by_snap,
                                      "training_chunk_ends": training}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
