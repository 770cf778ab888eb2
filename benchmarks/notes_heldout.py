"""Held-out documents of the training generator itself: did a model learn the training skill at all?

Why this exists beside the RULER / planted-fact / demo cells: when a trained model does not improve on
those, two explanations compete: it did not learn the skill, or it learned it and the skill does not
transfer to other wordings. Reading fresh documents of the training distribution (rl/notes_data.py with a
seed no training config uses, so no document is one the model saw) tells the two apart.

    python benchmarks/notes_heldout.py --model runs/notes-135m-v2 --kind prose --docs 16 --out X.json

--kind prose: facts told in prose (rl/notes_prose.py); needle: key-value needles; qa: SQuAD/HotpotQA
train-half questions. Greedy, the notes template at 512 / 64, 1-3 chunks; correct = sub_em (every value,
for a needle with several).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

SHARES = {"prose": (0.0, 1.0), "needle": (0.0, 0.0), "qa": (1.0, 0.0)}  # kind -> (qa_share, prose_share)
SEED = 99  # the training configs use seeds 0-3 and 11-13


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="registry name or HF folder")
    ap.add_argument("--kind", choices=sorted(SHARES), default="prose")
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--engine", choices=("torch", "llama.cpp"), default="torch")
    ap.add_argument("--adapter", default=None, help="a LoRA adapter folder (a run's final/) applied to --model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from rich.progress import Progress

    from memagent import MemoryAgent, models
    from memagent.backends import make_backend
    from memagent.rl.notes_data import NotesTask
    from memagent.tasks.scoring import score
    from memagent.tokenizer import HFTokenizer

    tokenizer = HFTokenizer.from_file(models.tokenizer_path(args.model))
    qa, prose = SHARES[args.kind]
    task = NotesTask(tokenizer, chunk_tokens=512, max_chunks=3, memory_tokens=64, seed=SEED, qa_share=qa,
                     prose_share=prose)
    samples = [task.sample(i) for i in range(args.docs)]
    extra = {"adapter": args.adapter} if args.adapter else {}
    backend = make_backend("embedded", model=args.model, engine=args.engine, **extra)
    agent = MemoryAgent(backend, tokenizer, template="notes", chunk_tokens=512, memory_tokens=64, answer_tokens=48)

    t0 = time.perf_counter()
    with Progress() as bar:
        task_id = bar.add_task(f"{args.kind} documents", total=len(samples))
        answers = [a[0] for a in agent.ask_many([(s.context, [s.question]) for s in samples], args.concurrency,
                                                done=lambda: bar.advance(task_id))]
    secs = time.perf_counter() - t0
    rows = []
    for s, a in zip(samples, answers):
        metric = "string_match_all" if len(s.answers) > 1 else "sub_em"  # several values: all of them
        _, sc = score(metric, a.answer, list(s.answers))
        rows.append({"id": s.id, "kind": s.meta["kind"], "chunks": len(s.chunks), "question": s.question,
                     "gold": list(s.answers), "answer": a.answer, "memory": a.memory, "correct": sc[metric] >= 1.0,
                     "error": a.error})
    acc = sum(r["correct"] for r in rows) / max(len(rows), 1)
    result = {"command": "python benchmarks/notes_heldout.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "model": args.model,
              "adapter": args.adapter, "engine": args.engine, "kind": args.kind,
              "seed": SEED, "docs": len(rows), "accuracy": acc, "seconds": round(secs, 1), "samples": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.model} {args.kind}: {sum(r['correct'] for r in rows)}/{len(rows)} correct, {secs:.0f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
