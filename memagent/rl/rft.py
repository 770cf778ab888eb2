"""`memagent rft --config FILE`: rejection-sampling fine-tuning on the policy's own successful reads.

Why this stage exists: the supervised stages (rl/sft.py) teach the model to copy sentences of the shapes
the program-written notes have, and each new shape traded one skill for another (docs/notes-model.md).
What they never score is the check that matters, whether the kept line answers *this* question. RL
scores it through the final answer; on this CPU a DAPO step of the 0.5B costs minutes in torch. RFT is
RL's cheapest relative: sample G reads per training question with the current adapter, score each read's
final answer only (sub_em, the same reward as `memagent train`), and fine-tune on every conversation of
the reads that answered correctly. That is a policy gradient with advantage 1 for correct reads and 0
for the rest, on samples of the policy itself, so it teaches no sentence shape the model did not write.

Two phases, both resumable, both in `output_dir`:
1. collect: `rft_questions` training questions (task = notes; training splits only) in rounds of
   `questions_per_step`, G = `num_generations` reads each at `temperature` / `top_p`, through the
   llama.cpp engine (the Q4 GGUF of `model` + `init_adapter` as a GGUF LoRA), so the torch process holds
   only the policy being trained. It is not a speed-up for batched reads of the 0.5B on 2 cores (stage 1
   read a 4K document in 353 s on torch and 585 s here, benchmarks/results/notes_model.json); the split
   is the one a GPU run makes with a vLLM server (rl/remote.py). Every read is appended to
   rollouts.jsonl with its token ids, the engine's sampling log-probs and its reward; a rerun skips
   finished rounds.
2. fine-tune: the cross-entropy of rl/sft.py on the kept reads' responses, exactly the sampled ids
   (no re-tokenisation), `max_steps` steps of at least `sft_conversations_per_step` conversations,
   whole reads at a time, from `init_adapter`. `rft_groups = "mixed"` keeps only groups where some
   reads failed (the questions whose answer depended on what the notes kept); "any" keeps all.
   `rft_rollouts` pools earlier collections of the same `init_adapter` (e.g. one drawn with later
   evidence; `rft_questions = 0` collects nothing new), and `rft_empty_turns` adds that many
   program-written "stay empty" turns to each step (see RFTRun.empty_turns for why).

Rollouts come from the Q4 weights, the gradient from torch's fp32 dequantised ones. The loss is a plain
likelihood with no importance ratio, so the gap does not enter it; it does make the samples slightly
off-policy. logprob_gap.json measures it: torch's log-probs of the sampled tokens (at the same
temperature) against the engine's, on the first kept conversations, before any update.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import random
import sys
import time
from pathlib import Path

from .config import ConfigError, TrainConfig, load_config, overrides_from_args
from .sft import SFTRun, end_of_turn_id, train_loop


def add_parser(subparsers) -> None:
    from .trainer import add_config_command

    add_config_command(subparsers, "rft", "rejection-sampling fine-tuning on the policy's own correct reads",
                       __doc__.split("\n\n")[0], main)


# ---- phase 1: collect ----------------------------------------------------------------------------------

def rounds_done(path: Path) -> set[int]:
    """Rounds whose reads are all in rollouts.jsonl (a round is written at once, after it finishes)."""
    if not path.is_file():
        return set()
    done = set()
    for line in path.read_text().splitlines():
        if line.strip():
            done.add(json.loads(line)["round"])
    return done


def trajectory_record(traj, round_: int, question: str) -> dict:
    return {"round": round_, "sample_id": traj.sample_id, "group": traj.group, "generation": traj.generation,
            "question": question, "answers": list(traj.answers), "match": traj.match, "reply": traj.reply,
            "correct": traj.correct, "reward": traj.reward, "memories": traj.memories,
            "conversations": [{"kind": c.kind, "prompt_ids": c.prompt_ids, "response_ids": c.response_ids,
                               "logprobs": c.logprobs, "finished": c.finished} for c in traj.conversations]}


def read_trajectory(read: dict, group: int, config: TrainConfig):
    """A stored read back as the rollout Trajectory it was (trajectory_record's inverse), in group
    `group`, rescored with this config's reward. `memagent train` uses this for `first_step_rollouts`."""
    from ..prompts import extract_answer
    from .rollout import Conversation, Trajectory, score_trajectories

    caps = {"update": config.memory_tokens, "final": config.answer_tokens}
    convs = [Conversation(prompt_ids=list(c["prompt_ids"]), response_ids=list(c["response_ids"]),
                          logprobs=list(c["logprobs"]) if c.get("logprobs") else None, finished=bool(c["finished"]),
                          kind=c["kind"], max_tokens=caps[c["kind"]])
             for c in read["conversations"]]
    t = Trajectory(sample_id=read["sample_id"], group=group, generation=int(read["generation"]), conversations=convs,
                   reply=read["reply"], answer=extract_answer(read["reply"]), answers=tuple(read["answers"]),
                   memories=list(read.get("memories") or []), match=read.get("match", "any"))
    score_trajectories([t], config)
    return t


def collect(config: TrainConfig, backend, tokenizer, log=None, progress=None) -> None:
    """Phase 1: roll out every round not yet in output_dir/rollouts.jsonl; `progress()` after each one."""
    from ..prompts import load_template
    from ..reader import Reader, ReaderConfig
    from .data import make_task
    from .rollout import rollout, score_trajectories

    log = log or (lambda m: print(m, file=sys.stderr))
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rollouts.jsonl"
    task = make_task(config, tokenizer)
    reader = Reader(load_template(config.template), tokenizer, ReaderConfig(
        memory_tokens=config.memory_tokens, answer_tokens=config.answer_tokens, temperature=config.temperature,
        top_p=config.top_p, return_tokens=True))
    per = config.questions_per_step
    n_rounds = -(-config.rft_questions // per)
    done = rounds_done(path)
    for r in (r for r in range(n_rounds) if r not in done):
        t0 = time.time()
        samples = [task.sample(i) for i in range(r * per, min((r + 1) * per, config.rft_questions))]
        trajs = asyncio.run(rollout(backend, reader, samples, config.num_generations, seed=config.seed, step=r,
                                    group_offset=r * per))
        score_trajectories(trajs, config)
        by_id = {s.id: s.question for s in samples}
        with open(path, "a") as f:
            f.write("".join(json.dumps(trajectory_record(t, r, by_id[t.sample_id])) + "\n" for t in trajs))
        log(f"rft collect: round {r + 1}/{n_rounds}: {sum(t.correct for t in trajs)}/{len(trajs)} correct, "
            f"{time.time() - t0:.0f}s")
        if progress:
            progress()


def load_rollouts(path: Path, tag: str = "") -> list[dict]:
    """Reads of one collection (rollouts.jsonl, or gzipped as kept in benchmarks/results/). A `tag`
    prefixes the group ids, so that two collections' question 0 stay two groups."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    reads = [json.loads(line) for line in text.splitlines() if line.strip()]
    if tag:
        for t in reads:
            t["group"] = f"{tag}:{t['group']}"
    return reads


def load_collections(paths: list, option: str, tag: str) -> list[dict]:
    """The reads of several collections, file i's groups tagged `{tag}{i}`; a missing file is a
    ConfigError naming `option` (rft_rollouts, first_step_rollouts)."""
    reads = []
    for i, p in enumerate(paths):
        if not Path(p).is_file():
            raise ConfigError(f"{option}: no such file {p}")
        reads += load_rollouts(Path(p), tag=f"{tag}{i}")
    return reads


def earlier_reads(config: TrainConfig) -> list[dict]:
    """The `rft_rollouts` collections. Why allowed: a collection made by the same `init_adapter` is a
    sample of the same policy, so pooling rounds drawn with different document settings (say, one with
    late evidence) is still RFT on that policy's own reads."""
    return load_collections(config.rft_rollouts, "rft_rollouts", "earlier")


def outcomes(reads: list[dict]) -> dict:
    """Each question's (group's) list of read outcomes."""
    groups: dict[int, list[bool]] = {}
    for t in reads:
        groups.setdefault(t["group"], []).append(t["correct"])
    return groups


def collection_stats(reads: list[dict], g: int) -> dict:
    groups = outcomes(reads)
    mixed = sum(0 < sum(v) < len(v) for v in groups.values())
    return {"questions": len(groups), "reads": len(reads), "correct_reads": sum(t["correct"] for t in reads),
            "groups_all_correct": sum(all(v) for v in groups.values()),
            "groups_all_wrong": sum(not any(v) for v in groups.values()), "groups_mixed": mixed,
            "num_generations": g}


def kept_reads(reads: list[dict], groups: str = "any") -> list[dict]:
    """The correct reads to train on; "mixed": only from groups where at least one read failed."""
    outcome = outcomes(reads)
    return [t for t in reads if t["correct"] and (groups == "any" or not all(outcome[t["group"]]))]


def training_rows(read: dict, eos_id: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every conversation of one read. A reply that ended by itself is
    trained to end there (its end-of-turn id appended when the engine left it out); one cut at its cap is
    trained as sampled, without an end it never produced."""
    rows = []
    for c in read["conversations"]:
        resp = list(c["response_ids"])
        if c["finished"] and (not resp or resp[-1] != eos_id):
            resp.append(eos_id)
        if resp:
            rows.append((list(c["prompt_ids"]), resp))
    return rows


# ---- phase 2: fine-tune --------------------------------------------------------------------------------

class RFTRun(SFTRun):
    """rl/sft.py's step on the kept reads instead of program-written notes (whole reads at a time)."""

    def __init__(self, config: TrainConfig, reads: list[dict], log=None):
        if not reads:
            raise ConfigError("rft: no correct reads to train on; sample more questions (rft_questions) or "
                              "use rft_groups = \"any\"")
        super().__init__(config, log)
        self.reads = list(reads)
        random.Random(f"rft:{config.seed}").shuffle(self.reads)
        self.eos = end_of_turn_id(self.hf_tok)

    def batch(self) -> list[tuple[list[int], list[int]]]:
        rows: list = []
        while len(rows) < self.c.sft_conversations_per_step:
            rows += training_rows(self.reads[self.cursor % len(self.reads)], self.eos)
            self.cursor += 1
        return rows + self.empty_turns(self.c.rft_empty_turns)

    def empty_turns(self, n: int) -> list[tuple[list[int], list[int]]]:
        """n supervised turns whose right output is the empty marker: a chunk without evidence read with
        empty notes (rl/sft.py's oracle). Why: a correct read rarely has to stay empty, so RFT alone
        barely trains that decision, and a model that then writes a noise sentence on a noise chunk keeps
        it (docs/notes-model.md). Drawn from the task's documents far past the rollout questions, by
        step, so a resumed run draws the same turns."""
        from .sft import conversations, encode

        empty, rows, i = self.template.empty_memory, [], 0
        while len(rows) < n:
            if i == 1000:
                raise ConfigError("rft_empty_turns: 1000 documents held no chunk without evidence; "
                                  "raise num_chunks (or chunk_tokens)")
            index = 1_000_000 + self.step * 64 + i
            i += 1
            try:
                sample = self.task.sample(index)
            except RuntimeError:  # no document of these settings fits this index: the next one
                continue
            turns = conversations(sample, self.reader, empty, random.Random(f"rft-empty:{index}"))
            rows += [encode(self.hf_tok, m, t, self.specials) for m, t in turns[:-1] if t == empty][:n - len(rows)]
        return rows

    def logprob_gap(self, n: int = 16) -> dict:
        """Torch's log-probs (logits / temperature, the policy being trained) of the engine's sampled
        tokens against the engine's own, over the first n kept conversations with log-probs."""
        torch = self.torch
        diffs: list[float] = []
        self.model.eval()
        with torch.no_grad():
            convs = [c for read in self.reads for c in read["conversations"] if c.get("logprobs") and c["response_ids"]]
            for c in convs[:n]:
                resp = c["response_ids"]
                logits = self.response_logits(c["prompt_ids"], resp).float() / max(self.c.temperature, 1e-6)
                ids = torch.tensor(resp, device=self.device).view(-1, 1)
                lp = torch.log_softmax(logits, -1).gather(1, ids).view(-1)
                diffs += [float(a) - float(b) for a, b in zip(lp.tolist(), c["logprobs"])]
        self.model.train()
        if not diffs:
            return {"tokens": 0}
        absd = sorted(abs(d) for d in diffs)
        return {"tokens": len(diffs), "mean_torch_minus_engine": sum(diffs) / len(diffs),
                "mean_abs": sum(absd) / len(absd), "median_abs": absd[len(absd) // 2],
                "p90_abs": absd[int(0.9 * (len(absd) - 1))], "max_abs": absd[-1], "temperature": self.c.temperature}


def run(config: TrainConfig, backend=None) -> dict:
    """Collect what is missing (on llama.cpp unless a backend is given), then fine-tune."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import models
    from ..tokenizer import HFTokenizer

    if config.task != "notes":
        raise ConfigError("memagent rft reads program-made notes documents: set task = \"notes\"")
    earlier = earlier_reads(config)  # before any read: a wrong path fails now, not after an hour of reads
    out = Path(config.output_dir)
    path = out / "rollouts.jsonl"
    n_rounds = -(-config.rft_questions // config.questions_per_step)
    todo = n_rounds - len(rounds_done(path))
    if todo > 0:
        owned = backend is None
        if owned:
            from ..backends.llamacpp import LlamaCppBackend

            backend = LlamaCppBackend.load(config.model, threads=config.torch_threads or None,
                                           max_batch=config.rollout_max_batch, adapter=config.init_adapter or None)
        tokenizer = HFTokenizer.from_file(models.tokenizer_path(config.model))
        try:
            with Progress(TextColumn("[bold]rft collect"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          disable=not config.progress) as bar:
                task = bar.add_task("", total=todo)
                collect(config, backend, tokenizer, progress=lambda: bar.advance(task))
        finally:
            if owned:
                asyncio.run(backend.aclose())
    all_reads = load_rollouts(path) if path.is_file() else []  # rft_questions = 0: only earlier collections
    out.mkdir(parents=True, exist_ok=True)
    reads = kept_reads(all_reads + earlier, config.rft_groups)
    stats = collection_stats(all_reads, config.num_generations)
    if earlier:
        stats["earlier"] = {"files": list(config.rft_rollouts), **collection_stats(earlier, config.num_generations)}
    stats.update(kept_reads=len(reads), kept_conversations=sum(len(r["conversations"]) for r in reads),
                 rft_groups=config.rft_groups)
    (out / "collect.json").write_text(json.dumps(stats, indent=1) + "\n")
    if config.max_steps == 0:  # collect only: the reads are a DAPO step's batch (memagent train, first_step_rollouts)
        return stats
    run_ = RFTRun(config, reads)
    if run_.step == 0 and not (out / "logprob_gap.json").is_file():
        (out / "logprob_gap.json").write_text(json.dumps(run_.logprob_gap(), indent=1) + "\n")
    return {**stats, **train_loop(run_, "rft")}


def main(args) -> int:
    from ..protocol import BackendError

    try:
        config = load_config(getattr(args, "config", None), overrides_from_args(args))
        last = run(config)
    except (ConfigError, FileNotFoundError, BackendError) as e:
        print(f"memagent rft: error: {e}", file=sys.stderr)
        return 2
    reads = last["reads"] + last.get("earlier", {}).get("reads", 0)
    if config.max_steps == 0:
        print(f"memagent rft: {reads} reads collected ({last['correct_reads']} correct), no fine-tune (max_steps = 0) "
              f"-> {config.output_dir}/rollouts.jsonl")
        return 0
    print(f"memagent rft: {last['kept_reads']} correct reads of {reads} kept; step {last.get('step', 0)} "
          f"-> {config.output_dir}/final")
    return 0
