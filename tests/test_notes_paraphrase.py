"""The paraphrase shape (rl/notes_paraphrase.py): an event told in none of its question's words, among
look-alike events with answers of the same kind and traps in the question's own words."""
import random
import re

import pytest

from memagent.rl import notes_paraphrase as P
from memagent.rl.notes_data import NotesTask


def test_no_question_wording_shares_a_content_word_with_its_evidence():
    """The shape's whole point: a reader that keeps what shares words with the question finds nothing here."""
    for e in P.EVENTS:
        assert len(e.questions) >= 2 and len(e.evidence) >= 2 and e.questions[0].endswith("?")
        assert all(ev.count("{v}") == 1 for ev in e.evidence)
        for q in e.questions:
            for ev in e.evidence:
                assert not P.shares_a_stem(P.content_words(q), P.content_words(ev.format(v="Ann Bell"))), (q, ev)
    # and the check itself is able to see a shared word, inflected or not
    assert P.shares_a_stem(P.content_words("Who mended the roof?"), P.content_words("She mends roofs.")) == \
        {"mended", "roof"}


def _told_by(template: str, sentence: str) -> bool:
    head, tail = template.split("{v}")
    return re.fullmatch(re.escape(head) + ".+" + re.escape(tail), sentence) is not None


def test_traps_repeat_the_question_and_never_hold_the_answer():
    kinds, traps, others = set(), 0, 0
    for seed in range(300):
        gold, distract, question, (answer,), subject = P.paraphrase_fact(random.Random(seed))
        assert subject is None and len(gold) == 1 and answer in gold[0]
        (event,) = [e for e in P.EVENTS if question in e.questions]
        kinds.add(event.kind)
        for d in distract:
            assert answer not in d  # not even as part of a longer number or name
        trap = [d for d in distract if question in d or (event.doing and event.doing in d)]
        traps += len(trap) == 1
        others += len(distract) - len(trap)
        for d in distract:
            if d not in trap:  # another event's evidence, so its answer is a look-alike of the same kind
                assert any(_told_by(ev, d) for o in P.EVENTS if o.kind == event.kind and o is not event
                           for ev in o.evidence), d
    assert kinds == {"person", "number", "place"}
    assert 170 <= traps <= 250  # 7 in 10
    assert others >= 300  # 1-3 look-alike events a document


def test_a_trap_without_a_usable_wrong_value_is_left_out_not_a_crash(monkeypatch):
    """Six small counts can all be part of an answer ("3" in "13"): that draw gets no value trap, and the
    rest of the document is the one the seed draws anyway."""
    def draw(seed):
        return P.paraphrase_fact(random.Random(seed))

    seed = next(s for s in range(200) if draw(s)[2].startswith("How") and any(draw(s)[2] in d for d in draw(s)[1]))
    gold, _, question, answers, _ = draw(seed)
    real = P._values
    monkeypatch.setattr(P, "_values", lambda kind, span, rng, k: real(kind, span, rng, k) if k == 1 else [""] * k)
    gold2, distract2, question2, answers2, _ = draw(seed)  # "" is part of every answer, so every wrong value clashes
    assert (gold2, question2, answers2) == (gold, question, answers)
    assert not any(question in d for d in distract2) and distract2


@pytest.mark.parametrize("seed", [0, 1])
def test_paraphrase_documents_carry_the_answer_once_and_only_when_asked_for(smol_tokenizer, seed):
    t = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=2, min_chunks=2, memory_tokens=64, seed=seed,
                  qa_share=0.0, prose_share=1.0, prose_shapes=("paraphrase",), late_share=0.5, early_share=0.3)
    for i in range(20):
        s = t.sample(i)
        assert s.meta["kind"] == "prose-paraphrase"
        (gold,) = [e for per in s.meta["evidence"] for e in per]
        text = " ".join(s.chunks)
        assert gold in text and s.answers[0] in gold
        for word in ("access code", "barometer", "keeper"):
            assert word not in (s.question + " " + gold).lower()
    default = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=seed, qa_share=0.0,
                        prose_share=1.0)
    assert "prose-paraphrase" not in {default.sample(i).meta["kind"] for i in range(40)}


def test_the_config_accepts_the_shape():
    from memagent.rl.config import ConfigError, TrainConfig

    TrainConfig(task="notes", notes_prose_shapes=["paraphrase", "role_told"]).validate()
    with pytest.raises(ConfigError, match="notes_prose_shapes"):
        TrainConfig(task="notes", notes_prose_shapes=["paraphrased"]).validate()
