"""RULER-HotpotQA as MemAgent built it, and RULER's document-QA tasks (qa_1 SQuAD, qa_2 HotpotQA).

Recipe (MemAgent `taskutils/memory_data`, RULER `qa.py`): the pool is every unique paragraph of the dev
set ("title\\nsentences", sorted; 66,635 for HotpotQA). A sample is the question's own paragraphs plus
random pool paragraphs, shuffled, rendered as "Document i:\\n<paragraph>" blocks separated by a blank
line. The same questions are used at every length.

What we do differently, and why:
- Length is a token budget in the *model's* tokenizer, not a paragraph count. MemAgent's "7K" is 50
  paragraphs (~137-140 Qwen tokens each); we add paragraphs until the next one would overshoot the
  target, so a sample lands within `TOLERANCE` below the target (paragraphs that do not fit are skipped,
  not cut). Gold paragraphs (HotpotQA supporting facts; the SQuAD paragraph) are always kept; the
  question's other paragraphs come next, then random ones.
- Question choice: MemAgent kept the first 128 dev questions that Qwen2.5-7B could not answer without
  the document (a filter that needs that model). We take the first N of a seeded shuffle of the dev set,
  so N=10 is a prefix of N=128 and every length sees the same questions.
- Random paragraphs for one question are drawn in one seeded order, so a longer sample of a question
  contains every paragraph of its shorter samples (accuracy-vs-length compares like with like); the
  order of documents is shuffled per length.
"""
from __future__ import annotations

import random

import numpy as np

from ..tokenizer import Tokenizer
from .data import CountCache, DocQACorpus, QARecord, count_tokens

# A sample's document is within 1% below the target (never above: counts are summed in context and
# match a whole tokenization to a token or two). Below ~4K tokens, or with SQuAD's small pool (1,204
# paragraphs of ~150 tokens), the last paragraph that fits may leave it a little further below.
TOLERANCE = 0.01
MAX_SKIPS = 64  # paragraphs tried in a row that do not fit before the document is considered full


def header(i: int) -> str:
    return f"Document {i}:\n" if i == 1 else f"\n\nDocument {i}:\n"


class DocQABuilder:
    """Builds samples of one document-QA corpus for one tokenizer; reuse it across samples."""

    def __init__(self, corpus: DocQACorpus, tokenizer: Tokenizer, persist_counts: bool = True):
        self.corpus, self.tokenizer = corpus, tokenizer
        self.counts = CountCache(corpus.name, corpus.docs, tokenizer, persist=persist_counts)
        self._headers: list[int] = [0]  # _headers[k] = tokens of the first k headers together

    def header_tokens(self, k: int) -> int:
        """Tokens of headers 1..k (the header text depends only on the position, not the paragraph)."""
        if k >= len(self._headers):
            upto = max(k + 1, 2 * len(self._headers))
            lo = len(self._headers)
            new = count_tokens(self.tokenizer, [header(i) for i in range(lo, upto)])
            acc = self._headers[-1]
            for n in new:
                acc += n
                self._headers.append(acc)
        return self._headers[k]

    def questions(self, n: int, seed: int, split: str | None = None) -> list[QARecord]:
        """n questions in a seeded order; `split` keeps only that half of the articles (data.split_of)."""
        order = list(range(len(self.corpus.records)))
        random.Random(f"{seed}/{self.corpus.name}/questions").shuffle(order)
        if split is not None:
            order = [i for i in order if self.corpus.records[i].split == split]
        if n > len(order):
            raise ValueError(f"{self.corpus.name} has {len(order)} questions{f' in its {split} split' if split else ''}; "
                             f"asked for {n}")
        return [self.corpus.records[i] for i in order[:n]]

    def select(self, rec: QARecord, target: int, seed: int) -> tuple[list[int], int]:
        """Pool indices for the sample and their total tokens (paragraphs + headers)."""
        must = list(dict.fromkeys(rec.must))
        total = int(self.counts.get(must).sum()) + self.header_tokens(len(must))
        if total > target:
            raise ValueError(f"{self.corpus.name}: {target} tokens is too short for question {rec.qid}: its gold "
                             f"paragraphs alone take {total} tokens")
        if target > 500_000:  # a large sample touches a third of the pool or more: count it all at once
            self.counts.ensure_all()
        chosen, taken = must, set(must)
        rng = random.Random(f"{seed}/{self.corpus.name}/{rec.qid}/fill")
        own = [i for i in rec.own if i not in taken]
        more = [i for i in rec.more if i not in taken and i not in own]
        rng.shuffle(more)

        def candidates():
            yield from own
            yield from more
            perm = np.random.default_rng(rng.getrandbits(64)).permutation(len(self.corpus.docs))
            yield from (int(i) for i in perm)

        skips, pending = 0, []
        cand = candidates()
        lo = target * (1 - TOLERANCE)
        while skips < MAX_SKIPS:
            if not pending:  # count the next block of candidates in one batch
                need = max(16, min(4096, int((target - total) / 100) + 16))
                block = [i for _, i in zip(range(need), cand)]
                if not block:
                    break
                pending = list(zip(block, self.counts.get(block).tolist()))[::-1]
            i, c = pending.pop()
            if i in taken:
                continue
            add = c + self.header_tokens(len(chosen) + 1) - self.header_tokens(len(chosen))
            if total + add <= target:
                chosen.append(i)
                taken.add(i)
                total += add
                skips = 0
            elif total >= lo:
                skips += 1
        self.counts.save()
        return chosen, total

    def render(self, docs: list[int], order_seed: str) -> str:
        docs = list(docs)
        random.Random(order_seed).shuffle(docs)
        texts = self.corpus.docs
        return "".join(header(k + 1) + texts[i] for k, i in enumerate(docs))

    def build(self, rec: QARecord, target: int, seed: int) -> tuple[str, int, dict]:
        """(document, estimated tokens, meta) for one question at one length."""
        chosen, total = self.select(rec, target, seed)
        text = self.render(chosen, f"{seed}/{self.corpus.name}/{rec.qid}/{target}/order")
        meta = {"qid": rec.qid, "num_docs": len(chosen), "gold_docs": len(rec.must), "type": rec.kind}
        return text, total, meta
