"""CPU demonstration of Multi-Conv DAPO: SmolLM2-135M-Instruct learns to keep a planted fact in memory.

Task (memagent.rl.data.KVTask, NIAH / RULER-like): filler prose cut into chunks of ~100 tokens; one chunk
holds "The access code for Project X is NNNN.", others hold distractor codes of other projects; the
question asks for X's code. Training documents have 3 chunks. Accuracy (one seeded read per document at
MemAgent's eval sampling T=0.7/top_p=0.95, normalised substring match = MemAgent's sub_em) is measured on held-out documents (another seed range) at the training length
and at 4x and 16x as many chunks, before training (the same model, untrained: LoRA starts at zero) and
after. Everything goes to benchmarks/results/train_demo.json and train_demo.png.

    nice -n 10 python benchmarks/train_demo.py                 # the full run (see --help for sizes)
    python benchmarks/train_demo.py --smoke                    # 2 steps, tiny evals: checks the plumbing

Config: configs/smollm2-135m-demo.toml (any TrainConfig key can be overridden with --set KEY=VALUE).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs/smollm2-135m-demo.toml"))
    ap.add_argument("--steps", type=int, default=None, help="override max_steps")
    ap.add_argument("--eval-n", type=int, nargs=3, default=[24, 12, 6], metavar=("N1X", "N4X", "N16X"),
                    help="held-out documents at 1x, 4x, 16x the training chunks")
    ap.add_argument("--multipliers", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-temperature", type=float, default=0.7, help="MemAgent's eval setting: 0.7 (0 = greedy)")
    ap.add_argument("--eval-top-p", type=float, default=0.95, help="MemAgent's eval setting: 0.95")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ap.add_argument("--smoke", action="store_true", help="2 steps, 2 eval documents at 1x and 4x")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/train_demo.json"))
    args = ap.parse_args()

    import torch

    from memagent.rl.config import load_config
    from memagent.rl.engine import Trainer, evaluate
    from memagent.rl.trainer import run  # noqa: F401  (same entry as the CLI; we drive steps ourselves)

    torch.set_num_threads(args.threads)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    if args.smoke:
        overrides.update(max_steps=2, output_dir="runs/train_demo_smoke", resume="false", questions_per_step=2)
        args.eval_n, args.multipliers = [2, 1, 1], [1, 4]
    overrides["torch_threads"] = args.threads
    config = load_config(args.config, overrides)
    if Path(config.output_dir).exists() and not config.resume:
        shutil.rmtree(config.output_dir)
    t_start = time.time()
    trainer = Trainer(config)
    sizes = dict(zip([1, 4, 16], args.eval_n))
    from memagent.rl.data import EVAL_OFFSET

    held_out = trainer.task.held_out()
    eval_sets = {m: [held_out.with_chunks(config.num_chunks * m).sample(EVAL_OFFSET + i)
                     for i in range(sizes.get(m, args.eval_n[-1]))] for m in args.multipliers}

    def run_evals(tag: str) -> dict:
        out = {}
        for m, samples in eval_sets.items():
            t0 = time.time()
            r = evaluate(trainer.backend, trainer.template, trainer.tokenizer, samples, config.memory_tokens,
                         config.answer_tokens, config.reward, temperature=args.eval_temperature,
                         top_p=args.eval_top_p, seed=config.seed + 1)
            r["seconds"] = round(time.time() - t0, 1)
            r["chunks"] = config.num_chunks * m
            out[f"{m}x"] = r
            print(f"[{tag}] {m}x ({r['chunks']} chunks): accuracy {r['accuracy']:.3f} "
                  f"({r['correct']}/{r['n']}) in {r['seconds']} s", flush=True)
        return out

    resumed_at = trainer.step
    before = run_evals("before") if trainer.step == 0 else None
    if before is not None:  # keep it for a resumed run
        (Path(config.output_dir) / "eval_before.json").write_text(json.dumps(before))
    else:
        before = json.loads((Path(config.output_dir) / "eval_before.json").read_text())
    t_train = time.time()
    from memagent.rl.trainer import train_steps

    train_steps(trainer, on_step=lambda rec: print(json.dumps(
        {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True))
    train_s = time.time() - t_train
    trainer.save()
    trainer.save_final()
    after = run_evals("after")
    png = trainer.plot()
    from memagent.rl import metrics as metrics_io

    recs = metrics_io.read(Path(config.output_dir) / "metrics.jsonl")
    result = {
        "what": "Multi-Conv DAPO on SmolLM2-135M-Instruct (LoRA), synthetic NIAH-like key->value memory task",
        "command": " ".join([sys.executable] + sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "smoke": args.smoke, "resumed_at_step": resumed_at,
        "config": config.to_dict(),
        "accuracy_before": {k: v["accuracy"] for k, v in before.items()},
        "accuracy_after": {k: v["accuracy"] for k, v in after.items()},
        "eval_before": before, "eval_after": after,
        "train_seconds": round(train_s, 1), "total_seconds": round(time.time() - t_start, 1),
        "reward_first_steps": [r["reward"] for r in recs[:3]], "reward_last_steps": [r["reward"] for r in recs[-3:]],
        "metrics": recs,
        "eval_sampling": {"temperature": args.eval_temperature, "top_p": args.eval_top_p,
                          "seeded": "per call from (seed, document, turn): before and after use the same seeds"},
        "notes": "accuracy = one read per document with MemAgent's eval sampling (T=0.7, top_p=0.95 unless "
                 "overridden), sub_em (normalised gold code occurs in the extracted answer); "
                 "before = the same model with the freshly initialised (zero) LoRA adapter, i.e. untrained; "
                 "eval documents come from a seed range never used in training; ci95 = normal approximation.",
    }
    out = Path(args.out) if not args.smoke else Path(config.output_dir) / "train_demo_smoke.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if png and not args.smoke:
        shutil.copy(png, out.with_suffix(".png"))
    print(f"wrote {out}")
    asyncio.run(trainer.aclose())
    return 0


if __name__ == "__main__":
    sys.exit(main())
