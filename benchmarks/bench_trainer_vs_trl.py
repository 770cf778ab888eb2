"""Trainer throughput: one optimisation step of `memagent train` against TRL's `GRPOTrainer` (issue 6, item 7).

Both trainers get the *same* thing, in one process, side by side: the same random-init Llama-style model
(SmolLM2's real tokenizer and vocabulary, a few small layers; built twice from one seed, float32), the same
prompts (B per step, all exactly `--prompt-tokens` tokens after the chat template), G completions per
prompt of at most `--completion-tokens` tokens sampled at T=1 (no top-p/top-k), the same reward function,
the token-mean "dapo" loss with group-std advantages, no KL (beta=0), one optimizer step per batch
(AdamW, same lr, no weight decay, grad clip 1.0), no LoRA, no gradient checkpointing, the same torch
threads. TRL generates on-policy with transformers' `generate` (no vLLM: CPU), logging/saving off.

Why a single-conversation task: TRL trains prompt -> completion pairs, while a memagent trajectory is one
conversation per chunk plus the answer. A document of *zero* chunks makes a memagent trajectory exactly
one conversation (question + empty memory -> answer), the like-for-like case. The ordinary
multi-conversation case (`--chunks K`: K memory updates + the answer per trajectory) is measured after it,
ours only (TRL has no such workflow), counting every conversation's tokens.

What is counted: tokens processed in one step = for every sampled sequence, its prompt tokens plus the
completion tokens actually generated (EOS included, padding excluded). A random model over 49K tokens
almost never samples EOS, so completions run to the cap on both sides; the counts are taken from what
each trainer actually produced. Step time = wall time of one whole optimisation step (TRL: from the end
of its previous step to `on_step_end`, so it includes its data loading and logging bookkeeping; ours:
`Trainer.train_step()`). It is split into generation (TRL: `_generate` = tokenise prompts + `generate` +
decode; ours: `collect()` = rollout + reward) and update (the rest: rewards/advantages, log-prob forward,
backward, optimizer). The two trainers alternate step by step through a TRL callback; the first
`--warmup` steps of each are dropped; medians over `--repeats`.

    nice -n 10 /work/trl-venv/bin/python benchmarks/bench_trainer_vs_trl.py        # ~7 min on 2 cores
    nice -n 10 /work/trl-venv/bin/python benchmarks/bench_trainer_vs_trl.py --trl-compact --chunks 0   # ~4 min
    /work/trl-venv/bin/python benchmarks/bench_trainer_vs_trl.py --smoke            # seconds; writes .smoke.json

`--trl-compact`: TRL 1.16's fused log-prob LM head scores every position (prompt included) on a CPU and
only the completion positions on CUDA/XPU; this flag makes it take the latter path here as well.

Needs TRL, which is not a project dependency: install `benchmarks/requirements-trl.txt` into a separate
venv (its header says how) so the project's pinned versions stay untouched.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what memagent's backend sets; shared by both sides
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, print_table, write_result  # noqa: E402

ANSWER = ("q",)  # reward = the letter q occurs in the reply (sub_em): varied rewards on random text


def bench_template():
    from memagent.prompts import Template

    return Template(name="bench", update="{question}\n{memory}\n{chunk}", final="{question}\n{memory}",
                    empty_memory="-")


class WordPrompts:
    """Questions made of single-token words, sized so that the final prompt has exactly `tokens` tokens."""

    def __init__(self, hf_tok, reader, tokens: int):
        self.hf, self.reader, self.tokens = hf_tok, reader, tokens
        vocab = hf_tok.get_vocab()
        self.words = sorted(w[1:] for w in vocab if w.startswith("Ġ") and w[1:].isalpha() and w[1:].islower()
                            and len(w) > 3)
        self._cache: dict[int, str] = {}

    def words_text(self, index: int, n: int) -> str:
        rng = random.Random(f"bench:{index}")
        return " ".join(rng.choice(self.words) for _ in range(n))

    def text(self, index: int) -> str:
        """The question of prompt `index`: as many words as make the final prompt exactly `tokens` long."""
        if index not in self._cache:
            n = max(1, self.tokens - len(self.prompt_ids("x")))
            for _ in range(50):
                got = len(self.prompt_ids(self.words_text(index, n)))
                if got == self.tokens or (got > self.tokens and n == 1):
                    break
                n = max(1, n + self.tokens - got)
            self._cache[index] = self.words_text(index, n)
        return self._cache[index]

    def messages(self, index: int) -> list[dict]:
        return self.reader.final_request(self.reader.start(self.text(index))).messages

    def prompt_ids(self, text: str) -> list[int]:
        msgs = self.reader.final_request(self.reader.start(text)).messages
        out = self.hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if not isinstance(out, list) else out
        return list(ids)


class BenchTask:
    """memagent task: sample i = the i-th word question, `chunks` chunks of word text (0 = single turn)."""

    def __init__(self, prompts: WordPrompts, chunks: int, chunk_words: int):
        self.prompts, self.chunks, self.chunk_words = prompts, chunks, chunk_words

    def sample(self, index: int):
        from memagent.rl.data import Sample

        chunks = tuple(self.prompts.words_text(10_000 * (index + 1) + c, self.chunk_words) for c in range(self.chunks))
        return Sample(id=f"bench-{index}", question=self.prompts.text(index), answers=ANSWER, chunks=chunks)


def build_model(vocab: int, hidden: int, layers: int, eos: int, pad: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64 or 64,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 64), max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, pad
    return model.float()


def ours_trainer(args, model, hf_tok, tokenizer, prompts, chunks: int, out: Path):
    from memagent.rl.config import TrainConfig
    from memagent.rl.engine import Trainer

    cfg = TrainConfig(model="bench-tiny", device="cpu", questions_per_step=args.batch, num_generations=args.generations,
                      memory_tokens=args.completion_tokens, answer_tokens=args.completion_tokens,
                      temperature=1.0, top_p=1.0, rollout_max_batch=args.batch * args.generations,
                      dynamic_sampling=False, loss_type="dapo", trajectory_weight="tokens", scale_rewards="group",
                      epsilon=0.2, beta=0.0, learning_rate=args.lr, warmup_steps=0, weight_decay=0.0,
                      max_grad_norm=1.0, max_steps=10 ** 6, max_tokens_per_microbatch=1 << 20, seed=0,
                      output_dir=str(out), resume=False, torch_threads=args.threads, progress=False)
    trainer = Trainer(cfg, model=model, hf_tokenizer=hf_tok, tokenizer=tokenizer,
                      task=BenchTask(prompts, chunks, args.chunk_words), template=bench_template(), log=lambda m: None)
    timing = {}
    collect = trainer.collect

    def timed_collect():
        t = time.perf_counter()
        kept, everything, dropped, rounds = collect()
        timing["gen_s"] = time.perf_counter() - t
        convs = [c for tr in kept for c in tr.conversations]
        timing["prompt_tokens"] = sum(len(c.prompt_ids) for c in convs)
        timing["completion_tokens"] = sum(len(c.response_ids) for c in convs)
        timing["conversations"] = len(convs)
        return kept, everything, dropped, rounds

    trainer.collect = timed_collect

    def step() -> dict:
        t = time.perf_counter()
        trainer.train_step()
        total = time.perf_counter() - t
        return dict(timing, step_s=total, update_s=total - timing["gen_s"])

    return trainer, step


def trl_trainer(args, model, hf_tok, prompts, steps: int, out: Path, between):
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from memagent.rl.rollout import score

    def reward(completions, **kw):
        return [float(score(c[0]["content"] if isinstance(c, list) else c, ANSWER)) for c in completions]

    data = Dataset.from_list([{"prompt": prompts.messages(i)} for i in range(args.batch * (steps + 2))])
    cfg = GRPOConfig(output_dir=str(out), per_device_train_batch_size=args.batch * args.generations,
                     gradient_accumulation_steps=1, num_generations=args.generations,
                     max_completion_length=args.completion_tokens, max_steps=steps, learning_rate=args.lr,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                     optim="adamw_torch", beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2,
                     temperature=1.0, top_p=1.0, top_k=0, bf16=False, fp16=False, use_cpu=True,
                     gradient_checkpointing=False, logging_strategy="no", save_strategy="no", report_to="none",
                     disable_tqdm=True, seed=0, dataloader_num_workers=0, log_completions=False,
                     mask_truncated_completions=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=data, processing_class=hf_tok)
    records, timing = [], {}
    generate = trainer._generate

    def timed_generate(p):
        t = time.perf_counter()
        res = generate(p)
        timing["gen_s"] = time.perf_counter() - t
        timing["prompt_tokens"] = sum(len(x) for x in res[0])
        timing["completion_tokens"] = sum(len(x) for x in res[1])
        timing["conversations"] = len(res[1])
        return res

    trainer._generate = timed_generate

    class Interleave(TrainerCallback):
        mark = 0.0

        def on_train_begin(self, *a, **kw):
            self.mark = time.perf_counter()

        def on_step_end(self, *a, **kw):
            total = time.perf_counter() - self.mark
            records.append(dict(timing, step_s=total, update_s=total - timing["gen_s"]))
            between(len(records))  # ours runs here, outside TRL's timed window
            self.mark = time.perf_counter()

    trainer.add_callback(Interleave())
    return trainer, records


def rates(rec: dict) -> dict:
    tokens = rec["prompt_tokens"] + rec["completion_tokens"]
    return {"tokens": tokens, "tokens_per_s": tokens / rec["step_s"],
            "gen_completion_tokens_per_s": rec["completion_tokens"] / rec["gen_s"],
            "update_tokens_per_s": tokens / rec["update_s"]}


def summarise(recs: list[dict]) -> dict:
    keys = ("step_s", "gen_s", "update_s", "prompt_tokens", "completion_tokens", "conversations")
    out = {k: median([r[k] for r in recs]) for k in keys}
    for k in ("tokens", "tokens_per_s", "gen_completion_tokens_per_s", "update_tokens_per_s"):
        out[k] = median([rates(r)[k] for r in recs])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4, help="B: prompts per step")
    ap.add_argument("--generations", type=int, default=4, help="G: completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, default=96, help="tokens of every prompt (after the chat template)")
    ap.add_argument("--completion-tokens", type=int, default=64, help="max completion length (both sides)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=8, help="measured steps per side")
    ap.add_argument("--warmup", type=int, default=1, help="steps per side dropped before measuring")
    ap.add_argument("--chunks", type=int, default=2, help="chunks per document of the multi-conversation run (0 = skip)")
    ap.add_argument("--chunk-words", type=int, default=64, help="single-token words per chunk")
    ap.add_argument("--multi-repeats", type=int, default=3)
    ap.add_argument("--trl-compact", action="store_true",
                    help="let TRL's fused LM head score only the completion positions, as it does on CUDA/XPU "
                         "(on a CPU it scores every position, prompt included); writes trainer_vs_trl_compact.json")
    ap.add_argument("--smoke", action="store_true", help="seconds-long: tiny sizes, 1 measured step")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.generations, args.prompt_tokens, args.completion_tokens = 2, 2, 40, 8
        args.hidden, args.layers, args.repeats, args.warmup, args.chunks, args.chunk_words = 64, 1, 1, 1, 1, 8
        args.multi_repeats = 1

    import copy

    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from memagent import models
    from memagent.reader import Reader, ReaderConfig
    from memagent.tokenizer import HFTokenizer

    hf_logging.set_verbosity_error()
    if args.trl_compact:
        import trl.trainer.utils as trl_utils

        trl_utils._use_triton = lambda device: True  # only decides `compact` there; the kernels stay torch
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' gradient->activation checkpointing rename
    datasets.disable_progress_bars()
    torch.set_num_threads(args.threads)
    path = models.hf_dir("smollm2-135m")  # only its tokenizer is used; the model is random-init below
    hf_tok = AutoTokenizer.from_pretrained(str(path))
    tokenizer = HFTokenizer.from_file(Path(path) / "tokenizer.json")
    reader = Reader(bench_template(), tokenizer, ReaderConfig(memory_tokens=args.completion_tokens,
                                                              answer_tokens=args.completion_tokens))
    prompts = WordPrompts(hf_tok, reader, args.prompt_tokens)
    lengths = {len(prompts.prompt_ids(prompts.text(i))) for i in range(8)}
    base = build_model(len(hf_tok), args.hidden, args.layers, hf_tok.eos_token_id, hf_tok.pad_token_id)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"model: {n_params / 1e6:.1f}M params (hidden {args.hidden}, {args.layers} layers, vocab {len(hf_tok)}); "
          f"prompt tokens {sorted(lengths)}; B={args.batch} G={args.generations} C={args.completion_tokens}; "
          f"threads {args.threads}", flush=True)

    steps = args.warmup + args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        ours, ours_step = ours_trainer(args, copy.deepcopy(base), hf_tok, tokenizer, prompts, 0, Path(tmp) / "ours")
        ours_recs = []

        def between(n: int) -> None:
            ours_recs.append(ours_step())
            r, t = ours_recs[-1], trl_recs[-1]
            print(f"step {n}: TRL {t['step_s']:.2f} s (gen {t['gen_s']:.2f}) {rates(t)['tokens_per_s']:.0f} tok/s | "
                  f"ours {r['step_s']:.2f} s (gen {r['gen_s']:.2f}) {rates(r)['tokens_per_s']:.0f} tok/s", flush=True)

        trl_tr, trl_recs = trl_trainer(args, copy.deepcopy(base), hf_tok, prompts, steps, Path(tmp) / "trl", between)
        trl_checkpointing = bool(getattr(trl_tr.model, "is_activation_checkpointing", False))
        trl_tr.train()
        multi = []
        if args.chunks:
            multi_tr, multi_step = ours_trainer(args, copy.deepcopy(base), hf_tok, tokenizer, prompts, args.chunks,
                                                Path(tmp) / "multi")
            for i in range(args.warmup + args.multi_repeats):
                rec = multi_step()
                print(f"multi-conversation step {i + 1}: ours {rec['step_s']:.2f} s (gen {rec['gen_s']:.2f}) "
                      f"{rates(rec)['tokens_per_s']:.0f} tok/s, {rec['conversations']} conversations", flush=True)
                multi.append(rec)
            asyncio.run(multi_tr.aclose())
        asyncio.run(ours.aclose())

    w = args.warmup
    s_trl, s_ours = summarise(trl_recs[w:]), summarise(ours_recs[w:])
    s_multi = summarise(multi[w:]) if multi else None
    pair = [rates(o)["tokens_per_s"] / rates(t)["tokens_per_s"] for o, t in zip(ours_recs[w:], trl_recs[w:])]
    ratios = {"tokens_per_s_ours_vs_trl": median(pair),
              "step_time_trl_vs_ours": s_trl["step_s"] / s_ours["step_s"],
              "generation_time_trl_vs_ours": s_trl["gen_s"] / s_ours["gen_s"],
              "update_time_trl_vs_ours": s_trl["update_s"] / s_ours["update_s"]}
    rows = [(name, f"{s['tokens']:.0f}", f"{s['step_s']:.2f}", f"{s['gen_s']:.2f}", f"{s['update_s']:.2f}",
             f"{s['tokens_per_s']:.0f}", f"{s['gen_completion_tokens_per_s']:.0f}", f"{s['update_tokens_per_s']:.0f}")
            for name, s in (("TRL GRPOTrainer", s_trl), ("memagent (1 conversation)", s_ours),
                            *([(f"memagent ({args.chunks} chunks + answer)", s_multi)] if s_multi else []))]
    print()
    print_table(rows, ("trainer", "tokens/step", "step s", "gen s", "update s", "tok/s", "gen tok/s", "update tok/s"))
    print(f"\nours / TRL tokens per second (median of paired steps): {ratios['tokens_per_s_ours_vs_trl']:.2f} "
          f"(goal >= 1.0); generation x{ratios['generation_time_trl_vs_ours']:.2f}, "
          f"update x{ratios['update_time_trl_vs_ours']:.2f}")
    path = write_result("trainer_vs_trl_compact" if args.trl_compact else "trainer_vs_trl", {
        "what": "one optimisation step, memagent Trainer vs TRL GRPOTrainer, same tiny model and batch, one process",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "datasets": datasets.__version__, "python": sys.version.split()[0],
                     "python_executable": sys.executable},
        "settings": {**vars(args), "model_params": n_params, "vocab": len(hf_tok), "prompt_tokens_measured": sorted(lengths),
                     "dtype": "float32", "loss_type": "dapo", "scale_rewards": "group", "beta": 0.0, "lora": False,
                     "sampling": "T=1.0, top_p=1.0, top_k off", "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                     "trl_activation_checkpointing": trl_checkpointing,
                     "trl_lm_head_scores": "completion positions only" if args.trl_compact else "every position (TRL's CPU path)"},
        "counted": "tokens per step = sum over sampled sequences of prompt tokens + generated completion tokens "
                   "(EOS included, padding excluded); step time = whole optimisation step; gen = TRL _generate / "
                   "memagent collect(); update = step - gen",
        "ratios": ratios, "paired_tokens_per_s_ratios": pair,
        "median": {"trl": s_trl, "ours_single_conversation": s_ours, "ours_multi_conversation": s_multi},
        "repeats": {"trl": trl_recs, "ours_single_conversation": ours_recs, "ours_multi_conversation": multi},
        "warmup_steps_dropped": w,
    }, smoke=args.smoke)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
