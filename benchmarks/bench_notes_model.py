"""Before vs after: the untrained base against our trained memory model, same documents, same seeds.

Every cell is one `memagent eval` run (RULER tasks, greedy, the embedded defaults 512 / 64, the notes
template) or one planted-fact run (benchmarks/planted_fact.py, test split), for each model and with the
lexical skip gate off and on (the demo only off: it is the README's command as written). Runs go to
benchmarks/results/eval_runs/notes/<model>/<gate>/<cell> and resume where they stopped (rerun the same command); the table of every finished cell is collected into
benchmarks/results/notes_model.json with the command, date and machine, and printed.

    python benchmarks/bench_notes_model.py --cells niah_multikey_2@4k,niah_single_1@16k --n 8
    python benchmarks/bench_notes_model.py --cells planted@4 --n 10 --gates off
    python benchmarks/bench_notes_model.py --collect          # only rebuild the JSON from finished runs

A cell is TASK@LENGTH (any `memagent eval tasks` name; lengths as eval reads them, 4k = 4096) or
planted@CHUNKS, or demo (the README demo's two questions, scored against the answers its document states,
asked one after the other). `--engine llama.cpp` runs every cell on llama.cpp into rows (and folders)
named MODEL+llama.cpp, kept apart from the torch rows because the weights differ (Q4 base); the documents
are the same. `--adapter RUN/final` reads a training run's adapter on an untrained base, into rows named
MODEL+RUN. `--chunk-tokens` / `--memory-tokens` other than 512 / 64 (e.g. the issue's 1024 / 128 for
the untrained 0.5B) name the row MODEL@CHUNK-MEMORY, and `--seed N` (fresh documents of the same
generators, to confirm on documents no stage was chosen on) names it MODEL...+seedN. The documents are
generated from seeds (eval --seed 42, planted-fact's test split): none of them is in the training data,
whose generator (memagent/rl/notes_data.py) draws other keys, values and wordings, and whose
SQuAD/HotpotQA questions come from the other half of the articles.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "eval_runs" / "notes"
OUT = ROOT / "benchmarks" / "results" / "notes_model.json"


# The embedded defaults, spelled out: a model given as a folder would otherwise get the server defaults.
CHUNK, MEMORY = 512, 64


def settings(chunk: int, memory: int) -> list[str]:
    return ["--template", "notes", "--chunk-tokens", str(chunk), "--memory-tokens", str(memory)]


def row_key(model: str, engine: str, chunk: int = CHUNK, memory: int = MEMORY, adapter: str | None = None,
            seed: int | None = None, snap: int = 0) -> str:
    """The row (and folder) name: other weights (llama.cpp's Q4, an adapter), other read settings or other
    documents (--seed) are another row, never mixed into the default one."""
    from memagent.models import adapter_label

    key = Path(model).name + (f"+{adapter_label(adapter)}" if adapter else "")
    key += "+llama.cpp" if engine == "llama.cpp" else ""
    key += f"@{chunk}-{memory}" if (chunk, memory) != (CHUNK, MEMORY) else ""
    key += f"+snap{snap}" if snap else ""  # chunks ending at sentence ends (--chunk-snap): other chunks
    return key + (f"+seed{seed}" if seed is not None else "")


# The demo's questions and the answers its document states ("... is 943 millibars", "her name is Agnes Varley").
DEMO = {"What is the lowest barometer reading recorded in the ledger?": "943 millibars",
        "What is the name of the relief keeper?": "Agnes Varley"}


def ask_demo(args: list[str], env: dict | None = None) -> tuple[list[dict], int, float]:
    """The README demo's two questions in one `memagent ask` (memagent/examples/keeper_log.txt, never
    trained on) with `args` (model, engine, settings): (one scored row per question, exit code, seconds)."""
    cmd = [sys.executable, "-m", "memagent", "ask", str(ROOT / "memagent" / "examples" / "keeper_log.txt"),
           *DEMO, "--json", *args]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    replies = {r["question"]: r for r in map(json.loads, (ln for ln in proc.stdout.splitlines()
                                                            if ln.startswith("{")))}
    failed = {"answer": None, "memory": None, "seconds": 0.0,
              "error": proc.stderr.strip()[-500:] or f"no reply (exit {proc.returncode})"}
    runs = []
    for q, gold in DEMO.items():  # a question without a reply is a failed sample, never a dropped one
        r = {**failed, **replies.get(q, {})}
        runs.append({"question": q, "answer": r["answer"], "memory": r["memory"], "gold": gold,
                     "correct": gold.lower() in (r["answer"] or "").lower(), "seconds": r["seconds"],
                     "error": r["error"]})
    return runs, proc.returncode, round(time.time() - t0, 1)


def run_cell(model: str, gate: str, cell: str, n: int, concurrency: int, threads: int, engine: str = "torch",
             chunk: int = CHUNK, memory: int = MEMORY, adapter: str | None = None, seed: int | None = None,
             snap: int = 0) -> Path:
    name, _, at = cell.partition("@")
    folder = RUNS / row_key(model, engine, chunk, memory, adapter, seed, snap) / gate / cell.replace("@", "-")
    read_args = settings(chunk, memory) + (["--chunk-snap", str(snap)] if snap else [])
    # always explicit: a registered model's own default engine (memagent models) must not move a torch row
    engine_args = ["--engine", engine] + (["--adapter", adapter] if adapter else [])
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    seed_args = ["--seed", str(seed)] if seed is not None else []
    if name == "demo":  # the README demo's two questions on memagent/examples/keeper_log.txt (never trained on)
        out = folder / "demo.json"
        if gate != "off" or (out.is_file() and json.loads(out.read_text())["rc"] == 0):
            return folder  # a failed run is recorded, then retried by the next invocation
        runs, rc, wall = ask_demo(["--model", model, "--threads", str(threads)] + engine_args + read_args, env)
        out.write_text(json.dumps({"runs": runs, "rc": rc, "wall_seconds": wall}, indent=1) + "\n")
        return folder
    if name == "planted":
        out = folder / "planted.json"
        if out.is_file() and all(r["docs"] == n for r in json.loads(out.read_text())["runs"]):
            return folder
        cmd = [sys.executable, str(ROOT / "benchmarks" / "planted_fact.py"), "--split", "test", "--chunks", at,
               "--docs", str(n), "--model", model, "--concurrency", str(concurrency), "--out", str(out),
               "--threads", str(threads), "--templates", "notes", "--chunk-tokens", str(chunk),
               "--memory-tokens", str(memory), "--skip-update", gate] + engine_args + seed_args
    else:
        cmd = [sys.executable, "-m", "memagent", "eval", "--task", name, "--lengths", at, "--n", str(n),
               "--model", model, "--concurrency", str(concurrency), "--threads", str(threads),
               "--skip-update", gate, "--no-plot", "--out", str(folder)] + engine_args + read_args + seed_args
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return folder


def rows_of(model: str, gate: str, folder: Path) -> list[dict]:
    out = []
    planted = folder / "planted.json"
    if planted.is_file():
        d = json.loads(planted.read_text())
        for r in d["runs"]:
            out.append({"model": Path(model).name, "gate": gate, "task": "planted_fact", "length": f"{r['chunks']} chunks",
                        "n": r["docs"], "accuracy": round(100 * r["accuracy"], 1),
                        "seconds_per_doc": round(r["seconds"] / max(r["docs"], 1), 1),
                        "fact_in_memory": r["fact_in_final_memory"]}
                       | ({"skipped_chunks": r["skipped_chunks"]} if "skipped_chunks" in r else {}))
    demo = folder / "demo.json"
    if demo.is_file():
        runs = json.loads(demo.read_text())["runs"]
        out.append({"model": Path(model).name, "gate": gate, "task": "demo", "length": "2 chunks", "n": len(runs),
                    "accuracy": round(100 * sum(r["correct"] for r in runs) / max(len(runs), 1), 1),
                    "seconds_per_doc": round(sum(r["seconds"] for r in runs) / max(len(runs), 1), 1),
                    "answers": [r["answer"] for r in runs], "failures": sum(bool(r.get("error")) for r in runs)})
    summary = folder / "summary.json"
    if summary.is_file():
        d = json.loads(summary.read_text())
        for r in d["results"]:
            out.append({"model": Path(model).name, "gate": gate, "task": r["task"], "length": r["length"],
                        "n": r["n"], "accuracy": r["accuracy"], "seconds_per_doc": r["seconds_per_sample"],
                        "failures": r["failures"], "calls": r["calls"], "skipped_chunks": r.get("skipped_chunks")}
                       | documents(folder / "samples.jsonl", r["task"], r["length"], r["n"]))
    return out


def documents(samples: Path, task: str, length: int, n: int) -> dict:
    """Which of a cell's documents were answered right ("right_docs"), by index: two rows of the same seed
    read the same documents 0..n-1, so notes_grid.py can compare them document by document (a paired
    test) instead of only by their totals. Records are eval's own (`read_records`: a resumed document's
    last record, a torn last line of a run still going ignored); a failed sample is read and wrong. Only
    the summary's n documents count: a run growing the cell appends reads before its summary is rewritten,
    and a cell missing one of them, or with partial credit (a score between 0 and 1, which right and wrong
    do not split), gets no list rather than a guessed one."""
    from memagent.eval import read_records

    latest = {r["index"]: r.get("correct") or 0.0 for r in read_records(samples).values()
              if r.get("task") == task and r.get("length") == length and r.get("index", n) < n}
    if len(latest) != n or any(c not in (0.0, 1.0) for c in latest.values()):
        return {}
    return {"right_docs": sorted(i for i, c in latest.items() if c == 1.0)}


def collect(command: str) -> dict:
    rows = []
    for model_dir in sorted(RUNS.glob("*")):
        for gate_dir in sorted(model_dir.glob("*")):
            for cell in sorted(gate_dir.glob("*")):
                rows += rows_of(model_dir.name, gate_dir.name, cell)
    commands = json.loads(OUT.read_text()).get("commands", []) if OUT.is_file() else []
    if "--collect" not in command and command not in commands:
        commands.append(command)
    result = {"what": "accuracy (%) of the untrained base vs our trained memory model, greedy, same documents; "
                      "seconds_per_doc is wall time per document with the other documents of the cell read "
                      "concurrently (a loaded 2-core machine: training and tests ran beside it); "
                      "merged-sft / merged-rl: the stage-1 and stage-1+2 adapters merged into runs/ folders "
                      "(the same eval with --models runs/merged-sft), memagent-notes-135m: all three stages (shipped); "
                      "notes-135m-v2: a candidate stage 4 (configs/notes-135m-sft3.toml: prose facts, first token "
                      "weighted 4x) merged into runs/notes-135m-v2, measured and not shipped; qwen2.5-coder-0.5b: "
                      "the untrained 0.5B base; notes-qwen0.5b: the stage-1 0.5B adapter "
                      "(configs/notes-qwen0.5b-sft.toml, shipped as memagent-notes-0.5b until DAPO round 4) merged into "
                      "runs/notes-qwen0.5b (the 0.5B cells cut the same seeds' documents with Qwen's tokenizer); notes-qwen0.5b-v2: a candidate stage 2 on "
                      "the 0.5B (configs/notes-qwen0.5b-sft2.toml, from the shipped adapter) merged into "
                      "runs/notes-qwen0.5b-v2, measured and not shipped; notes-qwen0.5b-v3: a candidate stage 3 "
                      "(configs/notes-qwen0.5b-sft3.toml, from stage 2, prose facts in RULER noise too) merged "
                      "into runs/notes-qwen0.5b-v3, measured and not shipped; MODEL+llama.cpp: the same model on "
                      "--engine llama.cpp (the Q4 base, an adapter as a GGUF LoRA: other weights than torch's); "
                      "MODEL+RUN: MODEL with the adapter of runs/RUN/final (--adapter): notes-qwen0.5b-sft is "
                      "stage 1 (shipped until DAPO round 4), notes-qwen0.5b-rft is stage 1 + RFT "
                      "(configs/notes-qwen0.5b-rft.toml), measured and not shipped; notes-qwen0.5b-rft2 (not "
                      "shipped): RFT on that collection and one with later evidence "
                      "(configs/notes-qwen0.5b-rft2.toml); notes-qwen0.5b-rft3 (not shipped): the same reads plus "
                      "stay-empty turns (configs/notes-qwen0.5b-rft3.toml); notes-qwen0.5b-dapo: stage 1 + one "
                      "Multi-Conv DAPO step on stage 1's stored reads (configs/notes-qwen0.5b-dapo.toml); "
                      "dapo-r2-step / dapo-r3-step / dapo-r4-step: on-policy DAPO rounds 2-4 after it "
                      "(configs/notes-qwen0.5b-dapo{2,3,4}*.toml); dapo-r4-step is the shipped memagent-notes-0.5b; "
                      "notes-qwen0.5b-dapo5: round 5 from it (configs/notes-qwen0.5b-dapo5*.toml), not shipped; "
                      "notes-0.5b: the shipped adapter folder read with --adapter; ROW+seedN: fresh documents "
                      "(eval --seed N, planted_fact --seed N) instead of the fixed measuring ones; "
                      "MODEL@CHUNK-MEMORY: read with those chunk / memory tokens instead of 512 / 64; "
                      "demo: the README demo's two questions (accuracy over the 2), asked in one read; "
                      "right_docs: the indices (0..n-1) of a RULER cell's documents answered right "
                      "(same seed, same documents across rows: notes_grid.py pairs them)",
              "commands": commands, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "rows": rows}
    # a row's document lists on one line each: one index per line would bury the rows
    text = re.sub(r"\[(\s*\d+,?)+\s*\]", lambda m: json.dumps(json.loads(m.group(0))), json.dumps(result, indent=1))
    OUT.write_text(text + "\n")
    return result


def print_table(result: dict) -> None:
    cells = sorted({(r["task"], str(r["length"]), r["gate"]) for r in result["rows"]})
    models = sorted({r["model"] for r in result["rows"]})
    print("| task | length | gate | " + " | ".join(f"{m} acc (n) | s/doc" for m in models) + " |")
    print("|---|---|---|" + "---|---|" * len(models))
    for task, length, gate in cells:
        line = f"| {task} | {length} | {gate} |"
        for m in models:
            r = next((x for x in result["rows"] if (x["task"], str(x["length"]), x["gate"], x["model"]) ==
                      (task, length, gate, m)), None)
            line += f" {r['accuracy']:.0f}% ({r['n']}) | {r['seconds_per_doc']} |" if r else " — | — |"
        print(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m,memagent-notes-135m", help="comma list: registry names or HF folders")
    ap.add_argument("--cells", default="niah_single_1@16k,niah_multikey_2@16k,planted@4")
    ap.add_argument("--gates", default="off,lexical", help="skip-update modes to run: off, lexical")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8, help="documents read at once (batched)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", choices=("torch", "llama.cpp"), default="torch",
                    help="the embedded engine; llama.cpp rows are named MODEL+llama.cpp (registry names only)")
    ap.add_argument("--chunk-tokens", type=int, default=CHUNK, help="another value names the row MODEL@CHUNK-MEMORY")
    ap.add_argument("--memory-tokens", type=int, default=MEMORY)
    ap.add_argument("--adapter", default=None, help="a LoRA adapter folder (a run's final/) applied to every model "
                                                    "(untrained bases); rows are named MODEL+RUN")
    ap.add_argument("--seed", type=int, default=None,
                    help="fresh documents: eval's data seed and planted_fact's document seed (default: the fixed "
                         "measuring documents, eval seed 42 and planted seed 0); rows are named MODEL...+seedN")
    ap.add_argument("--chunk-snap", type=int, default=0, metavar="N",
                    help="end chunks at the last sentence end within their final N tokens (memagent --chunk-snap); "
                         "rows are named MODEL...+snapN")
    ap.add_argument("--collect", action="store_true", help="only rebuild the JSON from finished runs")
    args = ap.parse_args(argv)
    if args.seed is not None and "demo" in args.cells.split(","):
        ap.error("the demo is one fixed document: run it without --seed")
    if args.chunk_snap and any(c.startswith("planted") for c in args.cells.split(",")):
        ap.error("--chunk-snap is for RULER cells and the demo (planted_fact.py cuts its own chunks)")
    if args.engine != "torch" and any(Path(m).is_dir() for m in args.models.split(",")):
        ap.error("--engine llama.cpp reads registered models (a GGUF); an HF folder runs on --engine torch")
    command = "python benchmarks/bench_notes_model.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if not args.collect:
        for cell in args.cells.split(","):
            for gate in args.gates.split(","):
                for model in args.models.split(","):
                    run_cell(model, gate, cell, args.n, args.concurrency, args.threads, args.engine,
                             args.chunk_tokens, args.memory_tokens, args.adapter, args.seed, args.chunk_snap)
                    print_table(collect(command))
    print_table(collect(command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
