"""Hand-computed checks of the RL maths (advantages, weights, loss, KL, filters) and of the rollout shape."""
import asyncio
import math

import pytest

from memagent.protocol import Generation
from memagent.reader import Reader, ReaderConfig
from memagent.rl.advantage import assign_weights, expand_to_rows, filter_groups, group_advantages, weight_totals
from memagent.rl.config import ConfigError, load_config
from memagent.rl.data import CharKVTask, Sample
from memagent.rl.rollout import (Conversation, Trajectory, holds_answers, normalize_answer, rollout, score,
                                 trajectory_reward)
from memagent.rl.tiny import TINY_TEMPLATE
from memagent.tokenizer import ByteTokenizer


def conv(n_resp, finished=True, kind="update"):
    return Conversation(prompt_ids=[7, 7], response_ids=[1] * n_resp, logprobs=[-1.0] * n_resp,
                        finished=finished, kind=kind, max_tokens=4)


def traj(group, reward, convs):
    return Trajectory(sample_id=f"s{group}", group=group, generation=0, conversations=convs, reply="", answer="",
                      answers=("x",), reward=reward)


# ---- advantages -----------------------------------------------------------------------------------

def test_advantage_is_per_trajectory_then_broadcast_to_every_conversation():
    # group 0: a 3-conversation trajectory with reward 1 and a 1-conversation one with reward 0
    trajs = [traj(0, 1.0, [conv(2), conv(2), conv(1, kind="final")]), traj(0, 0.0, [conv(3, kind="final")])]
    adv = group_advantages([t.reward for t in trajs], [t.group for t in trajs])
    assert adv == [0.5, -0.5]  # mean of the 2 trajectories is 0.5; expanding first would give 0.75
    rows = expand_to_rows(trajs, adv)
    assert [r.advantage for r in rows] == [0.5, 0.5, 0.5, -0.5]
    assert [r.trajectory for r in rows] == [0, 0, 0, 1]


def test_advantage_std_scaling_options():
    r, g = [1.0, 0.0, 0.0, 2.0, 2.0], [0, 0, 0, 1, 1]
    assert group_advantages(r, g, "none") == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0, 0])
    std0 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0)
    assert group_advantages(r, g, "group") == pytest.approx([(2 / 3) / (std0 + 1e-4), (-1 / 3) / (std0 + 1e-4),
                                                             (-1 / 3) / (std0 + 1e-4), 0, 0])
    assert group_advantages(r, g, "batch", batch_std=2.0) == pytest.approx([(2 / 3) / 2.0001, (-1 / 3) / 2.0001,
                                                                           (-1 / 3) / 2.0001, 0, 0])
    assert group_advantages([3.0], [0]) == [0.0]  # a group of one has no signal


# ---- weights (normalisation) ----------------------------------------------------------------------

def rows_two_trajs():
    # trajectory A: 2 conversations with 3 and 1 response tokens; trajectory B: 1 conversation with 2
    trajs = [traj(0, 1.0, [conv(3), conv(1, kind="final")]), traj(0, 0.0, [conv(2, kind="final")])]
    return expand_to_rows(trajs, [1.0, -1.0])


@pytest.mark.parametrize("loss_type,mode,expected", [
    ("dapo", "tokens", [1 / 6, 1 / 6, 1 / 6]),
    ("dapo", "equal", [1 / 8, 1 / 8, 1 / 4]),
    ("grpo", "tokens", [1 / 9, 1 / 3, 1 / 6]),
    ("grpo", "equal", [1 / 12, 1 / 4, 1 / 4]),
    ("dr_grpo", "tokens", [1 / 12, 1 / 12, 1 / 12]),
    ("dr_grpo", "equal", [1 / 16, 1 / 16, 1 / 8]),
])
def test_token_weights_by_loss_type_and_trajectory_weight(loss_type, mode, expected):
    rows = rows_two_trajs()
    assign_weights(rows, loss_type, mode, completion_cap=4)
    assert [r.weight for r in rows] == pytest.approx(expected)


