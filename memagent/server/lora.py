"""What an RL trainer needs from a rollout server, the way vLLM offers it (memagent/rl/remote.py is the client).

* Token ids and log-probs: a chat completion with `"return_token_ids": true` answers, as vLLM >= 0.10.2
  does, `prompt_token_ids` at the top level and `token_ids` in the choice; `"logprobs": true` adds
  `choices[0].logprobs.content = [{"token", "logprob", "bytes", "top_logprobs": []}, ...]`, one per
  generated token. Our log-probs are those of the distribution actually sampled from (after temperature
  and top-p), which is what vLLM returns with `--logprobs-mode processed_logprobs`; they are what the
  trainer recomputes, so the two can be compared token by token.
* LoRA adapters loaded at run time: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and
  `POST /v1/unload_lora_adapter {"lora_name"}` (vLLM with `--enable-lora` and
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); a request whose `model` is an adapter's name samples from
  base + adapter. `GET /v1/lora_adapters` lists what is loaded (ours only; vLLM lists them in /v1/models).
  Only the embedded backend has weights to adapt; each adapter is a PEFT model over a private copy of
  the base weights, unmerged, so its forward is the trainer's own (the same LoRA maths, not a merged
  approximation) and log-probs agree to float rounding.

Kept out of protocol.py/serving.py on purpose: the chat service calls `requested()`/`add_fields()`
and looks adapters up by model name, nothing more.
"""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from ..protocol import Generation
from .protocol import RequestError


def requested(body) -> tuple[bool, bool]:
    """(return_token_ids, logprobs) as the client asked (vLLM's request fields)."""
    if not isinstance(body, dict):
        return False, False
    ids, lps = body.get("return_token_ids"), body.get("logprobs")
    for key, value in (("return_token_ids", ids), ("logprobs", lps)):
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"'{key}' must be true or false", param=key)
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise RequestError("top_logprobs > 0 is not supported by this server", param="top_logprobs")
    return bool(ids), bool(lps)


def add_fields(response: dict, gen: Generation, ids: bool, logprobs: bool, tokenizer=None) -> dict:
    """Put the token ids and log-probs of `gen` into a chat-completion body, in vLLM's shape."""
    if gen.response_ids is None or gen.prompt_ids is None or (logprobs and gen.logprobs is None):
        raise RequestError("this backend cannot return token ids or log-probs (serve --backend embedded)",
                           param="return_token_ids" if ids else "logprobs", code="not_supported")
    choice = response["choices"][0]
    if ids:
        response["prompt_token_ids"] = list(gen.prompt_ids)
        choice["token_ids"] = list(gen.response_ids)
    if logprobs:
        content = []
        for tid, lp in zip(gen.response_ids, gen.logprobs):
            text = tokenizer.decode([tid]) if tokenizer is not None else str(tid)
            content.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8", "replace")),
                            "top_logprobs": []})
        choice["logprobs"] = {"content": content}
    return response


class Adapters:
    """LoRA adapters over an embedded backend's model, by name; each one a backend of its own."""

    def __init__(self, base):
        self.base = base
        self.loaded: dict[str, object] = {}
        self.paths: dict[str, str] = {}
        self.stats = {"loads": 0, "unloads": 0}
        self._lock = asyncio.Lock()

    @property
    def supported(self) -> bool:
        return hasattr(self.base, "model") and hasattr(self.base, "tokenizer")

    def get(self, name: str | None):
        return self.loaded.get(name) if name else None

    async def load(self, name: str, path: str) -> None:
        if not self.supported:
            raise RequestError("LoRA adapters need a model: serve with --backend embedded", status=400,
                               code="not_supported")
        if not Path(path).is_dir() or not (Path(path) / "adapter_config.json").is_file():
            raise RequestError(f"no LoRA adapter (adapter_config.json) at {path!r}", status=400,
                               param="lora_path")
        async with self._lock:
            if name in self.loaded:
                raise RequestError(f"The lora adapter '{name}' has already been loaded.", status=400,
                                   param="lora_name")
            backend = await asyncio.to_thread(self._build, name, path)
            self.loaded[name], self.paths[name] = backend, path
            self.stats["loads"] += 1

    def _build(self, name: str, path: str):
        from peft import PeftModel

        from ..backends.embedded import EmbeddedBackend

        b = self.base
        model = PeftModel.from_pretrained(copy.deepcopy(b.model), path).eval()
        return EmbeddedBackend(model, b.tokenizer, name=name, max_batch=b.max_batch, threads=b.threads)

    async def unload(self, name: str) -> None:
        async with self._lock:
            backend = self.loaded.pop(name, None)
            if backend is None:
                raise RequestError(f"The lora adapter '{name}' cannot be found.", status=404, param="lora_name",
                                   code="not_found")
            self.paths.pop(name, None)
            self.stats["unloads"] += 1
        await backend.aclose()

    async def aclose(self) -> None:
        for name in list(self.loaded):
            await self.loaded.pop(name).aclose()


def add_routes(app, adapters: Adapters, authorise, read_json, json_response, error_response) -> None:
    """Register the adapter routes; the helpers are the router's own (auth, JSON in/out, error bodies)."""
    from aiohttp import web

    def name_of(body, key="lora_name") -> str:
        name = body.get(key) if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError(f"'{key}' must be a non-empty string", param=key)
        return name

    async def load(request):
        denied = authorise(request)
        if denied is not None:
            return denied
        try:
            body = await read_json(request)
            name = name_of(body)
            path = name_of(body, "lora_path")
            await adapters.load(name, path)
        except RequestError as e:
            return error_response(e)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")  # vLLM's reply

    async def unload(request):
        denied = authorise(request)
        if denied is not None:
            return denied
        try:
            name = name_of(await read_json(request))
            await adapters.unload(name)
        except RequestError as e:
            return error_response(e)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def listing(request):
        denied = authorise(request)
        if denied is not None:
            return denied
        return json_response({"adapters": [{"name": n, "path": p} for n, p in adapters.paths.items()],
                              **adapters.stats})

    app.router.add_post("/v1/load_lora_adapter", load)
    app.router.add_post("/v1/unload_lora_adapter", unload)
    app.router.add_get("/v1/lora_adapters", listing)
