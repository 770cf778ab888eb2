"""Scale-out rollouts: generate through an OpenAI-compatible server (vLLM) and sync weights to it.

Design (what runs where):
* The trainer process(es) own the weights and the optimizer (torchrun ranks, as in engine.py).
* One or more vLLM servers do the sampling. Each rollout call is a chat completion that must also return
  the exact token ids and sampling log-probs; vLLM does this with `"return_token_ids": true` (prompt and
  completion ids) and `"logprobs": true` (log-prob of each sampled token). `TokenServerBackend` below
  is that client; it implements memagent.protocol.Backend, so `rollout()` is unchanged.
* After every optimizer step the new weights reach the servers through a `WeightSync`:
  - `LoraReloadSync` (implemented): save the LoRA adapter to a folder both sides can read and POST
    `/v1/load_lora_adapter {lora_name, lora_path}` (vLLM started with `--enable-lora` and
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); later requests name the new adapter as their model, and the
    previous one is unloaded. Cheap: a 0.5B model's rank-16 adapter is a few MB.
  - full weights (not implemented here, needs a GPU to test): the same shape with vLLM's weight-update
    paths (NCCL broadcast into the engine as TRL's vLLM client does, or save safetensors + a reload
    RPC). Plug it in as another `WeightSync`.
* Off-policy lag: rollouts of step k use weights of step k-1 at most (sync before each rollout), and the
  loss uses the server's sampling log-probs as old log-probs only when num_iterations*num_mini_batches
  > 1; otherwise the trainer recomputes them (on-policy ratio 1), so a numerics gap between server and
  trainer cannot bias the update. `logprob_mismatch` in metrics.jsonl watches that gap.
What is tested here without a GPU: the request body, the parsing of ids/log-probs/finish reasons, and the
adapter-sync calls, against a fake transport (tests/test_rl_remote.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable, Protocol

from ..protocol import BackendError, Generation, GenerationRequest

Post = Callable[[str, dict], Awaitable[dict]]


def aiohttp_post(base_url: str, api_key: str = "EMPTY", timeout: float = 600.0) -> Post:
    async def post(path: str, body: dict) -> dict:
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.post(base_url.rstrip("/") + path, json=body,
                              headers={"Authorization": f"Bearer {api_key}"}) as r:
                if r.status >= 400:
                    raise BackendError(f"{path}: HTTP {r.status}: {(await r.text())[:200]}")
                return await r.json(content_type=None)

    return post


class TokenServerBackend:
    """A Backend over a vLLM-style server that returns prompt/completion token ids and log-probs."""

    def __init__(self, post: Post, model: str, name: str = "vllm"):
        self.post, self.model, self.name = post, model, name

    def body(self, request: GenerationRequest) -> dict:
        body = {"model": self.model, "messages": request.messages, "max_tokens": request.max_tokens,
                "temperature": request.temperature, "top_p": request.top_p}
        if request.seed is not None:
            body["seed"] = request.seed
        if request.return_tokens:
            body.update({"logprobs": True, "return_token_ids": True})
        return body

    async def generate(self, request: GenerationRequest) -> Generation:
        data = await self.post("/v1/chat/completions", self.body(request))
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            gen = Generation(text=text, finish_reason=finish)
            if request.return_tokens:
                gen.prompt_ids = list(data["prompt_token_ids"])
                gen.response_ids = list(choice["token_ids"])
                gen.logprobs = [float(t["logprob"]) for t in choice["logprobs"]["content"]]
                if len(gen.logprobs) != len(gen.response_ids):
                    raise BackendError("server returned a log-prob count that differs from its token count")
            gen.prompt_tokens = len(gen.prompt_ids or []) or int(data.get("usage", {}).get("prompt_tokens", 0))
            gen.completion_tokens = len(gen.response_ids or []) or int(data.get("usage", {}).get("completion_tokens", 0))
            return gen
        except (KeyError, IndexError, TypeError) as e:
            raise BackendError(f"the server's reply lacks token ids or log-probs ({e}); training needs a "
                               "server with return_token_ids and logprobs (vLLM >= 0.10.2)") from None

    async def aclose(self) -> None:
        return None


class WeightSync(Protocol):
    async def push(self, model, step: int) -> str:
        """Make the server sample from `model`'s current weights; returns the model name to request."""
        ...


class LoraReloadSync:
    def __init__(self, post: Post, folder: str | Path, prefix: str = "policy"):
        self.post, self.folder, self.prefix = post, Path(folder), prefix
        self.current: str | None = None

    async def push(self, model, step: int) -> str:
        name = f"{self.prefix}-{step}"
        path = self.folder / name
        model.save_pretrained(str(path))  # a peft model writes only the adapter
        await self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if self.current:
            await self.post("/v1/unload_lora_adapter", {"lora_name": self.current})
        self.current = name
        return name


def make_remote_backend(config, model):
    if not config.backend_url:
        raise BackendError("backend = 'openai' needs backend_url (the vLLM server, e.g. http://127.0.0.1:8000)")
    if not config.use_peft:
        raise BackendError("server rollouts currently sync weights as a LoRA adapter: set use_peft = true")
    return TokenServerBackend(aiohttp_post(config.backend_url), model=config.model)
