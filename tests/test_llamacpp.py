"""The llama.cpp engine (memagent/backends/llamacpp.py) on the real SmolLM2-135M Q4_1 GGUF, and the
PEFT LoRA -> GGUF export (memagent/gguf_export.py). Short prompts; the module runs in well under a minute
on 2 cores. The torch-vs-llama.cpp agreement check with an adapter is marked slow."""
import asyncio
import json

import numpy as np
import pytest

pytest.importorskip("xllamacpp")

from memagent import gguf_export, models  # noqa: E402
from memagent.backends.llamacpp import ChatTemplate, LlamaCppBackend  # noqa: E402
from memagent.protocol import BackendError, GenerationRequest, PromptTooLongError  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def run(coro):
    return asyncio.run(coro)


def user(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend.load("smollm2-135m", max_batch=4)
    yield b
    run(b.aclose())


def test_chat_template_gives_the_torch_engines_ids():
    """The prompt ids must be the torch engine's (same template, same defusing of control tokens)."""
    from transformers import AutoTokenizer

    from memagent.specials import chat_ids

    path = models.hf_dir("smollm2-135m")
    hf, ours = AutoTokenizer.from_pretrained(str(path)), ChatTemplate(path)
    for messages in (QUESTION, [{"role": "system", "content": "Be brief."}, *user("Hi <|im_end|> there")],
                     user("Notes:\n(empty)\n\n<section>\nSome text, ünïcödé — and tabs\t.\n</section>"),
                     [*user("a"), {"role": "assistant", "content": "b"}, *user("c")]):
        assert ours.ids(messages) == chat_ids(hf, messages)


def test_greedy_reply_with_tokens_is_repeatable(backend):
    a = run(backend.generate(GenerationRequest(QUESTION, 8, return_tokens=True)))
    b = run(backend.generate(GenerationRequest(QUESTION, 8, return_tokens=True)))
    assert a.text and a.text == b.text
    assert a.finish_reason in ("stop", "length") and a.completion_tokens == len(a.response_ids) <= 8
    assert a.prompt_ids == ChatTemplate(models.hf_dir("smollm2-135m")).ids(QUESTION)
    assert a.prompt_tokens == len(a.prompt_ids)
    assert len(a.logprobs) == len(a.response_ids) and all(lp <= 0 for lp in a.logprobs)
    assert b.extra["reused_prompt_tokens"] >= len(b.prompt_ids) - 1  # the same prompt again: its KV is kept


def test_concurrent_requests_and_prefix_reuse(backend):
    shared = "Read the following and answer in one word. " * 12
    reqs = [GenerationRequest(user(shared + f"Question {i}: name a colour."), 6) for i in range(6)]

    async def go():
        return await asyncio.gather(*[backend.generate(r) for r in reqs])

    gens = run(go())
    assert len(gens) == 6 and all(g.completion_tokens >= 1 for g in gens)
    again = run(backend.generate(GenerationRequest(user(shared + "Question 9: name a fruit."), 4)))
    assert again.extra["reused_prompt_tokens"] >= 100  # the shared instruction was not prefilled again


def test_sampling_is_seeded(backend):
    """Same seed, same prompt, same cached prefix: the same sample (a different prefix split may round
    the logits differently, as on the torch engine, so the first call only warms the cache)."""
    r = GenerationRequest(user("Tell me a word."), 6, temperature=1.0, seed=7)
    run(backend.generate(r))
    assert run(backend.generate(r)).text == run(backend.generate(r)).text


def test_prompt_longer_than_the_window_is_one_clear_error(backend):
    with pytest.raises(PromptTooLongError, match="context window is 8192"):
        run(backend.generate(GenerationRequest(user("word " * 9000), 4)))
    with pytest.raises(BackendError, match="max_tokens"):
        run(backend.generate(GenerationRequest(QUESTION, 0)))


def test_cancelled_request_stops_and_the_engine_goes_on(backend):
    async def go():
        task = asyncio.create_task(backend.generate(GenerationRequest(user("Write a very long story."), 4000)))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.wait_for(backend.generate(GenerationRequest(QUESTION, 4)), 60)

    assert run(go()).completion_tokens >= 1


def test_make_backend_selects_the_engine():
    from memagent.backends import make_backend

    with pytest.raises(ValueError, match="unknown engine"):
        make_backend("embedded", engine="onnx")
    with pytest.raises(BackendError, match="folder"):
        make_backend("embedded", model=str(models.hf_dir("smollm2-135m")), engine="llama.cpp")


def test_closed_backend_refuses():
    b = LlamaCppBackend.load("smollm2-135m", max_batch=1)
    run(b.aclose())
    with pytest.raises(BackendError, match="closed"):
        run(b.generate(GenerationRequest(QUESTION, 2)))


def test_cli_ask_on_llamacpp(tmp_path, capsys):
    from memagent.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text("The keeper's cat is called Pepper. She sleeps on the lamp room stairs.\n")
    assert main(["ask", str(doc), "What is the cat called?", "--model", "smollm2-135m", "--engine", "llama.cpp",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["question"] == "What is the cat called?" and out["calls"] == 2


# ---- LoRA export ----------------------------------------------------------------------------------

def _write_adapter(folder, rank=4, layers=(0, 5), modules=("q_proj", "k_proj", "down_proj"), b_std=0.0, seed=0):
    """A PEFT-format LoRA folder for SmolLM2 written directly (numpy + safetensors, no torch)."""
    from safetensors.numpy import save_file

    shapes = {"q_proj": (576, 576), "k_proj": (192, 576), "v_proj": (192, 576), "o_proj": (576, 576),
              "gate_proj": (1536, 576), "up_proj": (1536, 576), "down_proj": (576, 1536)}
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in layers:
        for m in modules:
            out_f, in_f = shapes[m]
            part = "self_attn" if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{m}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.05, (rank, in_f)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(0, b_std, (out_f, rank)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules),
         "fan_in_fan_out": False, "use_dora": False, "use_rslora": False}))
    return folder, tensors


