"""The reading workflow as a pure state machine: no I/O, no backend, no clock.

Given a state and a chunk it builds the request for the memory update; given the model's reply it
returns the next state (the reply *replaces* the memory, hard-capped at `memory_tokens`). After the last
chunk it builds the final request (question + memory only) and extracts the answer. The driver (I/O,
batching, resume) and the RL rollout (sampling, token ids) both run this same machine, so what training
optimises is exactly what inference does.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .prompts import Template, extract_answer, render, strip_reasoning, to_messages
from .protocol import Generation, GenerationRequest
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class ReadState:
    question: str
    memory: str
    chunks_read: int = 0
    capped_updates: int = 0  # memory updates cut at the cap (overlong), for traces and RL masking
    reply: str | None = None  # raw final reply
    answer: str | None = None


@dataclass(frozen=True)
class ReaderConfig:
    memory_tokens: int = 1024
    answer_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    return_tokens: bool = False  # training asks for ids and log-probs
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.memory_tokens <= 0:
            raise ValueError(f"memory size must be a positive number of tokens, got {self.memory_tokens}")
        if self.answer_tokens <= 0:
            raise ValueError(f"answer size must be a positive number of tokens, got {self.answer_tokens}")


class Reader:
    def __init__(self, template: Template, tokenizer: Tokenizer, config: ReaderConfig | None = None):
        self.template, self.tokenizer = template, tokenizer
        self.config = config or ReaderConfig()

    def start(self, question: str) -> ReadState:
        if not question or not question.strip():
            raise ValueError("the question is empty")
        return ReadState(question=question.strip(), memory=self.template.empty_memory)

    def _request(self, user: str, max_tokens: int, key: str) -> GenerationRequest:
        c = self.config
        return GenerationRequest(
            messages=to_messages(self.template, user), max_tokens=max_tokens, temperature=c.temperature,
            top_p=c.top_p, seed=c.seed, return_tokens=c.return_tokens, cache_key=key)

    def update_request(self, state: ReadState, chunk: str) -> GenerationRequest:
        user = render(self.template.update, self.template, question=state.question, memory=state.memory, chunk=chunk)
        return self._request(user, self.config.memory_tokens, f"u:{self.template.digest}:{state.question}")

    def cap(self, text: str) -> tuple[str, bool]:
        """Hard cap: a backend that overshoots max_tokens is cut at the memory_tokens-th token."""
        ids, starts = self.tokenizer.encode_offsets(text)
        if len(ids) <= self.config.memory_tokens:
            return text, False
        return text[: starts[self.config.memory_tokens]].rstrip(), True

    def apply_update(self, state: ReadState, gen: Generation) -> ReadState:
        memory, cut = self.cap(strip_reasoning(gen.text).strip())
        capped = cut or gen.finish_reason == "length"
        return replace(state, memory=memory or self.template.empty_memory, chunks_read=state.chunks_read + 1,
                       capped_updates=state.capped_updates + int(capped))

    def final_request(self, state: ReadState) -> GenerationRequest:
        user = render(self.template.final, self.template, question=state.question, memory=state.memory)
        return self._request(user, self.config.answer_tokens, f"f:{self.template.digest}:{state.question}")

    def apply_final(self, state: ReadState, gen: Generation) -> ReadState:
        return replace(state, reply=gen.text, answer=extract_answer(gen.text))
