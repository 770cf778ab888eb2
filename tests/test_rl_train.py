"""End-to-end training on a from-scratch character model: learning, exact resume, NaN guard, torchrun.

Each test builds the tiny 2-layer Llama of memagent.rl.tiny; a step is ~1-3 s on one core.
"""
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from memagent.rl import metrics as metrics_io  # noqa: E402
from memagent.rl.engine import TrainError  # noqa: E402
from memagent.rl.tiny import tiny_trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_mean_reward_rises_on_a_trivial_memory_task(tmp_path):
    torch.set_num_threads(1)
    tr = tiny_trainer(tmp_path, questions_per_step=8, num_generations=8, dynamic_sampling=True,
                      max_resample_rounds=1, seed=0)
    recs = [tr.train_step() for _ in range(14)]
    asyncio.run(tr.aclose())
    first = sum(r["reward"] for r in recs[:2]) / 2
    last = sum(r["reward"] for r in recs[-3:]) / 3
    # random init answers right ~10-20% of the time (2 tokens from an 11-token vocabulary)
    assert first < 0.3
    assert last > first + 0.2, [round(r["reward"], 2) for r in recs]
    # the metrics file and the plot come from the run itself
    rows = metrics_io.read(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 15))
    assert {"groups_kept", "groups_dropped", "clip_frac", "entropy", "memory_len", "train_tokens_per_s"} <= set(rows[-1])
    assert rows[-1]["logprob_mismatch"] < 1e-4  # trainer log-probs == the sampler's
    tr.plot()
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000


def test_resume_is_exact(tmp_path):
    torch.set_num_threads(1)
    a = tiny_trainer(tmp_path / "a", dynamic_sampling=True, max_resample_rounds=2)
    ra = [a.train_step() for _ in range(3)]
    pa = params(a.model)
    asyncio.run(a.aclose())

    b = tiny_trainer(tmp_path / "b", dynamic_sampling=True, max_resample_rounds=2)
    [b.train_step() for _ in range(2)]
    b.save()
    asyncio.run(b.aclose())
    c = tiny_trainer(tmp_path / "b", dynamic_sampling=True, max_resample_rounds=2, model_seed=123)  # other init
    assert c.step == 2 and c.cursor == b.cursor
    rc = c.train_step()
    asyncio.run(c.aclose())
    assert rc["reward"] == ra[2]["reward"] and rc["groups_kept"] == ra[2]["groups_kept"]
    for k, v in params(c.model).items():
        torch.testing.assert_close(v, pa[k], rtol=0, atol=1e-6)


def test_nonfinite_loss_skips_the_update_and_then_stops(tmp_path):
    torch.set_num_threads(1)
    msgs = []
    tr = tiny_trainer(tmp_path, max_nonfinite_steps=2, dynamic_sampling=False)
    tr.log = msgs.append
    kept, _, _, _ = tr.collect()
    kept[0].reward = float("nan")  # poisons its group's advantages -> NaN loss
    before = params(tr.model)
    stats = tr.update(kept)
    assert stats["skipped"] == 1 and "non-finite" in msgs[0] and "weights unchanged" in msgs[0]
    for k, v in params(tr.model).items():
        assert torch.equal(v, before[k])
    with pytest.raises(TrainError, match="2 non-finite updates in a row"):
        tr.update(kept)
    asyncio.run(tr.aclose())


def test_torchrun_two_ranks_match_one_process(tmp_path):
    """2 CPU ranks (gloo) each read half the questions; after 2 steps both hold the same weights, equal
    to a single process that read all of them (the loss is normalised by global counts)."""
    overrides = "dict(questions_per_step=4, num_generations=4, dynamic_sampling=False)"
    script = tmp_path / "run.py"
    script.write_text(f"import sys, torch\ntorch.set_num_threads(1)\nfrom memagent.rl.tiny import run_tiny\n"
                      f"run_tiny(sys.argv[1], 2, **{overrides})\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    single = tmp_path / "single"
    single.mkdir()
    subprocess.run([sys.executable, str(script), str(single)], env=env, check=True, timeout=300)
    multi = tmp_path / "multi"
    multi.mkdir()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), str(multi)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    one = torch.load(single / "params-0.pt")
    r0, r1 = torch.load(multi / "params-0.pt"), torch.load(multi / "params-1.pt")
    assert not all(torch.equal(one[k], tiny0) for k, tiny0 in params_at_init().items())  # it did train
    for k in one:
        assert torch.equal(r0[k], r1[k]), k  # ranks are identical bit for bit
        torch.testing.assert_close(r0[k], one[k], rtol=1e-4, atol=1e-6)
    # the logged loss is the whole batch's (summed over ranks), as one process logs it, not rank 0's share
    loss_one = [r["loss"] for r in metrics_io.read(single / "run" / "metrics.jsonl")]
    loss_two = [r["loss"] for r in metrics_io.read(multi / "run" / "metrics.jsonl")]
    assert loss_two == pytest.approx(loss_one, rel=1e-4, abs=1e-7)


