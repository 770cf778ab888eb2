"""Streaming documents and token-exact chunks.

A document is read in blocks (a file, stdin, or an in-memory string) so that peak memory does not grow
with its size. Blocks are cut at positions where the tokenizer's own pre-tokenizer starts a new piece
(`Tokenizer.safe_cut`), then encoded several at a time (the Rust tokenizer uses every core for a batch).
Chunks are exactly `chunk_tokens` tokens (the last one shorter) and carry the original text between the
start of their first token and the start of the next chunk's first token, so concatenating the chunks
gives back the document byte for byte.
"""
from __future__ import annotations

import codecs
import hashlib
import io

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator

from .tokenizer import Tokenizer

BLOCK_CHARS = 1 << 18  # 256K characters a piece: big enough for the Rust tokenizer, small for memory
PIECES_PER_BATCH = 8  # pieces encoded together (parallel in the Rust tokenizer)
SAFE_MARGIN = 256  # characters kept behind a cut so the pre-tokenizer sees the same context


class DocumentError(ValueError):
    """A document we cannot read; the message is one line for the user."""


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    n_tokens: int
    start_char: int

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class _ReplaceCounter:
    """codecs error handler that replaces invalid UTF-8 with U+FFFD and counts how often it did."""

    def __init__(self):
        self.count = 0

    def __call__(self, err: UnicodeDecodeError):
        self.count += 1
        return "\ufffd", err.end


class Document:
    """A source of text blocks. `size` is in bytes when known (files), for progress and ETA."""

    def __init__(self, name: str, opener, size: int | None):
        self.name, self._opener, self.size = name, opener, size
        self.invalid_utf8 = 0  # number of invalid byte sequences replaced with U+FFFD
        self.bytes_read = 0

    def blocks(self, block_chars: int = BLOCK_CHARS) -> Iterator[str]:
        counter = _ReplaceCounter()
        handler = f"memagent-replace-{id(counter)}"
        codecs.register_error(handler, counter)
        decoder = codecs.getincrementaldecoder("utf-8")(errors=handler)
        first, any_text = True, False
        with self._opener() as f:
            while True:
                raw = f.read(block_chars)
                if isinstance(raw, str):  # text stream (StringIO)
                    text, raw_len = raw, len(raw)
                else:
                    if first and b"\x00" in raw[:8192]:
                        raise DocumentError(f"{self.name}: looks like a binary file (NUL bytes); give a text document")
                    text, raw_len = decoder.decode(raw, final=not raw), len(raw)
                first = False
                self.bytes_read += raw_len
                self.invalid_utf8 = counter.count
                if text:
                    any_text = True
                    yield text
                if not raw:
                    break
        if not any_text:
            raise DocumentError(f"{self.name}: the document is empty")


def open_document(src) -> Document:
    """A `pathlib.Path` (a file), '-' (stdin), a binary/text stream, a `Document`, or text (any other str).

    A str is always document text, never guessed to be a path: a document whose whole text happens to
    name an existing file ("/", "notes.txt") must not be read from disk instead.
    """
    if isinstance(src, Document):
        return src
    if src == "-":
        return Document("<stdin>", lambda: _NoClose(sys.stdin.buffer), None)
    if isinstance(src, (io.TextIOBase, io.BufferedIOBase)):
        return Document(getattr(src, "name", "<stream>"), lambda: _NoClose(src), None)
    if isinstance(src, Path):
        p = Path(src)
        if p.is_dir():
            raise DocumentError(f"{p}: is a directory, not a document")
        if not p.exists():
            raise DocumentError(f"{p}: no such file")
        try:
            size = p.stat().st_size
            open(p, "rb").close()
        except OSError as e:
            raise DocumentError(f"{p}: cannot read ({e.strerror})") from None
        return Document(str(p), lambda: open(p, "rb"), size)
    if isinstance(src, str):
        data = src
        return Document("<text>", lambda: io.StringIO(data), len(data))
    raise DocumentError(f"cannot read a document from {type(src).__name__}")


class _NoClose:
    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self.f

    def __exit__(self, *exc):
        return False


def _pieces(blocks: Iterable[str], tokenizer: Tokenizer) -> Iterator[str]:
    """Re-cut arbitrary blocks at tokenizer-safe positions."""
    carry = ""
    for block in blocks:
        text = carry + block
        if len(text) < 2 * SAFE_MARGIN + 64:
            carry = text
            continue
        cut = tokenizer.safe_cut(text, len(text) - SAFE_MARGIN)
        if cut <= 0:
            carry = text
            continue
        yield text[:cut]
        carry = text[cut:]
    if carry:
        yield carry


def _encoded(pieces: Iterable[str], tokenizer: Tokenizer) -> Iterator[tuple[str, list[int]]]:
    """(piece, token start offsets) per piece; batches pieces when the tokenizer can."""
    batch_fn = getattr(tokenizer, "encode_batch_offsets", None)
    if batch_fn is None:
        for p in pieces:
            yield p, tokenizer.encode_offsets(p)[1]
        return
    batch: list[str] = []
    for p in pieces:
        batch.append(p)
        if len(batch) == PIECES_PER_BATCH:
            for piece, (_, starts) in zip(batch, batch_fn(batch)):
                yield piece, starts
            batch = []
    if batch:
        for piece, (_, starts) in zip(batch, batch_fn(batch)):
            yield piece, starts


def iter_chunks(doc, tokenizer: Tokenizer, chunk_tokens: int) -> Iterator[Chunk]:
    """Token-exact chunks of a document (anything `open_document` accepts), streamed."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk size must be a positive number of tokens, got {chunk_tokens}")
    document = open_document(doc)
    pending = ""  # text from the current chunk's first character to the end of the last encoded piece
    starts: list[int] = []  # token starts inside `pending`; starts[0] is the current chunk's first token
    pending_char0 = 0  # document offset of pending[0]
    index = 0
    for piece, piece_starts in _encoded(_pieces(document.blocks(), tokenizer), tokenizer):
        base = len(pending)
        pending += piece
        starts.extend(base + s for s in piece_starts)
        head = 0
        while len(starts) - head > chunk_tokens:
            b = starts[head + chunk_tokens]
            a = starts[head] if head else 0  # the first chunk also owns any text before its first token
            yield Chunk(index, pending[a:b], chunk_tokens, pending_char0 + a)
            index += 1
            head += chunk_tokens
        if head:  # drop what was emitted: memory stays bounded by one chunk plus one batch of pieces
            a = starts[head]
            pending, pending_char0 = pending[a:], pending_char0 + a
            starts = [s - a for s in starts[head:]]
    if starts or pending:
        yield Chunk(index, pending, len(starts), pending_char0)
