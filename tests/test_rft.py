"""memagent rft: which reads are kept, what is trained of them, and the command end to end on a real model
(rollouts on the llama.cpp engine, the update in torch)."""
import json

import pytest

from memagent.rl.rft import collection_stats, kept_reads, training_rows


def _read(group, correct, convs=()):
    return {"group": group, "correct": correct, "conversations": list(convs)}


def test_kept_reads_any_keeps_every_correct_read_and_mixed_only_informative_groups():
    reads = [_read(0, True), _read(0, True),  # all correct: nothing to learn about the choice
             _read(1, True), _read(1, False),  # mixed: the answer depended on what the notes kept
             _read(2, False), _read(2, False)]
    assert [r["group"] for r in kept_reads(reads, "any")] == [0, 0, 1]
    assert [r["group"] for r in kept_reads(reads, "mixed")] == [1]
    stats = collection_stats(reads, 2)
    assert (stats["groups_all_correct"], stats["groups_mixed"], stats["groups_all_wrong"]) == (1, 1, 1)
    assert (stats["reads"], stats["correct_reads"], stats["questions"]) == (6, 3, 3)


def test_training_rows_end_a_finished_reply_once_and_leave_a_capped_one_open():
    eos = 7
    read = _read(0, True, [
        {"prompt_ids": [1, 2], "response_ids": [3, 4], "finished": True},  # engine left the end-of-turn out
        {"prompt_ids": [1, 2], "response_ids": [3, eos], "finished": True},  # already there: not doubled
        {"prompt_ids": [1, 2], "response_ids": [3, 4, 5], "finished": False},  # cut at its cap: no end added
        {"prompt_ids": [1, 2], "response_ids": [], "finished": False}])  # nothing sampled: nothing to train
    assert training_rows(read, eos) == [([1, 2], [3, 4, eos]), ([1, 2], [3, eos]), ([1, 2], [3, 4, 5])]


