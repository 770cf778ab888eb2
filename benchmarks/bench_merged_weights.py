"""The adapter applied per token vs folded into Q8_0 weights (`--merge-lora`), on llama.cpp.

Two measurements, both on the shipped default (memagent-notes-0.5b) unless --model says otherwise:

1. Reads one at a time (what `memagent ask` does): the same RULER documents read by both, alternately
   (runtime, merged, runtime, merged, ...), so a neighbour on the shared cores slows both alike.
   llama.cpp's own timings of every call give prompt-processing and decoding speeds; the answers and
   final notes of the two are compared.
2. Optional `--cells`: `memagent eval` cells (greedy, the grid's documents and settings, n documents read
   at once) for both, into benchmarks/results/eval_runs/merged/<mode>/<cell> (resumable): accuracy,
   seconds per document, and how many documents end with the same notes and answer.

Writes benchmarks/results/merged_weights.json (command, date, machine) and prints the ratios.

    python benchmarks/bench_merged_weights.py --docs 4
    python benchmarks/bench_merged_weights.py --docs 0 --cells niah_multikey_2@4k --n 8
    python benchmarks/bench_merged_weights.py --docs 0 --demo    # the README demo's questions, both modes

Parts not rerun keep their earlier numbers in the results file; each part records the command and date
that measured it.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine  # noqa: E402

RUNS = RESULTS / "eval_runs" / "merged"
OUT = RESULTS / "merged_weights.json"
MODES = ("runtime", "merged")


class Timed:
    """Wraps a backend; keeps llama.cpp's timings of every call."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def generate(self, request):
        gen = await self.backend.generate(request)
        e = gen.extra
        self.calls.append({"prompt_n": gen.prompt_tokens - e.get("reused_prompt_tokens", 0),
                           "prompt_ms": e.get("prompt_ms"), "decode_n": gen.completion_tokens,
                           "decode_ms": e.get("decode_ms")})
        return gen


def speeds(calls: list[dict]) -> dict:
    pp = [c["prompt_n"] / c["prompt_ms"] * 1000 for c in calls if c["prompt_ms"] and c["prompt_n"] > 64]
    tg = [(c["decode_n"] - 1) / c["decode_ms"] * 1000 for c in calls if c["decode_ms"] and c["decode_n"] > 4]
    return {"calls": len(calls), "prompt_tokens_per_s_median": round(statistics.median(pp), 1) if pp else None,
            "decode_tokens_per_s_median": round(statistics.median(tg), 1) if tg else None,
            "prompt_tokens": sum(c["prompt_n"] for c in calls), "decode_tokens": sum(c["decode_n"] for c in calls)}


def reads(model: str, docs: int, task: str, length: int, threads: int) -> dict:
    from memagent import models
    from memagent.backends import make_backend, resolve_tokenizer
    from memagent.driver import MemoryAgent
    from memagent.tasks import iter_samples
    from memagent.tasks.scoring import score

    spec = models.get_spec(model)
    tok = resolve_tokenizer("embedded", model, None)
    samples = list(iter_samples([task], [length], docs, tok, 42))
    timed = {m: Timed(make_backend("embedded", model=model, engine="llama.cpp", threads=threads, max_batch=1,
                                   merge_lora=(m == "merged"))) for m in MODES}
    agents = {m: MemoryAgent(timed[m], tok, template=spec.default_template, chunk_tokens=spec.chunk_tokens,
                             memory_tokens=spec.memory_tokens) for m in MODES}
    rows = []
    from rich.progress import Progress

    with Progress() as bar:
        job = bar.add_task(f"{task} {length} tokens, both modes", total=len(samples) * 2)
        for i, s in enumerate(samples):
            row = {"id": s.id}
            for m in (MODES if i % 2 == 0 else MODES[::-1]):  # alternate which goes first
                t = time.perf_counter()
                a = agents[m].ask(s.document, s.question)
                _, scores = score(s.metric, a.reply, s.gold)
                row[m] = {"seconds": round(time.perf_counter() - t, 2), "answer": a.answer, "memory": a.memory,
                          "correct": scores[s.metric] == 1.0}
                bar.advance(job)
            rows.append(row)
    for m in MODES:
        asyncio.run(timed[m].backend.aclose())
    out = {"task": task, "length": length, "docs": docs, "rows": rows}
    for m in MODES:
        out[m] = {**speeds(timed[m].calls), "correct": sum(r[m]["correct"] for r in rows),
                  "seconds_per_doc": round(statistics.mean(r[m]["seconds"] for r in rows), 1)}
    out["same_answer"] = sum(r["runtime"]["answer"] == r["merged"]["answer"] for r in rows)
    out["same_notes"] = sum(r["runtime"]["memory"] == r["merged"]["memory"] for r in rows)
    rt, mg = out["runtime"], out["merged"]
    out["prompt_speedup"] = round(mg["prompt_tokens_per_s_median"] / rt["prompt_tokens_per_s_median"], 2)
    out["decode_speedup"] = round(mg["decode_tokens_per_s_median"] / rt["decode_tokens_per_s_median"], 2)
    out["doc_speedup"] = round(rt["seconds_per_doc"] / mg["seconds_per_doc"], 2)
    return out


