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
    """Re-cut arbitrary blocks at tokenizer-safe positions (the last block needs no cut: it is looked
    ahead for, so a short document is one piece and costs no `safe_cut`)."""
    carry = ""
    blocks = iter(blocks)
    block = next(blocks, None)
    while block is not None:
        following = next(blocks, None)
        text = carry + block
        block = following
        if following is None or len(text) < 2 * SAFE_MARGIN + 64:
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


def _encoded(pieces: Iterable[str], tokenizer: Tokenizer) -> Iterator[tuple[str, "np.ndarray"]]:
    """(piece, token start offsets as an int64 array) per piece; batches pieces when the tokenizer can.

    Arrays, not lists: the chunker only needs where every chunk_tokens-th token starts, and shifting
    and slicing offsets in numpy costs nothing per token (a 3.5M-token document has 3.5M of them).
    """
    import numpy as np

    batch_fn = getattr(tokenizer, "encode_batch_starts", None)
    if batch_fn is None and hasattr(tokenizer, "encode_batch_offsets"):
        batch_fn = lambda texts: [starts for _, starts in tokenizer.encode_batch_offsets(texts)]  # noqa: E731
    if batch_fn is None:
        for p in pieces:
            yield p, np.asarray(tokenizer.encode_offsets(p)[1], dtype=np.int64)
        return
    batch: list[str] = []
    for p in pieces:
        batch.append(p)
        if len(batch) == PIECES_PER_BATCH:
            for piece, starts in zip(batch, batch_fn(batch)):
                yield piece, np.asarray(starts, dtype=np.int64)
            batch = []
    if batch:
        for piece, starts in zip(batch, batch_fn(batch)):
            yield piece, np.asarray(starts, dtype=np.int64)


def iter_chunks(doc, tokenizer: Tokenizer, chunk_tokens: int) -> Iterator[Chunk]:
    """Token-exact chunks of a document (anything `open_document` accepts), streamed."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk size must be a positive number of tokens, got {chunk_tokens}")
    import numpy as np

    document = open_document(doc)
    pending = ""  # text from the current chunk's first character to the end of the last encoded piece
    starts = np.zeros(0, dtype=np.int64)  # token starts inside `pending`; starts[0]: the current chunk's first
    pending_char0 = 0  # document offset of pending[0]
    index = 0
    for piece, piece_starts in _encoded(_pieces(document.blocks(), tokenizer), tokenizer):
        starts = np.concatenate((starts, piece_starts + len(pending)))
        pending += piece
        head = 0
        cuts = starts[chunk_tokens::chunk_tokens].tolist()  # first token of every following chunk
        for b in cuts:
            a = int(starts[head]) if head else 0  # the first chunk also owns any text before its first token
            yield Chunk(index, pending[a:b], chunk_tokens, pending_char0 + a)
            index += 1
            head += chunk_tokens
        if head:  # drop what was emitted: memory stays bounded by one chunk plus one batch of pieces
            a = int(starts[head])
            pending, pending_char0 = pending[a:], pending_char0 + a
            starts = starts[head:] - a
    if len(starts) or pending:
        yield Chunk(index, pending, len(starts), pending_char0)
