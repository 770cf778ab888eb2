"""The memory-model recipe's data and warm start: samples with known evidence, train/eval splits that never
share an article, oracle notes, and SFT conversations rendered exactly as inference renders them."""
import random
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
