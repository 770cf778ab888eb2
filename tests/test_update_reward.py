"""`update_reward`: each memory update's own advantage term (rl/advantage.py update_advantages), hand-computed."""
import math

import pytest

from memagent.rl.advantage import expand_to_rows, filter_groups, update_advantages
from memagent.rl.config import ConfigError, TrainConfig
from memagent.rl.rollout import Conversation, Trajectory


def conv(kind="update"):
    return Conversation(prompt_ids=[7], response_ids=[1, 2], logprobs=[-1.0, -1.0], finished=True, kind=kind,
                        max_tokens=8)


def read(group, memories, reward=0.0, answers=("4821",), match="any"):
    """One read: an update per entry of `memories` (the notes it wrote), then the final answer."""
    return Trajectory(sample_id=f"q{group}", group=group, generation=0,
                      conversations=[conv() for _ in memories] + [conv("final")], reply="", answer="",
                      answers=answers, reward=reward, memories=list(memories), match=match)


def test_keep_is_rewarded_drop_is_punished_and_a_read_with_nothing_to_keep_is_left_alone():
    reads = [read(0, ["The code is 4821.", "The code is 4821."]),   # found at chunk 1, kept
             read(0, ["The code is 4821.", "The code is 7777."]),   # found, then rewritten away
             read(0, ["No notes yet.", "The code is 7777."])]       # never saw it
    u = update_advantages(reads)
    # chunk 1 brings the gold (a read holds it that did not before): all three compared, mean 2/3
    assert [x[0] for x in u] == pytest.approx([1 / 3, 1 / 3, -2 / 3])
    # chunk 2: only the two reads whose notes held it could keep it, mean 1/2; the third gets nothing
    assert [x[1] for x in u] == pytest.approx([0.5, -0.5, 0.0])


def test_a_chunk_that_brings_nothing_to_anyone_gives_no_signal():
    reads = [read(0, ["No notes yet.", "The code is 4821."]), read(0, ["Nothing.", "The code is 4821."])]
    assert update_advantages(reads) == [[0.0, 0.0], [0.0, 0.0]]  # chunk 1: no gold; chunk 2: all found it
    lone = [read(1, ["The code is 4821."]), read(2, ["Nothing."])]  # groups of one have no baseline
    assert update_advantages(lone) == [[0.0], [0.0]]


def test_group_scaling_divides_by_the_cells_std_and_match_all_needs_every_value():
    reads = [read(0, ["4821"]), read(0, ["4821"]), read(0, ["0000"]), read(0, ["0000"])]
    s = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 1, 0, 0]
    assert [x[0] for x in update_advantages(reads, "group")] == pytest.approx([0.5 / (s + 1e-4)] * 2
                                                                               + [-0.5 / (s + 1e-4)] * 2)
    both = [read(0, ["12 and 34"], answers=("12", "34"), match="all"),
            read(0, ["12 only"], answers=("12", "34"), match="all")]
    assert [x[0] for x in update_advantages(both)] == pytest.approx([0.5, -0.5])


def test_the_signal_reaches_update_rows_only_and_keeps_a_group_dynamic_sampling_would_drop():
    reads = [read(0, ["4821", "4821"], reward=0.0), read(0, ["4821", "7777"], reward=0.0)]
    u = [[0.5 * x for x in row] for row in update_advantages(reads)]  # update_reward = 0.5
    rows = expand_to_rows(reads, [0.0, 0.0], False, u)
    assert [(r.kind, r.advantage) for r in rows] == [("update", 0.0), ("update", 0.25), ("final", 0.0),
                                                     ("update", 0.0), ("update", -0.25), ("final", 0.0)]
    assert filter_groups(reads) == ([], 1)  # equal final rewards: DAPO drops the group
    kept, dropped = filter_groups(reads, update_signal=u)
    assert len(kept) == 2 and dropped == 0
    assert [r.advantage for r in expand_to_rows(reads, [0.0, 0.0], False)] == [0.0] * 6  # off: as before


def test_update_reward_is_off_by_default_and_never_negative():
    assert TrainConfig().update_reward == 0.0
    with pytest.raises(ConfigError, match="update_reward"):
        TrainConfig(update_reward=-1.0)


def test_the_trainer_adds_the_weighted_signal_to_its_update_rows(tmp_path):
    pytest.importorskip("torch")
    from memagent.rl.tiny import tiny_trainer

    t = tiny_trainer(tmp_path / "on", seed=3, dynamic_sampling=False, update_reward=2.0)
    reads = [read(0, ["4821"], reward=1.0), read(0, ["0000"], reward=0.0)]
    assert t.update_signal(reads) == [[1.0], [-1.0]]  # 2.0 x (+-1/2)
    rec = t.update(reads)
    assert rec["update_signal_rows"] == 2
    off = tiny_trainer(tmp_path / "off", seed=3, dynamic_sampling=False)
    assert off.update_signal(reads) is None and "update_signal_rows" not in off.update(reads)


def test_a_read_without_its_notes_is_refused_not_silently_given_no_signal(tmp_path):
    bare = read(0, ["4821", "7777"])
    bare.memories = []  # as a read stored before the notes were kept
    with pytest.raises(ValueError, match="2 updates"):
        update_advantages([bare, read(0, ["4821", "4821"])])
    pytest.importorskip("torch")
    from memagent.rl.engine import TrainError
    from memagent.rl.tiny import tiny_trainer

    with pytest.raises(TrainError, match="update_reward needs the notes"):
        tiny_trainer(tmp_path, seed=3, update_reward=1.0).update_signal([bare])
