"""The memory-model recipe's data and warm start: samples with known evidence, train/eval splits that never
share an article, oracle notes, and SFT conversations rendered exactly as inference renders them."""
import random
import re
from dataclasses import replace

import pytest

from memagent.prompts import load_template
from memagent.reader import Reader, ReaderConfig
from memagent.rl.notes_data import NotesTask, oracle_answer, oracle_memories
from memagent.tasks import data as corpora
from memagent.tasks.data import split_of


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


def test_only_questions_asking_for_several_values_need_all_of_them(task):
    matches = {}
    for i in range(200):
        s = task.sample(i)
        want = "all" if s.meta["kind"] == "needle" and len(s.answers) > 1 else "any"
        assert s.match == want, s.id
        matches[want] = matches.get(want, 0) + 1
    assert matches["all"] >= 5 and matches["any"] >= 100  # both kinds are drawn


def test_distractor_keys_never_reuse_the_asked_key(task):
    n = 0
    for i in range(40):
        s = task.sample(i)
        if s.meta["kind"] != "needle" or not s.meta["distractors"]:
            continue
        n += 1
        assert s.meta["key"] not in s.meta["distractor_keys"] and len(s.meta["distractor_keys"]) == s.meta["distractors"]
        evidence = [e for per in s.meta["evidence"] for e in per]
        # the notes keep exactly one fact per gold value, and each names a gold value, never a distractor's
        assert len(evidence) == len(s.answers)
        assert all(any(a in e for a in s.answers) for e in evidence)
        # every distractor fact was planted in the document but is not evidence
        planted_lines = [ln for ln in s.context.replace(". ", ".\n").splitlines()
                         if any(k.lower() in ln.lower() for k in s.meta["distractor_keys"])]
        assert planted_lines and not (set(planted_lines) & set(evidence))
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


def test_qa_1_asks_only_the_eval_half_of_squad(smol_tokenizer):
    """What the trained model is measured on (qa_1) never shares an article with its training data."""
    from memagent.tasks import tasks

    builder = tasks()["qa_1"].make(smol_tokenizer, 42)
    recs = [builder.record(i) for i in range(40)]
    assert {r.split for r in recs} == {"eval"}
    train_qids = {q["id"] for a in corpora.load_json("squad")["data"] if split_of(a["title"]) == "train"
                  for p in a["paragraphs"] for q in p["qas"]}
    assert not train_qids & {r.qid for r in recs}


def test_sft_command_trains_saves_and_resumes_on_the_real_model(tmp_path, capsys):
    """`memagent sft` end to end on SmolLM2-135M (LoRA on its top block, tiny chunks): the loss is finite,
    only adapter tensors change, a rerun resumes at the saved step, and final/ is a loadable adapter."""
    from memagent.cli import main
    from memagent.rl import metrics as metrics_io

    cfg = tmp_path / "sft.toml"
    cfg.write_text('model = "smollm2-135m"\nuse_peft = true\nlora_r = 4\nlora_alpha = 8\nlora_last_layers = 1\n'
                   'task = "notes"\ntemplate = "notes"\nnum_chunks = 1\nchunk_tokens = 64\nmemory_tokens = 64\n'
                   'answer_tokens = 32\nlearning_rate = 1e-3\nwarmup_steps = 0\nsft_conversations_per_step = 2\n'
                   f'torch_threads = 1\nprogress = false\noutput_dir = "{tmp_path / "run"}"\n')
    assert main(["sft", "--config", str(cfg), "--max-steps", "1"]) == 0
    assert main(["sft", "--config", str(cfg), "--max-steps", "2"]) == 0  # resumes at step 1, runs one more
    rows = metrics_io.read(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(0 < r["loss"] < 20 for r in rows)
    assert "resumed from" in capsys.readouterr().err
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    assert main(["sft", "--config", str(cfg), "--task", "kv"]) == 2  # sft needs the notes task's evidence


def test_sft_response_logits_equal_the_full_forward_slice(tmp_path):
    """The SFT step sends only the response positions through the LM head; those logits must be exactly the
    ones a full-length forward gives at the positions that predict the response (off by one would train
    the model to copy its input instead)."""
    import torch

    from memagent.rl.config import load_config
    from memagent.rl.sft import SFTRun

    cfg = tmp_path / "sft.toml"
    cfg.write_text('model = "smollm2-135m"\nuse_peft = true\nlora_r = 4\nlora_alpha = 8\nlora_last_layers = 1\n'
                   'task = "notes"\ntemplate = "notes"\nnum_chunks = 1\nchunk_tokens = 64\nmemory_tokens = 64\n'
                   f'answer_tokens = 32\nsft_conversations_per_step = 1\ntorch_threads = 1\nprogress = false\n'
                   f'output_dir = "{tmp_path / "run"}"\n')
    run = SFTRun(load_config(str(cfg), {}))
    run.model.eval()
    prompt, resp = run.batch()[0]
    with torch.no_grad():
        kept = run.response_logits(prompt, resp)
        full = run.model(input_ids=torch.tensor([prompt + resp])).logits[0]
    assert kept.shape == (len(resp), full.shape[-1])
    torch.testing.assert_close(kept, full[len(prompt) - 1:-1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(kept, full[len(prompt):], atol=1e-2)  # the test can tell a shifted slice


def test_first_token_weight_matches_hand_computed_loss():
    """Two-word vocabulary, uniform logits except the first position: the weighted loss by hand."""
    import math

    import torch

    from memagent.rl.sft import response_loss

    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0], [0.0, 0.0]])  # p(1) = 3/4 at the first token
    target = torch.tensor([0, 1, 0])  # first token's CE = -ln(1/4) = ln 4; the others ln 2
    loss, per_token = response_loss(logits, target, first_weight=4.0, norm=6.0)
    assert per_token.tolist() == pytest.approx([math.log(4), math.log(2), math.log(2)])
    assert float(loss) == pytest.approx((4 * math.log(4) + 2 * math.log(2)) / 6)
    unweighted, _ = response_loss(logits, target, first_weight=1.0, norm=3.0)
    assert float(unweighted) == pytest.approx((math.log(4) + 2 * math.log(2)) / 3)