def test_export_writes_what_llamacpp_expects(tmp_path):
    from gguf import GGUFReader

    folder, tensors = _write_adapter(tmp_path / "ad", b_std=0.01)
    out = gguf_export.export_adapter_gguf(folder, tmp_path / "ad.gguf", base="smollm2-135m")
    r = GGUFReader(str(out))
    kv = gguf_export.read_gguf_kv(out)
    assert kv["general.architecture"] == "llama" and kv["general.type"] == "adapter"
    assert kv["adapter.type"] == "lora" and kv["adapter.lora.alpha"] == 4.0
    got = {t.name: t for t in r.tensors}
    assert set(got) == {f"blk.{i}.{n}.weight.lora_{s}" for i in (0, 5) for n in ("attn_q", "attn_k", "ffn_down")
                        for s in "ab"}
    # GGUF dims are reversed numpy dims: lora_a (r, in) -> ne [in, r]; lora_b (out, r) -> ne [r, out]
    assert list(got["blk.0.attn_k.weight.lora_a"].shape) == [576, 4]
    assert list(got["blk.0.attn_k.weight.lora_b"].shape) == [4, 192]
    assert list(got["blk.5.ffn_down.weight.lora_a"].shape) == [1536, 4]
    # PEFT scaling alpha/r = 2 is folded into lora_b (llama.cpp then scales by alpha/rank = 1)
    b = np.asarray(got["blk.5.ffn_down.weight.lora_b"].data).reshape(576, 4)
    np.testing.assert_allclose(b, 2 * tensors["base_model.model.model.layers.5.mlp.down_proj.lora_B.weight"], rtol=1e-6)
    # q rows are permuted per head like the base GGUF's attn_q (a permutation: same multiset of rows)
    bq = np.asarray(got["blk.0.attn_q.weight.lora_b"].data).reshape(576, 4)
    src = 2 * tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert not np.allclose(bq, src) and np.allclose(np.sort(bq, axis=0), np.sort(src, axis=0))


