"""Backends: one file each behind memagent.protocol.Backend. Imported lazily: torch and HTTP stay out
of `import memagent` and load only for the backend actually used."""
from __future__ import annotations

import os
import sys

from ..tokenizer import HFTokenizer, Tokenizer, TokenizerError, load_tokenizer

KINDS = ("embedded", "openai", "instant", "scripted")
ENGINES = ("torch", "llama.cpp")  # runtimes of the embedded backend (docs/engines.md)


def make_backend(kind: str, model: str | None = None, base_url: str | list[str] | None = None,
                 api_key: str | None = None, base_url_file: str | None = None, **kw):
    if kind == "embedded":
        from ..models import DEFAULT_MODEL, MODELS, ModelError, default_engine

        engine = kw.pop("engine", None) or default_engine(model)
        spec = MODELS.get(model or DEFAULT_MODEL)
        if kw.get("adapter") and spec is not None and spec.adapter:
            # both engines would stack the two adapters (torch merges onto already-merged weights)
            raise ModelError(f"{spec.name} already carries its own adapter; give --adapter with its base, "
                             f"--model {spec.base}")
        if engine in ("llama.cpp", "llamacpp"):
            from .llamacpp import LlamaCppBackend

            return LlamaCppBackend.load(model or DEFAULT_MODEL, **kw)
        if engine != "torch":
            raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        from .embedded import EmbeddedBackend

        return EmbeddedBackend.load(model or DEFAULT_MODEL, **kw)
    if kind == "openai":
        from .openai_http import OpenAIBackend
        from .pool import PoolBackend, read_url_file, split_urls

        # several URLs (--base-url repeated or comma separated, or --base-url-file): a pool of replicas
        urls = split_urls(base_url) + (read_url_file(base_url_file) if base_url_file else [])
        if not urls:
            raise ValueError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        if len(urls) > 1:
            return PoolBackend.from_urls(urls, model=model, api_key=api_key, **kw)
        return OpenAIBackend(urls[0], model=model, api_key=api_key, **kw)
    if kind == "instant":
        from .instant import InstantBackend

        return InstantBackend(**kw)
    if kind == "scripted":
        from .scripted import ScriptedBackend

        return ScriptedBackend(**kw)
    raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(KINDS)}")


def resolve_tokenizer(kind: str, model: str | None, spec: str | None, warn=print) -> Tokenizer:
    """The tokenizer chunk sizes are counted in.

    embedded: the model's own. openai: `spec` (tokenizer.json, HF folder, .gguf, or 'cl100k_base');
    a registered embedded model name also works. Without either, chunks are counted in cl100k_base
    tokens and a warning says that sizes only approximate the served model's tokens.
    """
    from .. import models

    if spec:
        if spec.endswith(".gguf") or (spec in models.MODELS):
            return fast(HFTokenizer.from_file(models.tokenizer_path(spec)))
        return fast(load_tokenizer(spec))
    if kind == "embedded" or (model in models.MODELS):
        return fast(HFTokenizer.from_file(models.tokenizer_path(model or models.DEFAULT_MODEL)))
    if kind in ("instant", "scripted"):
        return load_tokenizer("cl100k_base")
    warn("memagent: no --tokenizer given; counting chunk sizes in cl100k_base tokens, which only "
         "approximate the served model's tokens. Pass --tokenizer (tokenizer.json, HF folder or .gguf) "
         "for exact chunks.", file=sys.stderr)
    return load_tokenizer("cl100k_base")


def fast(tokenizer: Tokenizer) -> Tokenizer:
    """The fastest exact stand-in for `tokenizer` when it is a byte-level BPE (same ids and offsets):
    the C encoder (memagent.nativebpe, ~20x the reference), else memagent.fasttok's numpy piece cache
    (3-5x) where no C compiler is found; benchmarks/bench_tokenize.py measures all three.
    MEMAGENT_FAST_TOKENIZER=0 turns both off; MEMAGENT_NATIVE=0 only the C encoder."""
    if os.environ.get("MEMAGENT_FAST_TOKENIZER", "1") == "0" or not isinstance(tokenizer, HFTokenizer):
        return tokenizer
    from ..fasttok import FastBPETokenizer
    from ..nativebpe import NativeBPETokenizer

    return NativeBPETokenizer.wrap(tokenizer) or FastBPETokenizer.wrap(tokenizer)


__all__ = ["make_backend", "resolve_tokenizer", "KINDS", "ENGINES", "TokenizerError"]
