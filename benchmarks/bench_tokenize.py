"""Tokenising and chunking throughput, and the fast tokenizer's exactness.

Measures, side by side in one run and repeated (median): the reference `tokenizers` encoder called
once per 256K-character block, the same encoder batch-encoding 8 blocks (both cores),
`memagent.fasttok.FastBPETokenizer` (numpy piece cache, the fallback without a C compiler) and
`memagent.nativebpe.NativeBPETokenizer` (the C encoder, the default), each cold (a new tokenizer: first
sight of the text) and warm (its piece cache filled). Then `iter_chunks` (chunk 5000) over the whole
corpus with each tokenizer, cold. Before timing anything it checks that both fast tokenizers give the
reference's ids and offsets for every block of the corpus (Paul Graham essays, HotpotQA paragraphs,
generated many-script text, and text with special tokens in it).

    python benchmarks/bench_tokenize.py            # full: ~6.5 M characters
    python benchmarks/bench_tokenize.py --smoke    # seconds
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import essays, hotpot_paragraphs, median, smollm2_tokenizer, unicode_text, write_result  # noqa: E402

BLOCK = 1 << 18  # the chunker's block size


def corpus(smoke: bool) -> dict[str, str]:
    if smoke:
        return {"essays": essays()[:150_000], "hotpotqa": hotpot_paragraphs(150_000), "unicode": unicode_text(60_000)}
    return {"essays": essays(), "hotpotqa": hotpot_paragraphs(3_000_000), "unicode": unicode_text(500_000, seed=1)}


def blocks_of(text: str, tok) -> list[str]:
    """Cut where the chunker would (safe cuts), so per-block results equal whole-text results."""
    out, pos = [], 0
    while len(text) - pos > BLOCK:
        cut = tok.safe_cut(text, pos + BLOCK)
        if cut <= pos:
            cut = pos + BLOCK
        out.append(text[pos:cut])
        pos = cut
    out.append(text[pos:])
    return out


def verify(ref, fast, blocks: list[str]) -> dict:
    """Id-for-id, offset-for-offset comparison of every block; returns counts (raises on a difference)."""
    tokens = 0
    for i, b in enumerate(blocks):
        want, got = ref.encode_offsets(b), fast.encode_offsets(b)
        if want != got:
            at = next((k for k, (x, y) in enumerate(zip(want[0], got[0])) if x != y), None)
            raise SystemExit(f"fast tokenizer differs from the reference in block {i} (token {at})")
        if ref.encode(b) != fast.encode(b):
            raise SystemExit(f"fast tokenizer's encode() differs in block {i}")
        tokens += len(want[0])
    return {"blocks": len(blocks), "tokens": tokens}


def special_text_check(ref, fast) -> bool:
    text = "Hello <|im_start|>user\nhi<|im_end|> there <|endoftext|> and <repo_name> done." * 50
    return ref.encode_offsets(text) == fast.encode_offsets(text) and fast.stats["fallback"] > 0


def rate(fn, blocks) -> tuple[float, int]:
    t = time.perf_counter()
    n = sum(len(ids) for ids, _ in fn(blocks))
    return n / (time.perf_counter() - t), n


def chunk_rate(text: str, tok, chunk_tokens: int = 5000) -> float:
    from memagent.chunking import iter_chunks

    t = time.perf_counter()
    n = sum(c.n_tokens for c in iter_chunks(text, tok, chunk_tokens))
    return n / (time.perf_counter() - t)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a seconds-long version")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.smoke else 3)

    from memagent import nativebpe
    from memagent.fasttok import FastBPETokenizer

    ref = smollm2_tokenizer()
    texts = corpus(args.smoke)
    blocks = [b for t in texts.values() for b in blocks_of(t, ref)]
    chars = sum(map(len, texts.values()))
    fast_kinds = {"fast": FastBPETokenizer}
    if nativebpe.load_module() is not None:
        fast_kinds["native"] = nativebpe.NativeBPETokenizer
    else:
        print(f"no C encoder: {nativebpe.build_error}")
    checked = {}
    for kind, cls in fast_kinds.items():
        checker = cls(ref)
        checked[kind] = verify(ref, checker, blocks)
        checked[kind]["special_tokens_fallback_ok"] = special_text_check(ref, checker)
        print(f"verified {kind}: {checked[kind]['tokens']:,} tokens in {checked[kind]['blocks']} blocks "
              f"({chars:,} characters) identical ids and offsets")

    timing = sorted(blocks, key=len, reverse=True)[: max(1, len(blocks) // 2)]  # time a part, not all
    single = lambda bs: [ref.encode_offsets(b) for b in bs]  # noqa: E731
    batch = lambda bs: [r for i in range(0, len(bs), 8) for r in ref.encode_batch_offsets(bs[i:i + 8])]  # noqa: E731
    runs = {"reference_single": [], "reference_batch": []}
    runs.update({f"{kind}_{state}": [] for kind in fast_kinds for state in ("cold", "warm")})
    for _ in range(repeats):  # alternate so that a noisy neighbour hits every variant alike
        runs["reference_single"].append(rate(single, timing)[0])
        runs["reference_batch"].append(rate(batch, timing)[0])
        for kind, cls in fast_kinds.items():
            fast = cls(ref)
            runs[f"{kind}_cold"].append(rate(fast.encode_batch_offsets, timing)[0])
            runs[f"{kind}_warm"].append(rate(fast.encode_batch_offsets, timing)[0])
    tok_s = {k: median(v) for k, v in runs.items()}

    whole = "".join(texts.values())
    chunk_runs = {"reference": [], **{kind: [] for kind in fast_kinds}}
    for _ in range(max(1, repeats - 1)):
        chunk_runs["reference"].append(chunk_rate(whole, ref))
        for kind, cls in fast_kinds.items():
            chunk_runs[kind].append(chunk_rate(whole, cls(ref)))  # cold cache: a fresh document
    chunk_s = {k: median(v) for k, v in chunk_runs.items()}

    ratios = {}
    for kind in fast_kinds:
        ratios.update({
            f"{kind}_warm_vs_reference_single": tok_s[f"{kind}_warm"] / tok_s["reference_single"],
            f"{kind}_warm_vs_reference_batch": tok_s[f"{kind}_warm"] / tok_s["reference_batch"],
            f"{kind}_cold_vs_reference_single": tok_s[f"{kind}_cold"] / tok_s["reference_single"],
            f"{kind}_cold_vs_reference_batch": tok_s[f"{kind}_cold"] / tok_s["reference_batch"],
            f"chunking_{kind}_vs_reference": chunk_s[kind] / chunk_s["reference"],
        })
    result = {"verified": checked, "corpus_chars": {k: len(v) for k, v in texts.items()},
              "timed_tokens": sum(len(ref.encode(b)) for b in timing) if args.smoke else None,
              "tokens_per_s": tok_s, "chunking_tokens_per_s": chunk_s, "ratios": ratios,
              "runs": runs, "chunk_runs": chunk_runs, "repeats": repeats, "goal_tokens_per_s": 1.5e6,
              "native_build_error": nativebpe.build_error}
    path = write_result("tokenize", result, smoke=args.smoke)
    for k, v in tok_s.items():
        print(f"encode {k:18s} {v / 1e6:6.3f} M tokens/s")
    for k, v in chunk_s.items():
        print(f"chunk  {k:18s} {v / 1e6:6.3f} M tokens/s")
    for k, v in ratios.items():
        print(f"ratio  {k:34s} {v:5.2f}")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
