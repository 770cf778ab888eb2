"""The embedded backend: a transformers causal LM run in-process with torch (CPU by default, no server).

Why a hand-written loop instead of `model.generate`: the reader sends many short, concurrent requests
(one memory update per question per chunk). `generate` serves one padded batch at a time and cannot
reuse a prompt prefix per question. Here one worker thread owns the model and runs *continuous
batching*: requests from many coroutines queue up, each new one is prefilled on its own (so it can
start from a cached KV prefix), then joins the running decode batch at the next step (left padding,
attention mask, explicit positions). On a CPU a decode step is bound by reading the weights from
memory, so 8 rows cost far less than 8 separate steps; finished rows leave at once and waiting rows
take their place, so a short reply never waits for a long one.

KV prefix reuse: every memory update of one question starts with the same tokens (chat header,
instruction, question). For each `cache_key` we keep the KV of the previous prompt and, on the next
prompt with that key, prefill only what follows the longest common token prefix. Weight changes (an RL
optimiser step) are detected through the parameters' version counters and drop the cache, so results
never depend on it beyond float rounding. It pays most for RL group sampling (G rollouts of one question
share their whole first prompt); for a reader's consecutive chunks only the instruction + question
(~110 tokens of ~950) is shared. Numbers: benchmarks/results/embedded_speed.json.

Log-probs (return_tokens) are those of the distribution actually sampled from: after temperature and
top-p renormalisation; for greedy requests, the plain softmax at temperature 1.

torch/transformers are imported here, never by `memagent` itself.
"""
from __future__ import annotations

import asyncio
import atexit
import math
import os
import queue
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

# Must precede the first `import torch` of the process to take effect. With the default (active
# spinning) OpenMP waits, two torch threads on a 2-core machine shared with other busy processes ran
# a decode step 5-15x slower than one thread (0.95-3.2 s vs 0.14-0.2 s); passive waiting removed that
# collapse (0.18-0.23 s). See benchmarks/results/embedded_speed.json for the idle-machine cost.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers.cache_utils import DynamicCache, DynamicLayer  # noqa: E402

from ..protocol import BackendError, Generation, GenerationRequest, PromptTooLongError

_STOP = object()  # queue sentinel: the worker thread exits
_LIVE: "weakref.WeakSet[EmbeddedBackend]" = weakref.WeakSet()


@atexit.register
def _stop_workers() -> None:
    """A worker still blocked in torch code while the interpreter tears torch down aborts the process
    ("terminate called without an active exception"); stop the threads of backends nobody closed."""
    for backend in list(_LIVE):
        backend._closed = True
        backend._queue.put(_STOP)
        backend._thread.join(timeout=10)


def resolve_device(device: str | None) -> str:
    device = (device or "cpu").lower()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} was asked for but torch sees no CUDA GPU; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise BackendError(f"unknown device {device!r}; use cpu, cuda or auto")
    return device


