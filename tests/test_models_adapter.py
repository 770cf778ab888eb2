"""Trained models ship as a LoRA adapter on a registered base: pinned by sha256, merged once into a plain
HF folder whose outputs equal base + adapter."""
import dataclasses
import hashlib

import pytest

torch = pytest.importorskip("torch")

from memagent import models  # noqa: E402


@pytest.fixture()
def tiny_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model

    from memagent.rl.tiny import build_model, build_tokenizer

    base = tmp_path / "base"
    build_tokenizer(base)
    build_model(seed=0).save_pretrained(str(base))
    lora = get_peft_model(build_model(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                          init_lora_weights=False))
    adapter = tmp_path / "adapter"
    lora.save_pretrained(str(adapter))
    digest = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    spec = dataclasses.replace(models.MODELS["smollm2-135m"], name="tiny-trained", base=str(base),
                               adapter=str(adapter), adapter_sha256=digest)
    return spec, lora


def test_merged_folder_equals_base_plus_adapter(tiny_adapter, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    spec, lora = tiny_adapter
    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    out = models.hf_dir(spec.name)
    assert (out / "tokenizer.json").is_file() and out == models.hf_dir(spec.name)  # cached
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    ids = torch.tensor([[2, 3, 4, 5, 6, 1]])
    lora.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, lora(input_ids=ids).logits, rtol=1e-4, atol=1e-5)


def test_a_tampered_adapter_is_refused(tiny_adapter, tmp_path, monkeypatch):
    spec, _ = tiny_adapter
    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
    weights = models.adapter_dir(spec) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    with pytest.raises(models.ModelError, match="does not match the pinned"):
        models.hf_dir(spec.name)


@pytest.mark.parametrize("name,base", [("memagent-notes-135m", "smollm2-135m"),
                                       ("memagent-notes-0.5b", "qwen2.5-coder-0.5b")])
def test_shipped_trained_model_is_pinned(name, base):
    spec = models.MODELS.get(name)
    if spec is None:
        pytest.skip("no trained adapter in this checkout")
    assert spec.base == base and spec.adapter_sha256 and len(spec.adapter_sha256) == 64
    assert models.verify_adapter(spec).is_file()  # the shipped file matches its pin
    card = models.card_text(spec)
    assert "Multi-Conv DAPO" in card and "## Stages" in card and "## Measured" in card


def test_trained_models_register_only_when_shipped_and_pinned(monkeypatch):
    """A trained model appears in the registry only when its adapter file ships and its sha256 is pinned,
    and it inherits its base's packages, checksum and reading defaults."""
    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    for name in [n for n, *_ in models.TRAINED]:
        models.MODELS.pop(name, None)
    monkeypatch.setattr(models, "TRAINED", (
        ("t-missing", "smollm2-135m", "no-such-folder", "0" * 64, "torch", "files not shipped"),
        ("t-unpinned", "smollm2-135m", "notes-135m", None, "torch", "no pin"),
        ("t-ok", "qwen2.5-coder-0.5b", "notes-135m", "1" * 64, "llama.cpp", "shipped and pinned"),
    ))
    models._register_trained()
    assert "t-missing" not in models.MODELS and "t-unpinned" not in models.MODELS
    spec, base = models.MODELS["t-ok"], models.MODELS["qwen2.5-coder-0.5b"]
    assert spec.base == base.name and spec.sha256 == base.sha256 and spec.packages == base.packages
    assert (spec.chunk_tokens, spec.memory_tokens, spec.default_template) == (512, 64, "notes")
    assert spec.adapter == "adapters/notes-135m" and spec.adapter_sha256 == "1" * 64
    assert spec.engine == "llama.cpp" and base.engine == "torch"  # the trained model's engine, not its base's
    assert models.default_engine("t-ok") == "llama.cpp" and models.default_engine("/some/hf-folder") == "torch"


def test_a_models_own_engine_is_used_unless_engine_is_given(monkeypatch):
    """ask/eval/serve run a registered model on its own engine (`memagent models` lists it) and --engine
    still wins; without this the 0.5B, measured on llama.cpp, would silently read on torch, 4-5x slower."""
    from argparse import Namespace

    from memagent import cli

    seen = []
    monkeypatch.setattr("memagent.backends.make_backend", lambda kind, **kw: seen.append(kw["engine"]) or object())
    monkeypatch.setattr("memagent.backends.resolve_tokenizer", lambda *a, **k: None)
    args = dict(backend="embedded", tokenizer=None, threads=None, adapter=None)
    for model, engine in [("memagent-notes-0.5b", None), ("memagent-notes-0.5b", "torch"),
                          ("smollm2-135m", None), ("smollm2-135m", "llama.cpp"), (None, None)]:
        cli.backend_from_args(Namespace(model=model, engine=engine, **args))
    assert seen == ["llama.cpp", "torch", "torch", "llama.cpp", "llama.cpp"]  # (None, None): the default's


def _ask(*extra):
    import json
    import subprocess
    import sys

    doc = "The night shift began at nine. The access code of the blue locker is 5521. Rain fell until dawn."
    proc = subprocess.run([sys.executable, "-m", "memagent", "ask", "-", "What is the access code of the blue locker?",
                           "--json", "--threads", "1", "--chunk-tokens", "64", "--memory-tokens", "32", *extra],
                          input=doc, capture_output=True, text=True, timeout=600)
    return proc, [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]


@pytest.mark.parametrize("engine", ["torch", "llama.cpp"])
def test_adapter_flag_reads_like_the_registered_trained_model(engine):
    """`--model BASE --adapter FOLDER` (how a freshly trained stage is read before it is shipped) must be the
    same weights as the registered model that pins that adapter: same notes, same answer, greedy."""
    if engine == "llama.cpp":
        pytest.importorskip("xllamacpp")
    from memagent.gguf_export import registered_adapter

    folder = str(registered_adapter("memagent-notes-135m"))
    proc_a, a = _ask("--model", "smollm2-135m", "--adapter", folder, "--engine", engine)
    proc_b, b = _ask("--model", "memagent-notes-135m", "--engine", engine)
    assert proc_a.returncode == 0 and proc_b.returncode == 0, proc_a.stderr[-400:] + proc_b.stderr[-400:]
    assert (a[0]["memory"], a[0]["answer"]) == (b[0]["memory"], b[0]["answer"])
    _, base = _ask("--model", "smollm2-135m", "--engine", engine)
    assert base[0]["memory"] != a[0]["memory"]  # the adapter changed what is read (the test can tell)


def test_adapter_flag_refuses_a_model_that_has_one_and_a_folder_that_is_not_an_adapter(tmp_path):
    proc, _ = _ask("--model", "memagent-notes-135m", "--adapter", str(tmp_path))
    assert proc.returncode == 2 and "already carries its own adapter" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc, _ = _ask("--model", "smollm2-135m", "--adapter", str(tmp_path))
    assert proc.returncode == 2 and "not a PEFT adapter folder" in proc.stderr and "Traceback" not in proc.stderr
