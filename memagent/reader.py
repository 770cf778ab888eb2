"""The reading workflow as a pure state machine: no I/O, no backend, no clock.

Given a state and a chunk it builds the request for the memory update; given the model's reply it
returns the next state (the reply *replaces* the memory, hard-capped at `memory_tokens`). After the last
chunk it builds the final request (question + memory only) and extracts the answer. The driver (I/O,
batching, resume) and the RL rollout (sampling, token ids) both run this same machine, so what training
optimises is exactly what inference does.

Two optional gates (memagent/gates.py, both off by default) let a read make fewer calls: `needs_update`
says before any call whether a chunk may be skipped (then `skip` keeps the memory), and in `marker` exit
mode `apply_update` notices the template's exit marker, strips it and marks the state `exited`; a caller
then stops feeding chunks and asks for the final answer. With both off, every chunk gets its update call
and the prompts are byte-for-byte those of a reader without gates.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .gates import EXIT_MODES, SKIP_MODES, LexicalSkipGate, edges, find_marker, words
from .prompts import Template, extract_answer, render, strip_reasoning, to_messages
from .protocol import Generation, GenerationRequest
from .specials import pattern, special_strings
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class ReadState:
    question: str
    memory: str
    chunks_read: int = 0  # chunks this question has passed, skipped ones included
    capped_updates: int = 0  # memory updates cut at the cap (overlong), for traces and RL masking
    reply: str | None = None  # raw final reply
    answer: str | None = None
    skipped: int = 0  # chunks passed without an update call (skip gate); the memory stayed as it was
    exit_chunk: int | None = None  # 0-based chunk whose update carried the exit marker; reading stopped there

    @property
    def exited(self) -> bool:
        return self.exit_chunk is not None


@dataclass(frozen=True)
class ReaderConfig:
    memory_tokens: int = 1024
    answer_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    return_tokens: bool = False  # training asks for ids and log-probs
    extra: dict = field(default_factory=dict)
    skip_update: str = "off"  # off | lexical (memagent/gates.py)
    early_exit: str = "off"  # off | marker

    @property
    def gated(self) -> bool:
        return self.skip_update != "off" or self.early_exit != "off"

    def __post_init__(self):
        if self.skip_update not in SKIP_MODES:
            raise ValueError(f"skip-update must be one of {', '.join(SKIP_MODES)}, got {self.skip_update!r}")
        if self.early_exit not in EXIT_MODES:
            raise ValueError(f"early-exit must be one of {', '.join(EXIT_MODES)}, got {self.early_exit!r}")
        if self.memory_tokens <= 0:
            raise ValueError(f"memory size must be a positive number of tokens, got {self.memory_tokens}")
        if self.answer_tokens <= 0:
            raise ValueError(f"answer size must be a positive number of tokens, got {self.answer_tokens}")


class Reader:
    def __init__(self, template: Template, tokenizer: Tokenizer, config: ReaderConfig | None = None):
        self.template, self.tokenizer = template, tokenizer
        self.config = config or ReaderConfig()
        self._exit = self.config.early_exit == "marker"
        if self._exit and template.update_exit is None:
            raise ValueError(f"--early-exit marker needs a template with update_exit and exit_marker; "
                             f"{template.name!r} has none")
        self._markers = (template.exit_marker,) if self._exit else ()
        self._specials = pattern(special_strings(tokenizer))  # its control tokens, defused in inserted text
        self._gates: dict[str, LexicalSkipGate] = {}  # per question: the terms are extracted once
        self._last_words: tuple[tuple, frozenset] = ((object(),) * 3, frozenset())  # many questions, one chunk

    @property
    def gates_id(self) -> str | None:
        """What the gates change, for state files (None when both are off)."""
        c = self.config
        if not c.gated:
            return None
        return f"skip={c.skip_update};exit={c.early_exit}" + (f":{self.template.exit_digest}" if self._exit else "")

    def start(self, question: str) -> ReadState:
        if not question or not question.strip():
            raise ValueError("the question is empty")
        return ReadState(question=question.strip(), memory=self.template.empty_memory)

    def _request(self, user: str, max_tokens: int, key: str) -> GenerationRequest:
        c = self.config
        return GenerationRequest(
            messages=to_messages(self.template, user), max_tokens=max_tokens, temperature=c.temperature,
            top_p=c.top_p, seed=c.seed, return_tokens=c.return_tokens, cache_key=key)

    def needs_update(self, state: ReadState, chunk: str, previous: str | None = None,
                     following: str | None = None) -> bool:
        """False when the chunk gets no call: the read has exited, or the skip gate finds nothing in it.

        `previous` / `following`: the neighbouring chunks' texts (None at the ends, or when not known);
        the skip gate also looks at their edges (gates.edges) so a fact cut by a boundary is not lost."""
        if state.exited:
            return False
        if self.config.skip_update == "off":
            return True
        gate = self._gates.get(state.question)
        if gate is None:
            if len(self._gates) > 4096:  # a long eval asks thousands of questions; this is only a cache
                self._gates.clear()
            gate = self._gates[state.question] = LexicalSkipGate(state.question, self.template.empty_memory)
        key = (chunk, previous, following)
        if any(a is not b for a, b in zip(self._last_words[0], key)):  # identity: the held references keep it valid
            before, after = edges(previous, following)
            self._last_words = (key, frozenset(words(before + chunk + after)))
        return gate.keep(state.memory, self._last_words[1])

    def skip(self, state: ReadState) -> ReadState:
        """Pass a chunk without a call: the memory is kept as it was."""
        return replace(state, chunks_read=state.chunks_read + 1, skipped=state.skipped + 1)

    def update_request(self, state: ReadState, chunk: str) -> GenerationRequest:
        if self._exit:
            user = render(self.template.update_exit, self.template, self._markers, specials=self._specials,
                          question=state.question, memory=state.memory, chunk=chunk)
            return self._request(user, self.config.memory_tokens, f"ux:{self.template.digest}:{state.question}")
        user = render(self.template.update, self.template, specials=self._specials, question=state.question,
                      memory=state.memory, chunk=chunk)
        return self._request(user, self.config.memory_tokens, f"u:{self.template.digest}:{state.question}")

    def cap(self, text: str) -> tuple[str, bool]:
        """Hard cap: a backend that overshoots max_tokens is cut at the memory_tokens-th token."""
        if len(text.encode("utf-8", "surrogatepass")) + 1 <= self.config.memory_tokens:
            return text, False  # a token covers at least one byte (+1: a tokenizer's added prefix space)
        ids, starts = self.tokenizer.encode_offsets(text)
        if len(ids) <= self.config.memory_tokens:
            return text, False
        return text[: starts[self.config.memory_tokens]].rstrip(), True

    def apply_update(self, state: ReadState, gen: Generation) -> ReadState:
        text, exit_ = strip_reasoning(gen.text).strip(), False
        if self._exit:
            text, exit_ = find_marker(text, self.template.exit_marker)
            # a marker with no notes beside it answers nothing: keep reading
            exit_ = exit_ and bool(text) and text != self.template.empty_memory
        memory, cut = self.cap(text)
        capped = cut or gen.finish_reason == "length"
        return replace(state, memory=memory or self.template.empty_memory, chunks_read=state.chunks_read + 1,
                       capped_updates=state.capped_updates + int(capped),
                       exit_chunk=state.chunks_read if exit_ else state.exit_chunk)

    def final_request(self, state: ReadState) -> GenerationRequest:
        user = render(self.template.final, self.template, self._markers, specials=self._specials,
                      question=state.question, memory=state.memory)
        return self._request(user, self.config.answer_tokens, f"f:{self.template.digest}:{state.question}")

    def apply_final(self, state: ReadState, gen: Generation) -> ReadState:
        return replace(state, reply=gen.text, answer=extract_answer(gen.text))
