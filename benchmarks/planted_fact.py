"""Planted-fact accuracy of the embedded model: documents of 1, 4 and 16 chunks, the fact at 10 depths.

A fact sentence ("The access code of the red vault is 48213.") is planted in Paul Graham essay text at a
known depth; the model reads the document chunk by chunk with the memory workflow and answers the
question. Correct = the number appears in the extracted answer; we also record whether it survived in the
final memory (so a reader can tell "lost while reading" from "lost while answering").

Two disjoint splits keep us honest: `--split tune` (first half of the essays, its own facts) is where
prompt wording is compared; `--split test` (second half, other facts) is what the README quotes.

    python benchmarks/planted_fact.py --split test --chunks 1,4,16 --docs 10
    python benchmarks/planted_fact.py --model memagent-notes-0.5b --engine llama.cpp --chunks 16,64

`--engine llama.cpp` reads with the Q4 GGUF (a registered model's adapter as a GGUF LoRA): other weights
than torch's, so its results say which engine they came from. The documents depend only on the tokenizer,
the split and the chunk count, so both engines read the same ones.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memagent.gates import SKIP_MODES  # noqa: E402  (no torch: the choices are known before a model loads)

COLORS = ["red", "blue", "green", "amber", "violet", "silver", "black", "white", "orange", "golden", "grey", "pink"]
THINGS = ["vault", "door", "locker", "gate", "cabinet", "safe", "hatch", "chest", "drawer", "trunk"]


def essay_text() -> str:
    import importlib.resources as r

    return json.loads((r.files("long_context_eval") / "data/synthetic/json/PaulGrahamEssays.json").read_text())["text"]


def make_docs(tokenizer, n_chunks: int, chunk_tokens: int, n_docs: int, split: str, seed: int = 0):
    """n_docs documents of exactly n_chunks chunks with the fact at evenly spread depths."""
    text = essay_text()
    half = len(text) // 2
    pool = text[:half] if split == "tune" else text[half:]
    rng = random.Random(f"{split}-{n_chunks}-{seed}")
    docs = []
    # the fact sentence itself takes ~15 tokens; leave room so the doc keeps n_chunks chunks
    target = n_chunks * chunk_tokens - 24
    for i in range(n_docs):
        depth = 0.05 + 0.9 * i / max(1, n_docs - 1)
        color, thing, code = rng.choice(COLORS), rng.choice(THINGS), rng.randint(10000, 99999)
        start = rng.randrange(0, len(pool) - 40 * target)
        ids, starts = tokenizer.encode_offsets(pool[start:start + 8 * target])
        body = pool[start:start + starts[target]] if len(ids) > target else pool[start:start + 8 * target]
        # plant at a sentence boundary near the requested depth
        cut = int(len(body) * depth)
        dot = body.find(". ", cut)
        cut = dot + 2 if 0 <= dot < cut + 400 else cut
        fact = f"The access code of the {color} {thing} is {code}."
        doc = body[:cut] + fact + " " + body[cut:]
        docs.append({"doc": doc, "question": f"What is the access code of the {color} {thing}?",
                     "answer": str(code), "depth": round(depth, 3)})
    return docs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=["tune", "test"], default="test")
    ap.add_argument("--chunks", default="1,4,16")
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--templates", default=None, help="comma list; default: the model's default template")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--chunk-tokens", type=int, default=None)
    ap.add_argument("--memory-tokens", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=8, help="documents read at once (batched by the backend)")
    ap.add_argument("--engine", choices=("torch", "llama.cpp"), default="torch",
                    help="the embedded engine (llama.cpp: registered model names only)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--adapter", default=None, help="a LoRA adapter folder applied to --model (an untrained base)")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/planted_fact_<split>.json)")
    ap.add_argument("--skip-update", choices=SKIP_MODES, default="off",
                    help="the skip gate, as `ask --skip-update` (memagent/gates.py): lexical passes a chunk that "
                         "names none of the question's key terms (nor the memory's new ones) without a call")
    ap.add_argument("--seed", type=int, default=0, help="document seed: another value draws fresh documents (other "
                                                       "facts, depths' passages) from the same split")
    ap.add_argument("--smoke", action="store_true", help="seconds-long check with the scripted backend")
    args = ap.parse_args(argv)
    if args.engine == "llama.cpp" and Path(args.model).is_dir():
        ap.error("--engine llama.cpp reads registered models (a GGUF); an HF folder runs on --engine torch")

    from rich.progress import Progress

    from memagent import MemoryAgent, models
    from memagent.backends import make_backend
    from memagent.protocol import BackendError
    from memagent.tokenizer import HFTokenizer, TokenizerError

    # An HF folder (e.g. a merged adapter under runs/) has no registry entry: the defaults it gets are the
    # embedded default model's, and --templates / --chunk-tokens / --memory-tokens override them.
    spec = models.get_spec(models.DEFAULT_MODEL if Path(args.model).is_dir() else args.model)
    chunk_tokens = args.chunk_tokens or spec.chunk_tokens
    memory_tokens = args.memory_tokens or spec.memory_tokens
    kw = {"threads": args.threads} if args.threads else {}
    if args.adapter:
        kw["adapter"] = args.adapter
    try:
        tokenizer = HFTokenizer.from_file(models.tokenizer_path(args.model))
        backend = (make_backend("scripted", keywords=["access code"]) if args.smoke
                   else make_backend("embedded", model=args.model, engine=args.engine, **kw))
    except (TokenizerError, models.ModelError, BackendError) as e:
        print(f"planted_fact: error: {e}", file=sys.stderr)
        return 2
    templates = (args.templates or spec.default_template).split(",")
    chunk_counts = [int(x) for x in args.chunks.split(",")]
    n_docs = 2 if args.smoke else args.docs
    results = {"command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
               "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
               "model": args.model, "adapter": args.adapter, "engine": args.engine, "backend": backend.name, "split": args.split,
               "seed": args.seed, "skip_update": args.skip_update, "chunk_tokens": chunk_tokens, "memory_tokens": memory_tokens, "metric": "number appears in the extracted answer", "runs": []}
    total = len(templates) * len(chunk_counts) * n_docs
    with Progress() as bar:
        task = bar.add_task("planted facts", total=total)
        for template in templates:
            agent = MemoryAgent(backend, tokenizer, template=template, chunk_tokens=chunk_tokens,
                                memory_tokens=memory_tokens, answer_tokens=32, skip_update=args.skip_update)
            for n in chunk_counts:
                docs = make_docs(tokenizer, n, chunk_tokens, n_docs, args.split, args.seed)
                t = time.perf_counter()
                answers = [a[0] for a in agent.ask_many([(d["doc"], [d["question"]]) for d in docs], args.concurrency,
                                                         done=lambda: bar.advance(task))]
                secs = time.perf_counter() - t
                rows = [{"depth": d["depth"], "gold": d["answer"], "answer": a.answer, "chunks": a.chunks,
                         "correct": bool(a.answer and d["answer"] in a.answer), "in_memory": d["answer"] in a.memory,
                         "calls": a.calls, "skipped_chunks": a.skipped_chunks, "error": a.error}
                        for d, a in zip(docs, answers)]
                acc = sum(r["correct"] for r in rows) / len(rows)
                kept = sum(r["in_memory"] for r in rows) / len(rows)
                calls = sum(r["calls"] for r in rows)
                results["runs"].append({"template": template, "chunks": n, "docs": len(rows), "accuracy": acc,
                                        "skipped_chunks": sum(r["skipped_chunks"] for r in rows),
                                        "fact_in_final_memory": kept, "seconds": round(secs, 1),
                                        "seconds_per_call": round(secs / max(1, calls), 2), "samples": rows})
                bar.console.print(f"{template:10s} chunks={n:3d} accuracy={acc:.2f} fact-in-memory={kept:.2f} "
                                  f"{secs:.0f}s ({secs / max(1, calls):.2f} s/call)")
    default = f"benchmarks/results/planted_fact_{args.split}.json"
    if args.smoke:  # a smoke run never overwrites a measured result
        import tempfile

        default = str(Path(tempfile.mkdtemp()) / "planted_fact_smoke.json")
    out = Path(args.out or default)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