def test_earlier_collections_are_pooled_as_their_own_groups(tmp_path):
    """rft_rollouts: a gzipped earlier collection is read, its question 0 stays apart from this run's
    question 0 (else a right read there would make this run's all-wrong group look mixed), and a missing
    file is refused before any read is made."""
    import gzip

    from memagent.rl.config import ConfigError, TrainConfig
    from memagent.rl.rft import earlier_reads, run

    lines = [json.dumps({**_read(0, ok), "round": 0}) for ok in (True, False)]
    (tmp_path / "old.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    cfg = TrainConfig(task="notes", rft_rollouts=[str(tmp_path / "old.jsonl.gz")])
    old = earlier_reads(cfg)
    assert [r["group"] for r in old] == ["earlier0:0", "earlier0:0"]
    assert [r["group"] for r in kept_reads([_read(0, False), _read(0, False)] + old, "mixed")] == ["earlier0:0"]
    with pytest.raises(ConfigError, match="no such file"):
        run(TrainConfig(task="notes", rft_rollouts=[str(tmp_path / "gone.jsonl")], output_dir=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_rft_config_rejects_unknown_group_rule():
    from memagent.rl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rft_groups"):
        load_config(None, {"rft_groups": "best"})
    with pytest.raises(ConfigError, match="rft_questions"):
        load_config(None, {"rft_questions": 0})  # no reads at all: only allowed with earlier collections
    assert load_config(None, {"rft_questions": 0, "rft_rollouts": ["r.jsonl"]}).rft_questions == 0
    with pytest.raises(ConfigError, match="rft_empty_turns"):
        load_config(None, {"rft_empty_turns": -1})
    with pytest.raises(ConfigError, match="num_chunks >= 2"):  # one chunk: evidence always there, no empty turn
        load_config(None, {"rft_empty_turns": 1, "num_chunks": 1})


def test_rft_command_collects_on_llama_cpp_resumes_and_trains_on_the_kept_reads(tmp_path, capsys):
    """Real SmolLM2-135M: the reads are sampled by llama.cpp with token ids and log-probs, a rerun does not
    roll out again, and the fine-tune trains on exactly the kept reads, after measuring the engine/torch
    log-prob gap. A read is marked correct by hand so the test does not depend on what a 135M model
    answers; the wiring is what is tested."""
    pytest.importorskip("xllamacpp")
    from memagent.cli import main

    run = tmp_path / "run"
    cfg = tmp_path / "rft.toml"
    cfg.write_text('model = "smollm2-135m"\nuse_peft = true\nlora_r = 4\nlora_alpha = 8\nlora_last_layers = 1\n'
                   'task = "notes"\ntemplate = "notes"\nnum_chunks = 1\nchunk_tokens = 64\nmemory_tokens = 24\n'
                   'answer_tokens = 16\nrft_questions = 2\nquestions_per_step = 2\nnum_generations = 2\n'
                   'dynamic_sampling = false\ntemperature = 0.7\nlearning_rate = 1e-3\nwarmup_steps = 0\n'
                   'sft_conversations_per_step = 1\ntorch_threads = 1\nprogress = false\nseed = 5\n'
                   f'max_steps = 1\noutput_dir = "{run}"\n')
    code = main(["rft", "--config", str(cfg)])
    reads = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(reads) == 4 and {r["round"] for r in reads} == {0}
    assert sorted((r["group"], r["generation"]) for r in reads) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in reads:
        assert [c["kind"] for c in r["conversations"]] == ["update", "final"]
        for c in r["conversations"]:
            assert c["prompt_ids"] and len(c["logprobs"]) == len(c["response_ids"])
            assert all(lp <= 1e-6 for lp in c["logprobs"])
    if not any(r["correct"] for r in reads):
        assert code == 2 and "no correct reads" in capsys.readouterr().err
        reads[0]["correct"] = True
        (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reads))
        assert main(["rft", "--config", str(cfg)]) == 0
    else:
        assert code == 0
    after = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert after == reads  # the rerun found round 0 done and sampled nothing new
    stats = json.loads((run / "collect.json").read_text())
    assert stats["reads"] == 4 and stats["kept_reads"] == sum(r["correct"] for r in reads) >= 1
    gap = json.loads((run / "logprob_gap.json").read_text())
    assert gap["tokens"] > 0 and gap["mean_abs"] < 5  # same model, two engines: close, not equal
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and 0 < metrics[0]["loss"] < 20
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert main(["rft", "--config", str(cfg), "--task", "kv"]) == 2  # rft reads the notes task's documents
    # a fine-tune on an earlier collection only (rft_questions = 0), with stay-empty turns mixed in
    run2 = tmp_path / "run2"
    assert main(["rft", "--config", str(cfg), "--rft-questions", "0", "--rft-rollouts", str(run / "rollouts.jsonl"),
                 "--rft-empty-turns", "1", "--num-chunks", "2", "--output-dir", str(run2)]) == 0
    assert not (run2 / "rollouts.jsonl").exists()
    stats2 = json.loads((run2 / "collect.json").read_text())
    assert stats2["reads"] == 0 and stats2["earlier"]["reads"] == 4 and stats2["kept_reads"] == stats["kept_reads"]
    m2 = json.loads((run2 / "metrics.jsonl").read_text().splitlines()[0])
    assert m2["conversations"] == metrics[0]["conversations"] + 1
    # collect only (max_steps = 0), then one `memagent train` step on those reads, wrong ones included
    run3, run4 = tmp_path / "run3", tmp_path / "run4"
    capsys.readouterr()
    assert main(["rft", "--config", str(cfg), "--max-steps", "0", "--seed", "6", "--output-dir", str(run3)]) == 0
    assert "no fine-tune" in capsys.readouterr().out
    assert len((run3 / "rollouts.jsonl").read_text().splitlines()) == 4
    assert not (run3 / "final").exists() and not (run3 / "metrics.jsonl").exists()
    assert main(["train", "--config", str(cfg), "--max-steps", "0"]) == 2  # collect-only is rft's alone
    assert main(["train", "--config", str(cfg), "--first-step-rollouts", str(run3 / "rollouts.jsonl"),
                 "--output-dir", str(run4)]) == 0
    step = json.loads((run4 / "metrics.jsonl").read_text().splitlines()[0])
    assert step["rollout_rounds"] == 0 and step["trajectories"] == 4  # the stored reads, none sampled
    assert "log-prob gap" in capsys.readouterr().err


def test_empty_turns_are_supervised_stay_empty_decisions_drawn_by_step(tmp_path):
    """rft_empty_turns: each step gets that many program-written turns whose target is exactly the empty
    marker, on a chunk read with empty notes (the decision a correct read rarely had to make); the same
    step draws the same turns (a resumed run trains what the first one would have)."""
    from memagent.rl.config import TrainConfig
    from memagent.rl.rft import RFTRun

    cfg = TrainConfig(model="smollm2-135m", use_peft=True, lora_r=4, lora_alpha=8, lora_last_layers=1, task="notes",
                      num_chunks=3, notes_min_chunks=3, chunk_tokens=96, memory_tokens=24, rft_empty_turns=3,
                      sft_conversations_per_step=1, torch_threads=1, progress=False, output_dir=str(tmp_path))
    run_ = RFTRun(cfg, [_read(0, True, [{"prompt_ids": [1, 2], "response_ids": [3], "finished": True}])])
    rows = run_.batch()
    assert rows[0] == ([1, 2], [3, run_.eos]) and len(rows) == 4
    empty = run_.template.empty_memory
    for prompt, resp in rows[1:]:
        assert run_.hf_tok.decode(resp[:-1]) == empty and resp[-1] == run_.eos
        assert empty in run_.hf_tok.decode(prompt)  # read with empty notes
    assert run_.empty_turns(3) == rows[1:]
    run_.step += 1
    assert run_.empty_turns(3) != rows[1:]


def test_an_eval_folder_belongs_to_one_adapter(tmp_path):
    """Results read with a run's adapter must not be resumed with another adapter (or the same folder
    retrained in place), and folders written without one still resume."""
    from memagent.eval import EvalConfig, adapter_digest

    folder = tmp_path / "final"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights one")
    one = adapter_digest(str(folder))
    (folder / "adapter_model.safetensors").write_bytes(b"weights two")
    assert adapter_digest(str(folder)) != one and adapter_digest(None) is None
    plain = EvalConfig(tasks=["x"], lengths=[1])
    assert "adapter" not in plain.identity() and "adapter_digest" not in plain.identity()
    with_a = EvalConfig(tasks=["x"], lengths=[1], adapter=str(folder), adapter_digest=one)
    assert with_a.identity()["adapter_digest"] == one and with_a.identity() != plain.identity()
