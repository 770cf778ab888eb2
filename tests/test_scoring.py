"""Scorers against hand-computed cases and against RULER's reference metric functions (shipped in the
`nvidia-long-context-eval` package, imported, not copied)."""
import pytest

from memagent.tasks import scoring
from memagent.tasks.scoring import (exact_match, f1_score, normalize_answer, score, string_match_all,
                                    string_match_part, sub_exact_match)


def test_normalize_like_squad():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    assert normalize_answer("  ") == ""


@pytest.mark.parametrize("pred,gold,expected", [
    ("Paris, France", "paris", 1.0),  # gold inside prediction
    ("Paris", "Paris, France", 1.0),  # prediction inside gold
    ("the 1959 season", "1959", 1.0),
    ("London", "Paris", 0.0),
    ("", "Paris", 0.0),  # empty prediction would be a substring of anything: must score 0
    ("The", "the Beatles", 0.0),  # normalises to empty
])
def test_sub_em(pred, gold, expected):
    assert sub_exact_match(pred, gold) == expected


def test_exact_match_and_f1_hand_computed():
    assert exact_match("The Beatles.", "beatles") == 1.0
    assert exact_match("Beatles band", "beatles") == 0.0
    # pred tokens {cat, sat}, gold {cat, sat, down}: P = 1, R = 2/3, F1 = 0.8
    assert f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert f1_score("dog", "cat") == 0.0
    # repeated tokens count with multiplicity: pred [a1 a1 b] gold [a1 b b]: common 2, P = R = 2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)


def test_score_takes_the_boxed_answer_and_reports_all_qa_metrics():
    pred, s = score("sub_em", "Thinking... 1958? No: the answer is \\boxed{1959}.", ["1959"])
    assert pred == "1959"
    assert s == {"sub_em": 1.0, "em": 1.0, "f1": 1.0}
    pred, s = score("sub_em", "It was in 1959.", ["1959"])  # no box: the whole reply
    assert s["sub_em"] == 1.0 and s["em"] == 0.0 and 0 < s["f1"] < 1
    # the best over several gold answers
    _, s = score("string_match_part", "\\boxed{lead plugs}", ["fusible plugs", "lead plugs"])
    assert s["string_match_part"] == 1.0 and s["em"] == 1.0


def test_failed_sample_scores_zero():
    pred, s = score("sub_em", None, ["x"])
    assert pred == "" and set(s.values()) == {0.0}
    _, s = score("string_match_all", None, ["1", "2"])
    assert s == {"string_match_all": 0.0}


def test_bad_metric_or_gold():
    with pytest.raises(ValueError):
        score("accuracy", "x", ["x"])
    with pytest.raises(ValueError):
        score("sub_em", "x", [])


CASES = [
    ("The special magic numbers are 1234567 and 7654321.", ["1234567", "7654321"]),
    ("The special magic numbers are 1234567 and 765432.", ["1234567", "7654321"]),
    ("variables: ABCDE, fghij, KLMNO", ["ABCDE", "FGHIJ", "KLMNO", "PQRST", "UVWXY"]),
    ("nothing here", ["apple", "pear"]),
    ("APPLE pie", ["apple"]),
]


def test_string_match_agrees_with_ruler_reference():
    ref = pytest.importorskip("long_context_eval.eval.synthetic.constants")
    preds, refs = [p for p, _ in CASES], [r for _, r in CASES]
    # per-sample (RULER scores x100)
    assert [100 * string_match_all(p, r) for p, r in CASES] == ref.string_match_all_per_sample(preds, refs)
    assert [100 * string_match_part(p, r) for p, r in CASES] == ref.string_match_part_per_sample(preds, refs)
    # aggregate, as RULER rounds it
    mine = round(100 * sum(string_match_all(p, r) for p, r in CASES) / len(CASES), 2)
    assert mine == ref.string_match_all(preds, refs)
    # through `score` (no \boxed{} in the reply: the whole reply is matched, as RULER does)
    assert [100 * score("string_match_all", p, r)[1]["string_match_all"] for p, r in CASES] == \
        ref.string_match_all_per_sample(preds, refs)


def test_metrics_listed():
    assert set(scoring.METRICS) == {"sub_em", "string_match_all", "string_match_part"}
