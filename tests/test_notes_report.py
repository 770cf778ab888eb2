"""The report shape of the notes-model training data (rl/notes_report.py): whole documents about one
organisation whose look-alikes are the same document's other people and numbers."""
import re

import pytest

from memagent.rl import notes_report
from memagent.rl.config import NOTES_PROSE_SHAPES, TrainConfig
from memagent.rl.notes_data import NotesTask


@pytest.fixture(scope="module")
def reports(report_samples):
    return report_samples("report", seed=5)


def _kind(s) -> str:
    q = s.question
    if not q.startswith(("How many", "What number", "What was last")):
        return "person"
    if "last" in q:
        return "last"
    return "part" if re.search(r" by [A-Z]|did [A-Z]", q) else "total"


def test_reports_are_reproducible_open_with_their_own_line_and_ask_every_kind(reports, smol_tokenizer):
    t, samples = reports
    assert [s.chunks for s in samples[:5]] == [t.sample(i).chunks for i in range(5)]
    assert all(s.meta["kind"] == "prose-report" and s.meta["haystack"] == "report" for s in samples)
    openers = [o.split("{")[0] for o in notes_report.OPENERS]
    assert all(any(s.chunks[0].startswith(o) for o in openers) for s in samples)
    kinds = [_kind(s) for s in samples]
    assert {"person", "total", "part", "last"} <= set(kinds)
    assert 25 <= kinds.count("person") <= 55  # about half ask for a person
    assert {len(s.chunks) for s in samples} == {1, 2}
    assert all(0 < len(smol_tokenizer.encode(c)) <= 512 for s in samples for c in s.chunks)


def test_the_answer_is_only_in_the_evidence_and_look_alikes_of_its_kind_surround_it(reports):
    """Every occurrence of the answer lies inside an evidence sentence (no filler sentence, other count or
    other role line contains it), and each document holds another person or number of the asked kind."""
    _, samples = reports
    for s in samples:
        text = "".join(s.chunks)
        ev = [e for per in s.meta["evidence"] for e in per]
        assert len(ev) == 1 and s.answers[0] in ev[0]
        assert text.count(s.answers[0]) == ev[0].count(s.answers[0]), (s.question, s.answers)
        others = s.meta["distractor_facts"]
        if _kind(s) == "person":  # another person in another role
            assert any(re.search(r"\b[A-Z][a-zé]+ [A-ZÜ][a-zü]+\b", d) for d in others)
        else:  # another count, and the numbers are told apart by sub_em
            nums = [n for d in others for n in re.findall(r"\d+", d)]
            assert nums and all(s.answers[0] not in n and n not in s.answers[0] for n in nums)


def test_part_and_last_questions_have_the_total_as_a_look_alike(reports):
    _, samples = reports
    seen = 0
    for s in samples:
        if _kind(s) in ("part", "last"):
            seen += 1
            noun = max((t for org in notes_report.ORGS for t, _ in org[3] if t in s.question), key=len)
            ev = " ".join(e for per in s.meta["evidence"] for e in per)
            total = [d for d in s.meta["distractor_facts"] + [ev] if noun in d and s.answers[0] not in d]
            if _kind(s) == "last":  # this period's total of the same thing is in the document
                assert total, s.question
    assert seen >= 8


def test_report_vocabulary_keeps_out_the_held_out_wordings_and_the_default_never_draws_it(smol_tokenizer):
    vocab = " ".join(map(str, [notes_report.ORGS, notes_report.OPENERS, notes_report.FILLER,
                               notes_report.ROLE_LINES, notes_report.COUNT_LINES, notes_report.PART_LINES,
                               notes_report.LAST_LINES, notes_report.ROLE_QUESTIONS, notes_report.COUNT_QUESTIONS,
                               notes_report.PART_QUESTIONS, notes_report.LAST_QUESTIONS])).lower()
    for word in ("access code", "barometer", "keeper", "ledger", "red ink"):
        assert word not in vocab
    assert "report" in NOTES_PROSE_SHAPES
    TrainConfig(task="notes", notes_prose_shapes=["report", "role_told"]).validate()
    default = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=2, seed=5, qa_share=0.0, prose_share=1.0)
    assert "prose-report" not in {default.sample(i).meta["kind"] for i in range(30)}
