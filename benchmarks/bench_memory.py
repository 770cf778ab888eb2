"""Flat memory: peak RSS of a process streaming a big document vs a small one through chunking.

A document is generated on the fly into a temporary file under /tmp (Paul Graham essay paragraphs in
a shuffled order, each with a running number, so the text never repeats exactly and tokenizer caches
meet new pieces all the way), then a fresh subprocess streams it through `iter_chunks` (chunk 5000),
or with `--driver` through `MemoryAgent` with the in-process instant backend, and reports its peak RSS.
The files are deleted afterwards. Goal: peak(big) - peak(small) < 100 MB.

    python benchmarks/bench_memory.py                    # 10 MB vs 1 GB (minutes: it tokenizes 1 GB)
    python benchmarks/bench_memory.py --big-mb 200       # a shorter run
    python benchmarks/bench_memory.py --smoke            # 10 MB vs 50 MB
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, essays, write_result  # noqa: E402


def write_document(path: str, n_bytes: int, seed: int = 0) -> int:
    """Stream ~n_bytes of text into `path` without holding more than one paragraph list in memory."""
    paragraphs = [p for p in essays().split("\n\n") if p.strip()]
    rng = random.Random(seed)
    written, k = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n_bytes:
            rng.shuffle(paragraphs)
            for p in paragraphs:
                piece = f"[{k}] {p}\n\n"
                f.write(piece)
                written += len(piece.encode("utf-8"))
                k += 1
                if written >= n_bytes:
                    break
    return written


def child(path: str, mode: str, tokenizer: str, chunk_tokens: int) -> None:
    """Runs in the measured subprocess: stream the file, print JSON with peak RSS."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import smollm2_tokenizer

    tok = smollm2_tokenizer()
    if tokenizer == "fast":
        from memagent.backends import fast

        tok = fast(tok)
    path = Path(path)  # a str would be read as document text
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if mode == "chunks":
        from memagent.chunking import iter_chunks

        n_tokens = n_chunks = 0
        for c in iter_chunks(path, tok, chunk_tokens):
            n_tokens += c.n_tokens
            n_chunks += 1
    else:
        from memagent.backends.instant import InstantBackend
        from memagent.driver import MemoryAgent

        agent = MemoryAgent(InstantBackend(), tok, template="memagent", chunk_tokens=chunk_tokens)
        answer = agent.ask(path, "What is this about?")
        n_tokens, n_chunks = answer.doc_tokens, answer.chunks
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_before_mb": base / 1024, "tokens": n_tokens, "chunks": n_chunks,
                      "tokenizer_class": type(tok).__name__,
                      "seconds": time.perf_counter() - t}))


def measure(n_mb: float, mode: str, tokenizer: str, chunk_tokens: int) -> dict:
    fd, path = tempfile.mkstemp(prefix="memagent-bench-", suffix=".txt", dir="/tmp")
    os.close(fd)
    try:
        size = write_document(path, int(n_mb * 1e6))
        cmd = [sys.executable, __file__, "--child", path, "--mode", mode, "--tokenizer", tokenizer,
               "--chunk-tokens", str(chunk_tokens)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"child failed: {out.stderr[-2000:]}")
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        rec["bytes"] = size
        return rec
    finally:
        os.unlink(path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="10 MB vs 50 MB")
    ap.add_argument("--small-mb", type=float, default=10)
    ap.add_argument("--big-mb", type=float, default=None, help="default 1000 (smoke: 50)")
    ap.add_argument("--driver", action="store_true", help="through MemoryAgent + instant backend, not just chunking")
    ap.add_argument("--tokenizer", choices=["reference", "fast"], default="reference")
    ap.add_argument("--chunk-tokens", type=int, default=5000)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="chunks", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.mode, args.tokenizer, args.chunk_tokens)
        return {}
    big = args.big_mb or (50 if args.smoke else 1000)
    mode = "driver" if args.driver else "chunks"
    small_rec = measure(args.small_mb, mode, args.tokenizer, args.chunk_tokens)
    big_rec = measure(big, mode, args.tokenizer, args.chunk_tokens)
    diff = big_rec["peak_rss_mb"] - small_rec["peak_rss_mb"]
    result = {"mode": mode, "tokenizer": args.tokenizer, "chunk_tokens": args.chunk_tokens,
              "small": small_rec, "big": big_rec, "peak_rss_difference_mb": diff, "goal_mb": 100}
    path = write_result(f"memory_{mode}" + ("_fasttok" if args.tokenizer == "fast" else ""), result, smoke=args.smoke)
    for name, r in (("small", small_rec), ("big", big_rec)):
        print(f"{name:5s} {r['bytes'] / 1e6:8.1f} MB  {r['tokens']:>12,} tokens  peak RSS {r['peak_rss_mb']:7.1f} MB"
              f"  ({r['tokens'] / r['seconds'] / 1e6:.3f} M tokens/s)")
    print(f"peak RSS difference: {diff:.1f} MB (goal < 100 MB)")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
