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
* Several servers: `backend_url = "http://a:8000,http://b:8000"` makes a pool (backends/pool.py) of
  TokenServerBackends; every adapter is loaded on every replica that answers, rollouts go to the least
  busy one, a replica that dies mid-rollout has its calls re-sent to another, and a dead replica is left
  out until a later sync reaches it again (then it gets the current adapter before any rollout).
Tested without a GPU: against a fake transport (tests/test_rl_remote.py), and end to end against two real
`memagent serve --backend embedded` processes, which answer the same fields and LoRA calls as vLLM
(memagent/server/lora.py; tests/test_remote_rollouts.py). The vLLM launch line is in docs/scaling.md.
"""
from __future__ import annotations

import json
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
                text = await r.text()
                if r.status >= 400:
                    raise BackendError(f"{path}: HTTP {r.status}: {text[:200]}")
                try:
                    return json.loads(text)
                except ValueError:  # vLLM answers the LoRA calls with plain text ("Success: ...")
                    return {"text": text}

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
    """Save the adapter, load it on every server (one `post` per replica), unload the previous one.

    With several replicas, one that cannot be reached is marked down in `pool` (no rollouts go to it)
    and tried again at the next push; it is marked up once it has the new adapter. A single server's
    failure is raised, as is every replica failing."""

    def __init__(self, post: Post | list[Post], folder: str | Path, prefix: str = "policy", pool=None):
        self.posts = list(post) if isinstance(post, (list, tuple)) else [post]
        self.folder, self.prefix, self.pool = Path(folder), prefix, pool
        self.loaded: list[str | None] = [None] * len(self.posts)
        self.current: str | None = None

    async def push(self, model, step: int) -> str:
        name = f"{self.prefix}-{step}"
        path = self.folder / name
        model.save_pretrained(str(path))  # a peft model writes only the adapter
        errors = []
        for i, post in enumerate(self.posts):
            try:
                await post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            except Exception as e:
                if len(self.posts) == 1:
                    raise
                if "already been loaded" not in str(e):  # another rank of this run loaded it: fine
                    errors.append(f"replica {i}: {e}")
                    if self.pool is not None:
                        self.pool.set_healthy(i, False)
                    continue
            old, self.loaded[i] = self.loaded[i], name
            if old and old != name:
                try:
                    await post("/v1/unload_lora_adapter", {"lora_name": old})
                except Exception:  # a restarted replica no longer has it
                    if len(self.posts) == 1:
                        raise
            if self.pool is not None:
                self.pool.set_healthy(i, True)
        if len(errors) == len(self.posts):
            raise BackendError("no rollout server took the new adapter: " + "; ".join(errors))
        self.current = name
        return name


def make_remote_backend(config, model, folder: str | Path | None = None):
    """(backend, weight sync) for `backend = "openai"`; several comma-separated URLs make a pool."""
    from ..backends.pool import PoolBackend, split_urls

    urls = split_urls(config.backend_url)
    if not urls:
        raise BackendError("backend = 'openai' needs backend_url (the vLLM server, e.g. http://127.0.0.1:8000)")
    if not config.use_peft:
        raise BackendError("server rollouts currently sync weights as a LoRA adapter: set use_peft = true")
    if getattr(config, "fsdp", False):
        raise BackendError("fsdp = true with backend = 'openai' is not supported yet (the adapter would be saved "
                           "from sharded weights); use fsdp = false for server rollouts")
    folder = Path(folder or Path(config.output_dir) / "adapters")
    posts = [aiohttp_post(u) for u in urls]
    backends = [TokenServerBackend(p, model=config.model, name=f"vllm@{u}") for p, u in zip(posts, urls)]
    if len(urls) == 1:
        return backends[0], LoraReloadSync(posts[0], folder)

    async def revived_only_by_a_sync(replica) -> bool:
        return False  # a replica back from the dead lacks the current adapter until the next push

    pool = PoolBackend(backends, urls, probe=revived_only_by_a_sync, probe_interval=3600.0, wait_healthy=30.0,
                       name=f"vllm-pool[{len(urls)}]")
    return pool, LoraReloadSync(posts, folder, pool=pool)