@pytest.fixture(scope="module")
def prose_task(smol_tokenizer):
    return NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=4, memory_tokens=64, seed=5, qa_share=0.0,
                     prose_share=1.0)


def test_prose_facts_keep_the_asked_fact_and_plant_look_alikes(prose_task):
    shapes, with_distractors = set(), 0
    for i in range(40):
        s = prose_task.sample(i)
        assert s == prose_task.sample(i)
        shapes.add(s.meta["kind"])
        evidence = [e for per in s.meta["evidence"] for e in per]
        assert len(evidence) == 1 and s.answers[0].lower() in evidence[0].lower()
        assert evidence[0] in s.context
        if s.meta["distractors"]:
            with_distractors += 1
            # every planted distractor is in the document and is not kept by the oracle notes
            others = [ln for ln in s.context.replace(". ", ".\n").splitlines()
                      if ln.strip() and ln.strip() not in evidence[0] and s.answers[0] not in ln]
            assert others
            facts = s.meta["distractor_facts"]
            assert len(facts) == s.meta["distractors"]
            assert all(f in s.context for f in facts)  # planted in the document ...
            assert not set(facts) & set(evidence)  # ... and never kept by the oracle notes
    assert shapes == {"prose-attr", "prose-role", "prose-extreme"} and with_distractors >= 15


def test_value_a_sentence_away_is_kept_with_the_sentence_naming_the_key(prose_task):
    """Wordings that name the thing in one sentence and give its value in the next travel as one unit,
    so the oracle note holds both: a note with only the first sentence would have lost the answer."""
    from memagent.rl.notes_data import oracle_memories

    split = 0
    for i in range(200):
        s = prose_task.sample(i)
        gold = [e for per in s.meta["evidence"] for e in per][0]
        first, sep, rest = gold.partition(". ")
        if sep and s.answers[0] not in first and s.answers[0] in rest:
            split += 1
            assert gold in oracle_memories(s, "(none)")[-1]  # the whole two-sentence unit, not the first half
    assert split >= 10


def test_prose_noise_sets_prose_facts_in_ruler_noise_and_leaves_the_default_documents_alone(smol_tokenizer,
                                                                                            prose_task):
    """prose_noise puts prose facts among RULER's noise sentences, which the oracle notes never keep; at 0
    it draws nothing, so the documents of a seed (the held-out prose check's among them) do not change."""
    from memagent.rl.notes_data import RULER_NOISE, oracle_memories

    noisy = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=4, memory_tokens=64, seed=5, qa_share=0.0,
                      prose_share=1.0, prose_noise=1.0)
    own = 0
    for i in range(12):
        s = noisy.sample(i)
        assert s.meta["haystack"] == "noise" and s.meta["kind"].startswith("prose-")
        own += RULER_NOISE not in s.context
        gold = [e for per in s.meta["evidence"] for e in per][0]
        notes = oracle_memories(s, "(none)")
        assert "The grass is green." not in notes[-1] and gold in notes[-1]
    assert 0 < own < 12  # RULER's own noise sentences or the generator's, half and half
    assert {prose_task.sample(i).meta["haystack"] for i in range(40)} <= {"essay", "squad", "hotpot"}
    # Pinned: these changing means the held-out prose documents changed too, and every model's held-out
    # prose row must be measured again (docs/notes-model.md).
    assert [(prose_task.sample(i).question, prose_task.sample(i).answers) for i in range(3)] == [
        ("Who was named station clerk?", ("Pavel Ingram",)),
        ("What is the locker number of the stroke in Saltcombe?", ("747",)),
        ("What is the smallest attendance in the season's register?", ("844 people",))]