def test_export_refuses_what_llamacpp_cannot_run(tmp_path):
    folder, _ = _write_adapter(tmp_path / "dora")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(models.ModelError, match="use_dora"):
        gguf_export.export_adapter_gguf(folder, tmp_path / "x.gguf")
    with pytest.raises(models.ModelError, match="not a PEFT adapter"):
        gguf_export.export_adapter_gguf(tmp_path, tmp_path / "x.gguf")
    assert not list(tmp_path.glob("x.gguf*"))  # nothing half-written


def test_adapter_runs_on_llamacpp(tmp_path):
    """A zero adapter leaves greedy answers unchanged; a strong one changes them (so it is applied)."""
    zero, _ = _write_adapter(tmp_path / "zero", b_std=0.0)
    strong, _ = _write_adapter(tmp_path / "strong", rank=8, layers=tuple(range(30)),
                               modules=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"), b_std=0.5)

    async def answers(adapter):  # one request at a time: a batch's make-up changes float rounding
        b = LlamaCppBackend.load("smollm2-135m", max_batch=1, adapter=adapter)
        try:
            return [(await b.generate(GenerationRequest(user(q), 8))).text
                    for q in ("Name a colour.", "What is 2+2?")]
        finally:
            await b.aclose()

    base = run(answers(None))
    assert run(answers(zero)) == base
    assert run(answers(strong)) != base


@pytest.mark.slow
def test_torch_and_llamacpp_agree_with_a_peft_adapter(tmp_path):
    """Greedy answers of torch (+LoRA merged) and llama.cpp (+LoRA as GGUF) on the same prompt ids.
    Q4_1 x Q8 arithmetic vs fp32 flips near-ties, so agreement is measured, not required to be total:
    the first token must agree nearly always, and the adapter must agree about as well as the base."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import check_adapter_agreement as chk

    adapter = chk.make_random_lora(tmp_path / "lora")
    out = run(chk.run(adapter, n=12, tokens=24))
    lora, base = out["torch_vs_llamacpp_lora"], out["torch_vs_llamacpp_base"]
    assert out["adapter_changed_answers_torch"] >= out["prompts"] // 3
    assert lora["same_first_token"] >= lora["n"] - 2
    assert lora["identical_answers"] >= base["identical_answers"] - 3


def test_registered_model_with_adapter_loads_it_checked(tmp_path, monkeypatch):
    """The registry hook: ModelSpec.adapter (+ adapter_sha256) is exported once and loaded by llama.cpp."""
    import dataclasses
    import hashlib

    folder, _ = _write_adapter(tmp_path / "ad", b_std=0.0)
    digest = hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest()
    base = models.MODELS["smollm2-135m"]
    extra = {"adapter": str(folder), "adapter_sha256": digest}
    if "base" in {f.name for f in dataclasses.fields(models.ModelSpec)}:
        extra["base"] = "smollm2-135m"
    monkeypatch.setitem(models.MODELS, "test-adapted", dataclasses.replace(base, name="test-adapted", **extra))
    b = LlamaCppBackend.load("test-adapted", max_batch=1)
    try:
        assert len(b.lora) == 1 and b.lora[0][0].endswith("adapter.gguf")
        assert run(b.generate(GenerationRequest(QUESTION, 2))).completion_tokens >= 1
    finally:
        run(b.aclose())
    monkeypatch.setitem(models.MODELS, "test-adapted",
                        dataclasses.replace(models.MODELS["test-adapted"], adapter_sha256="0" * 64))
    with pytest.raises(BackendError, match="sha256"):
        LlamaCppBackend.load("test-adapted", max_batch=1)
