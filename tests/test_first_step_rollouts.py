"""`first_step_rollouts`: step 1 of `memagent train` on reads collected earlier (rl/engine.py first_step)."""
import json

import pytest

torch = pytest.importorskip("torch")

from memagent.rl.config import ConfigError  # noqa: E402
from memagent.rl.engine import TrainError  # noqa: E402
from memagent.rl.rft import read_trajectory, trajectory_record  # noqa: E402
from memagent.rl.rollout import score_trajectories  # noqa: E402
from memagent.rl.tiny import tiny_trainer  # noqa: E402


def collected(tmp_path, **kw):
    """One step's reads of the tiny policy (model_seed 0), stored as memagent rft stores them."""
    t = tiny_trainer(tmp_path / "collect", seed=3, dynamic_sampling=False, weight_decay=0.0, **kw)
    _, trajs, _, _ = t.collect()
    # The untrained tiny model answers nothing right; gold answers that make each question's first read
    # right and the rest wrong ("z" is outside its alphabet) give every group a non-zero advantage.
    for x in trajs:
        x.answers = (x.reply,) if x.generation == 0 else ("zzzz",)
    score_trajectories(trajs, t.config)
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(trajectory_record(x, 0, "q")) + "\n" for x in trajs))
    return t, trajs, path


def params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_stored_reads_give_the_same_update_as_the_fresh_batch(tmp_path):
    fresh, trajs, path = collected(tmp_path)
    fresh.update(trajs)
    stored = tiny_trainer(tmp_path / "stored", seed=3, dynamic_sampling=False, weight_decay=0.0,
                          first_step_rollouts=[str(path)])
    rec = stored.train_step()
    assert rec["rollout_rounds"] == 0 and rec["trajectories"] == len(trajs)
    assert rec["reward"] == pytest.approx(sum(t.reward for t in trajs) / len(trajs))
    assert rec["logprob_mismatch"] < 1e-4  # the same policy: the stored sampler log-probs are this model's
    a, b = params(fresh.model), params(stored.model)
    start = params(tiny_trainer(tmp_path / "x", seed=3).model)
    assert any(not torch.allclose(a[k], start[k]) for k in a)  # the update moved the weights
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    rec2 = stored.train_step()  # later steps sample fresh reads
    assert rec2["rollout_rounds"] >= 1


def test_a_stored_read_keeps_its_match_and_is_rescored_with_it(tmp_path):
    t, trajs, _ = collected(tmp_path)
    x = trajs[0]
    x.answers, x.reply, x.match = ("ab", "cd"), "\\boxed{ab}", "all"
    rec = json.loads(json.dumps(trajectory_record(x, 0, "q")))
    assert read_trajectory(rec, 0, t.config).correct is False  # one of the two asked values
    rec["reply"] = "\\boxed{ab, cd}"
    assert read_trajectory(rec, 0, t.config).correct is True
    del rec["match"]  # reads stored before the field: scored as they were collected, any answer
    rec["reply"] = "\\boxed{ab}"
    assert read_trajectory(rec, 0, t.config).correct is True


def test_dynamic_sampling_drops_equal_groups_of_stored_reads(tmp_path):
    _, trajs, path = collected(tmp_path)
    t = tiny_trainer(tmp_path / "stored", seed=3, first_step_rollouts=[str(path)])
    kept, everything, dropped, rounds = t.first_step()
    assert len(everything) == len(trajs) and rounds == 0
    assert (dropped, len(kept)) == equal_groups(trajs)
    for x in trajs[:4]:  # question 0: all four reads wrong now, so its group carries no signal
        x.answers = ("zzzz",)
    score_trajectories(trajs, t.config)
    path.write_text("".join(json.dumps(trajectory_record(x, 0, "q")) + "\n" for x in trajs))
    kept, everything, dropped, _ = tiny_trainer(tmp_path / "stored2", seed=3, first_step_rollouts=[str(path)]).first_step()
    assert (dropped, len(kept)) == equal_groups(trajs) and dropped >= 1 and len(everything) == len(trajs)


def equal_groups(trajs):
    """(groups whose rewards are all equal, reads in the other groups), counted by hand."""
    groups = {}
    for x in trajs:
        groups.setdefault(x.group, []).append(x.reward)
    equal = [g for g, r in groups.items() if len(set(r)) == 1]
    return len(equal), sum(len(r) for g, r in groups.items() if g not in equal)


def test_reads_of_another_policy_or_a_missing_file_are_refused(tmp_path):
    _, _, path = collected(tmp_path)
    other = tiny_trainer(tmp_path / "other", seed=3, model_seed=7, first_step_rollouts=[str(path)])
    with pytest.raises(TrainError, match="differ from this model's"):
        other.train_step()
    hot = tiny_trainer(tmp_path / "hot", seed=3, temperature=2.0, first_step_rollouts=[str(path)])
    with pytest.raises(TrainError, match="temperature"):
        hot.train_step()
    missing = tiny_trainer(tmp_path / "missing", seed=3, first_step_rollouts=[str(tmp_path / "nope.jsonl")])
    with pytest.raises(ConfigError, match="first_step_rollouts: no such file"):
        missing.train_step()
