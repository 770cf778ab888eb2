"""The embedded backend: batching, prefix reuse and token outputs on a tiny random Llama (fast), plus
one end-to-end read of a planted fact with the real SmolLM2-135M."""
import asyncio
import math
import os

import pytest

# Before torch is first imported (see memagent/backends/embedded.py): busy-waiting OpenMP threads make
# a shared 2-core machine 10x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
torch = pytest.importorskip("torch")

from memagent import models  # noqa: E402
from memagent.backends.embedded import EmbeddedBackend  # noqa: E402
from memagent.protocol import BackendError, GenerationRequest  # noqa: E402


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(models.hf_dir("smollm2-135m")))


@pytest.fixture(scope="module")
def tiny_model(hf_tokenizer):
    """2 layers, hidden 64, SmolLM2's vocabulary. A large init scale makes the logits peaked, so that
    float rounding between code paths cannot flip a greedy choice by accident."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=len(hf_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, initializer_range=0.5,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def run(coro):
    return asyncio.run(coro)


def ask(i: int, filler: int = 0, memory: str = "(none)", **kw) -> GenerationRequest:
    text = f"Question {i}: which colour is the door?\nNotes: {memory}\n" + "the quick brown fox " * filler
    return GenerationRequest(messages=[{"role": "user", "content": text}], **kw)


async def one_by_one(backend, requests):
    return [await backend.generate(r) for r in requests]


async def together(backend, requests):
    return await asyncio.gather(*[backend.generate(r) for r in requests])


async def closing(backend, coro):
    try:
        return await coro
    finally:
        await backend.aclose()


def test_batching_matches_one_at_a_time(tiny_model, hf_tokenizer):
    # Different prompt lengths (left padding) and different max_tokens (rows leave the batch early).
    reqs = [ask(i, filler=7 * i, max_tokens=3 + 4 * i, return_tokens=True) for i in range(7)]
    single = EmbeddedBackend(tiny_model, hf_tokenizer, max_batch=1, prefix_cache=False)
    a = run(closing(single, one_by_one(single, reqs)))
    batched = EmbeddedBackend(tiny_model, hf_tokenizer, max_batch=4, prefix_cache=False)
    b = run(closing(batched, together(batched, reqs)))
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    assert [g.completion_tokens for g in b] == [r.max_tokens for r in reqs]
    assert all(g.finish_reason == "length" for g in b)
    # the rows really shared forwards: fewer decode steps than rows stepped
    assert batched.stats["rows_stepped"] > batched.stats["steps"]
    for x, y in zip(a, b):
        assert all(math.isclose(p, q, abs_tol=1e-3) for p, q in zip(x.logprobs, y.logprobs))


def test_max_batch_change_on_a_live_backend_takes_effect(tiny_model, hf_tokenizer):
    backend = EmbeddedBackend(tiny_model, hf_tokenizer, max_batch=8)

    async def go():
        await backend.generate(ask(9, max_tokens=2))  # the worker now waits for work with max_batch 8
        backend.max_batch = 1
        before = dict(backend.stats)
        await together(backend, [ask(i, max_tokens=5) for i in range(3)])
        return before

    before = run(closing(backend, go()))
    steps = backend.stats["steps"] - before["steps"]
    assert steps == backend.stats["rows_stepped"] - before["rows_stepped"] == 3 * 4  # one row per step


def test_prefix_reuse_gives_identical_output(tiny_model, hf_tokenizer):
    # Same question (cache key), growing memory: each prompt shares the header + question with the last.
    reqs = [ask(1, filler=40, memory="note " * k, max_tokens=12, cache_key="q1") for k in range(1, 5)]
    plain = EmbeddedBackend(tiny_model, hf_tokenizer, prefix_cache=False)
    a = run(closing(plain, one_by_one(plain, reqs)))
    cached = EmbeddedBackend(tiny_model, hf_tokenizer, prefix_cache=True)
    b = run(closing(cached, one_by_one(cached, reqs)))
    assert [g.text for g in a] == [g.text for g in b]
    assert b[0].extra["reused_prompt_tokens"] == 0
    assert all(g.extra["reused_prompt_tokens"] > 20 for g in b[1:])  # reuse really happened
    assert cached.stats["reused_tokens"] > 0 and plain.stats["reused_tokens"] == 0


def test_group_of_identical_prompts_reuses_almost_everything(tiny_model, hf_tokenizer):
    # RL group sampling: several rollouts of one question start from the same prompt, arriving together.
    reqs = [ask(8, filler=20, max_tokens=6, cache_key="g", temperature=0.8, seed=s) for s in (1, 2, 3)]
    plain = EmbeddedBackend(tiny_model, hf_tokenizer, prefix_cache=False)
    a = run(closing(plain, together(plain, reqs)))
    cached = EmbeddedBackend(tiny_model, hf_tokenizer, prefix_cache=True)
    b = run(closing(cached, together(cached, reqs)))
    assert [g.text for g in a] == [g.text for g in b]
    assert sorted(g.extra["reused_prompt_tokens"] for g in b) == [0] + [b[0].prompt_tokens - 1] * 2


def test_prefix_cache_dropped_when_weights_change(tiny_model, hf_tokenizer):
    import copy

    model = copy.deepcopy(tiny_model)
    backend = EmbeddedBackend(model, hf_tokenizer)

    async def go():
        first = await backend.generate(ask(2, filler=30, max_tokens=4, cache_key="k"))
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.01)  # an in-place update, like an optimiser step
        second = await backend.generate(ask(2, filler=30, memory="x", max_tokens=4, cache_key="k"))
        return first, second

    _, second = run(closing(backend, go()))
    assert second.extra["reused_prompt_tokens"] == 0


def test_return_tokens_and_seed(tiny_model, hf_tokenizer):
    backend = EmbeddedBackend(tiny_model, hf_tokenizer)
    sampled = [ask(3, filler=5, max_tokens=10, temperature=0.9, top_p=0.95, seed=s, return_tokens=True)
               for s in (7, 7, 8)]
    greedy = ask(3, filler=5, max_tokens=10, return_tokens=True)
    a, b, c, g = run(closing(backend, together(backend, sampled + [greedy])))
    assert a.response_ids == b.response_ids  # same seed, same tokens (even inside one batch)
    assert a.response_ids != c.response_ids  # another seed differs (10 tokens from a peaked model)
    expected_prompt = hf_tokenizer.apply_chat_template(sampled[0].messages, add_generation_prompt=True,
                                                       tokenize=True)["input_ids"]
    for gen in (a, c, g):
        assert gen.prompt_ids == list(expected_prompt)
        assert gen.prompt_tokens == len(gen.prompt_ids)
        assert len(gen.logprobs) == len(gen.response_ids) == gen.completion_tokens == 10
        assert all(lp <= 0 for lp in gen.logprobs)
        assert gen.text == hf_tokenizer.decode(gen.response_ids, skip_special_tokens=True)
    assert sum(a.logprobs) != sum(g.logprobs)


def test_stops_at_eos_and_keeps_it_in_response_ids(tiny_model, hf_tokenizer):
    backend = EmbeddedBackend(tiny_model, hf_tokenizer)

    async def go():
        free = await backend.generate(ask(4, max_tokens=6, return_tokens=True))
        # White-box: declare the 3rd greedy token an end-of-sequence token; the same greedy run must stop there.
        backend.eos_ids = {free.response_ids[2]}
        stopped, other = await asyncio.gather(backend.generate(ask(4, max_tokens=6, return_tokens=True)),
                                              backend.generate(ask(5, filler=3, max_tokens=6)))
        return free, stopped, other

    free, stopped, other = run(closing(backend, go()))
    assert free.finish_reason == "length"
    if free.response_ids[2] in free.response_ids[:2]:
        pytest.skip("degenerate sample: the stop token also occurs earlier")
    assert stopped.finish_reason == "stop"
    assert stopped.response_ids == free.response_ids[:3] and stopped.completion_tokens == 3
    assert stopped.text == hf_tokenizer.decode(free.response_ids[:2], skip_special_tokens=True)
    assert other.completion_tokens >= 1


def test_prompt_longer_than_context_is_one_clear_error(tiny_model, hf_tokenizer):
    backend = EmbeddedBackend(tiny_model, hf_tokenizer)

    async def go():
        too_long, fine = await asyncio.gather(backend.generate(ask(6, filler=400, max_tokens=4)),
                                              backend.generate(ask(7, max_tokens=4)), return_exceptions=True)
        return too_long, fine

    too_long, fine = run(closing(backend, go()))
    assert isinstance(too_long, BackendError)
    assert "context window is 1024" in str(too_long) and "\n" not in str(too_long)
    assert fine.completion_tokens == 4  # the other request of the batch is unaffected


def test_real_smollm2_reads_a_planted_fact(smol_tokenizer):
    """One chunk through the real reader loop ('notes' template): the code must reach the answer."""
    from memagent.prompts import load_template
    from memagent.reader import Reader, ReaderConfig

    # Varied sentences: a repeated paragraph makes the 135M model copy the filler instead of the fact.
    # With these 15 sentences the fact survived at the start, middle and end, in 2 shuffled orders and at
    # memory 96 and 160 (12/12 runs while writing this test).
    filler = ["The harbour town woke slowly on Monday.", "Fishermen mended their nets beside the old stone wall.",
              "A bakery on the main square opened its shutters at six, and the smell of fresh bread drifted over "
              "the cobbles.", "Children chased gulls along the pier while their parents argued about the price "
              "of mackerel.", "The mayor, a tall woman named Edith Marsh, walked to the town hall carrying a "
              "folder of planning permits.", "In the library, a student read about the storm of 1887 that had "
              "flattened half of the eastern houses.", "By noon the wind had turned, and the ferry from the "
              "island arrived forty minutes late.", "Later that afternoon the market closed early because of rain.",
              "A painter packed up her easel and hurried home.", "The lighthouse keeper climbed the spiral stairs "
              "to clean the great lens before dusk.", "At the inn, travellers shared stories about the mountain "
              "pass and the wolves said to roam there.", "A cart loaded with barrels of cider rattled down the "
              "hill towards the harbour.", "Two old men played chess outside the post office and disagreed about "
              "every move.", "The schoolteacher rang the bell, and the children ran back inside, still arguing "
              "about the gulls.", "Somewhere a dog barked at the fog rolling in from the sea."]
    chunk = " ".join(filler[:7] + ["The secret code of the blue door is 73412."] + filler[7:])
    assert 230 < len(smol_tokenizer.encode(chunk)) < 330
    reader = Reader(load_template("notes"), smol_tokenizer, ReaderConfig(memory_tokens=96, answer_tokens=48))
    backend = EmbeddedBackend.load("smollm2-135m")

    async def go():
        state = reader.start("What is the secret code of the blue door?")
        state = reader.apply_update(state, await backend.generate(reader.update_request(state, chunk)))
        return reader.apply_final(state, await backend.generate(reader.final_request(state)))

    state = run(closing(backend, go()))
    assert "73412" in state.memory
    assert "73412" in (state.answer or state.reply)
