"""Run every performance benchmark and print one table of their ratios against the issue's goals.

    python benchmarks/run_all.py --smoke        # seconds to a couple of minutes: checks the scripts work
    python benchmarks/run_all.py                # the full runs (the linear 3.6 M-token and 1 GB memory
                                                # runs are the long ones)
    python benchmarks/run_all.py --only linear,tokenize --memory-mb 200

Not here: bench_embedded.py and bench_gates.py's model part (tens of minutes of model time each) and
bench_trainer_vs_trl.py (needs TRL, in its own venv: benchmarks/requirements-trl.txt).

Each script runs in its own process (so one's memory or threads cannot colour another's numbers) and
writes benchmarks/results/<name>.json; this reads those files back for the table.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, print_table  # noqa: E402

HERE = Path(__file__).resolve().parent
# name -> (script, result file stem, [(label, path into the JSON, goal, "<=" or ">=" or "<")])
BENCHMARKS = {
    "tokenize": ("bench_tokenize.py", "tokenize", [
        ("C encoder M tokens/s, unseen text", ("tokens_per_s", "native_cold"), 1.5e6, ">="),
        ("C encoder M tokens/s, warm cache", ("tokens_per_s", "native_warm"), 1.5e6, ">="),
        ("C encoder / reference batch, unseen", ("ratios", "native_cold_vs_reference_batch"), None, ""),
        ("chunking C encoder / reference", ("ratios", "chunking_native_vs_reference"), None, ""),
        ("numpy path (no compiler) M tokens/s, unseen", ("tokens_per_s", "fast_cold"), None, ""),
    ]),
    "linear": ("bench_linear.py", "linear", [
        ("per-token time long / short", ("ratio_long_vs_short",), 1.10, "<="),
    ]),
    "overhead": ("bench_overhead.py", "overhead", [
        ("ours / bare client (end to end)", ("ratio_ours_vs_bare",), 1.15, "<="),
        ("ours pretokenized / bare client", ("ratio_pretokenized_vs_bare",), 1.15, "<="),
        ("ours / the openai SDK's raw post (end to end)", ("ratio_ours_vs_bare_sdk",), None, ""),
        ("chunk-requests per second", ("chunk_requests_per_s",), None, ""),
    ]),
    "memory": ("bench_memory.py", "memory_chunks", [
        ("peak RSS big - small (MB)", ("peak_rss_difference_mb",), 100, "<"),
    ]),
    # model-free part only here (--only calls); the model part is ~30 minutes: run bench_gates.py itself
    "gates": ("bench_gates.py", "gates", [
        ("lexical skip: NIAH calls removed, longest", lambda d: _gate_rows(d, "niah")[-1]["calls_saved_fraction"], None, ""),
        ("lexical skip: NIAH evidence recall (min)", lambda d: min(r["evidence_recall"] for r in _gate_rows(d, "niah")), 1.0, ">="),
    ]),
}
EXTRA_ARGS = {"gates": ["--only", "calls"]}


def _gate_rows(data: dict, task: str) -> list[dict]:
    return [r for r in data["calls"]["rows"] if r["task"].startswith(task) and r["chunk_tokens"] == 512]


def dig(obj, path):
    if callable(path):
        return path(obj)
    for key in path:
        obj = obj[key]
    return obj


def verdict(value, goal, op) -> str:
    if goal is None:
        return ""
    ok = {"<=": value <= goal, ">=": value >= goal, "<": value < goal}[op]
    return "meets" if ok else "MISSES"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated subset of: " + ", ".join(BENCHMARKS))
    ap.add_argument("--memory-mb", type=float, default=None, help="size of the big memory document")
    ap.add_argument("--fast-tokenizer", action="store_true", help="linear/memory with memagent.fasttok (overhead uses it by default)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    rows, failed = [], []
    for name in names:
        script, stem, metrics = BENCHMARKS[name]
        cmd = [sys.executable, str(HERE / script)] + (["--smoke"] if args.smoke else []) + EXTRA_ARGS.get(name, [])
        if name == "memory":
            if args.memory_mb:
                cmd += ["--big-mb", str(args.memory_mb)]
            elif args.smoke:
                cmd += ["--small-mb", "1", "--big-mb", "4"]  # the seconds-long version of 10 vs 50 MB
            if args.fast_tokenizer:
                cmd += ["--tokenizer", "fast"]
                stem += "_fasttok"
        elif name == "linear" and args.fast_tokenizer:  # overhead uses memagent.fasttok by default
            cmd.append("--fast-tokenizer")
            stem += "_fasttok"
        print(f"$ {' '.join(cmd)}", flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT)
        seconds = time.perf_counter() - t
        if proc.returncode != 0:
            failed.append(name)
            rows.append((name, "(failed)", "", "", "", f"{seconds:.0f}"))
            continue
        data = json.loads((RESULTS / f"{stem}{'.smoke' if args.smoke else ''}.json").read_text())
        for label, path, goal, op in metrics:
            try:
                value = dig(data, path)
            except (KeyError, TypeError):  # e.g. no C compiler: the C encoder's rows are absent
                rows.append((name, label, "(absent)", "", "", f"{seconds:.0f}"))
                continue
            shown = f"{value / 1e6:.3f}" if "M tokens/s" in label else f"{value:.3f}"
            goal_s = "" if goal is None else f"{op} {goal / 1e6 if 'M tokens/s' in label else goal:g}"
            rows.append((name, label, shown, goal_s, verdict(value, goal, op), f"{seconds:.0f}"))
    print()
    print_table(rows, ("benchmark", "measure", "value", "goal", "", "seconds"))
    if args.smoke:
        print("\n(smoke sizes: the values show the scripts work, not the project's performance)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
