"""Document QA over whole paragraphs (NotesTask with qa_context_share > 0).

Why: the plain QA sample of rl/notes_data.py plants only the sentence that holds the answer, inside
sentence-by-sentence filler, so that sentence is the cue. Real document QA (RULER qa_1, a user's own files)
gives whole paragraphs, and the default's notes on qa_1 restate the question with a guess from a paragraph
on the same subject (docs/notes-model.md, "The default on the issue's grid"). No round has trained that.
"""
from __future__ import annotations

import random

from ..tasks import data as corpora
from .data import Sample
from .notes_data import as_asked


def squad_in_context(task, rng: random.Random, n_chunks: int, index: int) -> Sample | None:
    """A SQuAD question (train-half article) with its whole paragraph, among other whole paragraphs.

    Half of the documents fill with the same article's other paragraphs (look-alikes: the same names,
    other facts), half with any train-half paragraph; none of them holds the answer's words. The evidence
    is the answer's sentence, not the paragraph: it is what notes of 64 tokens can keep, and what the
    oracle and the where-lost tools check."""
    art = rng.choice(task._pool("squad_arts"))
    para = rng.choice(art)
    qas = corpora.answerable(para)
    if not qas:
        return None
    qa = rng.choice(qas)
    answer, context = qa["answers"][0]["text"], para["context"].strip()
    gold = [s for s in corpora.split_sentences(context) if answer in s][:1]
    if not gold or len(context) > 2 * task.chunk_tokens:  # ~4 chars a token: at most half a chunk
        return None
    same = rng.random() < 0.5
    pool = [p["context"] for p in art] if same else task._pool("squad")
    pool = [p.strip() for p in pool if answer not in p and len(p) <= 2 * task.chunk_tokens]
    if len(pool) < 2:
        return None

    def paragraphs():
        while True:
            yield pool[rng.randrange(len(pool))], "\n\n"

    chunks, placed = task._layout(rng, n_chunks, paragraphs(), [context], n_gold=1)
    if any(task.ntok(c) > task.chunk_tokens for c in chunks):  # units are counted apart; joined, a token more
        return None
    evidence = [list(gold) if context in per else [] for per in placed]
    return Sample(id=f"notes-{task.seed}-{index}", question=as_asked(rng, qa["question"]), answers=(answer,), chunks=tuple(chunks),
                  meta={"evidence": evidence, "haystack": "squad_same" if same else "squad", "distractors": 0,
                        "kind": "qa", "context": True})
