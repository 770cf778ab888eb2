"""A deterministic backend for unit tests: no model, replies computed from the prompt.

Why: the driver, resume and trace logic must be testable in milliseconds and give the same answer
every run. Its default policy is a tiny "perfect reader": the memory keeps every sentence of the
section that contains one of `keywords`, and the final answer boxes the last number in the memory.
Tests can pass any `policy(request) -> str` instead, and can make calls fail on purpose.
"""
from __future__ import annotations

import asyncio
import re
from typing import Callable

from ..protocol import BackendError, Generation, GenerationRequest

_SECTION = re.compile(r"<section>\n(.*)\n</section>", re.S)
_MEMORY = re.compile(r"<(?:notes|memory)>\n(.*?)\n</(?:notes|memory)>", re.S)


def keyword_policy(keywords: list[str]) -> Callable[[GenerationRequest], str]:
    def policy(req: GenerationRequest) -> str:
        prompt = req.messages[-1]["content"]
        mem_m = _MEMORY.search(prompt)
        memory = mem_m.group(1) if mem_m else ""
        sec = _SECTION.search(prompt)
        if sec is None:  # final prompt
            nums = re.findall(r"\d+", memory)
            return f"The answer is \\boxed{{{nums[-1] if nums else 'unknown'}}}."
        keep = [s for s in re.split(r"(?<=[.!?])\s+", sec.group(1)) if any(k in s for k in keywords)]
        lines = [] if memory.startswith(("(no notes", "No previous")) else [memory]
        return " ".join(lines + keep) or memory

    return policy


class ScriptedBackend:
    name = "scripted"

    def __init__(self, policy: Callable[[GenerationRequest], str] | None = None, keywords=("secret",),
                 fail_on: Callable[[int, GenerationRequest], bool] | None = None, delay: float = 0.0):
        self.policy = policy or keyword_policy(list(keywords))
        self.fail_on, self.delay = fail_on, delay
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        n = len(self.requests)
        self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_on and self.fail_on(n, request):
            raise BackendError(f"scripted failure on call {n}")
        text = self.policy(request)
        words = text.split()
        finish = "stop"
        if len(words) > request.max_tokens:  # the backend's own max_tokens, in words
            text, finish = " ".join(words[: request.max_tokens]), "length"
        prompt_words = sum(len(m["content"].split()) for m in request.messages)
        return Generation(text=text, finish_reason=finish, prompt_tokens=prompt_words,
                          completion_tokens=min(len(words), request.max_tokens))

    async def aclose(self) -> None:
        pass