def params_at_init():
    from memagent.rl.tiny import build_model

    return params(build_model(seed=0))


def test_lora_policy_from_a_folder_with_kl_to_the_adapter_free_reference(tmp_path):
    """The path real models take: load from an HF folder, LoRA on the last layer only, k3 KL against the
    same weights with the adapter switched off; only adapter tensors change and get checkpointed."""
    from memagent.rl.config import TrainConfig
    from memagent.rl.data import CharKVTask
    from memagent.rl.engine import Trainer
    from memagent.rl.tiny import TINY_TEMPLATE, build_model, build_tokenizer

    torch.set_num_threads(1)
    folder = tmp_path / "model"
    build_tokenizer(folder)
    build_model(seed=0).save_pretrained(str(folder))
    cfg = TrainConfig(model=str(folder), use_peft=True, lora_last_layers=1, lora_r=4,
                      lora_target_modules=["q_proj", "v_proj"], beta=0.05, memory_tokens=3, answer_tokens=2,
                      questions_per_step=4, num_generations=4, learning_rate=1e-2, warmup_steps=0, max_steps=3,
                      mask_truncated_completions=False, dynamic_sampling=False, output_dir=str(tmp_path / "run"),
                      progress=False, device="cpu")
    tr = Trainer(cfg, task=CharKVTask(num_chunks=2), template=TINY_TEMPLATE)
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".layers.1." in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    recs = [tr.train_step() for _ in range(2)]
    assert recs[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # adapter B starts at zero: policy == reference
    assert recs[1]["kl"] > 0  # after one update the policy has moved away from the reference
    for n, p in tr.model.named_parameters():
        if n in base_before:
            assert torch.equal(p, base_before[n])
    tr.save()
    saved = torch.load(tmp_path / "run" / "checkpoint" / "weights.pt")
    assert set(saved) and all("lora_" in k for k in saved)
    final = tr.save_final()
    assert (final / "adapter_config.json").is_file() and (final / "tokenizer.json").is_file()
    asyncio.run(tr.aclose())


def test_evaluate_is_reproducible_when_sampling(tmp_path):
    from memagent.rl.data import CharKVTask
    from memagent.rl.engine import evaluate

    torch.set_num_threads(1)
    tr = tiny_trainer(tmp_path)
    samples = [CharKVTask(num_chunks=8).sample(10_000_000 + i) for i in range(6)]  # 4x the training length
    runs = [evaluate(tr.backend, tr.template, tr.tokenizer, samples, 3, 2, temperature=0.7, top_p=0.95, seed=s)
            for s in (1, 1, 2)]
    greedy = evaluate(tr.backend, tr.template, tr.tokenizer, samples, 3, 2)
    asyncio.run(tr.aclose())
    assert runs[0]["examples"] == runs[1]["examples"] and runs[0]["n"] == greedy["n"] == 6
    assert runs[0]["examples"] != runs[2]["examples"]  # another seed, other draws


def test_cli_train_runs_saves_and_resumes(tmp_path, capsys):
    from memagent.cli import main
    from memagent.rl.tiny import build_model, build_tokenizer

    folder = tmp_path / "model"
    build_tokenizer(folder)
    build_model(seed=0).save_pretrained(str(folder))
    template = tmp_path / "tiny.toml"
    template.write_text('update = "{question}|{memory}|{chunk}>"\nfinal = "{question}|{memory}>"\nempty_memory = "-"\n')
    cfg = tmp_path / "train.toml"
    cfg.write_text(f'model = "{folder}"\ntask = "charkv"\nnum_chunks = 2\ntemplate = "{template}"\nmemory_tokens = 3\n'
                   f'answer_tokens = 2\nquestions_per_step = 2\nnum_generations = 4\nbeta = 0.0\nwarmup_steps = 0\n'
                   f'learning_rate = 1e-3\ndevice = "cpu"\ntorch_threads = 1\noutput_dir = "{tmp_path / "run"}"\n')
    assert main(["train", "--config", str(cfg), "--max-steps", "2"]) == 0
    run = tmp_path / "run"
    assert (run / "checkpoint" / "trainer_state.json").is_file() and (run / "curves.png").is_file()
    assert (run / "final" / "config.json").is_file()
    assert main(["train", "--config", str(cfg), "--max-steps", "3"]) == 0  # resumes at step 2, runs one more
    assert [r["step"] for r in metrics_io.read(run / "metrics.jsonl")] == [1, 2, 3]
    assert "resumed from" in capsys.readouterr().err
    assert main(["train", "--config", str(cfg), "--loss-type", "ppo"]) == 2
