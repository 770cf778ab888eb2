"""memagent/gguf_merge.py: a LoRA folded into Q8_0 weights, checked on a hand-built GGUF (the arithmetic)
and on the real SmolLM2-135M GGUF (llama.cpp runs the merged file and replies as the runtime adapter does)."""
import asyncio

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from memagent import gguf_merge  # noqa: E402
from memagent.models import ModelError  # noqa: E402


def _write(path, tensors, kv, arch="llama"):
    kinds = {str: gguf.GGUFValueType.STRING, float: gguf.GGUFValueType.FLOAT32}
    return gguf_merge.write_gguf(path, arch, [(k, v, kinds[type(v)], None) for k, v in kv.items()], tensors)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.normal(0, 0.1, (64, 96)).astype(np.float32)  # numpy (out, in), as GGUF stores it
    up = rng.normal(0, 0.1, (32, 64)).astype(np.float32)
    emb = rng.normal(0, 0.1, (16, 64)).astype(np.float32)
    norm = rng.normal(1, 0.1, (64,)).astype(np.float32)
    base = _write(tmp_path / "base.gguf", [
        ("token_embd.weight", quantize(emb, Q.Q5_0), Q.Q5_0),
        ("blk.0.attn_norm.weight", norm, Q.F32),
        ("blk.0.attn_q.weight", quantize(q, Q.Q5_0), Q.Q5_0),
        ("blk.0.ffn_up.weight", quantize(up, Q.Q4_0), Q.Q4_0),
    ], {"general.name": "tiny"})
    a = rng.normal(0, 0.2, (4, 96)).astype(np.float32)  # rank 4
    b = rng.normal(0, 0.2, (64, 4)).astype(np.float32)
    adapter = _write(tmp_path / "lora.gguf", [("blk.0.attn_q.weight.lora_a", a, Q.F32),
                                               ("blk.0.attn_q.weight.lora_b", b, Q.F32)],
                     {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0})
    return tmp_path, base, adapter, a, b


def _tensors(path):
    r = gguf.GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


def test_merge_adds_scaled_b_at_a_and_stores_q8_0(files):
    tmp, base, adapter, a, b = files
    out = gguf_merge.merge_lora_gguf(base, adapter, tmp / "merged.gguf", scale=0.5)
    _, src = _tensors(base)
    r, got = _tensors(out)
    assert r.fields["general.name"].contents() == "tiny"  # metadata copied
    assert got["blk.0.attn_q.weight"].tensor_type == Q.Q8_0 and got["blk.0.ffn_up.weight"].tensor_type == Q.Q8_0
    # the token embedding is kept byte for byte; f32 vectors too
    assert got["token_embd.weight"].tensor_type == Q.Q5_0
    assert bytes(got["token_embd.weight"].data) == bytes(src["token_embd.weight"].data)
    assert np.array_equal(got["blk.0.attn_norm.weight"].data, src["blk.0.attn_norm.weight"].data)
    w = dequantize(src["blk.0.attn_q.weight"].data, Q.Q5_0)
    want = w + 0.5 * (8.0 / 4) * (b @ a)  # scale * alpha / rank * B @ A
    merged = dequantize(got["blk.0.attn_q.weight"].data, Q.Q8_0)
    step = np.abs(want).reshape(64, 3, 32).max(-1, keepdims=True) / 127  # Q8_0's step in each block of 32
    assert np.all(np.abs(merged - want).reshape(64, 3, 32) <= 0.6 * step + 1e-6)  # half a step, and the fp16 scale
    assert np.abs(merged - w).max() > 10 * step.max()  # the delta is really there
    # a matrix without an adapter is only re-stored
    up = dequantize(src["blk.0.ffn_up.weight"].data, Q.Q4_0)
    assert np.abs(dequantize(got["blk.0.ffn_up.weight"].data, Q.Q8_0) - up).max() <= np.abs(up).max() / 127


