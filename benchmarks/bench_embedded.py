"""Speed of the embedded backend on this machine: load, prefill, decode, memory-update calls, batching,
KV prefix reuse and torch threads, side by side in one run (medians over repeats).

Why these numbers: the reader's cost per chunk is one prefill of (instruction + question + memory +
chunk) plus a decode of up to `memory_tokens` tokens, so the embedded defaults for chunk and memory
size are picked from the seconds-per-update grid below, and the batching/prefix-reuse defaults from the
side-by-side rows.

    nice -n 5 python benchmarks/bench_embedded.py            # full run, ~10 min on 2 cores
    python benchmarks/bench_embedded.py --smoke              # seconds-long check (CI); writes nothing
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # same as the backend; recorded in the results

RESULTS = Path(__file__).resolve().parent / "results" / "embedded_speed.json"
QUESTIONS = ["What did the author regret most about his first startup?",
             "Which programming language does the essay recommend for beginners?",
             "Why did the investors turn down the company in 2005?",
             "What is the main risk the author sees in raising too much money?",
             "Who founded the company that the author compares to a painting studio?",
             "How many founders did the essay say a startup should have?",
             "What advice is given about hiring the first employees?",
             "Which city does the author think is best for starting a company?"]


def essay_text() -> str:
    import importlib.resources as r

    return json.loads((r.files("long_context_eval") / "data/synthetic/json/PaulGrahamEssays.json").read_text())["text"]


class Texts:
    """Cuts of real essay text of an exact token length, from different places (no accidental reuse)."""

    def __init__(self, tokenizer, chars: int):
        self.tok, self.ids, self.pos = tokenizer, tokenizer.encode(essay_text()[:chars]), 0

    def take(self, n: int) -> str:
        piece = self.ids[self.pos:self.pos + n]
        self.pos += n
        return self.tok.decode(piece)


def med(xs):
    return round(statistics.median(xs), 4)


async def timed(backend, req):
    t = time.perf_counter()
    gen = await backend.generate(req)
    return time.perf_counter() - t, gen


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def measure(args, out: dict) -> None:
    from memagent import models
    from memagent.backends.embedded import EmbeddedBackend
    from memagent.prompts import load_template
    from memagent.protocol import GenerationRequest as Req
    from memagent.reader import Reader, ReaderConfig
    from memagent.tokenizer import HFTokenizer

    import torch

    tok = HFTokenizer.from_file(models.tokenizer_path(args.model))
    texts = Texts(tok, 30_000 if args.smoke else 300_000)
    R = args.repeats

    # load: first call converts/caches nothing (the HF folder exists); we time the folder -> model step
    loads = []
    for _ in range(R):
        t = time.perf_counter()
        backend = EmbeddedBackend.load(args.model, threads=args.threads, max_batch=8)
        loads.append(time.perf_counter() - t)
        if len(loads) < R:
            await backend.aclose()
    out["load_s"] = med(loads)
    out["torch_threads"] = torch.get_num_threads()
    step(f"load {out['load_s']:.2f} s")

    # prefill: max_tokens=1 so the time is the prompt's forward plus one sampling step
    out["prefill_tok_s"] = {}
    for n in args.prefill_sizes:
        runs = [await timed(backend, Req(user(texts.take(n)), max_tokens=1)) for _ in range(R)]
        out["prefill_tok_s"][str(n)] = med([g.prompt_tokens / s for s, g in runs])
        step(f"prefill {n}: {out['prefill_tok_s'][str(n)]:.0f} tok/s")

    # decode: end-of-sequence disabled (white-box) so every run produces exactly N tokens; the rate is
    # (N-1) / (time for N tokens - time for 1 token), so the prompt's prefill cancels out. Side by side:
    # the same model through transformers' `model.generate` (min_new_tokens forces the length).
    eos = backend.eos_ids
    backend.eos_ids = {-1}
    prompt = user("Write a long story about a lighthouse keeper.")
    prompt_ids = torch.tensor([backend._prompt_ids(prompt)])

    def hf_generate(n):
        with torch.inference_mode():
            t = time.perf_counter()
            backend.model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=n,
                                   min_new_tokens=n, do_sample=False, pad_token_id=min(eos))
            return time.perf_counter() - t

    ours, theirs = [], []
    for _ in range(R):
        one, _ = await timed(backend, Req(prompt, max_tokens=1))
        s, g = await timed(backend, Req(prompt, max_tokens=args.gen_tokens))
        ours.append((g.completion_tokens - 1) / max(s - one, 1e-6))
        theirs.append((args.gen_tokens - 1) / max(hf_generate(args.gen_tokens) - hf_generate(1), 1e-6))
    out["decode_tok_s"] = {"tokens": args.gen_tokens, "batch1": med(ours), "hf_generate_batch1": med(theirs)}
    step(f"decode {args.gen_tokens} tok: {med(ours):.1f} tok/s (model.generate: {med(theirs):.1f})")

    # decode throughput by batch size: B short prompts at once, N tokens each (prefill negligible)
    by_batch = {}
    backend.max_batch = max(args.decode_batches)
    for b in args.decode_batches:
        reqs = [Req(user(f"Story number {i}: write about a lighthouse keeper."), max_tokens=args.gen_tokens)
                for i in range(b)]
        s = time.perf_counter()
        gens = await asyncio.gather(*[backend.generate(r) for r in reqs])
        by_batch[str(b)] = round(sum(g.completion_tokens for g in gens) / (time.perf_counter() - s), 2)
    backend.max_batch = 8
    out["decode_tok_s"]["by_batch"] = by_batch
    step(f"decode throughput by batch: {by_batch} tok/s")
    backend.eos_ids = eos

    # seconds per memory-update call (notes template, real text, natural stop), plus a worst case where
    # the reply runs to the memory cap (prefill measured + cap x the measured decode step)
    template = load_template("notes")
    grid = []
    for mem in args.memory_sizes:
        reader = Reader(template, tok, ReaderConfig(memory_tokens=mem))
        for chunk in args.chunk_sizes:
            secs, gens = [], []
            for r in range(args.grid_repeats):
                state = reader.start(QUESTIONS[r % len(QUESTIONS)])
                state = replace(state, memory=texts.take(mem))
                s, g = await timed(backend, reader.update_request(state, texts.take(chunk)))
                secs.append(s)
                gens.append(g)
            prompt = med([g.prompt_tokens for g in gens])
            row = {"chunk_tokens": chunk, "memory_tokens": mem, "prompt_tokens": prompt,
                   "completion_tokens": med([g.completion_tokens for g in gens]),
                   "seconds": med(secs),
                   "worst_case_seconds": round(prompt / out["prefill_tok_s"][str(args.prefill_sizes[0])]
                                               + mem / out["decode_tok_s"]["batch1"], 2)}
            grid.append(row)
            step(f"update chunk {chunk} mem {mem}: {row['seconds']:.1f} s ({row['completion_tokens']} tok), "
                 f"worst {row['worst_case_seconds']:.1f} s")
    out["update_call"] = grid

    # batching: N different questions' update prompts at once, fixed reply length, max_batch 1/4/8
    backend.eos_ids = {-1}
    reader = Reader(template, tok, ReaderConfig(memory_tokens=args.batch_gen))
    prompts = []
    for i in range(args.batch_requests):
        state = reader.start(QUESTIONS[i % len(QUESTIONS)])
        state = replace(state, memory=texts.take(64))
        prompts.append(reader.update_request(state, texts.take(args.batch_chunk)))
    batching = {}
    for mb in args.batch_sizes:
        backend.max_batch = mb
        backend.prefix_cache = False
        t, cpu = time.perf_counter(), time.process_time()
        gens = await asyncio.gather(*[backend.generate(p) for p in prompts])
        s = time.perf_counter() - t
        batching[str(mb)] = {"seconds": round(s, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
                             "requests": len(prompts),
                             "generated_tok_s": round(sum(g.completion_tokens for g in gens) / s, 2),
                             "seconds_per_request": round(s / len(prompts), 2)}
        step(f"max_batch {mb}: {s:.1f} s ({batching[str(mb)]['cpu_seconds']:.1f} CPU s) for {len(prompts)} requests "
             f"({batching[str(mb)]['generated_tok_s']:.1f} generated tok/s)")
    out["batching"] = {"chunk_tokens": args.batch_chunk, "reply_tokens": args.batch_gen, "by_max_batch": batching}
    backend.eos_ids = eos
    backend.max_batch = 8

    # prefix reuse: the same question over consecutive chunks (one cache key), short replies so the
    # prefill difference shows; identical outputs are checked by the tests, recorded here too
    reuse = {}
    chunks = [texts.take(args.reuse_chunk) for _ in range(args.reuse_calls)]
    memories = [texts.take(64) for _ in range(args.reuse_calls)]
    reader = Reader(template, tok, ReaderConfig(memory_tokens=args.reuse_gen))
    for on in (False, True, False, True):
        backend.prefix_cache = on
        backend.clear_prefix_cache()
        secs, texts_out, reused, prompt = [], [], 0, 0
        cpu = time.process_time()
        for c, m in zip(chunks, memories):
            state = reader.start(QUESTIONS[0])
            state = replace(state, memory=m)
            s, g = await timed(backend, reader.update_request(state, c))
            secs.append(s)
            texts_out.append(g.text)
            reused += g.extra.get("reused_prompt_tokens", 0)
            prompt += g.prompt_tokens
        key = "on" if on else "off"
        entry = reuse.setdefault(key, {"runs_s": [], "cpu_s": [], "reused_tokens": reused, "prompt_tokens": prompt})
        entry["runs_s"].append(round(sum(secs[1:]), 3))  # the first call of a key cannot reuse anything
        entry["cpu_s"].append(round(time.process_time() - cpu, 3))  # all calls: our own work, whatever the load
        entry["outputs"] = texts_out
    for entry in reuse.values():
        entry["seconds_calls_2_to_n"] = med(entry["runs_s"])
        entry["cpu_seconds_all_calls"] = med(entry["cpu_s"])
    same = reuse["on"].pop("outputs") == reuse["off"].pop("outputs")
    out["prefix_reuse"] = {"chunk_tokens": args.reuse_chunk, "calls": args.reuse_calls, "reply_tokens": args.reuse_gen,
                           "identical_outputs": same, **reuse,
                           "speedup": round(reuse["off"]["seconds_calls_2_to_n"] / reuse["on"]["seconds_calls_2_to_n"], 3)}
    step(f"prefix reuse off {reuse['off']['seconds_calls_2_to_n']:.2f} s, on {reuse['on']['seconds_calls_2_to_n']:.2f} s "
         f"({reuse['on']['reused_tokens']}/{reuse['on']['prompt_tokens']} prompt tokens reused), identical={same}")
    # RL group sampling: G rollouts of one question start from the *same* first-chunk prompt, so all
    # but the first reuse the whole prompt (prefill only, max_tokens=1)
    state = replace(reader.start(QUESTIONS[1]), memory=template.empty_memory)
    group = reader.update_request(state, texts.take(args.reuse_chunk))
    group.max_tokens = 1
    for on in (False, True):
        backend.prefix_cache = on
        backend.clear_prefix_cache()
        t, cpu = time.perf_counter(), time.process_time()
        gens = await asyncio.gather(*[backend.generate(group) for _ in range(args.group_size)])
        out["prefix_reuse"][f"group_{'on' if on else 'off'}_s"] = round(time.perf_counter() - t, 2)
        out["prefix_reuse"][f"group_{'on' if on else 'off'}_cpu_s"] = round(time.process_time() - cpu, 2)
        out["prefix_reuse"][f"group_{'on' if on else 'off'}_reused"] = sum(g.extra["reused_prompt_tokens"] for g in gens)
    out["prefix_reuse"]["group_size"] = args.group_size
    step(f"group of {args.group_size} identical prompts: off {out['prefix_reuse']['group_off_s']:.1f} s, "
         f"on {out['prefix_reuse']['group_on_s']:.1f} s")
    backend.prefix_cache = True

    # torch threads: decode rate at 1 thread vs all cores, each in a fresh backend (own worker thread),
    # run last because torch's thread setting is process-wide
    if args.threads_probe:
        probe = {}
        for nt in sorted({1, os.cpu_count() or 1}):
            b2 = EmbeddedBackend(backend.model, backend.tokenizer, threads=nt)
            b2.eos_ids = {-1}
            s, g = await timed(b2, Req(user("Tell me about the sea."), max_tokens=args.gen_tokens // 2))
            await b2.aclose()
            probe[str(nt)] = round(g.completion_tokens / s, 2)
        torch.set_num_threads(out["torch_threads"])
        out["decode_tok_s_by_threads"] = probe
        step(f"threads: {probe}")
    await backend.aclose()


def step(msg: str) -> None:
    print(f"  {msg}", flush=True)


def print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"embedded backend speed ({out['model']}, {out['torch_threads']} torch threads)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("load (HF folder)", f"{out['load_s']:.2f} s")
    for n, v in out["prefill_tok_s"].items():
        t.add_row(f"prefill {n}-token prompt", f"{v:.0f} tok/s")
    d = out["decode_tok_s"]
    t.add_row(f"decode {d['tokens']} tokens, batch 1 (this loop)", f"{d['batch1']:.1f} tok/s")
    t.add_row(f"decode {d['tokens']} tokens, batch 1 (model.generate)", f"{d['hf_generate_batch1']:.1f} tok/s")
    for b, v in d["by_batch"].items():
        t.add_row(f"decode throughput, {b} requests at once", f"{v:.1f} tok/s")
    for n, v in out.get("decode_tok_s_by_threads", {}).items():
        t.add_row(f"decode at {n} torch thread(s)", f"{v:.1f} tok/s")
    for r in out["update_call"]:
        t.add_row(f"update call chunk {r['chunk_tokens']} / memory {r['memory_tokens']}",
                  f"{r['seconds']:.1f} s ({r['completion_tokens']} tok); cap {r['worst_case_seconds']:.1f} s")
    for mb, v in out["batching"]["by_max_batch"].items():
        t.add_row(f"max_batch {mb}: {v['requests']} requests", f"{v['seconds_per_request']:.2f} s/request, "
                  f"{v['generated_tok_s']:.1f} gen tok/s, {v['cpu_seconds']:.0f} CPU s")
    p = out["prefix_reuse"]
    t.add_row("prefix reuse off / on (calls 2..n)",
              f"{p['off']['seconds_calls_2_to_n']:.2f} / {p['on']['seconds_calls_2_to_n']:.2f} s (x{p['speedup']})")
    t.add_row("prefix reuse off / on, CPU s of all calls",
              f"{p['off']['cpu_seconds_all_calls']:.2f} / {p['on']['cpu_seconds_all_calls']:.2f} CPU s")
    t.add_row(f"prefix reuse off / on, {p['group_size']} identical prompts (RL group)",
              f"{p['group_off_s']:.1f} / {p['group_on_s']:.1f} s ({p['group_off_cpu_s']:.1f} / {p['group_on_cpu_s']:.1f} CPU s)")
    Console(width=120).print(t)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run with tiny sizes; writes nothing")
    ap.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS}; none with --smoke)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats, args.grid_repeats, args.prefill_sizes, args.gen_tokens = 1, 1, [64], 8
        args.memory_sizes, args.chunk_sizes, args.threads_probe = [16], [64], False
        args.batch_requests, args.batch_chunk, args.batch_gen, args.batch_sizes = 2, 32, 4, [1, 2]
        args.decode_batches, args.group_size = [1, 2], 2
        args.reuse_chunk, args.reuse_calls, args.reuse_gen = 32, 2, 2
    else:
        args.repeats, args.grid_repeats, args.prefill_sizes, args.gen_tokens = 3, 2, [512, 2000], 64
        args.memory_sizes, args.chunk_sizes, args.threads_probe = [128, 256], [256, 512, 1024], True
        args.batch_requests, args.batch_chunk, args.batch_gen, args.batch_sizes = 8, 256, 32, [1, 4, 8]
        args.decode_batches, args.group_size = [1, 4, 8, 16], 8
        args.reuse_chunk, args.reuse_calls, args.reuse_gen = 512, 4, 4
    out = {"command": " ".join([Path(sys.executable).name] + sys.argv),
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": platform.platform(), "cpu_count": os.cpu_count(), "model": args.model,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "load_average_before": [round(x, 2) for x in os.getloadavg()]}
    t0 = time.perf_counter()
    asyncio.run(measure(args, out))
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print_table(out)
    path = args.out or (None if args.smoke else RESULTS)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
