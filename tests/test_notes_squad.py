"""Document QA over whole paragraphs (rl/notes_squad.py): what a training document of that kind must be."""
import pytest

from memagent.rl.config import ConfigError, TrainConfig
from memagent.rl.notes_data import NotesTask
from memagent.tasks import data as corpora
from memagent.tasks.data import split_of


@pytest.fixture(scope="module")
def squad_docs(smol_tokenizer):
    t = NotesTask(smol_tokenizer, chunk_tokens=512, max_chunks=2, min_chunks=1, memory_tokens=64, seed=72,
                  qa_share=1.0, qa_context_share=1.0, early_share=0.45, late_share=0.45)
    return t, [t.sample(i) for i in range(40)]


@pytest.fixture(scope="module")
def title_of():
    """Every SQuAD dev paragraph (stripped) -> its article's title."""
    return {p["context"].strip(): a["title"] for a in corpora.load_json("squad")["data"] for p in a["paragraphs"]}


def test_the_whole_paragraph_is_there_once_among_paragraphs_without_the_answer(squad_docs, title_of):
    task, samples = squad_docs
    for s in samples:
        assert s.meta["kind"] == "qa" and s.meta["context"] and len(s.answers) == 1
        answer = s.answers[0]
        paragraphs = [p for ch in s.chunks for p in ch.split("\n\n") if p.strip()]
        with_answer = [p.strip() for p in paragraphs if answer in p]
        # one paragraph holds the answer, whole (not cut by a chunk edge), from a train-half article
        assert len(with_answer) == 1, (s.id, with_answer)
        assert with_answer[0] in title_of and split_of(title_of[with_answer[0]]) == "train"
        # the evidence is that paragraph's answer sentence, in the chunk that holds the paragraph
        ev = [(i, e) for i, per in enumerate(s.meta["evidence"]) for e in per]
        assert len(ev) == 1 and answer in ev[0][1] and ev[0][1] in with_answer[0]
        assert with_answer[0] in s.chunks[ev[0][0]]
        assert all(task.ntok(ch) <= task.chunk_tokens for ch in s.chunks)
    # both kinds of filler are drawn: the same article's other paragraphs, and any train-half paragraph
    assert {s.meta["haystack"] for s in samples} == {"squad", "squad_same"}
    assert {len(s.chunks) for s in samples} == {1, 2}


def test_same_article_filler_comes_from_the_asked_article(squad_docs, title_of):
    _, samples = squad_docs
    same = [s for s in samples if s.meta["haystack"] == "squad_same"]
    assert len(same) >= 10
    for s in same:
        titles = {title_of.get(p.strip()) for ch in s.chunks for p in ch.split("\n\n") if p.strip()}
        assert len(titles) == 1 and None not in titles, (s.id, titles)


def test_share_is_checked_and_off_by_default():
    assert TrainConfig().notes_qa_context_share == 0.0
    with pytest.raises(ConfigError, match="notes_qa_context_share"):
        TrainConfig(notes_qa_context_share=1.5)
