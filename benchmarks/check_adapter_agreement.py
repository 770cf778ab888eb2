"""Do torch (+ PEFT LoRA, merged) and llama.cpp (+ the same LoRA exported to GGUF) give the same greedy
answers on the same prompts? Writes benchmarks/results/adapter_agreement.json.

Both engines get identical prompt token ids (memagent builds them) and run the same effective weights:
torch dequantises the Q4_1 GGUF to fp32 and merges the adapter in fp32; llama.cpp keeps the Q4_1 blocks,
multiplies them with Q8-quantised activations, and adds the f32 LoRA product on top, with an f16 KV
cache. So any disagreement comes from arithmetic rounding flipping a near-tie between two tokens; once
one token differs, the rest of the reply follows another path.

    nice -n 19 python benchmarks/check_adapter_agreement.py [--adapter DIR] [--n 24] [--tokens 48]

Without --adapter a random LoRA (r=16, all projections, lora_B ~ N(0, 0.02)) is made with peft on the
real SmolLM2 so that it changes the model's answers (reported: how many answers it changed).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

PROMPTS = [
    "What is the capital of France?", "Name three colours of the rainbow.", "Write one sentence about the sea.",
    "What is 12 plus 30?", "Give a synonym for 'happy'.", "Who wrote Romeo and Juliet?",
    "Explain what a computer is in one sentence.", "List two fruits that are yellow.",
    "What do bees make?", "Translate 'good morning' into Spanish.", "How many legs does a spider have?",
    "Describe the moon in five words.", "What is the opposite of 'cold'?", "Name a famous painter.",
    "Why is the sky blue? Answer briefly.", "Write a haiku about rain.", "What is water made of?",
    "Give one tip for learning to code.", "What is the largest planet?", "Say hello in French.",
    "What season comes after winter?", "Name an animal that lives in the ocean.",
    "Complete: The quick brown fox ...", "What is the boiling point of water in Celsius?",
]
NOTES = ("Question: {q}\nNotes so far: (empty)\nSection:\n{doc}\n\nRewrite your notes: keep the old notes "
         "and add only the sentences of the section that help answer the question. Output only the notes.")
DOC = ("The keeper of the lighthouse wrote in his log that the supply boat came on Tuesday. It brought "
       "flour, lamp oil and a letter from his sister in Bergen. The secret code of the blue door is 73412. "
       "On Thursday a storm broke the north window, and he fixed it with boards from the shed.")
NOTE_QS = ["What is the secret code of the blue door?", "When did the supply boat come?",
           "Where does the keeper's sister live?", "What broke the north window?"]


def make_random_lora(out: Path, std: float = 0.02, r: int = 16, seed: int = 0) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from memagent import models

    base = AutoModelForCausalLM.from_pretrained(str(models.hf_dir("smollm2-135m")), dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    model.save_pretrained(str(out))
    return out


async def answers(backend, prompts: list[list[dict]], tokens: int) -> list:
    from memagent.protocol import GenerationRequest

    return await asyncio.gather(*[backend.generate(GenerationRequest(m, tokens, return_tokens=True)) for m in prompts])


def load_torch(adapter: Path | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent import gguf_export, models
    from memagent.backends.embedded import EmbeddedBackend

    path = models.hf_dir("smollm2-135m")
    lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    if adapter is not None:
        lm = gguf_export.merge_adapter_torch(lm, adapter)
    return EmbeddedBackend(lm, AutoTokenizer.from_pretrained(str(path)), name="torch", max_batch=8)


def compare(a: list, b: list) -> dict:
    same_text = sum(x.text == y.text for x, y in zip(a, b))
    same_first = sum(x.response_ids[:1] == y.response_ids[:1] for x, y in zip(a, b))
    prefix = []
    for x, y in zip(a, b):
        n = 0
        while n < min(len(x.response_ids), len(y.response_ids)) and x.response_ids[n] == y.response_ids[n]:
            n += 1
        prefix.append(n / max(1, min(len(x.response_ids), len(y.response_ids))))
    return {"identical_answers": same_text, "n": len(a), "agreement_rate": round(same_text / len(a), 3),
            "same_first_token": same_first, "mean_common_prefix_fraction": round(sum(prefix) / len(prefix), 3)}


async def run(adapter: Path, n: int, tokens: int) -> dict:
    from memagent import gguf_export
    from memagent.backends.llamacpp import LlamaCppBackend

    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[:n]]
    prompts += [[{"role": "user", "content": NOTES.format(q=q, doc=DOC)}] for q in NOTE_QS]
    t = time.perf_counter()
    gguf = gguf_export.export_adapter_gguf(adapter, Path(tempfile.mkdtemp()) / "adapter.gguf", base="smollm2-135m")
    export_s = time.perf_counter() - t
    out: dict = {"adapter": str(adapter), "prompts": len(prompts), "max_tokens": tokens,
                 "export_seconds": round(export_s, 2), "adapter_gguf_bytes": gguf.stat().st_size}
    res = {}
    for label, ad in (("base", None), ("lora", adapter)):
        tb = load_torch(ad)
        res[f"torch_{label}"] = await answers(tb, prompts, tokens)
        await tb.aclose()
        lb = LlamaCppBackend.load("smollm2-135m", lora=[(str(gguf), 1.0)] if ad else None)
        res[f"llamacpp_{label}"] = await answers(lb, prompts, tokens)
        await lb.aclose()
    out["torch_vs_llamacpp_base"] = compare(res["torch_base"], res["llamacpp_base"])
    out["torch_vs_llamacpp_lora"] = compare(res["torch_lora"], res["llamacpp_lora"])
    same = compare(res["torch_base"], res["torch_lora"])["identical_answers"]
    out["adapter_changed_answers_torch"] = len(prompts) - same
    out["examples"] = [{"prompt": p[0]["content"][:80], "torch_lora": a.text, "llamacpp_lora": b.text}
                       for p, a, b in list(zip(prompts, res["torch_lora"], res["llamacpp_lora"]))[:6]]
    out["disagreements"] = [{"prompt": p[0]["content"][:80], "torch_lora": a.text, "llamacpp_lora": b.text}
                            for p, a, b in zip(prompts, res["torch_lora"], res["llamacpp_lora"]) if a.text != b.text]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", type=Path, default=None, help="a PEFT LoRA folder (default: a random one)")
    ap.add_argument("--n", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    adapter = args.adapter or make_random_lora(Path(tempfile.mkdtemp()) / "random-lora")
    out = asyncio.run(run(adapter, args.n, args.tokens))
    if args.adapter is None:
        out["adapter"] = "random LoRA r=16 alpha=32 on q,k,v,o,gate,up,down; lora_B ~ N(0, 0.02), seed 0"
    if not args.no_write:
        print(write_result("adapter_agreement", out))
    import json

    print(json.dumps({k: v for k, v in out.items() if k not in ("examples", "disagreements")}, indent=1))


if __name__ == "__main__":
    main()