def test_late_share_puts_all_evidence_in_the_last_chunk_and_the_look_alikes_before_it(smol_tokenizer):
    """notes_late_share: the documents where keeping chunk 1's first guess is a wrong read. Every kind of
    sample (needle, prose, QA) of 2+ chunks has its evidence in the last chunk only, its prose look-alikes
    before it, and the oracle's notes stay empty until the last chunk."""
    from memagent.rl.notes_data import oracle_memories

    late = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=3, min_chunks=2, memory_tokens=64, seed=7,
                     qa_share=0.3, prose_share=0.4, late_share=1.0)
    kinds, looks = set(), 0
    for i in range(24):
        s = late.sample(i)
        kinds.add(s.meta["kind"].split("-")[0])
        ev = s.meta["evidence"]
        assert len(s.chunks) >= 2 and ev[-1] and not any(ev[:-1]), (i, s.meta["kind"])
        for d in s.meta.get("distractor_facts") or []:
            assert d not in s.chunks[-1] and any(d in c for c in s.chunks[:-1])
            looks += 1
        assert oracle_memories(s, "(none)")[:-1] == ["(none)"] * (len(s.chunks) - 1)
    assert kinds == {"needle", "prose", "qa"} and looks >= 5
    mixed = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=3, min_chunks=2, memory_tokens=64, seed=7,
                      qa_share=0.3, prose_share=0.4, late_share=0.5)
    last_only = sum(not any(mixed.sample(i).meta["evidence"][:-1]) for i in range(24))
    assert 6 <= last_only <= 22  # a share, not all: random layouts put evidence last sometimes too


def test_prose_shapes_narrow_the_draw_and_the_default_keeps_the_documents(smol_tokenizer, tmp_path):
    """notes_prose_shapes aims a round at one shape (roles, for round 7) from the config file; the default
    draws the same documents as before the knob existed, so the kept reads and held-out sets stay valid."""
    from memagent.rl.config import load_config
    from memagent.rl.data import make_task

    cfg_file = tmp_path / "roles.toml"
    cfg_file.write_text('task = "notes"\nnum_chunks = 2\nchunk_tokens = 256\nnotes_qa_share = 0.0\n'
                        'notes_prose_share = 1.0\nnotes_prose_shapes = ["role"]\nseed = 3\n')
    roles = make_task(load_config(cfg_file), smol_tokenizer)
    assert {roles.sample(i).meta["kind"] for i in range(12)} == {"prose-role"}
    kw = dict(chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=3, qa_share=0.0, prose_share=1.0)
    default = NotesTask(smol_tokenizer, **kw)
    listed = NotesTask(smol_tokenizer, prose_shapes=("extreme", "role", "attr"), **kw)
    kinds = [default.sample(i).meta["kind"] for i in range(16)]
    assert len(set(kinds)) == 3 and kinds == [listed.sample(i).meta["kind"] for i in range(16)]
    assert [default.sample(i).question for i in range(6)] == [listed.sample(i).question for i in range(6)]
    with pytest.raises(ValueError, match="prose_shapes"):
        NotesTask(smol_tokenizer, prose_shapes=("roles",), **kw)
    assert "prose-role_split" not in {default.sample(i).meta["kind"] for i in range(40)}


def test_essay_needles_and_decoys_aim_a_round_at_prose_and_leave_the_default_documents_alone(smol_tokenizer):
    """notes_needle_essay_share and notes_decoy_share (DAPO round 12): needles set in essay prose, most with
    answer-sounding sentences that belong to no key. A decoy never holds an answer (a read that copies it
    must be scored wrong), never names the asked key and is never evidence; at 0 neither draws a number, so
    every earlier seed keeps its documents (the digest was taken from the generator before the knobs)."""
    import hashlib
    import json

    from memagent.rl.config import ConfigError, TrainConfig
    from memagent.rl.notes_data import DECOYS

    kw = dict(chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=5, qa_share=0.2, prose_share=0.2)
    default = NotesTask(smol_tokenizer, **kw)
    h = hashlib.sha256()
    for i in range(12):
        s = default.sample(i)
        h.update(json.dumps([s.question, s.answers, s.chunks]).encode())
    assert h.hexdigest()[:16] == "fd63419209e597f4"
    aimed = NotesTask(smol_tokenizer, needle_essay_share=1.0, decoy_share=1.0, **dict(kw, qa_share=0.0,
                                                                                       prose_share=0.0))
    with_decoys, valued, plain = 0, 0, {f for f in DECOYS if "{v}" not in f}
    for i in range(16):
        s = aimed.sample(i)
        assert s.meta["haystack"] == "essay"
        with_decoys += bool(s.meta["decoys"])
        ev = [e for per in s.meta["evidence"] for e in per]
        for d in s.meta["decoys"]:
            assert any(d in c for c in s.chunks) and d not in ev
            assert s.meta["key"] not in d and not any(a in d or d in a for a in s.answers)
            valued += d not in plain
    assert with_decoys >= 14 and valued >= 10
    assert {default.sample(i).meta["haystack"] for i in range(24)} != {"essay"}
    for name in ("notes_needle_essay_share", "notes_decoy_share"):
        with pytest.raises(ConfigError, match=name):
            TrainConfig(task="notes", **{name: 1.5})


