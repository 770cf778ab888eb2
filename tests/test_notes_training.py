"""The memory-model recipe's data and warm start: samples with known evidence, train/eval splits that never
share an article, oracle notes, and SFT conversations rendered exactly as inference renders them."""
import random

import pytest

from memagent.prompts import load_template
from memagent.reader import Reader, ReaderConfig
from memagent.rl.notes_data import NotesTask, oracle_answer, oracle_memories, split_of
from memagent.tasks import data as corpora


@pytest.fixture(scope="module")
def task(smol_tokenizer):
    return NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=4, memory_tokens=64, seed=0)


def test_samples_are_reproducible_and_hold_their_evidence(task, smol_tokenizer):
    kinds, hays = set(), set()
    for i in range(24):
        s = task.sample(i)
        assert s == task.sample(i)  # a pure function of (seed, index)
        kinds.add(s.meta["kind"])
        hays.add(s.meta["haystack"])
        assert 1 <= len(s.chunks) <= 4
        assert all(len(smol_tokenizer.encode(c)) <= 256 for c in s.chunks)
        ev = [e for per in s.meta["evidence"] for e in per]
        assert ev, s.id
        for per, chunk in zip(s.meta["evidence"], s.chunks):
            assert all(e in chunk for e in per)  # the evidence is where the sample says it is
        notes = oracle_memories(s, "(none)")
        assert len(notes) == len(s.chunks) and notes[-1] == "\n".join(dict.fromkeys(ev))
        assert len(smol_tokenizer.encode(notes[-1])) <= 60  # fits the memory cap with room to spare
        if s.meta["kind"] == "needle":
            assert all(a in notes[-1] for a in s.answers)
        else:
            assert s.answers[0].lower() in notes[-1].lower()
        assert oracle_answer(s) == "\\boxed{" + ", ".join(s.answers) + "}"
    assert kinds == {"needle", "qa"} and len(hays) >= 4


def test_distractor_keys_never_reuse_the_asked_key(task):
    n = 0
    for i in range(40):
        s = task.sample(i)
        if s.meta["kind"] != "needle" or not s.meta["distractors"]:
            continue
        n += 1
        gold = set(s.answers)
        text = s.context
        # every planted distractor is a fact for another key: the asked key's values are the only gold
        assert all(text.count(a) >= 1 for a in gold)
    assert n >= 5


def test_qa_training_questions_come_from_train_articles_only():
    squad = corpora.load_json("squad")
    splits = {a["title"]: split_of(a["title"]) for a in squad["data"]}
    assert set(splits.values()) == {"train", "eval"}  # both halves exist
    assert split_of("Normans") == split_of("Normans")  # stable (sha256, not hash())
    task = NotesTask.__new__(NotesTask)
    task._pools = {}
    train_paras = set(task._pool("squad"))
    for a in squad["data"]:
        for p in a["paragraphs"]:
            assert (p["context"] in train_paras) == (splits[a["title"]] == "train")


def test_sft_conversations_match_the_inference_prompts(task, smol_tokenizer):
    from memagent.rl.sft import conversations

    template = load_template("notes")
    reader = Reader(template, smol_tokenizer, ReaderConfig(memory_tokens=64, answer_tokens=48))
    s = next(task.sample(i) for i in range(50) if len(task.sample(i).chunks) >= 3)
    turns = conversations(s, reader, template.empty_memory, random.Random(0))
    notes = oracle_memories(s, template.empty_memory)
    before = [template.empty_memory] + notes[:-1]
    # every evidence turn is trained; its prompt is the reader's own update prompt with the previous notes
    for i, chunk in enumerate(s.chunks):
        if notes[i] != before[i]:
            st = reader.start(s.question)
            from dataclasses import replace

            want = reader.update_request(replace(st, memory=before[i]), chunk).messages
            assert (want, notes[i]) in turns
    final_msgs, final_target = turns[-1]
    assert final_target == oracle_answer(s) and notes[-1] in final_msgs[-1]["content"]
    assert len(turns) <= sum(n != b for n, b in zip(notes, before)) + 3


def test_sft_targets_end_the_turn():
    from transformers import AutoTokenizer

    from memagent import models
    from memagent.rl.sft import encode

    hf = AutoTokenizer.from_pretrained(str(models.hf_dir("smollm2-135m")))
    prompt, resp = encode(hf, [{"role": "user", "content": "Q?"}], "\\boxed{42}")
    assert hf.decode(prompt).rstrip().endswith("assistant")  # the generation prompt, as inference sends it
    assert resp[-1] == hf.convert_tokens_to_ids("<|im_end|>") and hf.decode(resp[:-1]) == "\\boxed{42}"
