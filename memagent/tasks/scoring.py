"""Answer scoring: the metrics MemAgent and RULER report, computed the same way.

Which number is which (results always name the metric next to the number):
- `sub_em`: SQuAD-normalised gold is a substring of the normalised prediction, or the prediction of
  the gold. This is what the MemAgent paper calls "accuracy" on RULER-HotpotQA (its evaluation
  aggregates only this field). An empty prediction scores 0 (an empty string is a substring of
  everything, which would otherwise count as correct).
- `em`: normalised exact match. `f1`: SQuAD token F1. Each is the maximum over the gold answers.
- `string_match_all` (RULER niah / vt / cwe / fwe): the fraction of gold strings found, case-insensitive,
  anywhere in the prediction.
- `string_match_part` (RULER qa): 1 if any gold string is found, case-insensitive.
All values are in [0, 1]; summaries report their means x 100.

The prediction is the content of the last \\boxed{} when the reply has one, else the whole reply
(`memagent.prompts.extract_answer`). RULER's own pipeline matches against the whole reply; using the
boxed answer is stricter only when a model boxes a wrong answer after stating the right one.
"""
from __future__ import annotations

import re
import string
from collections import Counter

from ..prompts import extract_answer

METRICS = ("sub_em", "string_match_all", "string_match_part")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def sub_exact_match(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p or not g:
        return 0.0
    return float(g in p or p in g)


def f1_score(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def string_match_all(pred: str, golds: list[str]) -> float:
    low = pred.lower()
    return sum(g.lower() in low for g in golds) / len(golds)


def string_match_part(pred: str, golds: list[str]) -> float:
    low = pred.lower()
    return float(any(g.lower() in low for g in golds))


def qa_scores(pred: str, golds: list[str]) -> dict[str, float]:
    return {"sub_em": max(sub_exact_match(pred, g) for g in golds),
            "em": max(exact_match(pred, g) for g in golds),
            "f1": max(f1_score(pred, g) for g in golds)}


def holds_answers(text: str, answers, match: str = "any") -> bool:
    """sub_em's test on `text` as it stands, with no answer extracted from it: a normalised gold answer
    (every one, with `match="all"`) occurs in the normalised text. It asks whether notes hold the gold
    (training's per-update signal, eval's notes_hold) and, on an extracted answer, is the RL reward.
    sub_em's other direction (the prediction inside the gold) is left out on purpose: short notes such as
    "the" would otherwise hold every answer."""
    if match not in ("any", "all"):
        raise ValueError(f"match must be 'any' or 'all', got {match!r}")
    golds = [g for g in map(normalize_answer, answers) if g]
    got = normalize_answer(text or "")
    return bool(golds) and (all if match == "all" else any)(g in got for g in golds)


def notes_hold(metric: str, notes: str, golds: list[str]) -> bool:
    """Whether notes (not an answer: nothing is extracted from them) state the gold as `metric` counts it:
    every gold for string_match_all, any for string_match_part (both case-insensitive), and for sub_em
    `holds_answers` (a normalised gold inside the normalised notes)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if metric == "string_match_all":
        return bool(golds) and string_match_all(notes, golds) == 1.0
    if metric == "string_match_part":
        return bool(golds) and string_match_part(notes, golds) == 1.0
    return holds_answers(notes, golds)


def score(metric: str, reply: str | None, golds: list[str]) -> tuple[str, dict[str, float]]:
    """(prediction, scores) for one sample; `scores[metric]` is the task's main number.

    `reply` is the model's raw final reply (None when the sample failed: every score is 0).
    QA-shaped metrics always come with sub_em/em/f1 so that any run can be compared to MemAgent's table.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if not golds:
        raise ValueError("a sample needs at least one gold answer")
    pred = extract_answer(reply) if reply else ""
    scores = qa_scores(pred, golds)
    if metric == "string_match_all":
        scores = {"string_match_all": string_match_all(pred, golds)}
    elif metric == "string_match_part":
        scores["string_match_part"] = string_match_part(pred, golds)
    return pred, scores