def test_title_lines_open_the_document_and_leave_the_default_documents_alone(smol_tokenizer):
    """notes_title_share (DAPO round 14): a heading line opens the first chunk, takes its tokens from the
    filler, is never evidence, half the time names the question's key or role, and at 0 draws nothing (the
    same digest as the essay-needle test)."""
    import hashlib
    import json

    from memagent.rl.config import ConfigError, TrainConfig

    kw = dict(chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=5, qa_share=0.2, prose_share=0.2)
    h = hashlib.sha256()
    for i in range(12):
        s = NotesTask(smol_tokenizer, title_share=0.0, **kw).sample(i)
        h.update(json.dumps([s.question, s.answers, s.chunks]).encode())
    assert h.hexdigest()[:16] == "fd63419209e597f4"
    titled = NotesTask(smol_tokenizer, title_share=1.0, late_share=1.0, prose_shapes=("role_split",),
                       **dict(kw, qa_share=0.3, prose_share=0.4))
    kinds, named = set(), 0
    for i in range(40):
        s = titled.sample(i)
        title = s.meta["title"]
        kinds.add(s.meta["kind"].split("-")[0])
        subject = s.meta["key"] if s.meta["kind"] == "needle" else s.question.rstrip("?").split()[-1]
        named += s.meta["kind"] != "qa" and subject in title  # the title names what the question asks about
        assert s.chunks[0].startswith(title + "\n\n")
        assert all(len(smol_tokenizer.encode(c)) <= 256 for c in s.chunks)
        ev = [e for per in s.meta["evidence"] for e in per]
        assert ev and title not in ev and all(a.lower() not in title.lower() for a in s.answers)
        for per, chunk in zip(s.meta["evidence"], s.chunks):
            assert all(e in chunk for e in per)
    assert kinds == {"needle", "qa", "prose"} and 5 <= named <= 30
    assert "title" not in NotesTask(smol_tokenizer, **kw).sample(0).meta
    with pytest.raises(ConfigError, match="notes_title_share"):
        TrainConfig(task="notes", notes_title_share=1.5).validate()


def test_word_titles_share_one_word_with_the_role_and_leave_earlier_titles_alone(smol_tokenizer):
    """notes_title_word_share (DAPO round 16): a title naming the subject may keep only its last word
    ("The Porter's Book, ..." over "Who is the night porter?"), never the answer; at 0 every title is the one
    drawn before the knob existed."""
    from memagent.rl import notes_prose
    from memagent.rl.config import ConfigError, TrainConfig

    kw = dict(chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=9, qa_share=0.0, prose_share=1.0,
              prose_shapes=("role_told",), title_share=1.0)
    plain, word = NotesTask(smol_tokenizer, **kw), NotesTask(smol_tokenizer, title_word_share=1.0, **kw)
    worded = 0
    for i in range(30):
        a, b = plain.sample(i), word.sample(i)
        role = max((r for r in notes_prose.ROLES if r in b.question), key=len)
        head = role.split()[-1].capitalize()
        assert b.answers[0] not in b.meta["title"]
        if a.meta["title"] != b.meta["title"]:  # only a title that named the subject changes
            assert role in a.meta["title"] and head in b.meta["title"] and role not in b.meta["title"]
            worded += 1
        assert (a.question, a.answers, a.meta["evidence"]) == (b.question, b.answers, b.meta["evidence"])
    assert worded >= 8
    with pytest.raises(ConfigError, match="notes_title_word_share"):
        TrainConfig(task="notes", notes_title_word_share=-0.1).validate()


def _assert_within_budget_with_evidence(tokenizer, sample, chunk_tokens: int):
    """Every chunk within its token budget, and every evidence sentence in some chunk (the openers the
    the_opening knobs add must take their room from the filler, never from the facts)."""
    assert all(len(tokenizer.encode(c)) <= chunk_tokens for c in sample.chunks)
    evidence = [e for per in sample.meta["evidence"] for e in per]
    assert evidence and all(any(e in c for c in sample.chunks) for e in evidence)