def test_merge_refuses_an_adapter_for_another_model(files):
    tmp, base, adapter, a, b = files
    other = _write(tmp / "other.gguf", [("blk.7.attn_k.weight.lora_a", a, Q.F32),
                                        ("blk.7.attn_k.weight.lora_b", b, Q.F32)],
                   {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0})
    with pytest.raises(ModelError, match="does not fit.*blk.7.attn_k"):
        gguf_merge.merge_lora_gguf(base, other, tmp / "x.gguf")
    with pytest.raises(ModelError, match="not a GGUF LoRA"):
        gguf_merge.merge_lora_gguf(base, base, tmp / "x.gguf")
    assert not (tmp / "x.gguf").exists()


def test_cached_merge_is_built_once(files, monkeypatch):
    tmp, base, adapter, _, _ = files
    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp / "cache"))
    calls = []
    real = gguf_merge.merge_lora_gguf
    monkeypatch.setattr(gguf_merge, "merge_lora_gguf", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = gguf_merge.cached_merged_gguf(base, adapter)
    assert gguf_merge.cached_merged_gguf(base, adapter) == first and len(calls) == 1
    assert gguf_merge.cached_merged_gguf(base, adapter, scale=0.5) != first and len(calls) == 2


def test_llamacpp_runs_the_merged_model_like_the_runtime_adapter(tmp_path, monkeypatch):
    """SmolLM2 (Q4_1) with a strong random adapter: the merged Q8_0 file is what llama.cpp loads, with no
    LoRA left to apply, and its greedy replies begin as the runtime adapter's do (not the base's)."""
    pytest.importorskip("xllamacpp")
    from memagent.backends.llamacpp import LlamaCppBackend
    from memagent.protocol import GenerationRequest
    from test_llamacpp import _write_adapter

    folder, _ = _write_adapter(tmp_path / "strong", rank=8, layers=tuple(range(30)),
                               modules=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"), b_std=0.5)
    prompts = ("Name a colour.", "What is 2+2?", "Say hello.")
    monkeypatch.setattr(gguf_merge, "cache_root", lambda: tmp_path / "cache")  # not the shared cache

    async def replies(**kw):
        b = LlamaCppBackend.load("smollm2-135m", max_batch=1, **kw)
        try:
            got = [(await b.generate(GenerationRequest([{"role": "user", "content": p}], 6))).text for p in prompts]
            return got, b
        finally:
            await b.aclose()

    base, _ = asyncio.run(replies())
    runtime, _ = asyncio.run(replies(adapter=folder))
    merged, b = asyncio.run(replies(adapter=folder, merge_lora=True))
    assert b.lora == [] and b.gguf.parent.parent.name == "merged" and b.name.endswith("+merged")
    assert runtime != base
    first = [r.split()[:1] for r in runtime]
    assert sum(m.split()[:1] == f for m, f in zip(merged, first)) >= 2, (merged, runtime)
    assert sum(m.split()[:1] == r.split()[:1] for m, r in zip(merged, base)) <= 1, (merged, base)


def test_cli_refuses_merge_lora_where_there_is_nothing_to_fold(tmp_path, capsys):
    from memagent.cli import main

    (tmp_path / "d.txt").write_text("some text")
    assert main(["ask", str(tmp_path / "d.txt"), "Q?", "--model", "smollm2-135m", "--engine", "torch",
                 "--merge-lora"]) == 2
    assert "--merge-lora is for --engine llama.cpp" in capsys.readouterr().err
    assert main(["ask", str(tmp_path / "d.txt"), "Q?", "--backend", "openai", "--base-url",
                 "http://127.0.0.1:9/v1", "--merge-lora"]) == 2
    assert "--merge-lora is for the embedded backend" in capsys.readouterr().err


def test_eval_folder_keeps_merged_and_runtime_reads_apart(tmp_path):
    """A merged read is another model's read: an eval folder of one refuses to resume as the other, and
    folders written before the option existed resume unchanged."""
    from memagent.eval import EvalConfig, _check_dir

    cfg = EvalConfig(tasks=["niah_single_1"], lengths=[4096], model="memagent-notes-0.5b")
    assert "merge_lora" not in cfg.identity()
    _check_dir(tmp_path, cfg)
    merged = EvalConfig(tasks=["niah_single_1"], lengths=[4096], model="memagent-notes-0.5b", merge_lora=True)
    with pytest.raises(ValueError, match="merge_lora: None -> True"):
        _check_dir(tmp_path, merged)
