"""The roster shape of the notes-model training data (rl/notes_roster.py): reports whose asked person has
look-alikes of the same kind, told apart by one word of the question."""
import re

import pytest

from memagent.rl import notes_report, notes_roster
from memagent.rl.config import NOTES_PROSE_SHAPES
from memagent.rl.notes_data import NotesTask
from memagent.rl.notes_prose import _FIRST

NAME = re.compile(rf"\b(?:{'|'.join(_FIRST)}) [A-ZÜ][a-zü]+\b")  # a person, not a town ("Old Marton")


@pytest.fixture(scope="module")
def rosters(report_samples):
    return report_samples("roster", seed=9)


def _kind(s) -> str:
    q, ev = s.question, s.meta["evidence"]
    sentence = next(e for per in ev for e in per)
    if any(w in q for w in ("now?", "new ", "taken over", "current", "before", "previous", "handed over")):
        return "handover"
    if re.search(r"Monday|Tuesday|Wednesday|Thursday|Friday|Saturday", q):
        return "rota"
    if any(w.split("{")[0] in q for w in notes_roster.AWARDS):
        return "awards"
    assert "deputy" in sentence or "assistant" in sentence or any(
        "deputy" in d or "assistant" in d for d in s.meta["distractor_facts"]), (q, sentence)
    return "deputy"


def test_rosters_are_reproducible_reports_and_ask_every_kind(rosters, smol_tokenizer):
    t, samples = rosters
    assert [s.chunks for s in samples[:5]] == [t.sample(i).chunks for i in range(5)]
    assert all(s.meta["kind"] == "prose-roster" and s.meta["haystack"] == "report" for s in samples)
    kinds = [_kind(s) for s in samples]
    assert set(kinds) == set(notes_roster.KINDS) and min(kinds.count(k) for k in notes_roster.KINDS) >= 10
    assert {len(s.chunks) for s in samples} == {1, 2}
    assert all(0 < len(smol_tokenizer.encode(c)) <= 512 for s in samples for c in s.chunks)


def test_the_answer_is_only_in_the_evidence_beside_a_look_alike_of_its_own_kind(rosters):
    """The asked person's name occurs only in the evidence sentence, and another person of the same kind is
    in the document: the other holder of the post (in the evidence itself), another prize's winner,
    another day's person, or the holder of the deputy's or the main post."""
    _, samples = rosters
    for s in samples:
        text = "".join(s.chunks)
        ev = [e for per in s.meta["evidence"] for e in per]
        assert len(ev) == 1 and s.answers[0] in ev[0]
        assert text.count(s.answers[0]) == ev[0].count(s.answers[0]) == 1, (s.question, s.answers)
        kind, others = _kind(s), s.meta["distractor_facts"]
        if kind == "handover":
            assert len(set(NAME.findall(ev[0])) - {s.answers[0]}) == 1
        elif kind == "rota":
            day = re.search(r"Monday|Tuesday|Wednesday|Thursday|Friday|Saturday", s.question).group()
            assert day in ev[0] and not any(day in d for d in others)
            assert day not in text.replace(ev[0], "")  # no filler sentence about the asked day either
            assert sum(bool(re.search(r"session was run|was in charge|looked after things|shift fell", d))
                       for d in others) >= 2
        elif kind == "awards":
            assert sum(any(w.split("{")[0] in d for w in notes_roster.AWARDS) for d in others) >= 2
        else:  # the same post's other half: "treasurer" beside "deputy treasurer"
            base = max((r for org in notes_report.ORGS for r in org[2] if f" {r}" in s.question), key=len)
            assert any(base in d and NAME.search(d) for d in others)


def test_the_handover_is_asked_both_ways_and_the_default_never_draws_a_roster(rosters, smol_tokenizer):
    _, samples = rosters
    hand = [s for s in samples if _kind(s) == "handover"]
    new = [s for s in hand if not any(w in s.question for w in ("before", "previous", "handed over"))]
    assert 0 < len(new) < len(hand)
    vocab = " ".join(map(str, [notes_roster.HANDOVER_LINES, notes_roster.HANDOVER_NEW, notes_roster.HANDOVER_OLD,
                               notes_roster.AWARDS, notes_roster.AWARD_LINES, notes_roster.AWARD_QUESTIONS,
                               notes_roster.ROTA_LINES, notes_roster.ROTA_QUESTIONS])).lower()
    for word in ("access code", "barometer", "keeper", "ledger", "red ink"):
        assert word not in vocab
    assert "roster" in NOTES_PROSE_SHAPES
    default = NotesTask(smol_tokenizer, chunk_tokens=512, max_chunks=2, seed=9, qa_share=0.0, prose_share=1.0)
    assert not any(default.sample(i).meta["kind"] in ("prose-roster", "prose-report") for i in range(40))