def test_more_chunks_do_not_weigh_more_unless_configured():
    rows = rows_two_trajs()
    assign_weights(rows, "dapo", "equal", completion_cap=4)
    per_traj = [sum(r.weight * r.num_response for r in rows if r.trajectory == j) for j in (0, 1)]
    assert per_traj == pytest.approx([0.5, 0.5])
    assign_weights(rows, "dapo", "tokens", completion_cap=4)  # the original: the longer trajectory weighs 2x
    per_traj = [sum(r.weight * r.num_response for r in rows if r.trajectory == j) for j in (0, 1)]
    assert per_traj == pytest.approx([4 / 6, 2 / 6])


def test_global_totals_override_local_counts():
    rows = rows_two_trajs()
    totals = weight_totals(rows)
    assert totals == {"tokens": 6.0, "conversations": 3.0, "trajectories": 2.0}
    assign_weights(rows, "dapo", "tokens", 4, totals={"tokens": 12.0, "conversations": 6, "trajectories": 4})
    assert [r.weight for r in rows] == pytest.approx([1 / 12] * 3)


def test_overlong_turns_are_masked_individually():
    trajs = [traj(0, 1.0, [conv(3, finished=False), conv(1, kind="final")]),
             traj(0, 0.0, [conv(4, finished=False, kind="final")])]
    rows = expand_to_rows(trajs, [0.5, -0.5], mask_truncated_completions=True)
    assert [r.active for r in rows] == [False, True, False]
    assign_weights(rows, "dapo", "equal", 4)
    # only trajectory 0 has an active turn: N_traj = 1, its one live token carries everything
    assert [r.weight for r in rows] == [0.0, 1.0, 0.0]
    rows = expand_to_rows(trajs, [0.5, -0.5], mask_truncated_completions=False)
    assert all(r.active for r in rows)


# ---- loss -----------------------------------------------------------------------------------------

def test_clip_higher_is_asymmetric_and_stops_gradients():
    torch = pytest.importorskip("torch")
    from memagent.rl.loss import policy_loss

    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5]])
    old = torch.zeros(1, 4)
    logp = torch.log(ratios).requires_grad_(True)
    adv_tok = torch.tensor([1.0, -1.0, -1.0, 1.0])
    # one row per token so that each gets its own advantage
    loss, st = policy_loss(logp.view(4, 1), old.view(4, 1), adv_tok, torch.ones(4, 1), epsilon=0.2, epsilon_high=0.28)
    # -min(1.5*1, 1.28*1) = -1.28 ; -min(-0.5, -0.8) = 0.8 ; -min(-1.5, -1.28) = 1.5 ; -min(0.5, 0.8) = -0.5
    assert float(loss.detach()) == pytest.approx(-1.28 + 0.8 + 1.5 - 0.5)
    assert st["clipped_high"] == 1 and st["clipped_low"] == 1 and st["tokens"] == 4
    loss.backward()
    # clipped tokens pass no gradient; unclipped ones: d(-ratio*A)/dlogp = -ratio*A
    assert logp.grad.view(-1).tolist() == pytest.approx([0.0, 0.0, 1.5, -0.5])
    # with a symmetric 0.2 the first token is clipped at 1.2 instead
    loss2, _ = policy_loss(torch.log(ratios).view(4, 1), old.view(4, 1), adv_tok, torch.ones(4, 1), epsilon=0.2)
    assert float(loss2) == pytest.approx(-1.2 + 0.8 + 1.5 - 0.5)


@pytest.mark.parametrize("loss_type,mode,expected", [
    ("dapo", "tokens", -1 / 3), ("dapo", "equal", 0.0), ("grpo", "tokens", -1 / 3), ("dr_grpo", "tokens", -1 / 6)])
def test_each_loss_type_on_policy(loss_type, mode, expected):
    torch = pytest.importorskip("torch")
    from memagent.rl.loss import policy_loss

    rows = rows_two_trajs()  # advantages +1 (4 tokens in 2 rows), -1 (2 tokens)
    assign_weights(rows, loss_type, mode, completion_cap=4)
    R = 3
    w = torch.zeros(3, R)
    for i, r in enumerate(rows):
        w[i, R - r.num_response:] = r.weight
    logp = torch.full((3, R), -0.7)
    loss, _ = policy_loss(logp, logp.clone(), torch.tensor([r.advantage for r in rows]), w)
    assert float(loss) == pytest.approx(expected)  # ratio 1: loss = -sum(w * A)


