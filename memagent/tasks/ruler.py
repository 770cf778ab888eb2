"""RULER's synthetic tasks (NVIDIA/RULER `scripts/data/synthetic`), rebuilt for a memory agent.

Task shapes, texts, counts and metrics follow RULER's recipes (see the reference generators shipped in
`long_context_eval/data/synthetic/*.py`); as MemAgent did, the haystack becomes the document and the
instruction plus query becomes the question. Our own choices, each for a reason:
- Length is document tokens; sizes are reached by adding pieces whose token counts (taken in context,
  with their leading separator) are summed, instead of RULER's loop that re-tokenizes the whole prompt at
  every step, so a 1M-token haystack builds in seconds.
- Essay sentences come from a regular-expression splitter (NLTK punkt is a download; see data.py), and
  the essays repeat from the start when a length needs more text than they hold (~650K tokens).
- Word keys are an adjective and a noun drawn separately (RULER enumerates all 6M pairs first); keys in
  one sample are distinct, and distractor needles never reuse a real key.
- vt puts each assignment on its own line between noise lines and has no few-shot example; cwe's
  few-shot example is omitted too (the memory agent gets the instruction, not a chat transcript).
- Everything a sample contains is drawn from a generator seeded by (seed, task, index), and placement by
  (seed, task, index, length): the same index asks about the same needles at every length.
"""
from __future__ import annotations

import bisect
import random
import string
import uuid
from dataclasses import dataclass

import numpy as np

from ..tokenizer import Tokenizer
from . import Builder, Sample, TaskSpec
from .data import CountCache, count_tokens, essay_sentences, wonderwords_lists

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True))]
NIAH_QUESTION = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_v} afterwards.\n"
                 "What are all the special magic {type_v} for {query} mentioned in the provided text?")
VT_QUESTION = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
CWE_QUESTION = ("Below is a numbered list of words. In these words, some appear more often than others. "
                "Memorize the ones that appear most often.\n"
                "Question: What are the 10 most common words in the above list?")
FWE_QUESTION = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words.\nQuestion: Do not provide any explanation. Please ignore the "
                "dots '....'. What are the three most frequently appeared words in the above coded text?")


class _Base(Builder):
    name = ""
    metric = "string_match_all"

    def __init__(self, tokenizer: Tokenizer, seed: int):
        self.tok, self.seed = tokenizer, seed
        self._unit_cache: dict[str, int] = {}

    def rngs(self, index: int, length: int) -> tuple[random.Random, random.Random]:
        return (random.Random(f"{self.seed}/{self.name}/{index}"),
                random.Random(f"{self.seed}/{self.name}/{index}/{length}"))

    def unit(self, text: str) -> int:
        """Tokens of a piece that repeats (counted once)."""
        if text not in self._unit_cache:
            self._unit_cache[text] = count_tokens(self.tok, [text])[0]
        return self._unit_cache[text]

    def make(self, index, length, question, document, gold, tokens, **meta) -> Sample:
        return Sample(f"{self.name}/{length}/{index}", self.name, length, index, question, document,
                      list(gold), self.metric, int(tokens), meta)


# ---- NIAH ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NiahConfig:
    haystack: str  # repeat | essay | needle
    type_k: str  # words | numbers | uuids
    type_v: str
    k: int = 1  # keys (needles with different keys; k-1 are distractors)
    v: int = 1  # values per key
    q: int = 1  # keys asked about


NIAH = {
    "niah_single_1": NiahConfig("repeat", "words", "numbers"),
    "niah_single_2": NiahConfig("essay", "words", "numbers"),
    "niah_single_3": NiahConfig("essay", "words", "uuids"),
    "niah_multikey_1": NiahConfig("essay", "words", "numbers", k=4),
    "niah_multikey_2": NiahConfig("needle", "words", "numbers"),
    "niah_multikey_3": NiahConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NiahConfig("essay", "words", "numbers", v=4),
    "niah_multiquery": NiahConfig("essay", "words", "numbers", q=4),
}


