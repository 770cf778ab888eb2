"""Fewer calls, same answers? The skip-update and early-exit gates (memagent/gates.py), measured.

Part A, model-free, at scale: for RULER-HotpotQA (7K..112K) and RULER niah_single_1 / niah_multikey_1
(8K..128K) samples, the documents are cut into chunks exactly as the reader cuts them (token-exact, at
512 and 5000 tokens) and the `lexical` skip gate is run over them: the fraction of update calls it
removes, and its **evidence recall** — how often every chunk holding the gold evidence (HotpotQA's gold
paragraphs, the asked needle) is kept. A skipped evidence chunk is an answer the model can no longer
give, whatever the model. Two memories bracket what a model writes:
- `question`: the memory never gains a name (a model whose notes add nothing): the gate's terms are the
  question's alone; most skipping, least recall.
- `ideal`: after each kept evidence chunk the memory holds that evidence (a model that notes exactly
  the gold paragraph or needle); its names join the terms, which is how a bridge entity found in hop 1
  keeps the hop-2 paragraph. A real memory also notes distractors, so it keeps more than this.

Part B, with the real embedded model (SmolLM2-135M, chunk 512, memory 64, `notes` wording): accuracy,
calls and seconds for gates off / lexical / marker / both, on niah_single_1 at 8K and 16K and
RULER-HotpotQA at 7K, n small (default 2 per cell). The four variants of a cell read *concurrently*
(the embedded backend batches their calls), so they share one machine state; a variant that finishes
early leaves the others smaller batches, which, if anything, flatters `off`. Each read goes through
`memagent.eval.Runner`, i.e. exactly what `memagent eval` records.

    nice -n 10 python benchmarks/bench_gates.py                  # part A (n=20) + part B (n=2), ~30 min
    python benchmarks/bench_gates.py --only calls --n 50         # part A only (a few minutes)
    python benchmarks/bench_gates.py --only model --model-n 4    # part B only
    python benchmarks/bench_gates.py --smoke                     # seconds: NIAH 8K part A + scripted part B
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, smollm2_tokenizer, write_result  # noqa: E402

from memagent.gates import LexicalSkipGate, edges, words  # noqa: E402

HOTPOT_LENGTHS = [7000, 14000, 28000, 56000, 112000]
NIAH_LENGTHS = [8192, 16384, 32768, 65536, 131072]
VARIANTS = {"off": ("off", "off"), "lexical": ("lexical", "off"), "marker": ("off", "marker"),
            "both": ("lexical", "marker")}


# ---- part A: calls saved and evidence recall, no model ---------------------------------------------

def chunk_spans(tokenizer, text: str, chunk_tokens: int) -> list[tuple[int, int]]:
    """(start, end) character spans of the reader's chunks: cut at every chunk_tokens-th token start."""
    ids, starts = tokenizer.encode_offsets(text)
    cuts = [starts[i] for i in range(0, len(ids), chunk_tokens)] + [len(text)]
    cuts[0] = 0
    return list(zip(cuts, cuts[1:]))


def evidence_spans(task: str, builder, sample) -> list[tuple[int, int, str]]:
    """(start, end, text) of each piece of gold evidence in the document."""
    doc = sample.document
    if task == "ruler-hotpotqa":
        rec = builder.record(sample.index)
        texts = [builder.builder.corpus.docs[i] for i in dict.fromkeys(rec.must)]
    else:  # the needles that carry the asked values
        texts = []
        for value in sample.gold:
            at = doc.find(value)
            line_start = max(doc.rfind("\n", 0, at), doc.rfind(". ", 0, at) + 1, 0)
            texts.append(doc[line_start:at + len(value) + 1].strip())
    out = []
    for t in texts:
        at = doc.find(t)
        if at < 0:
            raise RuntimeError(f"{sample.id}: gold evidence not found in the document: {t[:80]!r}")
        out.append((at, at + len(t), t))
    return out


def gate_run(question: str, doc: str, spans, evidence, memory_mode: str, empty_memory: str) -> tuple[list[bool], bool]:
    """Which chunks the gate keeps, and whether every evidence chunk was kept."""
    gate = LexicalSkipGate(question, empty_memory)
    memory, kept = empty_memory, []
    ev_chunks = [{k for k, (a, b) in enumerate(spans) if a < e1 and s0 < b} for s0, e1, _ in evidence]
    for k, (a, b) in enumerate(spans):
        prev = doc[spans[k - 1][0]:a] if k else None
        nxt = doc[b:spans[k + 1][1]] if k + 1 < len(spans) else None
        before, after = edges(prev, nxt)  # what the driver shows the gate: the chunk and its neighbours' edges
        keep = gate.keep(memory, frozenset(words(before + doc[a:b] + after)))
        kept.append(keep)
        if keep and memory_mode == "ideal":
            noted = [t for (s0, e1, t), ks in zip(evidence, ev_chunks) if k in ks]
            if noted:
                memory = " ".join(([] if memory == empty_memory else [memory]) + noted)
    recall = all(all(kept[k] for k in ks) for ks in ev_chunks)
    return kept, recall


