"""The llama.cpp engine: the same GGUF files, run as they are (Q4 weights, integer kernels) in-process
through the prebuilt `xllamacpp` wheel (no compiler, no server process).

Why: on a CPU, decoding is bound by reading the weights. The torch engine dequantises the GGUF to fp32
(~540 MB read per token for SmolLM2-135M); llama.cpp reads the ~100 MB of Q4 blocks. Torch stays the
training runtime and the engine for exact log-probs; this one is for reading documents fast.

How it maps onto memagent's Backend protocol:
- Prompts are built here, token-exact, with the model's own chat template and tokenizer (the same ids
  the torch engine feeds), then sent as token ids (`Server.handle_completions`). Both engines therefore
  see the same prompt; differences in answers come from the arithmetic alone (Q4 x Q8 dot products and
  an f16 KV cache here; fp32 on the dequantised weights in torch).
- Concurrency: each request runs on its own thread inside llama.cpp's server loop, which keeps
  `n_parallel` slots and decodes all busy slots in one batch (continuous batching). The calls release
  the GIL, so the asyncio loop stays free.
- Prefix reuse: llama.cpp keeps each slot's KV and picks, for a new prompt, the slot with the longest
  common token prefix (the instruction + question shared by the chunks of one question); prompts
  pushed out of a slot are kept in a host-RAM prompt cache (`prefix_cache_mb`). `cache_key` is not
  needed for that; `extra["reused_prompt_tokens"]` reports what was reused.
- Cancellation / Ctrl-C: replies are streamed token by token into a callback that returns "stop" once
  the caller has gone, so an abandoned request stops at its next token.
- xllamacpp's server also listens on HTTP while it lives; it is bound to 127.0.0.1 on a free port
  (nothing else is reachable) and never used. Its logging is switched off (verbosity -1).
"""
from __future__ import annotations

import asyncio
import atexit
import json
import math
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol import BackendError, Generation, GenerationRequest, PromptTooLongError

XLLAMACPP_VERSION = "2026.10.11549"
_LIVE: "weakref.WeakSet[LlamaCppBackend]" = weakref.WeakSet()


@atexit.register
def _stop_servers() -> None:
    """Stop in-flight requests and the server loops before the interpreter tears down."""
    for backend in list(_LIVE):
        backend._shutdown()


def _import_xllamacpp():
    try:
        import xllamacpp
    except ImportError:
        raise BackendError(f"--engine llama.cpp needs the xllamacpp package; run: pip install "
                           f"xllamacpp=={XLLAMACPP_VERSION} (scripts/setup.sh installs it)") from None
    return xllamacpp


class ChatTemplate:
    """The model's chat template rendered the way transformers' `apply_chat_template` renders it
    (jinja2 sandbox, trim_blocks + lstrip_blocks, text encoded without added special tokens), so the
    ids equal the torch engine's without importing transformers (and torch) here.
    tests/test_llamacpp.py checks the equality against transformers."""

    def __init__(self, tokenizer_dir: Path):
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        tokenizer_dir = Path(tokenizer_dir)
        cfg_path = tokenizer_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        source = cfg.get("chat_template")
        if (tokenizer_dir / "chat_template.jinja").is_file():
            source = (tokenizer_dir / "chat_template.jinja").read_text()
        if not source:
            raise BackendError(f"no chat template in {tokenizer_dir}; the llama.cpp engine needs an instruct model")

        def raise_exception(message):
            raise BackendError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(source)
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.special = {k: (v if isinstance(v, str) else (v or {}).get("content", ""))
                        for k, v in cfg.items() if k.endswith("_token") and v}
        self._search = None

    def render(self, messages: list[dict]) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True, **self.special)

    def ids(self, messages: list[dict]) -> list[int]:
        """Message content is text, never turn structure: control-token text in it is defused first,
        exactly as the torch engine does (memagent/specials.py)."""
        from ..specials import defuse_messages, pattern, special_strings

        if self._search is None:
            self._search = pattern(special_strings(self.tokenizer))
        return self.tokenizer.encode(self.render(defuse_messages(messages, self._search)), add_special_tokens=False).ids