def random_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))  # 7 digits
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        w = wonderwords_lists()
        return f"{rng.choice(w['adjective'])}-{rng.choice(w['noun'])}"
    raise ValueError(f"unknown needle type {kind!r}")


def join_query(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


class NiahBuilder(_Base):
    def __init__(self, name: str, cfg: NiahConfig, tokenizer: Tokenizer, seed: int):
        super().__init__(tokenizer, seed)
        self.name, self.cfg = name, cfg
        self._essay = None

    def question(self, keys: list[str]) -> str:
        text, type_v = NIAH_QUESTION, self.cfg.type_v
        if self.cfg.q * self.cfg.v == 1:  # RULER's singular wording
            text = text.replace("Some", "A").replace("are all", "is").replace("are", "is")
            type_v = type_v[:-1]
        return text.format(type_v=type_v, query=join_query(keys))

    def sample(self, index: int, length: int) -> Sample:
        cfg, (rng, place) = self.cfg, self.rngs(index, length)
        n_keys = max(cfg.k, cfg.q)
        keys: list[str] = []
        while len(keys) < n_keys:
            key = random_value(cfg.type_k, rng)
            if key not in keys:
                keys.append(key)
        values = [[random_value(cfg.type_v, rng) for _ in range(cfg.v)] for _ in keys]
        needles = [NEEDLE.format(type_v=cfg.type_v, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
        rng.shuffle(needles)
        asked = rng.sample(range(n_keys), cfg.q)
        gold = [v for i in asked for v in values[i]]
        if cfg.haystack == "essay":
            doc, tokens = self._essay_doc(needles, length, place)
        else:
            doc, tokens = self._line_doc(needles, length, place, set(keys), rng)
        return self.make(index, length, self.question([keys[i] for i in asked]), doc, gold, tokens,
                         haystack=cfg.haystack, needles=len(needles))

    def _line_doc(self, needles, length, place, real_keys, rng) -> tuple[str, int]:
        """Noise or distractor-needle lines, one per line, with the needles on lines of their own."""
        total = sum(count_tokens(self.tok, ["\n" + n for n in needles]))
        if total > length:
            raise ValueError(f"{self.name}: {length} tokens cannot hold its {len(needles)} needles")
        lines: list[str] = []
        if self.cfg.haystack == "repeat":
            lines = [NOISE] * max(0, (length - total) // self.unit("\n" + NOISE))
            total += len(lines) * self.unit("\n" + NOISE)
        else:
            full = False
            while not full:  # distractor needles, counted a block at a time
                block = []
                while len(block) < 256:
                    key = random_value(self.cfg.type_k, rng)
                    if key not in real_keys:
                        block.append(NEEDLE.format(type_v=self.cfg.type_v, key=key,
                                                   value=random_value(self.cfg.type_v, rng)))
                for line, n in zip(block, count_tokens(self.tok, ["\n" + b for b in block])):
                    if total + n > length:
                        full = True
                        break
                    lines.append(line)
                    total += n
        # RULER: needles go in at random line positions (inserted from the back so indices hold)
        for pos, needle in zip(sorted(place.sample(range(len(lines) + 1), len(needles)), reverse=True), needles):
            lines.insert(pos, needle)
        return "\n".join(lines), total

    def _essay_doc(self, needles, length, place) -> tuple[str, int]:
        """Essay sentences from the start (repeating when needed), needles at RULER's 40 depths."""
        sents = essay_sentences()
        if self._essay is None:
            self._essay = CountCache("essay-sentences", [" " + s for s in sents], self.tok)
        total = sum(count_tokens(self.tok, [" " + n for n in needles]))
        if total > length:
            raise ValueError(f"{self.name}: {length} tokens cannot hold its {len(needles)} needles")
        chosen: list[str] = []
        i = 0
        while True:
            block = [(i + j) % len(sents) for j in range(512)]
            counts = self._essay.get(block).tolist()
            cum = np.cumsum(counts)
            fit = bisect.bisect_right(cum.tolist(), length - total)
            chosen.extend(sents[b] for b in block[:fit])
            total += int(cum[fit - 1]) if fit else 0
            i += fit
            if fit < len(block):
                break
        self._essay.save()
        depths = place.sample(DEPTHS, len(needles))
        at = sorted(int(len(chosen) * d / 100) for d in depths)
        for pos, needle in sorted(zip(at, needles), key=lambda x: -x[0]):
            chosen.insert(pos, needle)
        return " ".join(chosen), total


# ---- Variable tracking --------------------------------------------------------------------------------

class VTBuilder(_Base):
    name = "vt"

    def __init__(self, tokenizer: Tokenizer, seed: int, chains: int = 1, hops: int = 4):
        super().__init__(tokenizer, seed)
        self.chains, self.hops = chains, hops

    def sample(self, index: int, length: int) -> Sample:
        rng, place = self.rngs(index, length)
        names: list[str] = []
        while len(names) < self.chains * (self.hops + 1):
            v = "".join(rng.choices(string.ascii_uppercase, k=5))
            if v not in names:
                names.append(v)
        chains, values = [], []
        for c in range(self.chains):
            vs = names[c * (self.hops + 1):(c + 1) * (self.hops + 1)]
            value = str(rng.randint(10000, 99999))
            while value in values:
                value = str(rng.randint(10000, 99999))
            values.append(value)
            chains.append([f"VAR {vs[0]} = {value}"] + [f"VAR {vs[j + 1]} = VAR {vs[j]}" for j in range(self.hops)])
        stmts = [s for ch in chains for s in ch]
        total = sum(count_tokens(self.tok, ["\n" + s for s in stmts]))
        if total > length:
            raise ValueError(f"vt: {length} tokens cannot hold {len(stmts)} assignments")
        lines = [NOISE] * max(0, (length - total) // self.unit("\n" + NOISE))
        total += len(lines) * self.unit("\n" + NOISE)
        for chain in chains:  # each chain in order, at sorted random positions (RULER)
            pos = sorted(place.sample(range(len(lines) + 1), len(chain)))
            for j, (p, stmt) in enumerate(zip(pos, chain)):
                lines.insert(p + j, stmt)
        gold = names[: self.hops + 1]
        return self.make(index, length, VT_QUESTION.format(query=values[0]), "\n".join(lines), gold, total,
                         chains=self.chains, hops=self.hops)


# ---- Common / frequent words extraction ---------------------------------------------------------------

class CWEBuilder(_Base):
    """Numbered word list; the 10 common words appear 30 times, the rest 3 (6 and 1 below 4K)."""

    name = "cwe"

    def __init__(self, tokenizer: Tokenizer, seed: int, freq_cw: int = 30, freq_ucw: int = 3, num_cw: int = 10):
        super().__init__(tokenizer, seed)
        w = wonderwords_lists()
        self.words = sorted(set(w["noun"] + w["adjective"] + w["verb"]))
        random.Random(f"{seed}/cwe/words").shuffle(self.words)
        self.freq_cw, self.freq_ucw, self.num_cw = freq_cw, freq_ucw, num_cw
        self._word_tokens = None
        self._number_tokens: list[int] = [0]  # cumulative tokens of " 1." .. " i."

    def numbers(self, n: int) -> int:
        if n >= len(self._number_tokens):
            lo, hi = len(self._number_tokens), max(n + 1, 2 * len(self._number_tokens))
            acc = self._number_tokens[-1]
            for c in count_tokens(self.tok, [f" {i}." for i in range(lo, hi)]):
                acc += c
                self._number_tokens.append(acc)
        return self._number_tokens[n]

    def sample(self, index: int, length: int) -> Sample:
        rng, place = self.rngs(index, length)
        if self._word_tokens is None:
            self._word_tokens = dict(zip(self.words, count_tokens(self.tok, [" " + w for w in self.words])))
        cw, ucw = (self.freq_cw, self.freq_ucw) if length >= 4096 else (6, 1)
        order = rng.sample(self.words, len(self.words))

        def tokens(num_words: int) -> int:
            common, rare = order[: self.num_cw], order[self.num_cw:num_words]
            words = sum(self._word_tokens[w] for w in common) * cw + sum(self._word_tokens[w] for w in rare) * ucw
            return words + self.numbers(cw * len(common) + ucw * len(rare))

        lo, hi = self.num_cw, len(order)  # largest num_words whose list fits (tokens grow with num_words)
        if tokens(lo) > length:
            raise ValueError(f"cwe: {length} tokens is too short for {self.num_cw} words x {cw}")
        if tokens(hi) <= length:
            raise ValueError(f"cwe: the word list ({len(order)} words, {tokens(hi)} tokens) is shorter than "
                             f"{length} tokens; RULER needs its english_words.json for longer cwe samples")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if tokens(mid) <= length else (lo, mid)
        common, rare = order[: self.num_cw], order[self.num_cw:lo]
        entries = common * cw + rare * ucw
        place.shuffle(entries)
        doc = " ".join(f"{i + 1}. {w}" for i, w in enumerate(entries))
        return self.make(index, length, CWE_QUESTION, doc, common, tokens(lo), num_words=lo)


def zeta(alpha: float, terms: int = 100_000) -> float:
    """Riemann zeta for alpha > 1 (partial sum + integral tail; relative error < 1e-9 at alpha=2)."""
    k = np.arange(1, terms + 1, dtype=np.float64)
    return float(np.sum(k ** -alpha) + terms ** (1 - alpha) / (alpha - 1) - 0.5 * terms ** -alpha)


class FWEBuilder(_Base):
    """Coded 6-letter words with Zipf counts; the top word becomes '...' (noise); answer = ranks 2-4."""

    name = "fwe"

    def __init__(self, tokenizer: Tokenizer, seed: int, alpha: float = 2.0, wordlen: int = 6):
        super().__init__(tokenizer, seed)
        self.alpha, self.wordlen = alpha, wordlen

    def sample(self, index: int, length: int) -> Sample:
        rng, place = self.rngs(index, length)
        size = max(16, length // 50)  # RULER: vocabulary of max_seq_length // 50
        vocab: set[str] = set()
        while len(vocab) < size:
            vocab.add("".join(rng.choices(string.ascii_lowercase, k=self.wordlen)))
        words = sorted(vocab)
        rng.shuffle(words)
        words[0] = "..."
        per_word = np.array(count_tokens(self.tok, [" " + w for w in words]), dtype=np.int64)
        share = np.arange(1, size + 1, dtype=np.float64) ** -self.alpha / zeta(self.alpha)

        def tokens(n: int) -> int:
            return int(((n * share).astype(np.int64) * per_word).sum())

        lo, hi = 1, max(2, length)
        while tokens(hi) <= length:
            hi *= 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if tokens(mid) <= length else (lo, mid)
        counts = (lo * share).astype(np.int64)
        text = [w for w, c in zip(words, counts) for _ in range(int(c))]
        place.shuffle(text)
        return self.make(index, length, FWE_QUESTION, " ".join(text), words[1:4], tokens(lo),
                         alpha=self.alpha, num_words=lo)


def specs() -> list[TaskSpec]:
    out = []
    for name, cfg in NIAH.items():
        desc = (f"RULER {name}: {cfg.haystack} haystack, {cfg.type_k} keys -> {cfg.type_v}, "
                f"k={cfg.k} v={cfg.v} q={cfg.q}")
        out.append(TaskSpec(name, "string_match_all", desc,
                            lambda tok, seed, n=name, c=cfg: NiahBuilder(n, c, tok, seed)))
    out.append(TaskSpec("vt", "string_match_all", "RULER vt: 1 chain of 4 hops in a noise haystack", VTBuilder))
    out.append(TaskSpec("cwe", "string_match_all", "RULER cwe: the 10 most common words of a numbered list",
                        CWEBuilder))
    out.append(TaskSpec("fwe", "string_match_all", "RULER fwe: the 3 most frequent coded words (Zipf, a=2)",
                        FWEBuilder))
    return out
