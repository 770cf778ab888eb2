"""The trainer's release-behaviour options and the audit fixes (issue: trainer fixes), with hand numbers."""
import asyncio

import pytest

torch = pytest.importorskip("torch")

from memagent.rl.advantage import Row, normalise_mini_batches  # noqa: E402
from memagent.rl.config import ConfigError, TrainConfig  # noqa: E402
from memagent.rl.loss import policy_loss  # noqa: E402


def test_dual_clip_caps_negative_advantage_tokens_at_c_times_a():
    # ratios 5 and 0.5 on A = -1, ratio 5 on A = +1; epsilon 0.2
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[5.0, 0.5, 5.0]]))
    w = torch.ones(1, 3)
    for adv_vals, c, want in (
        ([-1.0], None, [5.0, 0.8]),  # plain clip: -min(5*-1, 1.2*-1) = 5; -min(-0.5, -0.8) = 0.8
        ([-1.0], 3.0, [3.0, 0.8]),  # dual clip: min(5, 3) = 3; 0.8 is under the cap
    ):
        per = []
        for j in range(2):
            loss, _ = policy_loss(logp[:, j:j + 1], old[:, j:j + 1], torch.tensor(adv_vals), w[:, :1], clip_ratio_c=c)
            per.append(float(loss))
        assert per == pytest.approx(want, abs=1e-6)
    # positive advantages are never dual-clipped: -min(5, 1.2) = -1.2
    loss, st = policy_loss(logp[:, 2:], old[:, 2:], torch.tensor([1.0]), w[:, :1], clip_ratio_c=3.0)
    assert float(loss) == pytest.approx(-1.2) and st["dual_clipped"] == 0
    _, st = policy_loss(logp[:, :1], old[:, :1], torch.tensor([-1.0]), w[:, :1], clip_ratio_c=3.0)
    assert st["dual_clipped"] == 1


def rows(sizes, traj):
    return [Row(prompt_ids=[1], response_ids=[2] * n, sampler_logprobs=None, advantage=1.0, trajectory=t,
                kind="update", finished=True, active=True) for n, t in zip(sizes, traj)]


def test_mini_batch_normalisation_batch_vs_release():
    from memagent.rl.advantage import assign_weights

    a, b = rows([2, 3], [0, 1]), rows([5], [2])
    assign_weights(a + b, "dapo", "tokens", 64)  # whole batch: 10 tokens
    assert normalise_mini_batches([a, b], "batch", "dapo", "tokens", 64) == 2.0
    assert [r.weight for r in a + b] == pytest.approx([0.1, 0.1, 0.1])  # x2 per step = 0.2 a token
    scale = normalise_mini_batches([a, b], "mini_batch", "dapo", "tokens", 64)
    assert scale == 1.0
    # each mini-batch its own token-mean: part a has 5 tokens, part b 5 tokens
    assert [r.weight for r in a + b] == pytest.approx([0.2, 0.2, 0.2])
    c, d = rows([1, 3], [0, 0]), rows([4], [1])
    normalise_mini_batches([c, d], "mini_batch", "dapo", "tokens", 64)
    assert [r.weight for r in c + d] == pytest.approx([0.25, 0.25, 0.25])


def test_release_options_validate():
    assert TrainConfig(clip_ratio_c=3.0, mini_batch_norm="mini_batch", dynamic_sampling=False).clip_ratio_c == 3.0
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        TrainConfig(clip_ratio_c=0.5)
    with pytest.raises(ConfigError, match="mini_batch_norm"):
        TrainConfig(mini_batch_norm="rows")


def lora_tiny_trainer(tmp_path, **overrides):
    from peft import LoraConfig, get_peft_model

    from memagent.rl.data import CharKVTask
    from memagent.rl.engine import Trainer
    from memagent.rl.tiny import TINY_TEMPLATE, build_model, build_tokenizer

    hf, tok = build_tokenizer(tmp_path / "tok")
    model = get_peft_model(build_model(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5,
                                                     target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                                                     init_lora_weights=False))  # B != 0: dropout shows
    settings = dict(model="tiny", memory_tokens=3, answer_tokens=2, questions_per_step=4, num_generations=4,
                    learning_rate=0.0, warmup_steps=0, beta=0.0, output_dir=str(tmp_path / "run"),
                    torch_threads=1, progress=False, dynamic_sampling=False, use_peft=True)
    settings.update(overrides)
    return Trainer(TrainConfig(**settings), model=model, hf_tokenizer=hf, tokenizer=tok,
                   task=CharKVTask(num_chunks=2, seed=0), template=TINY_TEMPLATE)


def test_ratio_is_one_at_lr_zero_with_lora_dropout_and_several_mini_batches(tmp_path):
    torch.manual_seed(0)
    tr = lora_tiny_trainer(tmp_path, num_mini_batches=2, num_iterations=2, epsilon=0.01)
    kept, everything, dropped, _ = tr.collect()
    # dynamic sampling off (the release): every group is trained, none dropped
    assert dropped == 0 and len(kept) == len(everything) == 16
    for t, g in zip(kept, [0, 1, 2, 3] * 4):
        t.reward = float(t.generation % 2)  # both outcomes in every group: non-zero advantages
    stats = tr.update(kept)
    asyncio.run(tr.aclose())
    # with dropout active in the old or current forward the ratio wanders and the 1% clip fires
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clip_frac"] == 0.0
    assert any(m.training for m in tr.model.modules() if isinstance(m, torch.nn.Dropout))  # restored