def demo(model: str, threads: int) -> dict:
    """The README demo's two questions in both modes, scored as bench_notes_model scores them."""
    from bench_notes_model import ask_demo

    got = {}
    for m in MODES:
        runs, rc, wall = ask_demo(["--model", model, "--engine", "llama.cpp", "--threads", str(threads)]
                                  + (["--merge-lora"] if m == "merged" else []))
        got[m] = {"seconds": wall, "rc": rc, "answers": {r["question"]: r["answer"] for r in runs},
                  "errors": [r["error"] for r in runs if r["error"]], "right": sum(r["correct"] for r in runs)}
    return got


def cell(model: str, cell_name: str, n: int, concurrency: int, threads: int) -> dict:
    from memagent import models

    task, length = cell_name.split("@")
    spec = models.get_spec(model)
    folders = {m: RUNS / model / m / cell_name.replace("@", "-") for m in MODES}
    got = {}
    for m, out in folders.items():
        cmd = [sys.executable, "-m", "memagent", "eval", "--task", task, "--lengths", length, "--n", str(n),
               "--model", model, "--engine", "llama.cpp", "--concurrency", str(concurrency), "--threads",
               str(threads), "--template", spec.default_template, "--chunk-tokens", str(spec.chunk_tokens),
               "--memory-tokens", str(spec.memory_tokens), "--no-plot", "--out", str(out)]
        subprocess.run(cmd + (["--merge-lora"] if m == "merged" else []), cwd=ROOT, check=False)  # rc 1: failed samples, recorded
        got[m] = {"summary": json.loads((out / "summary.json").read_text())["results"][0],
                  "samples": {r["id"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}}
    a, b = got["runtime"]["samples"], got["merged"]["samples"]
    ids = sorted(a.keys() & b.keys())
    return {"cell": cell_name, "n": n, "concurrency": concurrency,
            **{m: {"correct": sum(got[m]["samples"][i]["correct"] for i in ids),
                   "seconds_per_doc": got[m]["summary"]["seconds_per_sample"],
                   "folder": str(folders[m].relative_to(ROOT))} for m in MODES},
            "same_notes": sum(a[i]["memory"] == b[i]["memory"] for i in ids),
            "same_prediction": sum(a[i]["prediction"] == b[i]["prediction"] for i in ids), "compared": len(ids)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="memagent-notes-0.5b", help="a registered model that carries an adapter")
    ap.add_argument("--docs", type=int, default=4, help="documents read one at a time by each mode (0: none)")
    ap.add_argument("--task", default="niah_multikey_2")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--demo", action="store_true", help="also ask the README demo's two questions in both modes")
    ap.add_argument("--cells", default="", help="eval cells TASK@LENGTH, comma separated (default: none)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT, help=f"results file (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args()
    out = args.out
    old = json.loads(out.read_text()) if out.is_file() else {}
    result = {"command": "python " + " ".join([f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine(), "model": args.model,
              "reads_one_at_a_time": old.get("reads_one_at_a_time"), "demo": old.get("demo"),
              "cells": old.get("cells", {})}
    if args.docs:
        r = reads(args.model, args.docs, args.task, args.length, args.threads)
        result["reads_one_at_a_time"] = r
        r["command"], r["date"] = result["command"], result["date"]
        print(f"one at a time, {r['docs']} x {r['task']} {r['length']}: prompt x{r['prompt_speedup']}, decode "
              f"x{r['decode_speedup']}, per document x{r['doc_speedup']}; correct {r['runtime']['correct']} vs "
              f"{r['merged']['correct']}; same answer {r['same_answer']}/{r['docs']}, same notes {r['same_notes']}")
    if args.demo:
        result["demo"] = d = demo(args.model, args.threads)
        d["command"], d["date"] = result["command"], result["date"]
        print("demo: " + "; ".join(f"{m} {d[m]['right']}/2 right ({d[m]['seconds']} s, with the model load): "
                                    f"{list(d[m]['answers'].values())}" for m in MODES))
    for c in [c for c in args.cells.split(",") if c]:
        r = cell(args.model, c, args.n, args.concurrency, args.threads)
        result["cells"][c] = r
        r["command"], r["date"] = result["command"], result["date"]
        print(f"{c}: runtime {r['runtime']['correct']}/{r['compared']} in {r['runtime']['seconds_per_doc']} s/doc, "
              f"merged {r['merged']['correct']}/{r['compared']} in {r['merged']['seconds_per_doc']} s/doc; "
              f"same notes {r['same_notes']}, same prediction {r['same_prediction']}")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