def test_the_openings_open_every_inner_chunk_with_the_and_keep_the_evidence(smol_tokenizer):
    """notes_the_opening_share: every chunk after a document's first opens with an essay sentence that
    begins "The " (the opening the default's notes copy, docs/notes-model.md, session 17), whatever the
    layout (evidence last, first, anywhere); the chunks keep their budget and every evidence sentence; a
    document's first chunk is never opened; at 0 the documents are the ones drawn before the knob."""
    from memagent.rl.config import ConfigError, TrainConfig
    from memagent.rl.notes_data import OPENER_TOKENS

    kw = dict(chunk_tokens=256, max_chunks=3, memory_tokens=64, seed=5, qa_share=0.0, prose_share=0.5,
              min_chunks=2, late_share=0.4, early_share=0.3, title_share=0.5)
    plain, zero, opened = (NotesTask(smol_tokenizer, **kw), NotesTask(smol_tokenizer, the_opening_share=0.0, **kw),
                           NotesTask(smol_tokenizer, the_opening_share=1.0, **kw))
    inner = 0
    for i in range(24):
        a, z, b = plain.sample(i), zero.sample(i), opened.sample(i)
        assert (a.question, a.chunks) == (z.question, z.chunks) and "the_openings" not in z.meta
        assert b.meta["the_openings"] and len(b.chunks) >= 2
        for c in b.chunks[1:]:
            first = c.split("\n")[0].split(". ")[0]
            assert c.startswith("The ") and len(smol_tokenizer.encode(first)) <= OPENER_TOKENS + 2
            inner += 1
        _assert_within_budget_with_evidence(smol_tokenizer, b, 256)
        assert b.chunks[0].startswith(b.meta["title"]) if "title" in b.meta else True
    assert inner >= 24
    not_the = sum(not c.startswith("The ") for i in range(24) for c in plain.sample(i).chunks[1:])
    assert not_the >= 12  # without the knob most inner chunks open otherwise, so the check above can fail
    with pytest.raises(ConfigError, match="notes_the_opening_share"):
        TrainConfig(task="notes", notes_the_opening_share=1.5).validate()


def _two_sentence_roles(tokenizer, shape: str, seed: int):
    """Documents of one two-sentence role shape, each checked for what role_split and role_told share: the
    asked role's first sentence names the role and not the person, the next names the person, and no
    distractor (other roles' people, ships, inns, visitors) holds the answer. Yields (sample, first, second)."""
    from memagent.rl import notes_prose

    t = NotesTask(tokenizer, chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=seed, qa_share=0.0,
                  prose_share=1.0, prose_shapes=(shape,))
    for i in range(30):
        s = t.sample(i)
        assert s.meta["kind"] == f"prose-{shape}"
        (gold,) = [e for per in s.meta["evidence"] for e in per]
        first, second = gold.split(". ", 1)
        name = s.answers[0]
        assert name not in first and name in second and name in " ".join(s.chunks)
        assert max((r for r in notes_prose.ROLES if r in s.question), key=len) in first
        for d in s.meta["distractor_facts"]:
            assert name not in d and d in " ".join(s.chunks)
        yield s, first, second


def test_split_roles_name_the_person_a_sentence_later_among_other_names(smol_tokenizer):
    """role_split (DAPO round 9): the name comes a sentence after the role, among other names (ships, inns,
    visitors), and no draw names a boat like the answer."""
    from memagent.rl import notes_prose

    mentions = 0
    for s, _, _ in _two_sentence_roles(smol_tokenizer, "role_split", seed=5):
        mentions += sum(any(m.split("{")[0] in d for m in notes_prose.NAME_MENTIONS if not m.startswith("{"))
                        for d in s.meta["distractor_facts"])
    assert mentions >= 10
    for seed in range(20000):  # 9 of these seeds (2994 the first) once drew a boat named like the answer
        gold, distract, _, (name,), role = notes_prose._role_split(random.Random(seed))
        assert not any(name in d for d in distract) and role in gold[0].lower(), seed


def test_told_roles_give_finished_news_first_and_the_name_only_after_it(smol_tokenizer):
    """role_told (DAPO round 15): the asked role's first sentence is whole news with a coach, a date or a town
    and no name; the name comes in the next sentence, which goes on past it; the default shapes never draw it."""
    from memagent.rl import notes_prose

    tails = 0
    for s, first, second in _two_sentence_roles(smol_tokenizer, "role_told", seed=7):
        assert any(v in first for v in notes_prose._VEHICLES + notes_prose._TOWNS) or " by " in first
        tails += len(second.split(s.answers[0], 1)[1]) > 20
    assert tails >= 15
    assert "prose-role_told" not in {NotesTask(smol_tokenizer, seed=7, prose_share=1.0, prose_shapes=(
        "attr", "role", "extreme", "role_split")).sample(i).meta["kind"] for i in range(40)}


