"""Benchmark tasks: a registry of sample builders, length parsing and JSONL export.

Every task turns (index, target length, tokenizer, seed) into a `Sample`: a question, a document of about
`length` tokens of the model's tokenizer, gold answers and the metric that scores it. As in MemAgent,
the task's question/instruction is what the memory agent is asked, and the haystack is the document it
reads. Samples are built lazily (one at a time) so a 3.5M-token run never holds more than the samples
in flight, and `export_jsonl` streams them to disk for anyone to inspect.

Length means document tokens (what is chunked), not prompt tokens; RULER counts the whole prompt plus
the answer, which differs by the instruction (~50 tokens) and is negligible beyond 4K.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..tokenizer import Tokenizer


@dataclass
class Sample:
    id: str  # "<task>/<length>/<index>": stable across runs with the same seed
    task: str
    length: int  # target tokens
    index: int
    question: str
    document: str
    gold: list[str]
    metric: str  # the main metric: sub_em | string_match_all | string_match_part
    doc_tokens: int  # the builder's count of the document's tokens
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    metric: str
    description: str
    make: Callable[[Tokenizer, int], "Builder"]  # (tokenizer, seed) -> builder


class Builder:
    """Builds the samples of one task for one tokenizer and seed (holds caches between samples)."""

    def sample(self, index: int, length: int) -> Sample:  # pragma: no cover - interface
        raise NotImplementedError


_UNITS = {"": 1, "k": 1000, "m": 1000_000}


def parse_length(text: str) -> int:
    """'4k' -> 4096, '7k' -> 7000, '1.75m' -> 1750000, '8192' -> 8192.

    Two conventions meet here: RULER writes its powers of two as 4k, 8k ... 128k (4k = 4096 tokens),
    MemAgent's table writes 7K, 14K ... 3.5M in thousands. So a whole power of two before 'k' counts
    in 1024s, every other 'k' in 1000s, 'm' in millions; exact numbers are always exact.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise ValueError(f"cannot read length {text!r}; use e.g. 4k (4096), 7k (7000), 28000, 1.75m")
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit == "k" and number.is_integer() and _power_of_two(int(number)):
        return int(number) * 1024
    value = round(number * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"length must be positive: {text!r}")
    return value


def parse_lengths(text: str) -> list[int]:
    out = [parse_length(t) for t in text.split(",") if t.strip()]
    if not out:
        raise ValueError("give at least one length, e.g. --lengths 7k,28k")
    return out


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def format_length(n: int) -> str:
    """The label `parse_length` reads back as `n`: 4096 -> '4K', 7000 -> '7K', 4000 -> '4000'."""
    if n % 1024 == 0 and _power_of_two(n // 1024):
        return f"{n // 1024}K"
    if n % 1000 == 0 and n < 1000_000 and _power_of_two(n // 1000):
        return str(n)  # '4K' would read back as 4096
    for unit, size in (("M", 1000_000), ("K", 1000)):
        if n >= size and n % (size // 100) == 0:
            return f"{n / size:g}{unit}"
    return str(n)


# MemAgent's RULER-HotpotQA lengths (7K ... 3.5M).
MEMAGENT_LENGTHS = [7000, 14000, 28000, 56000, 112000, 224000, 448000, 896000, 1750000, 3500000]


def _registry() -> dict[str, TaskSpec]:
    from . import ruler
    from .ruler_hotpotqa import DocQABuilder

    class _DocQA(Builder):
        def __init__(self, name, corpus, tokenizer, seed, metric, question_fmt, split=None):
            self.name, self.seed, self.metric, self.fmt, self.split = name, seed, metric, question_fmt, split
            self.builder = DocQABuilder(corpus(), tokenizer)
            self._questions: list = []

        def record(self, index):
            if index >= len(self._questions):
                want = max(index + 1, 2 * len(self._questions), 128)
                self._questions = self.builder.questions(want, self.seed, self.split)
            return self._questions[index]

        def sample(self, index, length):
            rec = self.record(index)
            text, tokens, meta = self.builder.build(rec, length, self.seed)
            return Sample(f"{self.name}/{length}/{index}", self.name, length, index, self.fmt.format(q=rec.question),
                          text, rec.answers, self.metric, tokens, meta)

    from .data import RULER_QA_PROMPT as qa_fmt, hotpotqa, squad

    specs = [
        TaskSpec("ruler-hotpotqa", "sub_em", "MemAgent's RULER-HotpotQA (HotpotQA dev + pool distractors)",
                 lambda tok, seed: _DocQA("ruler-hotpotqa", hotpotqa, tok, seed, "sub_em", "{q}")),
        TaskSpec("qa_1", "string_match_part", "RULER qa_1: SQuAD v2 dev (answerable; the eval half of the articles, "
                 "never trained on) + distractor paragraphs",
                 lambda tok, seed: _DocQA("qa_1", squad, tok, seed, "string_match_part", qa_fmt, split="eval")),
        TaskSpec("qa_2", "string_match_part", "RULER qa_2: HotpotQA dev + distractor paragraphs",
                 lambda tok, seed: _DocQA("qa_2", hotpotqa, tok, seed, "string_match_part", qa_fmt)),
    ]
    specs += ruler.specs()
    return {s.name: s for s in specs}


_TASKS: dict[str, TaskSpec] | None = None


def tasks() -> dict[str, TaskSpec]:
    global _TASKS
    if _TASKS is None:
        _TASKS = _registry()
    return _TASKS


# Groups usable wherever a task name is: RULER's 13, and the 11 MemAgent ran (no cwe, no qa_2).
GROUPS = {
    "ruler": ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
              "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"],
    "ruler-memagent": ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                       "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "fwe", "qa_1"],
}


def resolve_tasks(text: str) -> list[str]:
    """'ruler-hotpotqa,niah_single_1' or a group name -> task names (checked)."""
    known = tasks()
    out: list[str] = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        for n in GROUPS.get(name, [name]):
            if n not in known:
                raise ValueError(f"unknown task {n!r}; known: {', '.join(known)} (groups: {', '.join(GROUPS)})")
            if n not in out:
                out.append(n)
    if not out:
        raise ValueError("give at least one task")
    return out


def iter_samples(task_names: Iterable[str], lengths: Iterable[int], n: int, tokenizer: Tokenizer, seed: int = 42,
                 skip: Callable[[str], bool] | None = None) -> Iterator[Sample]:
    """Samples task by task, length by length, index by index; `skip(id)` avoids building finished ones."""
    lengths = list(lengths)
    for name in task_names:
        builder = tasks()[name].make(tokenizer, seed)
        for length in lengths:
            for index in range(n):
                if skip and skip(f"{name}/{length}/{index}"):
                    continue
                yield builder.sample(index, length)


def export_jsonl(samples: Iterable[Sample], path: str | Path) -> int:
    """Write samples one JSON line each (streamed; never holds more than one sample). Returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s.to_json(), ensure_ascii=False) + "\n")
            f.flush()  # a long export can be inspected (head, jq) while it runs
            n += 1
    return n


__all__ = ["Sample", "TaskSpec", "Builder", "tasks", "GROUPS", "resolve_tasks", "iter_samples", "export_jsonl",
           "parse_length", "parse_lengths", "format_length", "MEMAGENT_LENGTHS"]