@dataclass(eq=False)
class _Call:
    """One request's streamed reply, filled by llama.cpp's callback on a worker thread."""

    cancelled: bool = False
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    error: str | None = None

    def on_chunk(self, chunk) -> bool:
        """Returns True to make llama.cpp stop this request (cancelled, or an error arrived)."""
        if not isinstance(chunk, dict):
            return self.cancelled
        if "error" in chunk or ("code" in chunk and "message" in chunk):
            err = chunk.get("error", chunk)
            self.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return True
        for choice in chunk.get("choices") or []:
            self.text.append(choice.get("text") or "")
            for tok in ((choice.get("logprobs") or {}).get("content") or []):
                self.ids.append(int(tok["id"]))
                lp = tok.get("logprob")
                if lp is None:  # post-sampling probabilities come as "prob"
                    lp = math.log(max(float(tok.get("prob", 0.0)), 1e-45))
                self.logprobs.append(float(lp))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("timings"):
            self.timings = chunk["timings"]
        return self.cancelled


def gguf_context_length(path: Path) -> int | None:
    """The model's trained context length from the GGUF header (`<arch>.context_length`)."""
    from ..gguf_export import read_gguf_kv

    try:
        kv = read_gguf_kv(path)
        return int(kv[f"{kv['general.architecture']}.context_length"])
    except Exception:
        return None


