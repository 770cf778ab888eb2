"""The needle's chunk read alone, as a gated read that passes only that chunk sees it, in several shapes.

Why: with `--chunk-snap 64` and the lexical gate, the default model's 64K essay-number cell fell from 30
to 23 of 32, and in most of the lost reads the gate had passed only the needle's chunk and the notes
kept that chunk's first sentence instead of the number (docs/notes-model.md, session 16). A snapped chunk
starts at a sentence start, as a document does; a token-exact one starts mid-sentence. Is it the start
that misleads the model, would a mark saying "this continues the text" undo it, or is it the sentence?
A full gated read of a 64K cell takes about 6 minutes on 2 cores and reads 130 chunks with the gate to
find the one it passes; this reads only that chunk (empty notes, one update, then the final answer), so
each shape of it costs a few minutes:

    exact        the token-exact 512-token chunk that holds the needle sentence (starts mid-sentence)
    snapped      the `--snap` chunk that holds it, as is (starts at a sentence start)
    marked       the snapped chunk with "[...] " in front: a continuation mark
    from_second  the snapped chunk from its second sentence on (when the needle is not in the first)
    swapped      the snapped chunk with its first two sentences in the other order (neither the needle)
    the_front    the snapped chunk with the document's last sentence before it that begins "The " in front,
                 so every document opens so (a snap one or more sentences earlier could start there); this
                 is the opening the notes copy, made the rule instead of a sixth of the chunks

Each shape's reads are also split by whether the text read opens with the word "The": the notes this
model writes open with it ("The special magic number for ... is ..."), and a copy of the chunk's own
"The ..." opening is the failure this looks for.

    python benchmarks/needle_chunk_alone.py                                  # niah_single_2 @ 64K, n = 32
    python benchmarks/needle_chunk_alone.py --cells niah_single_1@16k --n 8 --shapes exact,snapped
    python benchmarks/needle_chunk_alone.py --model qwen2.5-coder-0.5b --adapter RUN/final --out FILE.json
    python benchmarks/needle_chunk_alone.py --seed 43 --shapes snapped,the_front     # fresh documents
    python benchmarks/needle_chunk_alone.py --compare OLD.json NEW.json [OLD2.json NEW2.json ...]
        # no model: per cell and shape, documents right only before, right only after, and the sign test

The documents are the grid's (eval seed 42; `--seed` draws others); scoring is eval's (memagent.tasks.scoring.score). Writes
benchmarks/results/needle_chunk_alone.json (command, date, machine).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chunk_snap_cuts import THE, needle_sentence, opening_words, paired  # noqa: E402
from common import write_result  # noqa: E402
from notes_grid import sign_test  # noqa: E402

from memagent import models  # noqa: E402
from memagent.chunking import iter_chunks  # noqa: E402
from memagent.tasks import format_length, iter_samples, parse_lengths  # noqa: E402
from memagent.tasks.scoring import score  # noqa: E402

SHAPES = ("exact", "snapped", "marked", "from_second", "swapped", "the_front")
MARK = "[...] "
SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")
THE_SENTENCE = re.compile(r"(?:^|(?<=[.!?]\s)|(?<=\n))The [^.!?\n]{1,200}[.!?]")


def holding(document: str, needle: str, tokenizer, chunk_tokens: int, snap: int) -> str | None:
    """The first chunk that holds the whole needle sentence (None: every cut falls inside it)."""
    return next((c.text for c in iter_chunks(document, tokenizer, chunk_tokens, snap) if needle in c.text), None)


def shaped(shape: str, exact: str | None, snapped: str | None, needle: str, document: str = "") -> str | None:
    """The text read for one shape; None when the shape does not exist for this document."""
    if shape == "exact":
        return exact
    if snapped is None:
        return None
    if shape == "snapped":
        return snapped
    if shape == "the_front":
        at = document.find(snapped.strip())
        before = list(THE_SENTENCE.finditer(document, 0, at)) if at > 0 else []
        return before[-1].group(0) + " " + snapped.lstrip() if before else None
    if shape == "marked":
        return MARK + snapped.lstrip()
    at = snapped.index(needle)
    lead = len(snapped) - len(snapped.lstrip())
    first = SENTENCE_END.search(snapped, lead)
    if not first or first.end() > at:
        return None
    if shape == "from_second":
        return snapped[first.end():]
    second = SENTENCE_END.search(snapped, first.end())  # swapped
    if not second or second.end() > at:
        return None
    one, two = snapped[lead:first.end()], snapped[first.end():second.end()]
    return snapped[:lead] + two.rstrip() + " " + one.rstrip() + " " + snapped[second.end():]


def opens_with_the(text: str) -> bool:
    return text.lstrip().startswith(THE)


def compare(pairs: list[tuple[dict, dict]]) -> dict:
    """Two results of the same documents (two adapters), per cell and shape: right before and after, and
    the documents that changed. A document is right unless it is in a shape's wrong list, and a shape is
    read on the same documents by every adapter (which ones exist depends on the document only)."""
    cells, total = [], {"gained": 0, "lost": 0}
    for old, new in pairs:
        seed = old.get("seed", 42)  # files written before --seed read the grid's documents
        if len(old["cells"]) != len(new["cells"]) or seed != new.get("seed", 42):
            raise SystemExit("--compare: the two files did not read the same cells of the same seed: not paired")
        for co, cn in zip(old["cells"], new["cells"]):
            if (co["task"], co["length"]) != (cn["task"], cn["length"]):
                raise SystemExit(f"--compare: {co['task']}@{co['length']} is not paired with {cn['task']}@{cn['length']}")
            for shape in sorted(co["shapes"].keys() & cn["shapes"].keys()):
                so, sn = co["shapes"][shape], cn["shapes"][shape]
                wo, wn = {w["id"] for w in so["wrong"]}, {w["id"] for w in sn["wrong"]}
                gained, lost = len(wo - wn), len(wn - wo)
                total["gained"] += gained
                total["lost"] += lost
                cells.append({"task": co["task"], "length": co["length"], "seed": seed, "shape": shape,
                              "read": so["read"], "right_before": so["right"], "right_after": sn["right"],
                              "gained": gained, "lost": lost, "p": round(sign_test(gained, gained + lost), 4)})
                print(f"{co['task']}@{format_length(co['length'])} seed {seed} {shape}: "
                      f"{so['right']} -> {sn['right']} of {so['read']} ({gained} gained, {lost} lost)")
    total["p"] = round(sign_test(total["gained"], total["gained"] + total["lost"]), 6)
    return {"cells": cells, "total": total}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="niah_single_2@64k", help="comma list of TASK@LENGTH (RULER needle tasks)")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seed", type=int, default=42, help="the documents' seed (42: the grid's)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--snap", type=int, default=64, help="the snap window of the snapped shapes, in tokens")
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--model", default=models.DEFAULT_MODEL)
    ap.add_argument("--adapter", default=None, help="a LoRA adapter folder on an untrained --model")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/needle_chunk_alone.json)")
    ap.add_argument("--compare", nargs="+", metavar="FILE", help="OLD NEW pairs of results files: compare, read nothing")
    args = ap.parse_args(argv)
    if args.compare:
        if len(args.compare) % 2:
            ap.error("--compare takes OLD NEW pairs of results files")
        loaded = []
        for f in args.compare:
            try:
                loaded.append(json.loads(Path(f).read_text()))
            except (OSError, ValueError) as e:
                ap.error(f"--compare: cannot read {f}: {e}")
        got = compare(list(zip(loaded[::2], loaded[1::2])))
        path = write_result("needle_chunk_alone_compare", path=Path(args.out) if args.out else None, numbers={
            "what": "the needle's chunk read alone by two adapters on the same documents: documents right only "
                    "after (gained), right only before (lost), exact sign test",
            "pairs": [{"before": a, "after": b} for a, b in zip(args.compare[::2], args.compare[1::2])], **got})
        print(f"total: {got['total']['gained']} gained, {got['total']['lost']} lost, p = {got['total']['p']}; wrote {path}")
        return 0
    shapes = args.shapes.split(",")
    if unknown := set(shapes) - set(SHAPES):
        ap.error(f"unknown shapes {sorted(unknown)}; choose from {', '.join(SHAPES)}")
    cells = []
    for cell in args.cells.split(","):
        task, _, length = cell.partition("@")
        if not task.startswith("niah_") or not length:
            ap.error(f"a cell is a RULER needle task at a length, e.g. niah_single_2@64k; got {cell!r}")
        cells.append((task, parse_lengths(length)[0]))

    from memagent.backends import make_backend
    from memagent.driver import MemoryAgent
    from memagent.tokenizer import load_tokenizer

    tok = load_tokenizer(str(models.tokenizer_path(args.model)))
    kw = {"adapter": args.adapter} if args.adapter else {}
    backend = make_backend("embedded", model=args.model, engine="llama.cpp", threads=args.threads, **kw)
    # a chunk plus the mark: the agent must not cut it again
    agent = MemoryAgent(backend, tok, template="notes", chunk_tokens=args.chunk_tokens + 32,
                        memory_tokens=args.memory_tokens)
    out = []
    for task, length in cells:
        samples = list(iter_samples([task], [length], args.n, tok, args.seed))
        texts = {}
        for s in samples:
            needle = needle_sentence(s.document, s.gold[0])
            exact = holding(s.document, needle, tok, args.chunk_tokens, 0)
            snapped = holding(s.document, needle, tok, args.chunk_tokens, args.snap)
            texts[s.id] = {shape: shaped(shape, exact, snapped, needle, s.document) for shape in shapes}
        result = {"task": task, "length": length, "n": len(samples), "shapes": {}}
        right_by_shape = {}
        for shape in shapes:
            todo = [s for s in samples if texts[s.id][shape] is not None]
            t = time.perf_counter()
            answers = agent.ask_many([(texts[s.id][shape], [s.question]) for s in todo], concurrency=args.concurrency)
            seconds = time.perf_counter() - t
            right, wrong, split = {}, [], {"opens_with_the": [0, 0], "other": [0, 0]}
            for s, (a,) in zip(todo, answers):
                pred, scores = score(s.metric, None if a.error else a.reply, s.gold)
                right[s.id] = scores[s.metric] == 1.0
                chunk = texts[s.id][shape].removeprefix(MARK)  # the chunk's own opening, behind any mark
                tally = split["opens_with_the" if opens_with_the(chunk) else "other"]
                tally[0] += right[s.id]
                tally[1] += 1
                if not right[s.id]:
                    first = opening_words(chunk)
                    wrong.append({"id": s.id, "prediction": pred, "notes": a.memory, "error": a.error,
                                  "notes_quote_chunk_opening": bool(first and first in a.memory)})
            right_by_shape[shape] = right
            result["shapes"][shape] = {
                "read": len(todo), "right": sum(right.values()),
                "wrong_notes_quoting_opening": sum(w["notes_quote_chunk_opening"] for w in wrong),
                "right_of_read_by_opening": split, "seconds": round(seconds, 1), "wrong": wrong}
            print(f"{task}@{format_length(length)} {shape}: {sum(right.values())}/{len(todo)} right, "
                  f"{result['shapes'][shape]['wrong_notes_quoting_opening']} of {len(wrong)} wrong notes quote "
                  f"the chunk's opening; opening with 'The' {split['opens_with_the'][0]}/{split['opens_with_the'][1]} right, "
                  f"others {split['other'][0]}/{split['other'][1]} ({seconds:.0f} s)", flush=True)
        if "snapped" in right_by_shape:  # per document, against the snapped chunk as is
            for shape, right in right_by_shape.items():
                got = paired(right_by_shape["snapped"], right)  # its "snapped" side is this shape
                result["shapes"][shape]["vs_snapped"] = {"documents": got["n"], "gained": got["only_snapped"],
                                                         "lost": got["only_exact"], "p": round(got["p"], 3)}
        out.append(result)
    path = write_result("needle_chunk_alone", path=Path(args.out) if args.out else None, numbers={
        "what": "the chunk holding the needle sentence read alone (empty notes, one update, then the answer), "
                "in several shapes; right = eval's score", "model": args.model, "adapter": args.adapter,
        "engine": "llama.cpp", "decoding": "greedy", "seed": args.seed, "chunk_tokens": args.chunk_tokens,
        "memory_tokens": args.memory_tokens, "snap": args.snap, "mark": MARK, "cells": out})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