def test_handovers_name_both_people_and_the_question_picks_one_by_its_qualifier(smol_tokenizer):
    """role_handover: the asked role's one fact names the person leaving and the person arriving; a question
    for the new holder is answered by the arriving one, one for the previous holder by the leaving one, both
    kinds are drawn, and neither person appears in any distractor."""
    from memagent.rl import notes_prose

    t = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=11, qa_share=0.0,
                  prose_share=1.0, prose_shapes=("role_handover",))
    asked = {"new": 0, "old": 0}
    for i in range(40):
        s = t.sample(i)
        assert s.meta["kind"] == "prose-role_handover"
        (gold,) = [e for per in s.meta["evidence"] for e in per]
        role = max((r for r in notes_prose.ROLES if r in s.question), key=len)
        others = [f"{f} {l}" for f in notes_prose._FIRST for l in notes_prose._LAST
                  if f"{f} {l}" in gold and f"{f} {l}" != s.answers[0]]
        assert role in gold and s.answers[0] in gold and len(others) == 1
        old_q = any(q.split("{")[0] in s.question for q in notes_prose.HANDOVER_OLD)
        new_q = any(q.format(r=role) == s.question for q in notes_prose.HANDOVER_NEW)
        assert old_q != new_q
        # read the gold back through its template: the {n} slot is the new holder, {o} the one leaving
        slots = {"o": "(?P<o>[^,.;]+?)", "n": "(?P<n>[^,.;]+?)", "r": re.escape(role), "k": r"\d+", "y": r"\d+",
                 "d": "[^.]+?", "t": "[^,.]+?"}
        found = [m for f in notes_prose.HANDOVER_FACTS
                 if (m := re.fullmatch("".join(slots[p[1:-1]] if p.startswith("{") else re.escape(p)
                                               for p in re.split(r"(\{\w\})", notes_prose._cap(f))), gold))]
        assert found and found[0]["n" if new_q else "o"] == s.answers[0]
        asked["old" if old_q else "new"] += 1
        for d in s.meta["distractor_facts"]:
            assert s.answers[0] not in d and others[0] not in d
    assert asked["new"] >= 20 and asked["old"] >= 6


def test_dated_values_differ_by_day_and_the_asked_day_is_anywhere_in_the_order(smol_tokenizer):
    """attr_dated: the thing's attribute is given on 2-5 days with different values; the gold is the asked
    day's sentence, the look-alikes are the other days' (plus sometimes another thing on the asked day), no
    look-alike holds the answer, and the asked day is not always first or last in the text."""
    from memagent.rl import notes_prose

    t = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=3, memory_tokens=64, seed=13, qa_share=0.0,
                  prose_share=1.0, prose_shapes=("attr_dated",))
    places = set()
    for i in range(40):
        s = t.sample(i)
        assert s.meta["kind"] == "prose-attr_dated"
        (gold,) = [e for per in s.meta["evidence"] for e in per]
        (day,) = [d for d in notes_prose.OCCASIONS if d in s.question]
        assert day in gold and s.answers[0] in gold
        text = " ".join(s.chunks)
        look = [d for d in s.meta["distractor_facts"] if d in text]
        assert look == s.meta["distractor_facts"]
        for d in look:
            assert s.answers[0] not in d
        same_thing = [d for d in look if day not in d]
        assert all(any(o in d for o in notes_prose.OCCASIONS) for d in same_thing)
        order = sorted([gold] + look, key=text.index)
        places.add("first" if order[0] == gold else "last" if order[-1] == gold else "middle")
    assert places == {"first", "middle", "last"}


def test_prose_facts_never_use_the_held_out_wordings(prose_task):
    """The demo document's measure and role and the planted-fact benchmark's attribute stay out of the
    training facts and questions, so those cells measure transfer."""
    from memagent.rl import notes_prose

    vocab = " ".join(map(str, [notes_prose.ATTRS, notes_prose.ATTR_FACTS, notes_prose.ROLES, notes_prose.ROLE_FACTS,
                               notes_prose.ROLE_SPLIT_FACTS, notes_prose.NAME_MENTIONS,
                               notes_prose.ROLE_TOLD_NEWS, notes_prose.ROLE_TOLD_NAMES,
                               notes_prose.HANDOVER_FACTS, notes_prose.HANDOVER_NEW, notes_prose.HANDOVER_OLD,
                               notes_prose.DATED_FACTS, notes_prose.DATED_QUESTIONS,
                               notes_prose.MEASURES, notes_prose.RECORDS, notes_prose.EXTREME_FACTS,
                               notes_prose.READING])).lower()
    for word in ("access code", "barometer", "keeper", "ledger", "red ink"):
        assert word not in vocab
    for i in range(40):
        s = prose_task.sample(i)
        text = (s.question + " " + " ".join(e for per in s.meta["evidence"] for e in per)).lower()
        assert "access code" not in text and "barometer" not in text and "keeper" not in text


