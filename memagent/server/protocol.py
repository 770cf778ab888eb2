"""OpenAI chat-completions wire format: validate a request body, build response and error bodies.

Pure functions over plain dicts (no aiohttp), so validation is unit-testable without a socket. Any
client that speaks to vLLM or OpenAI must be able to speak to us, so we accept what they accept for the
fields that matter (`max_tokens` or `max_completion_tokens`, content as a string or a list of text
parts, `stream`) and answer unsupported features (n > 1, tools) with a clear 400 rather than silently
ignoring them. Anything a client can get wrong is a 400 here, never a 500 later (clients retry 500s):
a lone surrogate in the text, a seed outside the 64-bit range.
"""
from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass

from ..protocol import Generation, GenerationRequest

ROLES = {"system", "developer", "user", "assistant", "tool"}
DEFAULT_MAX_TOKENS = 512  # OpenAI's default is "up to the context"; a small model needs a bound
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed accepts
_SURROGATE = re.compile("[\ud800-\udfff]")


class RequestError(Exception):
    """A request we refuse; becomes an OpenAI-style error body with this HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ChatRequest:
    model: str | None
    generation: GenerationRequest


def _number(body: dict, key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{key}' must be a number, got {type(value).__name__}", param=key)
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise RequestError(f"'{key}' must be in {bound}, got {value}", param=key)
    return float(value)


def _int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{key}' must be an integer, got {type(value).__name__}", param=key)
    return value


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""  # an assistant turn that only called tools; harmless as empty text
    if isinstance(content, str):
        return _no_surrogate(content, i)
    if isinstance(content, list):  # [{"type": "text", "text": "..."}], as newer clients send
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{i}].content: only text parts are supported", param="messages")
            texts.append(part["text"])
        content = "".join(texts)
        return _no_surrogate(content, i)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def check_text(text: str, param: str, where: str | None = None) -> str:
    """'\\ud800' is valid JSON but not text: no tokenizer can encode it, so it is a 400 here, not a 500
    later. Cheap for ASCII (most text)."""
    if not text.isascii() and _SURROGATE.search(text):
        raise RequestError(f"'{where or param}' contains a lone surrogate (not valid Unicode text)", param=param)
    return text


def _no_surrogate(text: str, i: int) -> str:
    return check_text(text, "messages", f"messages[{i}].content")


def parse_messages(value) -> list[dict]:
    if value is None:
        raise RequestError("'messages' is required", param="messages")
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}", param="messages")
        messages.append({"role": role, "content": _content(m, i)})
    return messages


def parse_chat_request(body) -> ChatRequest:
    """Validate a decoded JSON body; raise RequestError (status 400) on anything we cannot serve."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    messages = parse_messages(body.get("messages"))
    if not isinstance(body.get("stream", False), (bool, type(None))):
        raise RequestError("'stream' must be true or false", param="stream")
    n = _int(body, "n")
    if n not in (None, 1):
        raise RequestError("only n=1 is supported", param="n")
    if body.get("tools") or body.get("functions"):
        raise RequestError("tool calling is not supported by this server", param="tools")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError("response_format (JSON mode, schemas) is not supported by this server; omit it or "
                           "send {'type': 'text'}", param="response_format")
    max_tokens = _int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens")
        key = "max_tokens"
    else:
        key = "max_completion_tokens"
    if max_tokens is not None and max_tokens <= 0:
        raise RequestError(f"'{key}' must be a positive integer, got {max_tokens}", param=key)
    seed = _int(body, "seed")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise RequestError("'seed' must fit in 64 bits", param="seed")
    generation = GenerationRequest(
        messages=messages,
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        seed=seed,
    )
    return ChatRequest(model=model, generation=generation)


def chat_completion(gen: Generation, model: str) -> dict:
    finish = gen.finish_reason if gen.finish_reason in ("stop", "length") else "stop"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                     "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
                  "total_tokens": gen.prompt_tokens + gen.completion_tokens},
    }


def model_list(names: list[str], created: int) -> dict:
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "memagent"} for n in names]}
