"""A backend that answers at once, with no model: it measures everything *except* the model.

Why it exists: the performance benchmarks serve it over HTTP (`memagent serve --backend instant`) so
that the time they measure is our own orchestration (chunking, prompt rendering, HTTP client, server,
retries) and not a model's forward passes. Replies are deterministic functions of the prompt, so a run
can be checked for equality across client settings, and cheap (one CRC over the prompt), so the
backend never becomes the bottleneck it is meant to factor out.

A final-answer prompt (one that asks for \\boxed{}) gets `\\boxed{<answer>}`; any other prompt gets a
short memory line carrying the prompt's checksum, which makes a wrong routing of memories visible.
"""
from __future__ import annotations

import asyncio
import zlib

from ..protocol import Generation, GenerationRequest


def _message_text(messages: list[dict]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        parts.append(content if isinstance(content, str) else "")
    return "\n".join(parts)


class InstantBackend:
    """Deterministic, model-free replies; `delay` (seconds) simulates a model's latency in tests.

    `slots` > 0 bounds how many calls are "on the model" at once (the rest queue), so a server of it
    has a finite throughput of slots / delay calls per second, as a real GPU server does; 0 = unbounded.
    """

    def __init__(self, answer: str = "instant", delay: float = 0.0, name: str = "instant", slots: int = 0):
        self.answer, self.delay, self.name, self.slots = answer, delay, name, slots
        self.calls = 0
        self._sem, self._sem_loop = None, None

    def reply_for(self, request: GenerationRequest) -> tuple[str, int]:
        """(reply text, prompt size in pseudo-tokens). Pseudo-tokens: ~4 characters each, like BPE."""
        prompt = _message_text(request.messages)
        if "\\boxed" in prompt:
            text = f"The answer is \\boxed{{{self.answer}}}"
        else:
            text = f"notes {zlib.crc32(prompt.encode('utf-8', 'surrogatepass')):08x}"
        return text, max(1, len(prompt) // 4)

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {request.max_tokens}")
        self.calls += 1
        if self.delay > 0 and self.slots > 0:
            loop = asyncio.get_running_loop()
            if self._sem_loop is not loop:
                self._sem, self._sem_loop = asyncio.Semaphore(self.slots), loop
            async with self._sem:
                await asyncio.sleep(self.delay)
        elif self.delay > 0:
            await asyncio.sleep(self.delay)
        text, prompt_tokens = self.reply_for(request)
        words = text.split(" ")
        finish = "stop"
        if len(words) > request.max_tokens:  # one word = one token here: honour the cap like a model would
            words, finish = words[: request.max_tokens], "length"
        return Generation(text=" ".join(words), finish_reason=finish, prompt_tokens=prompt_tokens,
                          completion_tokens=len(words))

    async def aclose(self) -> None:
        return None