class LlamaCppBackend:
    """Backend on llama.cpp (xllamacpp); see the module docstring."""

    def __init__(self, gguf: str | Path, tokenizer_dir: str | Path, *, name: str | None = None,
                 max_batch: int = 8, threads: int | None = None, ctx_tokens: int | None = None,
                 context_window: int | None = None, prefix_cache: bool = True, prefix_cache_mb: int = 512,
                 lora: list[tuple[str, float]] | None = None, flash_attn: bool | None = None):
        """gguf: the model file; tokenizer_dir: its tokenizer.json + chat template (HF layout).

        max_batch: parallel slots (requests decoded together). ctx_tokens: the KV cache, in tokens,
        shared by all slots (default max(8192, 2048 * max_batch), capped so one request can use the
        model's whole window). lora: [(adapter.gguf, scale)] applied to every request.
        """
        if max_batch < 1:
            raise BackendError(f"max_batch must be at least 1, got {max_batch}")
        xl = _import_xllamacpp()
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise BackendError(f"no GGUF file at {self.gguf}")
        self.chat = ChatTemplate(Path(tokenizer_dir))
        self.tokenizer = self.chat.tokenizer  # a `tokenizers.Tokenizer` (serve decodes token strings with it)
        self.name = name or f"llama.cpp:{self.gguf.stem}"
        self.max_batch, self.prefix_cache = max_batch, prefix_cache
        self.threads = threads or os.cpu_count() or 1
        trained = gguf_context_length(self.gguf) or 4096
        self.context_window = min(context_window or trained, trained)
        total = ctx_tokens or max(8192, 2048 * max_batch)
        total = max(total, self.context_window)  # one request may always use the whole window
        p = xl.CommonParams()
        p.model.path = str(self.gguf)
        p.n_ctx, p.n_parallel, p.kv_unified = total, max_batch, True
        p.n_batch, p.n_ubatch = 2048, 512
        p.cpuparams.n_threads = self.threads
        p.cpuparams_batch.n_threads = self.threads
        # Threads sleep instead of spinning between ops (llama.cpp's default polls at level 50). On 2
        # cores shared with other jobs, spinning threads wait on a preempted peer: decode ran at 16-23
        # tok/s polling vs 32-35 tok/s without (SmolLM2, load average ~9; the same reason the torch
        # engine sets OMP_WAIT_POLICY=PASSIVE).
        p.cpuparams.poll = p.cpuparams_batch.poll = 0
        p.verbosity, p.warmup = -1, False
        p.cache_prompt = prefix_cache
        p.cache_ram_mib = prefix_cache_mb if prefix_cache else 0
        p.hostnames, p.port = ["127.0.0.1"], 0  # the embedded HTTP listener: loopback, a free port
        p.endpoint_metrics, p.endpoint_slots, p.endpoint_props = False, False, False
        p.n_predict = -1
        if flash_attn is not None:
            p.flash_attn_type = xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn \
                else xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.lora = [(str(path), float(scale)) for path, scale in (lora or [])]
        for path, _ in self.lora:
            if not Path(path).is_file():
                raise BackendError(f"no LoRA adapter GGUF at {path}")
        if self.lora:
            p.lora_adapters = [xl.CommonAdapterLoraInfo(path, scale) for path, scale in self.lora]
        try:
            self._server = xl.Server(p)
        except Exception as e:  # a broken file, or too little memory for the model + KV cache
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise BackendError(f"llama.cpp could not load {self.gguf.name}: {why}") from None
        self._wait_listening()
        self._pool = ThreadPoolExecutor(max_workers=max(4, 4 * max_batch), thread_name_prefix="memagent-llamacpp")
        self._calls: set[_Call] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.stats = {"requests": 0, "prefill_tokens": 0, "reused_tokens": 0, "completion_tokens": 0}
        _LIVE.add(self)

    def _wait_listening(self, timeout: float = 30.0) -> None:
        """Return once the embedded HTTP listener answers (one loopback GET /health). Destroying the
        server before its accept loop has started loses the stop signal and hangs the process at exit
        (seen once on a loaded machine: the listener thread blocked in accept, the destructor joining it)."""
        import time
        import urllib.error
        import urllib.request

        address = getattr(self._server, "listening_address", "") or ""
        if not address.startswith("http://"):
            return
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with opener.open(address.rstrip("/") + "/health", timeout=2) as r:
                    r.read()
                return
            except urllib.error.HTTPError:  # it answered (503 while loading): the loop runs
                return
            except OSError:
                time.sleep(0.02)

    @classmethod
    def load(cls, model: str = "smollm2-135m", threads: int | None = None, max_batch: int = 8,
             adapter: str | Path | None = None, adapter_scale: float = 1.0, merge_lora: bool = False,
             **kw) -> "LlamaCppBackend":
        """A registered model name or a path to a .gguf file. adapter: a PEFT adapter folder (exported
        to GGUF once, cached) or a LoRA .gguf; a registered model's own adapter is applied by default.
        merge_lora: run a copy of the base with the adapter folded into Q8_0 weights (built once, cached;
        memagent/gguf_merge.py) instead of applying it per token: faster prompts, nearly the same replies."""
        from .. import gguf_export, models

        device = kw.pop("device", None)
        if device not in (None, "cpu", "auto"):
            raise BackendError(f"the llama.cpp engine (xllamacpp CPU wheel) runs on the CPU only, not {device!r}; "
                               f"use --engine torch for a GPU")
        try:
            gguf, tok_dir, window, label = _resolve(model)
            lora = list(kw.pop("lora", None) or [])
            for path in gguf_export.adapters_for(model, adapter):
                lora.append((str(path), adapter_scale))
            if merge_lora and lora:
                if len(lora) > 1:
                    raise models.ModelError("merge_lora folds one adapter; this model would get "
                                            f"{len(lora)}")
                from ..gguf_merge import cached_merged_gguf

                gguf, lora = cached_merged_gguf(gguf, lora[0][0], lora[0][1]), []
                label += "+merged"
        except models.ModelError as e:
            raise BackendError(str(e)) from None
        kw.setdefault("context_window", window)
        return cls(gguf, tok_dir, name=f"llama.cpp:{label}", max_batch=max_batch, threads=threads, lora=lora, **kw)

    # ---- asyncio side -------------------------------------------------------------------------

    def _payload(self, req: GenerationRequest, ids: list[int]) -> dict:
        body = {
            "prompt": ids, "stream": True, "max_tokens": min(req.max_tokens, self.context_window - len(ids)),
            "temperature": max(0.0, float(req.temperature)), "top_p": float(req.top_p), "top_k": 0,
            "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
            "cache_prompt": self.prefix_cache,
        }
        if req.seed is not None:
            body["seed"] = int(req.seed) & 0x7FFFFFFF
        if req.return_tokens:  # ids of the reply come with the per-token log-probs
            body["n_probs"] = 1
            body["logprobs"] = 1
            body["post_sampling_probs"] = req.temperature > 0
        return body

    def _run(self, body: dict, call: _Call) -> None:
        with self._lock:
            if self._closed:
                call.error = "the llama.cpp backend is closed"
                return
            self._calls.add(call)
        try:
            self._server.handle_completions(body, call.on_chunk)
        except Exception as e:
            call.error = f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                self._calls.discard(call)

    async def generate(self, request: GenerationRequest) -> Generation:
        if self._closed:
            raise BackendError("the llama.cpp backend is closed")
        if request.max_tokens < 1:
            raise BackendError(f"max_tokens must be at least 1, got {request.max_tokens}")
        try:
            ids = self.chat.ids(request.messages)
        except BackendError:
            raise
        except Exception as e:
            raise BackendError(f"cannot apply the chat template: {e}") from None
        if len(ids) >= self.context_window:
            raise PromptTooLongError(f"prompt is {len(ids)} tokens but the model's context window is "
                               f"{self.context_window}; use smaller chunks or a smaller memory")
        call = _Call()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self._run, self._payload(request, ids), call)
        except asyncio.CancelledError:
            call.cancelled = True  # the callback tells llama.cpp to stop at the next token
            raise
        except RuntimeError as e:  # the pool was shut down under us
            raise BackendError(f"the llama.cpp backend is closed ({e})") from None
        if call.error:
            raise BackendError(f"llama.cpp: {call.error}")
        n_out = int(call.usage.get("completion_tokens", len(call.ids)))
        details = call.usage.get("prompt_tokens_details") or {}
        cached = int(call.timings.get("cache_n", details.get("cached_tokens", 0)))
        self.stats["requests"] += 1
        self.stats["prefill_tokens"] += len(ids) - cached
        self.stats["reused_tokens"] += cached
        self.stats["completion_tokens"] += n_out
        finish = "length" if call.finish == "length" else "stop"
        gen = Generation(text="".join(call.text), finish_reason=finish, prompt_tokens=len(ids),
                         completion_tokens=n_out, extra={"reused_prompt_tokens": cached,
                                                         "prompt_ms": call.timings.get("prompt_ms"),
                                                         "decode_ms": call.timings.get("predicted_ms")})
        if request.return_tokens:
            gen.prompt_ids, gen.response_ids, gen.logprobs = ids, list(call.ids), list(call.logprobs)
        return gen

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for call in self._calls:
                call.cancelled = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._server = None  # the destructor stops llama.cpp's loop and frees the model

    async def aclose(self) -> None:
        if self._closed:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)


def _resolve(model: str) -> tuple[Path, Path, int | None, str]:
    """(gguf file, tokenizer folder, context window or None, label) for a registered name or a .gguf."""
    from .. import models

    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise models.ModelError(f"no GGUF file at {p}")
        return p, models.tokenizer_path(str(p)).parent, None, p.stem
    if p.is_dir():
        raise models.ModelError(f"{model} is a folder; the llama.cpp engine runs a .gguf file or a registered "
                                f"model ({', '.join(models.MODELS)}); use --engine torch for HF folders")
    spec = models.get_spec(model)
    gguf = models.gguf_path(model)
    hf = models.cache_root() / (getattr(spec, "base", None) or model) / "hf"  # an adapter model: its base's
    tok_dir = hf if (hf / "DONE").is_file() else models.tokenizer_path(str(gguf)).parent
    return gguf, tok_dir, spec.context_window, model


__all__ = ["LlamaCppBackend", "ChatTemplate", "XLLAMACPP_VERSION"]