@dataclass
class _Item:
    """One queued request and where its answer goes (an asyncio future on the caller's loop)."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass
class _Row:
    """A request being decoded: its prompt, what it generated so far, and its sampler."""

    item: _Item
    prompt_ids: list[int]
    max_new: int
    generator: torch.Generator | None
    reused: int = 0  # prompt tokens whose KV came from the prefix cache
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    pad: int = 0  # left padding of this row inside the batched cache


class EmbeddedBackend:
    """Backend running a loaded HF causal LM; see the module docstring for how batching works."""

    def __init__(self, model, tokenizer, *, name: str | None = None, max_batch: int = 8,
                 threads: int | None = None, device: str | None = None, prefix_cache: bool = True,
                 prefix_cache_mb: int = 512, min_reuse_tokens: int = 32, prefill_chunk: int = 2048):
        """Wrap an already loaded model (e.g. the RL policy, or a tiny test model) and its HF tokenizer.

        device=None keeps the model where it is; a device string moves it there. threads=None uses
        every core. prefix_cache_mb bounds the KV kept for reuse (least recently used key goes first).
        """
        if max_batch < 1:
            raise BackendError(f"max_batch must be at least 1, got {max_batch}")
        self.threads = threads or os.cpu_count() or 1
        torch.set_num_threads(self.threads)
        if device is not None:
            model = model.to(resolve_device(device))
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        self.name = name or f"embedded:{getattr(model.config, 'name_or_path', '') or model.config.model_type}"
        self.max_batch, self.prefix_cache = max_batch, prefix_cache
        self.prefix_cache_bytes, self.min_reuse_tokens = prefix_cache_mb << 20, min_reuse_tokens
        self.prefill_chunk = prefill_chunk
        self.context_window = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.eos_ids = self._eos_ids()
        self._prefixes: OrderedDict[str, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = OrderedDict()
        self._weights_version = None
        self._clear_requested = False
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self.stats = {"steps": 0, "rows_stepped": 0, "prefill_tokens": 0, "reused_tokens": 0}
        self._finished: list = []  # (item, Generation) of this worker pass, owned by the worker thread
        self._thread = threading.Thread(target=self._worker, name="memagent-embedded", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    @classmethod
    def load(cls, model: str = "smollm2-135m", threads: int | None = None, max_batch: int = 8,
             device: str = "cpu", prefix_cache: bool = True, adapter: str | None = None, **kw) -> "EmbeddedBackend":
        """Load a registered model name (converted once to an HF folder) or a path to an HF folder.
        adapter: a PEFT LoRA folder merged into the weights at load (a trained stage read before shipping)."""
        from .. import models

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            path = models.hf_dir(model)
        except models.ModelError as e:
            raise BackendError(str(e)) from None
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads or os.cpu_count() or 1)  # loading is faster on all cores too
        try:
            tok = AutoTokenizer.from_pretrained(str(path))
            lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise BackendError(f"cannot load model from {path}: {str(e).splitlines()[0]}") from None
        if adapter is not None:
            from ..gguf_export import merge_adapter_torch

            if not (Path(adapter) / "adapter_config.json").is_file():
                raise BackendError(f"{adapter} is not a PEFT adapter folder (missing adapter_config.json)")
            try:
                lm = merge_adapter_torch(lm, adapter)
            except (OSError, ValueError, RuntimeError, KeyError) as e:
                raise BackendError(f"cannot apply adapter {adapter}: {str(e).splitlines()[0]}") from None
        lm.eval()
        name = f"embedded:{model if model in models.MODELS else path.name}"
        if adapter:
            name += "+" + models.adapter_label(adapter)
        return cls(lm, tok, name=name, max_batch=max_batch, threads=threads, device=device,
                   prefix_cache=prefix_cache, **kw)

    # ---- asyncio side -------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        if self._closed:
            raise BackendError("the embedded backend is closed")
        if request.max_tokens < 1:
            raise BackendError(f"max_tokens must be at least 1, got {request.max_tokens}")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put(_Item(request, loop, fut))
        return await fut

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def clear_prefix_cache(self) -> None:
        """Drop all kept prefixes (the worker also does this by itself when the weights change)."""
        self._clear_requested = True  # the worker owns the dict; it clears it before the next prefill

    # ---- worker thread ------------------------------------------------------------------------

    @staticmethod
    def _deliver(item: _Item, result) -> None:
        def settle():
            if item.future.done():  # the caller gave up (cancelled)
                return
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

        try:
            item.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # that event loop is closed; nobody is waiting any more
            pass

    def _take(self, block: bool, running: int) -> tuple[list[_Item], bool]:
        """Queued items up to max_batch - running; blocks for the first one only when nothing runs.
        max_batch is read on every pass, so changing it on a live backend takes effect at once."""
        items, stop = [], False
        while len(items) < self.max_batch - running:
            try:
                got = self._queue.get(timeout=0.002 if items else None) if block else self._queue.get_nowait()
            except queue.Empty:
                break
            if got is _STOP:
                stop = True
                break
            items.append(got)
            block = True  # after the first, wait a moment for the rest of a gather() to arrive
        return items, stop

    def _worker(self) -> None:
        torch.set_num_threads(self.threads)  # the intra-op pool size is per thread under OpenMP
        batch: list[_Row] = []
        cache = mask = None
        stop = restore_train = False
        while not (stop and not batch):
            new, got_stop = self._take(block=not batch and not stop, running=len(batch))
            stop = stop or got_stop
            if stop and not batch and not new:
                break
            try:
                if self.model.training:  # a trainer's policy: no dropout while we sample from it
                    self.model.eval()
                    restore_train = True
                with torch.inference_mode():
                    if new:
                        batch, cache, mask = self._admit(batch, cache, mask, new)
                    if batch:
                        batch, cache, mask = self._step(batch, cache, mask)
            except Exception as e:  # a failure of the model itself: every row in flight gets the error
                err = e if isinstance(e, BackendError) else BackendError(
                    f"embedded model failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                for row in batch:
                    self._deliver(row.item, err)
                for item in new:
                    if not item.future.done():
                        self._deliver(item, err)
                batch, cache, mask = [], None, None
            if restore_train and not batch:
                self.model.train()
                restore_train = False
            # Results go out only now, after the train mode is back: a trainer that resumes on the last
            # result must never find the worker still about to flip its policy's dropout on.
            for item, gen in self._finished:
                self._deliver(item, gen)
            self._finished.clear()
        for item in self._take(block=False, running=-(1 << 30))[0]:
            self._deliver(item, BackendError("the embedded backend is closed"))

    def _eos_ids(self) -> set[int]:
        ids = set()
        for src in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if eos is not None:
                ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
        if not ids:
            raise BackendError("the model has no end-of-sequence token; cannot tell when a reply ends")
        return ids

    _specials = None  # the tokenizer's control-token search, built on first use

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        """Message content is text, never turn structure: a client's or a document's `<|im_end|>` is
        defused before the chat template runs (memagent/specials.py), so `serve` is safe from any client."""
        from ..specials import chat_ids, pattern, special_strings

        if self._specials is None:
            self._specials = pattern(special_strings(self.tokenizer))
        return chat_ids(self.tokenizer, messages, self._specials)

    def _check_weights(self) -> None:
        """An in-place optimiser step bumps each parameter's version: then the kept KV is stale."""
        version = sum(p._version for p in self.model.parameters())
        if version != self._weights_version or self._clear_requested:
            self._clear_requested = False
            self._prefixes.clear()
            self._weights_version = version

    def _lookup(self, key: str | None, ids: list[int]):
        """(tokens reused, per-layer KV of those tokens) from the previous prompt with this key."""
        if not (self.prefix_cache and key and key in self._prefixes):
            return 0, None
        old_ids, kv = self._prefixes[key]
        self._prefixes.move_to_end(key)
        n = min(len(old_ids), len(ids) - 1)  # at least one token must be fed to get the next logits
        common = 0
        while common < n and old_ids[common] == ids[common]:
            common += 1
        if common < self.min_reuse_tokens:
            return 0, None
        return common, [(k[:, :, :common], v[:, :, :common]) for k, v in kv]

    def _remember(self, key: str | None, ids: list[int], kv) -> None:
        if not (self.prefix_cache and key):
            return
        self._prefixes[key] = (ids, kv)
        self._prefixes.move_to_end(key)

        def size(entry):
            return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in entry[1])

        while len(self._prefixes) > 1 and sum(size(e) for e in self._prefixes.values()) > self.prefix_cache_bytes:
            self._prefixes.popitem(last=False)

    def _prefill(self, item: _Item):
        """Run one prompt through the model; returns the row, its per-layer KV and last logits."""
        req = item.request
        try:
            ids = self._prompt_ids(req.messages)
        except Exception as e:
            raise BackendError(f"cannot apply the chat template: {e}") from None
        if len(ids) >= self.context_window:
            raise PromptTooLongError(f"prompt is {len(ids)} tokens but the model's context window is "
                               f"{self.context_window}; use smaller chunks or a smaller memory")
        reused, kv = self._lookup(req.cache_key, ids)
        n_layers = self.model.config.get_text_config(decoder=True).num_hidden_layers
        cache = _make_cache([_KVLayer(*(kv[i] if kv else (None, None)), capacity=len(ids)) for i in range(n_layers)])
        logits = None
        for start in range(reused, len(ids), self.prefill_chunk):
            piece = torch.tensor([ids[start:start + self.prefill_chunk]], device=self.device)
            out = self.model(input_ids=piece, cache=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[0, -1].float()
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        self._remember(req.cache_key, ids, layers)
        self.stats["prefill_tokens"] += len(ids) - reused
        self.stats["reused_tokens"] += reused
        gen = None
        if req.temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(req.seed if req.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        max_new = min(req.max_tokens, self.context_window - len(ids))
        return _Row(item, ids, max_new, gen, reused=reused), layers, logits

    def _admit(self, batch, cache, mask, items):
        """Prefill new requests one by one and merge them into the running batch (left padded)."""
        self._check_weights()
        rows, kvs = [], []
        for item in items:
            if item.future.done():
                continue
            try:
                row, kv, logits = self._prefill(item)
            except BackendError as e:
                self._deliver(item, e)
                continue
            self._sample(row, logits)
            if row.finish:  # a one-token reply (or EOS at once) never enters the decode batch
                self._finish(row)
                continue
            rows.append(row)
            kvs.append(kv)
        if not rows:
            return batch, cache, mask
        old_len = mask.shape[1] if batch else 0
        width = max([old_len] + [len(r.prompt_ids) for r in rows])
        for r in batch:
            r.pad += width - old_len
        for r in rows:
            r.pad = width - len(r.prompt_ids)
        everyone = batch + rows
        capacity = width + max(r.max_new - len(r.out_ids) for r in everyone) + 1
        layers = []
        for li in range(len(kvs[0])):
            parts = ([(cache.layers[li].keys, cache.layers[li].values)] if batch else []) + [kv[li] for kv in kvs]
            k0 = parts[0][0]
            n_rows = sum(k.shape[0] for k, _ in parts)
            keys = k0.new_zeros(n_rows, k0.shape[1], capacity, k0.shape[3])  # zeros: padding is masked anyway
            values = keys.clone()
            at = 0
            for k, v in parts:
                keys[at:at + k.shape[0], :, width - k.shape[2]:width] = k
                values[at:at + k.shape[0], :, width - k.shape[2]:width] = v
                at += k.shape[0]
            layers.append(_KVLayer.from_buffers(keys, values, width))
        new_mask = torch.zeros(len(everyone), width, dtype=torch.long, device=self.device)
        for i, r in enumerate(everyone):
            new_mask[i, r.pad:] = 1
        return everyone, _make_cache(layers), new_mask

    def _step(self, batch, cache, mask):
        """One decode step for every row: feed each row's last token, sample the next one."""
        last = torch.tensor([[r.out_ids[-1]] for r in batch], device=self.device)
        pos = torch.tensor([[len(r.prompt_ids) + len(r.out_ids) - 1] for r in batch], device=self.device)
        mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype, device=self.device)], dim=1)
        out = self.model(input_ids=last, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        logits = out.logits[:, -1].float()
        greedy = logits.argmax(-1).tolist()  # one device sync for the whole batch
        self.stats["steps"] += 1
        self.stats["rows_stepped"] += len(batch)
        keep = []
        for i, row in enumerate(batch):
            if row.item.future.done():  # cancelled by the caller: stop spending compute on it
                continue
            self._sample(row, logits[i], greedy[i])
            if row.finish:
                self._finish(row)
            else:
                keep.append(i)
        if len(keep) == len(batch):
            return batch, cache, mask
        if not keep:
            return [], None, None
        batch = [batch[i] for i in keep]
        idx = torch.tensor(keep, device=self.device)
        trim = min(r.pad for r in batch)  # columns that are padding for every remaining row
        capacity = mask.shape[1] - trim + max(r.max_new - len(r.out_ids) for r in batch) + 1
        cache = _make_cache([_KVLayer(layer.keys[idx, :, trim:], layer.values[idx, :, trim:], capacity)
                             for layer in cache.layers])
        for r in batch:
            r.pad -= trim
        return batch, cache, mask[idx, trim:]

    def _sample(self, row: _Row, logits: torch.Tensor, greedy: int | None = None) -> None:
        """Pick the next token. Log-probs are taken from the distribution actually sampled from:
        after temperature and top-p renormalisation; for greedy, the plain softmax (temperature 1)."""
        req = row.item.request
        if req.temperature <= 0:
            tok = greedy if greedy is not None else int(torch.argmax(logits))
            lp = float(torch.log_softmax(logits, -1)[tok]) if req.return_tokens else 0.0
        else:
            probs = torch.softmax(logits / req.temperature, -1)
            if req.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                cum = torch.cumsum(sorted_p, -1)
                cut = int(torch.searchsorted(cum, torch.tensor([req.top_p], device=cum.device))[0]) + 1
                keep = order[:cut]
                probs = torch.zeros_like(probs).scatter_(0, keep, probs[keep])
                probs = probs / probs.sum()
            tok = int(torch.multinomial(probs, 1, generator=row.generator)[0])
            lp = math.log(max(float(probs[tok]), 1e-45))
        row.out_ids.append(tok)
        row.logprobs.append(lp)
        if tok in self.eos_ids:
            row.finish = "stop"
        elif len(row.out_ids) >= row.max_new:
            row.finish = "length"

    def _finish(self, row: _Row) -> None:
        req = row.item.request
        body = row.out_ids[:-1] if row.finish == "stop" else row.out_ids
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        gen = Generation(text=text, finish_reason=row.finish, prompt_tokens=len(row.prompt_ids),
                         completion_tokens=len(row.out_ids), extra={"reused_prompt_tokens": row.reused})
        if req.return_tokens:
            gen.prompt_ids, gen.response_ids, gen.logprobs = list(row.prompt_ids), list(row.out_ids), list(row.logprobs)
        self._finished.append((row.item, gen))  # delivered at the end of the worker's pass (see _worker)


def _make_cache(layers) -> DynamicCache:
    cache = DynamicCache()
    cache.layers, cache.layer_class_to_replicate = layers, None
    return cache


class _KVLayer(DynamicLayer):
    """One layer's KV in a preallocated buffer. transformers' DynamicLayer concatenates the whole
    cache on every decode step; that copy was 24% of a step at 800 tokens (torch profiler). Here a
    step writes one column in place; `keys`/`values` are views of the filled part."""

    def __init__(self, keys=None, values=None, capacity: int = 0):
        super().__init__()
        self.capacity = capacity
        if keys is not None:
            self._alloc(keys, values, capacity)

    @classmethod
    def from_buffers(cls, k_buf, v_buf, filled: int):
        layer = cls()
        layer._k, layer._v, layer._n, layer.capacity = k_buf, v_buf, filled, k_buf.shape[2]
        layer.is_initialized, layer.device = True, k_buf.device
        layer.keys, layer.values = k_buf[:, :, :filled], v_buf[:, :, :filled]
        return layer

    def lazy_initialization(self, key_states, value_states) -> None:
        self._alloc(key_states[:, :, :0], value_states[:, :, :0], self.capacity)

    def _alloc(self, keys, values, capacity: int) -> None:
        b, h, n, d = keys.shape
        self._k = keys.new_empty(b, h, max(capacity, n), d)
        self._v = values.new_empty(b, h, max(capacity, n), values.shape[3])
        self._k[:, :, :n] = keys
        self._v[:, :, :n] = values
        self._n, self.capacity, self.is_initialized, self.device = n, self._k.shape[2], True, keys.device
        self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._n + key_states.shape[2]
        if end > self._k.shape[2]:  # past the reserve (should not happen): grow geometrically
            self._alloc(self.keys, self.values, max(end, 2 * self._k.shape[2]))
        self._k[:, :, self._n:end] = key_states
        self._v[:, :, self._n:end] = value_states
        self._n = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the embedded backend never crops its decode cache")
