"""Chat-completions request -> Backend.generate -> response body; plus deterministic fault injection.

Kept apart from the aiohttp routes so the translation is testable without a socket and the routes stay
thin. The fault plan exists for tests: a client's retry loop is only believable if it has survived a
real process that returns 500s, hangs, drops connections and sends broken bodies. Faults are decided
per request by arrival order and a seeded RNG, so a test gets the same faults every run.

Fault spec (flag `--faults`, or env MEMAGENT_SERVER_FAULTS): comma-separated items `KIND:N` (the next N
requests get KIND; items are consumed in order) or `KIND@P` (after the counted items, each request gets
KIND with probability P). Kinds: 500, 429, hang, close, malformed, empty. Example: `hang:1,500:2,close@0.1`.
"""
from __future__ import annotations

import random
import sys
import traceback
from dataclasses import dataclass, field

from ..protocol import Backend, BackendError, PromptTooLongError
from . import lora
from .protocol import RequestError, chat_completion, parse_chat_request

FAULT_KINDS = ("500", "429", "hang", "close", "malformed", "empty")


@dataclass
class FaultPlan:
    counted: list[tuple[str, int]] = field(default_factory=list)
    chances: list[tuple[str, float]] = field(default_factory=list)
    seed: int = 0
    hang_seconds: float = 600.0

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self._arrivals = 0

    @classmethod
    def parse(cls, spec: str | None, seed: int = 0, hang_seconds: float = 600.0) -> "FaultPlan | None":
        if not spec or not spec.strip():
            return None
        plan = cls(seed=seed, hang_seconds=hang_seconds)
        for item in spec.split(","):
            item = item.strip()
            if not item:
                continue
            if "@" in item:
                kind, _, value = item.partition("@")
            elif ":" in item:
                kind, _, value = item.partition(":")
            else:
                raise ValueError(f"fault {item!r}: write KIND:N or KIND@P, e.g. 500:3 or close@0.2")
            if kind not in FAULT_KINDS:
                raise ValueError(f"fault {item!r}: kind must be one of {', '.join(FAULT_KINDS)}")
            try:
                if "@" in item:
                    p = float(value)
                    if not 0.0 <= p <= 1.0:
                        raise ValueError
                    plan.chances.append((kind, p))
                else:
                    n = int(value)
                    if n < 0:
                        raise ValueError
                    plan.counted.append((kind, n))
            except ValueError:
                raise ValueError(f"fault {item!r}: N must be a count >= 0, P a probability in [0, 1]") from None
        return plan

    def next_fault(self) -> str | None:
        """The fault for the next arriving request, or None for a normal answer."""
        i = self._arrivals
        self._arrivals += 1
        for kind, n in self.counted:
            if i < n:
                return kind
            i -= n
        if self.chances:
            r, acc = self._rng.random(), 0.0
            for kind, p in self.chances:
                acc += p
                if r < acc:
                    return kind
        return None


class ChatService:
    """Serves one model name from one Backend; counts what it did for /health and tests."""

    def __init__(self, backend: Backend, model_name: str):
        self.backend, self.model_name = backend, model_name
        self.adapters = None  # LoRA adapters loaded at run time (server/lora.py), set by build_app
        self.stats = {"requests": 0, "completed": 0, "errors": 0, "faults": 0, "in_flight": 0, "max_in_flight": 0}

    async def complete(self, body) -> dict:
        """Validated body -> response dict; raises RequestError for the client's mistakes."""
        request = parse_chat_request(body)
        adapter = self.adapters.get(request.model) if self.adapters is not None else None  # server/lora.py
        want_ids, want_logprobs = lora.requested(body)  # vLLM's return_token_ids / logprobs
        request.generation.return_tokens = want_ids or want_logprobs
        if adapter is None and request.model is not None and request.model != self.model_name:
            raise RequestError(f"The model `{request.model}` does not exist. This server serves `{self.model_name}`.",
                               status=404, param="model", code="model_not_found")
        s = self.stats
        s["in_flight"] += 1
        s["max_in_flight"] = max(s["max_in_flight"], s["in_flight"])
        try:
            gen = await (adapter or self.backend).generate(request.generation)
        except PromptTooLongError as e:  # the client's mistake: 400, so that it does not retry
            s["errors"] += 1
            raise RequestError(str(e), status=400, param="messages", code="context_length_exceeded") from None
        except (BackendError, ValueError) as e:
            s["errors"] += 1
            raise RequestError(f"generation failed: {e}", status=500, type="server_error") from None
        except Exception as e:  # a bug in a backend: keep serving, leave the traceback in the log
            s["errors"] += 1
            traceback.print_exc(file=sys.stderr)
            raise RequestError(f"generation failed: {type(e).__name__}: {e}", status=500, type="server_error") from None
        finally:
            s["in_flight"] -= 1
        s["completed"] += 1
        out = chat_completion(gen, request.model if adapter is not None else self.model_name)
        if want_ids or want_logprobs:
            out = lora.add_fields(out, gen, want_ids, want_logprobs, getattr(adapter or self.backend, "tokenizer", None))
        return out