def test_shares_mix_the_three_kinds(smol_tokenizer):
    t = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=1, qa_share=0.3,
                  prose_share=0.4)
    kinds = [t.sample(i).meta["kind"].split("-")[0] for i in range(40)]
    assert {"needle", "qa", "prose"} <= set(kinds)
    assert 8 <= kinds.count("prose") <= 24


def test_notes_shares_and_first_token_weight_are_validated():
    from memagent.rl.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="sum to at most 1"):
        TrainConfig(task="notes", notes_qa_share=0.7, notes_prose_share=0.5)
    with pytest.raises(ConfigError, match="sft_first_token_weight"):
        TrainConfig(task="notes", sft_first_token_weight=0.0)
    with pytest.raises(ConfigError, match="notes_prose_noise"):
        TrainConfig(task="notes", notes_prose_noise=1.5)
    with pytest.raises(ConfigError, match="notes_late_share"):
        TrainConfig(task="notes", notes_late_share=-0.1)
    with pytest.raises(ConfigError, match="notes_prose_shapes"):
        TrainConfig(task="notes", notes_prose_shapes=["role", "keeper"])
    with pytest.raises(ConfigError, match="notes_prose_shapes"):
        TrainConfig(task="notes", notes_prose_shapes=[])
    assert TrainConfig(task="notes", notes_qa_share=0.25, notes_prose_share=0.35).notes_prose_share == 0.35
    with pytest.raises(ConfigError, match="notes_min_chunks"):
        TrainConfig(task="notes", num_chunks=3, notes_min_chunks=4)


def test_notes_min_chunks_reaches_the_documents(smol_tokenizer):
    """notes_min_chunks travels from the config to the generator: every document has at least that many
    chunks, so the evidence often comes after chunks a reader must leave its notes empty on."""
    from memagent.rl.config import TrainConfig
    from memagent.rl.data import make_task

    cfg = TrainConfig(task="notes", num_chunks=3, notes_min_chunks=3, chunk_tokens=128, notes_qa_share=0.0, seed=5)
    docs = [make_task(cfg, smol_tokenizer).sample(i) for i in range(12)]
    assert all(len(d.meta["evidence"]) == 3 for d in docs)
    assert sum(not d.meta["evidence"][0] for d in docs) >= 4  # evidence placed anywhere: often not first


