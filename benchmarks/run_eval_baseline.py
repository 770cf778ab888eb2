"""The committed accuracy-vs-length baseline: memagent vs direct on the embedded default model.

What it measures (each job is one `memagent eval` run, resumable; sizes aim at under ~1 hour per job on
this 2-core CPU when nothing else runs; a smoke of one 7K sample took 514 s memagent / 102 s direct with
the CPU shared by 6 other processes, ~3x less alone):
- RULER-HotpotQA at 7K, 14K, 28K (n=6), SmolLM2-135M with its measured defaults (chunk 512, memory
  64). 7K fits SmolLM2's 8K window, so `direct` sees everything there and only a middle-truncated
  document beyond; memagent reads everything at every length.
- RULER niah_single_1 and niah_multikey_1 at 8K..128K (n=2), memagent with 2048-token chunks (512 would
  need 256 sequential updates per 128K sample, hours on this CPU), and direct.
- NIAH single_1/multikey_1 at 8K..128K with the lexical skip gate (chunk 512, n=4): most chunks cost
  no call, so this larger n fits.
- The crossover: niah_single_1 at 4K, 8K, 16K, 32K (around SmolLM2's 8K window), memagent (chunk 512) vs
  direct, n=8 each, seconds side by side.
Outputs: benchmarks/results/eval_<job>.json (the run's summary + command, date, machine, threads),
benchmarks/results/eval_ruler_hotpotqa.png and eval_niah.png (one line per run), and the per-sample
records under benchmarks/results/eval_runs/<job>/ (rerunning this script resumes unfinished jobs).

    nice -n 10 python benchmarks/run_eval_baseline.py                 # everything (several hours)
    nice -n 10 python benchmarks/run_eval_baseline.py --only hotpotqa-memagent hotpotqa-direct
    python benchmarks/run_eval_baseline.py --only niah-direct --n 1 --lengths 8192   # a quick subset
    python benchmarks/run_eval_baseline.py --smoke                    # n=1, shortest length, temp dir
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

NIAH_LENGTHS = "8192,16384,32768,65536,131072"
JOBS = {
    "hotpotqa-memagent": ["--task", "ruler-hotpotqa", "--lengths", "7k,14k,28k", "--n", "6", "--method", "memagent"],
    "hotpotqa-direct": ["--task", "ruler-hotpotqa", "--lengths", "7k,14k,28k", "--n", "6", "--method", "direct"],
    "niah-single-memagent": ["--task", "niah_single_1", "--lengths", NIAH_LENGTHS, "--n", "2", "--method", "memagent",
                             "--chunk-tokens", "2048"],
    "niah-multikey-memagent": ["--task", "niah_multikey_1", "--lengths", NIAH_LENGTHS, "--n", "2",
                               "--method", "memagent", "--chunk-tokens", "2048"],
    "niah-direct": ["--task", "niah_single_1,niah_multikey_1", "--lengths", NIAH_LENGTHS, "--n", "2",
                    "--method", "direct"],
    # the lexical skip gate (benchmarks/bench_gates.py): most NIAH chunks cost no call, so chunk 512 and
    # a larger n fit where plain memagent needed chunk 2048 and n=1
    "niah-memagent-skip": ["--task", "niah_single_1,niah_multikey_1", "--lengths", NIAH_LENGTHS, "--n", "4",
                           "--method", "memagent", "--skip-update", "lexical"],
    # where memagent and direct cross on the same model: around the 8K window, n=4, default settings
    "crossover-memagent": ["--task", "niah_single_1", "--lengths", "4096,8192,16384,32768", "--n", "8",
                           "--method", "memagent"],
    "crossover-direct": ["--task", "niah_single_1", "--lengths", "4096,8192,16384,32768", "--n", "8",
                         "--method", "direct"],
}
FIGURES = {"eval_ruler_hotpotqa.png": ["hotpotqa-memagent", "hotpotqa-direct"],
           "eval_niah.png": ["niah-single-memagent", "niah-multikey-memagent", "niah-direct", "niah-memagent-skip"],
           "eval_crossover.png": ["crossover-memagent", "crossover-direct"]}


def override(args: list[str], n: str | None = None, lengths: str | None = None) -> list[str]:
    """The same job with another N and/or lengths (the smoke: n=1 at its shortest length)."""
    out = list(args)
    if n:
        out[out.index("--n") + 1] = n
    if lengths:
        out[out.index("--lengths") + 1] = lengths
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=list(JOBS), help="run only these jobs")
    ap.add_argument("--smoke", action="store_true", help="n=1 at the shortest length, in a temp dir; writes nothing")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (recorded)")
    ap.add_argument("--concurrency", type=int, default=6, help="samples in flight (batched by the backend)")
    ap.add_argument("--n", default=None, help="override every chosen job's N (results go to the same folders)")
    ap.add_argument("--lengths", default=None, help="override every chosen job's lengths")
    opts = ap.parse_args()

    from memagent.cli import main as cli_main
    from memagent.evalplot import plot

    names = opts.only or list(JOBS)
    if opts.smoke:
        names = opts.only or ["hotpotqa-memagent", "hotpotqa-direct"]
    runs = Path(tempfile.mkdtemp(prefix="memagent-eval-smoke-")) if opts.smoke else RESULTS / "eval_runs"
    failed = []
    for name in names:
        job = JOBS[name]
        if opts.smoke:
            job = override(job, "1", job[job.index("--lengths") + 1].split(",")[0])
        job = override(job, opts.n, opts.lengths)
        argv = ["eval", *job, "--backend", "embedded", "--threads", str(opts.threads),
                "--concurrency", str(opts.concurrency), "--out", str(runs / name), "--no-plot"]
        print(f"== {name}: memagent {' '.join(argv)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        rc = cli_main(argv)
        wall = time.perf_counter() - t0
        summary_path = runs / name / "summary.json"
        if rc not in (0, 1) or not summary_path.is_file():  # 1 = some samples failed (recorded, counted)
            failed.append(name)
            continue
        summary = json.loads(summary_path.read_text())
        summary.update(job=name, command=f"python benchmarks/run_eval_baseline.py (job {name}): memagent "
                       + " ".join(argv), wall_seconds=round(wall, 1), threads=opts.threads,
                       date=datetime.datetime.now().isoformat(timespec="seconds"),
                       machine={**summary.get("machine", {}), "platform": platform.platform(),
                                "cpus": os.cpu_count()})
        for r in summary["results"]:
            print(f"   {r['task']:16} {r['length_label']:>7} {r['metric']} {r['accuracy']:6.2f}  n={r['n']} "
                  f"failures={r['failures']} {r['seconds_per_sample']}s/sample", file=sys.stderr)
        if not opts.smoke:
            (RESULTS / f"eval_{name.replace('-', '_')}.json").write_text(json.dumps(summary, indent=1) + "\n")
    for png, jobs in FIGURES.items():
        dirs = [runs / j for j in jobs if (runs / j / "samples.jsonl").is_file()]
        if dirs:
            target = runs / png if opts.smoke else RESULTS / png
            print(f"plot: {plot(dirs, target, title='SmolLM2-135M (embedded), memagent vs direct')}",
                  file=sys.stderr)
    if opts.smoke:
        print(f"smoke ok: {runs}", file=sys.stderr)
        shutil.rmtree(runs, ignore_errors=True)
    if failed:
        print(f"failed jobs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