def part_calls(tokenizer, n: int, chunk_sizes: list[int], hotpot_lengths, niah_lengths) -> list[dict]:
    from memagent.prompts import load_template
    from memagent.tasks import tasks

    empty = load_template("notes").empty_memory
    rows = []
    plan = [("ruler-hotpotqa", hotpot_lengths), ("niah_single_1", niah_lengths), ("niah_multikey_1", niah_lengths)]
    for task, lengths in plan:
        if not lengths:
            continue
        builder = tasks()[task].make(tokenizer, 42)
        for length in lengths:
            t0 = time.perf_counter()
            cells = {(c, m): {"chunks": 0, "kept": 0, "recall": 0, "samples": 0}
                     for c in chunk_sizes for m in ("question", "ideal")}
            for i in range(n):
                s = builder.sample(i, length)
                ev = evidence_spans(task, builder, s)
                for c in chunk_sizes:
                    spans = chunk_spans(tokenizer, s.document, c)
                    for mode in ("question", "ideal"):
                        kept, ok = gate_run(s.question, s.document, spans, ev, mode, empty)
                        cell = cells[(c, mode)]
                        cell["chunks"] += len(kept)
                        cell["kept"] += sum(kept)
                        cell["recall"] += ok
                        cell["samples"] += 1
            for (c, mode), cell in cells.items():
                # a read makes one call per kept chunk plus the answer call
                calls_off, calls_on = cell["chunks"] + cell["samples"], cell["kept"] + cell["samples"]
                rows.append({"task": task, "length": length, "chunk_tokens": c, "memory": mode, "n": cell["samples"],
                             "chunks": cell["chunks"], "kept": cell["kept"],
                             "skipped_fraction": round(1 - cell["kept"] / cell["chunks"], 4),
                             "calls_saved_fraction": round(1 - calls_on / calls_off, 4),
                             "evidence_recall": round(cell["recall"] / cell["samples"], 4),
                             "evidence_kept_samples": cell["recall"]})
            print(f"  {task} {length}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return rows


# ---- part B: the real model (or the scripted oracle for --smoke) -------------------------------------

def oracle_backend():
    """--smoke: a scripted reader that notes needle sentences and marks its notes once it holds a value."""
    import re

    from memagent.backends.scripted import ScriptedBackend

    section = re.compile(r"<section>\n(.*)\n</section>", re.S)
    notes = re.compile(r"<notes>\n(.*?)\n</notes>", re.S)

    def policy(req):
        prompt = req.messages[-1]["content"]
        memory = notes.search(prompt).group(1)
        memory = "" if memory.startswith("(no notes") else memory
        sec = section.search(prompt)
        if sec is None:
            found = re.findall(r"\d{7}", memory)
            return f"\\boxed{{{found[-1] if found else 'none'}}}"
        keep = [x for x in re.split(r"(?<=[.!?])\s+", sec.group(1)) if "special magic" in x]
        out = " ".join([memory] * bool(memory) + keep)
        if "[[ANSWER FOUND]]" in prompt and re.search(r"\d{7}", out):
            out += "\n[[ANSWER FOUND]]"
        return out or "(no notes yet)"

    return ScriptedBackend(policy=policy)


async def run_cell(backend, tokenizer, samples, n_variants: dict, chunk: int, memory: int) -> list[dict]:
    from memagent.eval import EvalConfig, Runner

    runners = {}
    for name, (skip, exit_) in n_variants.items():
        cfg = EvalConfig(tasks=[samples[0].task], lengths=[samples[0].length], n=len(samples), method="memagent",
                         chunk_tokens=chunk, memory_tokens=memory, template="notes", skip_update=skip,
                         early_exit=exit_, backend=getattr(backend, "name", "?"), answer_tokens=64)
        runners[name] = Runner(cfg, backend, tokenizer)
    jobs = [(name, s) for s in samples for name in runners]
    recs = await asyncio.gather(*(runners[name].run(s) for name, s in jobs))
    out = []
    for (name, s), r in zip(jobs, recs):
        out.append({"variant": name, "id": r["id"], "correct": r["correct"], "prediction": r["prediction"][:80],
                    "gold": r["gold"], "chunks": r.get("chunks"), "calls": r["calls"],
                    "skipped_chunks": r.get("skipped_chunks"), "exit_chunk": r.get("exit_chunk"),
                    "seconds": r["seconds"], "error": r["error"], "memory": (r.get("memory") or "")[:300]})
    return out


def part_model(args, tokenizer) -> dict:
    from memagent.tasks import tasks

    if args.smoke:
        backend = oracle_backend()
        cells = [("niah_single_1", 8192), ("niah_single_1", 16384)]
        n = args.model_n or 1
        what = "scripted oracle reader (smoke: checks the plumbing, not the model)"
    else:
        from memagent.backends.embedded import EmbeddedBackend

        backend = EmbeddedBackend.load("smollm2-135m", threads=args.threads)
        cells = [("niah_single_1", 8192), ("niah_single_1", 16384), ("ruler-hotpotqa", 7000)]
        n = args.model_n or 2
        what = "embedded smollm2-135m"
    records, timing = [], []
    builders = {}
    for task, length in cells:
        builders.setdefault(task, tasks()[task].make(tokenizer, 42))
        samples = [builders[task].sample(i, length) for i in range(n)]
        t0 = time.perf_counter()
        recs = asyncio.run(run_cell(backend, tokenizer, samples, VARIANTS, args.chunk_tokens, args.memory_tokens))
        wall = time.perf_counter() - t0
        timing.append({"task": task, "length": length, "wall_seconds": round(wall, 1)})
        print(f"  {task} {length}: {wall:.0f} s", file=sys.stderr, flush=True)
        for r in recs:
            r.update(task=task, length=length)
        records.extend(recs)
    summary = []
    for task, length in cells:
        for name in VARIANTS:
            rs = [r for r in records if r["task"] == task and r["length"] == length and r["variant"] == name]
            summary.append({"task": task, "length": length, "variant": name, "n": len(rs),
                            "correct": sum(r["correct"] for r in rs), "calls": sum(r["calls"] for r in rs),
                            "skipped_chunks": sum(r["skipped_chunks"] or 0 for r in rs),
                            "exits": sum(r["exit_chunk"] is not None for r in rs),
                            "seconds": round(sum(r["seconds"] for r in rs), 1)})
    return {"backend": what, "n_per_cell": n, "chunk_tokens": args.chunk_tokens, "memory_tokens": args.memory_tokens,
            "template": "notes", "summary": summary, "cell_wall": timing, "reads": records}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="seconds: NIAH 8K only, scripted oracle instead of the model")
    ap.add_argument("--only", choices=["calls", "model"], default=None)
    ap.add_argument("--n", type=int, default=None, help="part A: samples per task and length (default 20)")
    ap.add_argument("--model-n", type=int, default=None, help="part B: samples per cell (default 2)")
    ap.add_argument("--chunk-tokens", type=int, default=512, help="part B chunk size")
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    tok = smollm2_tokenizer()
    result: dict = {"gate": "lexical (memagent/gates.py)", "tokenizer": "smollm2-135m"}
    if args.only in (None, "calls"):
        n = args.n or (2 if args.smoke else 20)
        hl, nl = ([], [8192]) if args.smoke else (HOTPOT_LENGTHS, NIAH_LENGTHS)
        rows = part_calls(tok, n, [512, 5000], hl, nl)
        result["calls"] = {"n": n, "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
                           "rows": rows}
        print_table([(r["task"], r["length"], r["chunk_tokens"], r["memory"], r["n"],
                      f"{100 * r['calls_saved_fraction']:.1f}%", f"{r['evidence_kept_samples']}/{r['n']}")
                     for r in rows], ("task", "length", "chunk", "memory", "n", "calls saved", "evidence kept"))
    if args.only in (None, "model"):
        result["model"] = part_model(args, tok)
        result["model"].update(command=" ".join(sys.argv), date=time.strftime("%Y-%m-%d %H:%M"))
        print_table([(r["task"], r["length"], r["variant"], f"{r['correct']:g}/{r['n']}", r["calls"],
                      r["skipped_chunks"], r["exits"], r["seconds"]) for r in result["model"]["summary"]],
                    ("task", "length", "variant", "correct", "calls", "skipped", "exits", "s (sum)"))
    if args.only and not args.smoke:  # the two parts run separately: keep the other part's last result
        from common import RESULTS

        prev = RESULTS / "gates.json"
        if prev.is_file():
            old = json.loads(prev.read_text())
            for part in ("calls", "model"):
                if part not in result and part in old:
                    result[part] = old[part]
    path = write_result("gates", result, smoke=args.smoke)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