def test_heldout_check_reads_fresh_training_documents_with_the_real_model(tmp_path):
    """benchmarks/notes_heldout.py end to end on SmolLM2-135M (one prose document): it writes the scored
    sample, and a sample is correct exactly when its gold value is in the answer."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "notes_heldout.py"
    spec = importlib.util.spec_from_file_location("notes_heldout", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "h.json"
    assert mod.main(["--model", "smollm2-135m", "--kind", "prose", "--docs", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["docs"] == 1 and d["seed"] == 99 and d["machine"]["cpu_count"] >= 1
    (row,) = d["samples"]
    assert row["kind"].startswith("prose-") and row["error"] is None
    assert row["correct"] == (row["gold"][0].lower() in (row["answer"] or "").lower())
    assert d["accuracy"] == float(row["correct"])


def test_early_share_puts_the_evidence_first_and_every_look_alike_after_it(smol_tokenizer):
    """notes_early_share: the documents where rewriting the notes at a later look-alike is a wrong read
    (at 16K the default wrote the asked key beside a later needle's number). Documents with look-alikes
    have all their evidence in chunk 1 and none of the look-alike keys or facts there; documents without
    look-alikes lay out as before; the share combined with late_share is checked by the config."""
    from memagent.rl.config import ConfigError, TrainConfig

    early = NotesTask(smol_tokenizer, chunk_tokens=256, max_chunks=3, min_chunks=2, memory_tokens=64, seed=7,
                      qa_share=0.0, prose_share=0.4, early_share=1.0)
    looks = 0
    for i in range(24):
        s = early.sample(i)
        m = s.meta
        alikes = list(m.get("distractor_keys") or []) + list(m.get("distractor_facts") or [])
        if not alikes:
            continue
        assert m["evidence"][0] and not any(m["evidence"][1:]), (i, m["kind"])
        for a in alikes:
            assert a.lower() not in s.chunks[0].lower(), (i, a)
            looks += 1
    assert looks >= 10
    with pytest.raises(ConfigError, match="notes_early_share"):
        TrainConfig(task="notes", notes_early_share=0.6, notes_late_share=0.5)


def test_counts_in_words_are_opt_in_keep_the_digits_as_an_answer_and_word_the_look_alikes(smol_tokenizer):
    """notes_words_share (after held-out set 6): a prose fact's counts, and its look-alikes' counts, are
    written in words; the digit form stays an accepted answer; codes, years, dates and times keep their
    digits; at 0 every document is the one drawn before the knob existed."""
    from memagent.rl.config import ConfigError, TrainConfig
    from memagent.rl import notes_prose
    from memagent.rl.notes_prose import _COUNT, number_words

    assert [number_words(n) for n in (0, 7, 13, 20, 34, 100, 230, 999)] == [
        "zero", "seven", "thirteen", "twenty", "thirty-four", "one hundred", "two hundred and thirty",
        "nine hundred and ninety-nine"]
    with pytest.raises(ValueError):
        number_words(1000)
    kw = dict(chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=5, qa_share=0.0, prose_share=1.0,
              prose_shapes=("attr", "extreme", "attr_dated"))
    assert _COUNT.sub(lambda m: number_words(int(m.group(1))),
                      "Code AB-123 weighs 3.5 kg at 12:30 on 12 March 1846; 1,234 people, then 45.") == \
        "Code AB-123 weighs 3.5 kg at 12:30 on 12 March 1846; 1,234 people, then forty-five."
    worded = NotesTask(smol_tokenizer, words_share=1.0, **kw)
    # at 0 the knob draws no random number: the documents equal those of a generator without the knob
    plain = [NotesTask(smol_tokenizer, **kw).sample(i) for i in range(6)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(notes_prose, "_maybe_in_words", lambda task, rng, gold, distract, answers: (gold, distract, answers))
        assert plain == [NotesTask(smol_tokenizer, **kw).sample(i) for i in range(6)]
    n_worded = 0
    for i in range(40):
        s = worded.sample(i)
        evidence = [e for per in s.meta["evidence"] for e in per]
        assert evidence and all(e in s.context for e in evidence)
        if len(s.answers) == 2:  # (in words, in digits)
            n_worded += 1
            words, digits = s.answers
            assert any(ch.isdigit() for ch in digits) and not any(ch.isdigit() for ch in words)
            assert any(words in e for e in evidence) and not any(digits in e for e in evidence)
            assert not any(_COUNT.search(d) for d in s.meta["distractor_facts"])  # look-alikes in words too
        else:  # a value with no bare count (a colour, a town, a code, a date) is drawn as before
            assert len(s.answers) == 1
    assert n_worded >= 10
    with pytest.raises(ConfigError, match="notes_words_share"):
        TrainConfig(task="notes", notes_words_share=2.0).validate()


def test_reads_from_the_middle_open_every_chunk_with_the(smol_tokenizer):
    """notes_the_first_share: an opened document read from the middle of a text opens its first chunk
    with "The ..." as well and has no title, so a one-chunk read meets the opening with empty notes (the
    case where the default copies it, docs/notes-model.md, session 18); at 0 the opened documents are
    the ones drawn before the knob, and the chunks keep their budget and every evidence sentence."""
    from memagent.rl.config import ConfigError, TrainConfig

    kw = dict(chunk_tokens=256, max_chunks=2, memory_tokens=64, seed=7, qa_share=0.0, prose_share=0.5,
              min_chunks=1, late_share=0.5, title_share=1.0, the_opening_share=1.0)
    tasks = [NotesTask(smol_tokenizer, **kw)] + [NotesTask(smol_tokenizer, the_first_share=x, **kw) for x in (0.0, 1.0)]
    one_chunk = 0
    for i in range(24):
        a, z, b = (t.sample(i) for t in tasks)
        assert (a.question, a.chunks) == (z.question, z.chunks) and "read_from_middle" not in z.meta
        assert "title" in a.meta  # titled before the knob: so the knob below changes the document
        assert b.meta["read_from_middle"] and "title" not in b.meta
        assert all(c.startswith("The ") for c in b.chunks)
        _assert_within_budget_with_evidence(smol_tokenizer, b, 256)
        one_chunk += len(b.chunks) == 1
    assert one_chunk >= 4
    half = NotesTask(smol_tokenizer, the_first_share=0.5, **kw)
    assert 4 <= sum("read_from_middle" in half.sample(i).meta for i in range(24)) <= 20
    with pytest.raises(ConfigError, match="notes_the_first_share"):
        TrainConfig(task="notes", notes_the_first_share=2.0).validate()