def test_kl_estimators_and_term():
    torch = pytest.importorskip("torch")
    from memagent.rl.loss import kl_penalty, policy_loss

    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_penalty(logp, ref, "k2")) == pytest.approx(0.5 * math.log(2) ** 2)
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 + math.log(2) - 1)
    assert float(kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "k3")) == 10.0  # clamped like verl
    loss, st = policy_loss(logp.view(1, 1), logp.view(1, 1), torch.tensor([0.0]), torch.full((1, 1), 2.0),
                           ref_logp=ref.view(1, 1), beta=0.001)
    assert float(loss) == pytest.approx(2.0 * 0.001 * (0.5 + math.log(2) - 1))
    assert st["kl_sum"] == pytest.approx(0.5 + math.log(2) - 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selected_logprobs_match_log_softmax_and_its_gradient(temperature):
    torch = pytest.importorskip("torch")
    from memagent.rl.policy import selected_logprobs

    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 101, generator=g, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, 101, (2, 5), generator=g)
    w = torch.randn(2, 5, generator=g, dtype=torch.float64)
    logp, ent = selected_logprobs(logits, targets, temperature)
    (logp * w).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    all_lp = torch.log_softmax(logits.float() / temperature, -1)
    ref = all_lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (ref * w).sum().backward()
    assert torch.allclose(logp, ref, atol=1e-5)
    assert torch.allclose(ent, -(all_lp.exp() * all_lp).sum(-1).detach(), atol=1e-4)
    assert torch.allclose(ours, logits.grad, atol=1e-6) and not ent.requires_grad


