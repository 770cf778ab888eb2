"""Multi-conversation rollouts: the inference reading loop, run with sampling and token ids turned on.

A trajectory is what one read of one document produces: one conversation per chunk (question, memory,
chunk -> new memory) and a final one (question, memory -> answer). Every conversation is an independent
prompt -> response pair; nothing is concatenated, so each training row is conditioned exactly as at
inference. Prompts come from `memagent.reader.Reader`, the same state machine the driver uses, and the
token ids and sampling log-probs come from the backend (`return_tokens=True`), never from re-tokenising
text later (the decode/encode drift other ports hit).

Lock-step: all G x B trajectories advance one chunk at a time and the calls of one chunk index are
issued together, so a batching backend (the embedded model) runs them as one batch. Documents with
fewer chunks simply drop out of later rounds.

Per-request seeds: each call gets `seed = hash(base seed, step, question, generation, turn)`. The G
trajectories of a question therefore differ, and a backend that honours per-request seeds produces the
same samples whatever else is in the batch (resume and data-parallel layouts stay reproducible).
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field, replace

from ..prompts import extract_answer, extract_boxed
from ..protocol import Backend, Generation, GenerationRequest
from ..reader import Reader, ReadState
from ..tasks.scoring import holds_answers, normalize_answer  # the reward's tests, shared with eval
from .data import Sample


@dataclass
class Conversation:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None  # sampling-policy log-prob of each response token (None if not given)
    finished: bool  # ended with EOS; False = cut at its cap (overlong)
    kind: str  # "update" or "final"
    max_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class Trajectory:
    sample_id: str
    group: int  # index of the question within the step's batch; the G trajectories of a question share it
    generation: int  # 0..G-1
    conversations: list[Conversation]
    reply: str
    answer: str
    answers: tuple[str, ...]
    reward: float = 0.0
    correct: bool = False
    memories: list[str] = field(default_factory=list)  # memory after each chunk (for logs and eval)
    match: str = "any"  # the sample's: "any" answer suffices, or "all" of them are asked for (data.Sample)

    @property
    def truncated(self) -> int:
        return sum(not c.finished for c in self.conversations)


# ---- reward ------------------------------------------------------------------------------------------

def score(reply: str, answers: tuple[str, ...], kind: str = "sub_em", match: str = "any") -> bool:
    """`sub_em`: a normalised gold answer occurs in the normalised extracted answer (MemAgent's eval
    metric). `boxed_em`: the last \\boxed{} exists and equals a gold answer after normalisation (the
    strict verifier MemAgent trained with). With `match="all"` every gold must be there: under sub_em
    each occurs in the answer, under boxed_em each occurs in the boxed text (a list has no one form)."""
    if match not in ("any", "all"):
        raise ValueError(f"match must be 'any' or 'all', got {match!r}")
    if kind == "boxed_em":
        boxed = extract_boxed(reply)
        if boxed is None:
            return False
        if match == "all":
            return holds_answers(boxed, answers, "all")
        pred = normalize_answer(boxed)
        return any(g == pred for g in map(normalize_answer, answers) if g)
    return holds_answers(extract_answer(reply), answers, match)


def trajectory_reward(traj: Trajectory, kind: str = "sub_em", format_reward: float = 0.0,
                      length_penalty: float = 0.0) -> tuple[float, bool]:
    """Reward on the final answer only; the optional terms are off by default."""
    correct = score(traj.reply, traj.answers, kind, traj.match)
    r = float(correct)
    if format_reward and extract_boxed(traj.reply) is not None:
        r += format_reward
    if length_penalty and traj.truncated:
        r -= length_penalty
    return r, correct


# ---- rollout -----------------------------------------------------------------------------------------

def request_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "little")


def _conversation(gen: Generation, kind: str, max_tokens: int) -> Conversation:
    if gen.prompt_ids is None or gen.response_ids is None:
        raise RuntimeError("the backend returned no token ids; training needs a backend that supports "
                           "return_tokens=True (embedded, or a server that returns token ids)")
    return Conversation(prompt_ids=list(gen.prompt_ids), response_ids=list(gen.response_ids),
                        logprobs=list(gen.logprobs) if gen.logprobs is not None else None,
                        finished=gen.finish_reason != "length", kind=kind, max_tokens=max_tokens)


async def rollout(backend: Backend, reader: Reader, samples: list[Sample], num_generations: int,
                  seed: int = 0, step: int = 0, group_offset: int = 0, keep_tokens: bool = True,
                  max_concurrency: int | None = None) -> list[Trajectory]:
    """G trajectories per sample, in sample-major order (the G of sample k are contiguous)."""
    if reader.config.gated:  # a skipped chunk or an exit has no conversation to train on, nor a reward for it
        raise ValueError("the skip-update and early-exit gates are for inference; training reads every chunk")
    jobs = [(k, g) for k in range(len(samples)) for g in range(num_generations)]
    states: list[ReadState] = [reader.start(samples[k].question) for k, _ in jobs]
    convs: list[list[Conversation]] = [[] for _ in jobs]
    memories: list[list[str]] = [[] for _ in jobs]
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def call(req: GenerationRequest) -> Generation:
        if limit is None:
            return await backend.generate(req)
        async with limit:
            return await backend.generate(req)

    def seeded(req: GenerationRequest, j: int, turn: int) -> GenerationRequest:
        if req.temperature <= 0:
            return req
        k, g = jobs[j]
        return replace(req, seed=request_seed(seed, step, samples[k].id, g, turn))

    max_chunks = max(len(s.chunks) for s in samples)
    for c in range(max_chunks):  # lock-step over chunk index
        active = [j for j, (k, _) in enumerate(jobs) if c < len(samples[k].chunks)]
        reqs = [seeded(reader.update_request(states[j], samples[jobs[j][0]].chunks[c]), j, c) for j in active]
        gens = await asyncio.gather(*(call(r) for r in reqs))
        for j, req, gen in zip(active, reqs, gens):
            states[j] = reader.apply_update(states[j], gen)
            memories[j].append(states[j].memory)
            if keep_tokens:
                convs[j].append(_conversation(gen, "update", req.max_tokens))
    reqs = [seeded(reader.final_request(states[j]), j, max_chunks) for j in range(len(jobs))]
    gens = await asyncio.gather(*(call(r) for r in reqs))
    out = []
    for j, (req, gen) in enumerate(zip(reqs, gens)):
        state = reader.apply_final(states[j], gen)
        if keep_tokens:
            convs[j].append(_conversation(gen, "final", req.max_tokens))
        k, g = jobs[j]
        out.append(Trajectory(sample_id=samples[k].id, group=group_offset + k, generation=g,
                              conversations=convs[j], reply=state.reply or "", answer=state.answer or "",
                              answers=samples[k].answers, memories=memories[j], match=samples[k].match))
    return out


def score_trajectories(trajs: list[Trajectory], config) -> None:
    for t in trajs:
        t.reward, t.correct = trajectory_reward(t, config.reward, config.format_reward, config.length_penalty)