def test_token_logprobs_equal_the_full_logits_computation():
    torch = pytest.importorskip("torch")
    from memagent.rl.advantage import Row
    from memagent.rl.policy import micro_batches, token_logprobs
    from memagent.rl.tiny import build_model

    model = build_model()
    rows = [Row(prompt_ids=[2, 3, 4, 5], response_ids=[6, 7, 1], sampler_logprobs=None, advantage=1.0, trajectory=0,
                kind="update", finished=True),
            Row(prompt_ids=[2, 3], response_ids=[8], sampler_logprobs=None, advantage=1.0, trajectory=1,
                kind="final", finished=True)]
    mb = micro_batches(rows, 1 << 10, 0, "cpu")[0]
    logp, ent = token_logprobs(model, mb, 0.7, with_entropy=True)
    with torch.no_grad():
        for r, lp in zip(rows, logp):
            seq = torch.tensor([r.prompt_ids + r.response_ids])
            full = torch.log_softmax(model(input_ids=seq).logits[0, :-1] / 0.7, -1)
            want = full[-len(r.response_ids):].gather(-1, torch.tensor(r.response_ids).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(lp[-len(r.response_ids):], want, atol=1e-5)
    assert ent.shape == logp.shape


# ---- dynamic sampling, reward ---------------------------------------------------------------------

def test_dynamic_sampling_drops_groups_with_equal_rewards():
    trajs = [traj(0, 1.0, []), traj(0, 1.0, []), traj(1, 0.0, []), traj(1, 1.0, []), traj(2, 0.0, []), traj(2, 0.0, [])]
    kept, dropped = filter_groups(trajs)
    assert [t.group for t in kept] == [1, 1] and dropped == 2


def test_rewards():
    assert normalize_answer("The  Eiffel, Tower!") == "eiffel tower"
    assert score("I think \\boxed{4821}.", ("4821",), "sub_em")
    assert score("the code is 4821", ("4821",), "sub_em")
    assert not score("the code is 4821", ("4821",), "boxed_em")
    assert score("so \\boxed{ 4821 }", ("4821",), "boxed_em")
    t = traj(0, 0.0, [conv(2, finished=False)])
    t.reply = "\\boxed{x}"
    assert trajectory_reward(t) == (1.0, True)
    assert trajectory_reward(t, format_reward=0.1, length_penalty=0.5) == (pytest.approx(0.6), True)


def test_a_question_that_asks_for_every_value_is_right_only_with_all_of_them():
    golds = ("601413280", "378027080")
    one, both = "\\boxed{601413280}", "\\boxed{601413280, 378027080}"
    assert score(one, golds) and score(one, golds, match="any")  # aliases: one suffices
    assert not score(one, golds, match="all") and score(both, golds, match="all")
    assert score("\\boxed{378027080 and 601413280}", golds, "boxed_em", "all")
    assert not score(one, golds, "boxed_em", "all") and not score("601413280, 378027080", golds, "boxed_em", "all")
    t = traj(0, 0.0, [conv(2)])
    t.reply, t.answers, t.match = one, golds, "all"
    assert trajectory_reward(t) == (0.0, False)
    with pytest.raises(ValueError, match="match"):
        score(one, golds, match="most")


# ---- config ---------------------------------------------------------------------------------------

def test_config_file_and_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('loss_type = "grpo"\nepsilon_high = 0.28\nnum_generations = 4\nuse_peft = true\n')
    c = load_config(f, {"num_generations": "6", "beta": "0"})
    assert (c.loss_type, c.eps_high, c.num_generations, c.use_peft, c.beta) == ("grpo", 0.28, 6, True, 0.0)
    y = tmp_path / "c.yaml"
    y.write_text("learning_rate: 1.0e-5\nlora_target_modules: [q_proj, v_proj]\n")
    assert load_config(y).lora_target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config(None, {"lerning_rate": "1"})
    with pytest.raises(ConfigError, match="loss_type"):
        load_config(None, {"loss_type": "ppo"})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(None, {"max_steps": "ten"})
    assert load_config(None, {"task": "hotpotqa", "chunk_tokens": "512", "chunk_snap": "64"}).chunk_snap == 64
    with pytest.raises(ConfigError, match="chunk_snap must be from 0"):
        load_config(None, {"task": "hotpotqa", "chunk_tokens": "64", "chunk_snap": "64"})
    with pytest.raises(ConfigError, match="chunk_snap is for task hotpotqa"):
        load_config(None, {"task": "notes", "chunk_snap": "16"})


def test_shipped_configs_load():
    from pathlib import Path

    files = sorted((Path(__file__).parents[1] / "configs").glob("*.*"))
    assert files
    for f in files:
        load_config(f)


def test_max_steps_zero_is_collect_only_and_the_trainers_refuse_it():
    from memagent.rl import sft, trainer

    config = load_config(None, {"task": "notes", "max_steps": 0})  # valid: memagent rft collects only
    for run in (trainer.run, sft.run):  # the Python entries refuse it before loading any model
        with pytest.raises(ConfigError, match="max_steps must be positive"):
            run(config)
    with pytest.raises(ConfigError, match="max_steps must be >= 0"):
        load_config(None, {"max_steps": -1})


# ---- rollout shape --------------------------------------------------------------------------------

class RecordingBackend:
    """Fake backend: replies with a fixed text; records each call in arrival order with its seed."""

    name = "fake"

    def __init__(self, tokenizer):
        self.tok, self.calls = tokenizer, []

    async def generate(self, req):
        self.calls.append(req)
        await asyncio.sleep(0)
        user = req.messages[-1]["content"]
        text = "k=a" if user.endswith(">") and "|" in user else "a"
        ids = self.tok.encode(text)
        return Generation(text=text, finish_reason="stop", prompt_ids=self.tok.encode(user), response_ids=ids + [0],
                          logprobs=[-0.5] * (len(ids) + 1))

    async def aclose(self):
        pass


def test_rollout_is_lock_step_with_exact_inference_prompts():
    tok = ByteTokenizer()
    reader = Reader(TINY_TEMPLATE, tok, ReaderConfig(memory_tokens=4, answer_tokens=2, temperature=1.0,
                                                     return_tokens=True))
    samples = [CharKVTask(num_chunks=3).sample(i) for i in range(2)]
    samples[1] = Sample(id="short", question="k?", answers=("b",), chunks=("xxk=bx",))  # 1 chunk only
    be = RecordingBackend(tok)
    trajs = asyncio.run(rollout(be, reader, samples, num_generations=2, seed=1, step=0))
    assert len(trajs) == 4 and [t.group for t in trajs] == [0, 0, 1, 1]
    assert [len(t.conversations) for t in trajs] == [4, 4, 2, 2]  # chunks + final
    assert [c.kind for c in trajs[0].conversations] == ["update"] * 3 + ["final"]
    # lock-step: all 4 first-chunk updates, then the 2 second-chunk ones, 2 third-chunk ones, then 4 finals
    assert len(be.calls) == 4 + 2 + 2 + 4
    first = reader.update_request(reader.start(samples[0].question), samples[0].chunks[0])
    assert be.calls[0].messages == first.messages and be.calls[0].return_tokens
    # every call of a group has its own seed (the G trajectories must differ)
    assert be.calls[0].seed != be.calls[1].seed
    c = trajs[0].conversations[0]
    assert c.prompt_ids == tok.encode(first.messages[-1]["content"]) and c.finished and c.logprobs


# ---- tasks ----------------------------------------------------------------------------------------

def test_kv_task_plants_the_fact_and_sizes_chunks_in_model_tokens(smol_tokenizer):
    from memagent.rl.data import EVAL_OFFSET, KVTask

    task = KVTask(smol_tokenizer, num_chunks=3, chunk_tokens=100, num_distractors=2)
    s = task.sample(5)
    assert s == task.sample(5) and s != task.sample(6)  # a pure function of the index
    assert len(s.chunks) == 3 and all(len(smol_tokenizer.encode(c)) <= 100 for c in s.chunks)
    holder = [i for i, c in enumerate(s.chunks) if f"is {s.answers[0]}." in c]
    assert holder == [s.meta["needle_chunk"]] and s.question.endswith("?")
    assert sum(c.count("access code for Project") for c in s.chunks) == 3
    long = task.with_chunks(48).sample(EVAL_OFFSET)
    assert len(long.chunks) == 48
    w = KVTask(smol_tokenizer, value_kind="word").sample(0)
    assert w.answers[0].isalpha() and "password" in w.question


def test_hotpotqa_task_keeps_gold_paragraphs_and_holds_out_questions(smol_tokenizer):
    pytest.importorskip("long_context_eval")
    from memagent.rl.data import HotpotQATask

    task = HotpotQATask(smol_tokenizer, num_chunks=2, chunk_tokens=256)
    s = task.sample(0)
    assert len(s.chunks) <= 2 and all(len(smol_tokenizer.encode(c)) <= 256 for c in s.chunks)
    assert s.context.startswith("Document 1:")
    train_q = {r["question"] for r in task.rows}
    held = task.held_out()
    assert not train_q & {r["question"] for r in held.rows}
    assert held.sample(3).question not in train_q


def test_hotpotqa_task_with_chunk_snap_cuts_only_at_line_or_sentence_ends(smol_tokenizer):
    pytest.importorskip("long_context_eval")
    from memagent.rl.data import HotpotQATask

    exact, snapped = (HotpotQATask(smol_tokenizer, num_chunks=3, chunk_tokens=200, chunk_snap=n) for n in (0, 60))
    cut_mid = 0
    for i in range(6):
        a, b = exact.sample(i), snapped.sample(i)
        assert a.question == b.question and len(b.chunks) <= 3
        assert all(140 <= len(smol_tokenizer.encode(c)) <= 200 for c in b.chunks[:-1])
        assert all(c.rstrip(" ")[-1] in "\n.!?\"')" for c in b.chunks[:-1]), b.chunks
        cut_mid += sum(c.rstrip(" ")[-1] not in "\n.!?\"')" for c in a.chunks[:-1])
    assert cut_mid >= 3  # the token-exact cuts do fall mid-sentence on these documents
    with pytest.raises(ValueError, match="chunk_snap"):
        HotpotQATask(smol_tokenizer, chunk_tokens=64, chunk_snap=64)


def test_holds_answers_reads_the_whole_text_where_score_reads_the_extracted_answer():
    notes = "Ticket OPS-4436 on Thursday; the summary says \\boxed{OPS-1200}."
    assert holds_answers(notes, ("ops-4436",)) and not score(notes, ("ops-4436",), "sub_em")
    assert holds_answers("7 and 9", ("7", "9"), "all") and not holds_answers("7 only", ("7", "9"), "all")
    assert not holds_answers("anything", ("",)) and not holds_answers("", ("7",))
    with pytest.raises(ValueError, match="match must be"):
        holds_answers("7", ("7",), "most")
