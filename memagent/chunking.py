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
import errno
import hashlib
import io
import itertools
import os
import stat
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
    """A source of text blocks. `size` is in bytes when known (files), for progress and ETA.

    `path`: the file, when it is one (so a trace or state file can be refused when it is the document);
    `blocking`: a pipe, FIFO or terminal whose reads may wait forever for a writer (the driver reads it
    in a daemon thread, so Ctrl-C is never stuck behind it). Chunking itself takes any text, blank too;
    `refuse_blank` makes blocks() refuse a document of only whitespace (the driver sets it)."""

    def __init__(self, name: str, opener, size: int | None, path: Path | None = None, blocking: bool = False):
        self.name, self._opener, self.size = name, opener, size
        self.path, self.blocking = path, blocking
        self.blank = False  # a regular file found to hold only whitespace (by the prescan)
        self.refuse_blank = False  # set by a reader that would spend model calls on blank text
        self.invalid_utf8 = 0  # number of invalid byte sequences replaced with U+FFFD
        self.bytes_read = 0

    def blocks(self, block_chars: int = BLOCK_CHARS) -> Iterator[str]:
        """Decoded text blocks. Refused on the way: NUL bytes anywhere (binary), lone surrogates in a
        str, an empty document, and (with `refuse_blank`) one of only whitespace: leading whitespace-only
        blocks are held back until real text arrives, so such a document costs no model call."""
        counter = _ReplaceCounter()
        handler = f"memagent-replace-{id(counter)}"
        codecs.register_error(handler, counter)
        decoder = None
        any_text, content, held, offset = False, False, [], 0
        with self._opener() as f:
            while True:
                raw = f.read(block_chars)
                if isinstance(raw, str):  # text stream (StringIO)
                    text, raw_len = raw, len(raw)
                    _check_unicode(self.name, text, offset)
                else:
                    if decoder is None:
                        utf16 = raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
                        decoder = codecs.getincrementaldecoder("utf-16" if utf16 else "utf-8")(errors=handler)
                    nul = -1 if utf16 else raw.find(b"\x00")
                    if nul >= 0:
                        raise _nul_error(self.name, raw, offset, nul)
                    text, raw_len = decoder.decode(raw, final=not raw), len(raw)
                    if utf16 and "\x00" in text:
                        raise DocumentError(f"{self.name}: looks like a binary file (NUL characters in UTF-16 "
                                            f"text); give a text document")
                offset += raw_len
                self.bytes_read += raw_len
                self.invalid_utf8 = counter.count
                if text:
                    any_text = True
                    if content:
                        yield text
                    elif text.strip():
                        content = True
                        yield from held
                        held = []
                        yield text
                    else:
                        held.append(text)
                if not raw:
                    break
        if not any_text:
            raise DocumentError(f"{self.name}: the document is empty")
        if not content and self.refuse_blank:
            raise DocumentError(f"{self.name}: the document holds only whitespace")
        yield from held


def _check_unicode(name: str, text: str, offset: int) -> None:
    """A str from the Python API may hold lone surrogates, which no tokenizer or file can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DocumentError(f"{name}: not valid Unicode text (lone surrogate U+{ord(text[e.start]):04X} at "
                            f"character {offset + e.start})") from None


def _nul_error(name: str, block: bytes, offset: int, nul: int) -> DocumentError:
    """NUL bytes mean binary, unless they sit at every other byte of the start: UTF-16 without a BOM."""
    head = block[:4096] if offset == 0 else b""
    even, odd, half = head[0::2].count(0), head[1::2].count(0), len(head) // 2
    if len(head) >= 8 and max(even, odd) > 0.4 * half and min(even, odd) < 0.02 * half:  # zeros on one side only
        order = "LE" if odd > even else "BE"
        return DocumentError(f"{name}: looks like UTF-16 text without a byte-order mark; convert it to UTF-8 "
                             f"(iconv -f UTF-16{order} -t UTF-8)")
    return DocumentError(f"{name}: looks like a binary file (NUL byte at offset {offset + nul}); "
                         f"give a text document")


def _prescan(p: Path, name: str, size: int) -> bool:
    """A regular file is checked whole before any model call: NUL bytes anywhere mean binary (a binary
    file whose first NUL comes late would otherwise cost calls first). Returns whether it holds only
    whitespace. Read in 1 MB blocks (~1 GB/s from the page cache; no mmap, which would count the whole
    file in the process's peak RSS). UTF-16 (with a BOM) is decoded, so not scanned here."""
    import re

    if size == 0:  # empty, or a file that only reads as text (/proc): blocks() decides
        return False
    blank, offset = True, 0
    with open(p, "rb") as f:
        while block := f.read(1 << 20):
            if offset == 0 and block[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
                return False
            nul = block.find(b"\x00")
            if nul >= 0:
                raise _nul_error(name, block, offset, nul)
            blank = blank and re.search(rb"\S", block) is None
            offset += len(block)
    return blank


def _is_blocking(f) -> bool:
    """A stream backed by a pipe, FIFO, socket or terminal (reads may wait); in-memory streams are not."""
    try:
        return not stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def open_document(src) -> Document:
    """A `pathlib.Path` (a file), a binary/text stream (e.g. `sys.stdin.buffer`), a `Document`, or text
    (any str).

    A str is always document text, never guessed to be a path or stdin: a document whose whole text
    happens to name an existing file ("/", "notes.txt") or be "-" must not be read from elsewhere. The
    CLI's "-" reaches here as `sys.stdin.buffer`.

    A path is checked without opening it when it is not a regular file: opening a FIFO to check it would
    take the writer's data.
    """
    if isinstance(src, Document):
        return src
    if isinstance(src, (io.TextIOBase, io.BufferedIOBase, io.RawIOBase)):
        name = getattr(src, "name", "<stream>")
        return Document(name if isinstance(name, str) else "<stream>", lambda: _NoClose(src), None,
                        blocking=_is_blocking(src))
    if isinstance(src, Path):
        p = Path(src)
        try:
            st = p.stat()
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise DocumentError(f"{p}: a symbolic link loop, not a document") from None
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                raise DocumentError(f"{p}: no such file") from None
            raise DocumentError(f"{p}: cannot read ({e.strerror})") from None
        if stat.S_ISDIR(st.st_mode):
            raise DocumentError(f"{p}: is a directory, not a document")
        if not stat.S_ISREG(st.st_mode):  # FIFO, character device, socket: opened once, when read
            return Document(str(p), lambda: open(p, "rb"), None, path=p, blocking=True)
        try:
            blank = _prescan(p, str(p), st.st_size)
        except OSError as e:
            raise DocumentError(f"{p}: cannot read ({e.strerror})") from None
        document = Document(str(p), lambda: open(p, "rb"), st.st_size, path=p)
        document.blank = blank
        return document
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


def _snapped_end(pending: str, starts, head: int, chunk_tokens: int, snap: int) -> int:
    """Index of the token that starts the next chunk: the latest one within the chunk's final `snap`
    tokens that follows a line end or a sentence end, else the token-exact one (head + chunk_tokens)."""
    end = head + chunk_tokens
    for i in range(end, max(head + 1, end - snap) - 1, -1):
        b = int(starts[i])
        before, at = pending[b - 1] if b else "", pending[b] if b < len(pending) else ""
        if before == "\n" or (before in _SENTENCE_END and (at.isspace() or at == "")):
            return i
        if before in _CLOSERS and b >= 2 and pending[b - 2] in _SENTENCE_END and at.isspace():
            return i  # 'He said "stop."' + ' Next'
    return end


_SENTENCE_END = frozenset(".!?")
_CLOSERS = frozenset("\"'\u201d\u2019)]")


def iter_chunks(doc, tokenizer: Tokenizer, chunk_tokens: int, snap: int = 0) -> Iterator[Chunk]:
    """Token-exact chunks of a document (anything `open_document` accepts), streamed.

    `snap` > 0 ends each chunk at the last line or sentence end within its final `snap` tokens (never
    later than `chunk_tokens`), so a fact is not cut in two by a boundary: of the needles a token-exact
    boundary split ("...is: 75726996-4c8" | "4-4afe..."), the default model answered 1 of 12 in one
    measured grid and 11 of 12 with snapped chunks (docs/notes-model.md). Chunks then hold between
    chunk_tokens - snap and chunk_tokens tokens; with no such end in the window the cut stays
    token-exact. 0 (the default) keeps every chunk exactly `chunk_tokens`: moving every boundary also
    moves reads that were near a tie (the README demo's among them), so it is opt-in.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk size must be a positive number of tokens, got {chunk_tokens}")
    if not 0 <= snap < chunk_tokens:
        raise ValueError(f"chunk snap must be between 0 and the chunk size - 1 ({chunk_tokens - 1}) tokens, got {snap}")
    import numpy as np

    document = open_document(doc)
    pending = ""  # text from the current chunk's first character to the end of the last encoded piece
    starts = np.zeros(0, dtype=np.int64)  # token starts inside `pending`; starts[0]: the current chunk's first
    pending_char0 = 0  # document offset of pending[0]
    index = 0
    pieces = _encoded(_pieces(document.blocks(), tokenizer), tokenizer)
    if snap:  # one more pass once the document has ended, for the cuts that waited on the next character
        pieces = itertools.chain(pieces, [(None, None)])
    for piece, piece_starts in pieces:
        last = piece is None
        if not last:
            starts = np.concatenate((starts, piece_starts + len(pending)))
            pending += piece
        ends: list[int] = []  # token index that starts each following chunk
        if snap:
            # a snapped cut looks at the character after it (the space after a period): keep one token
            # in hand until the document ends
            head = 0
            while len(starts) > head + chunk_tokens + (0 if last else 1):
                head = _snapped_end(pending, starts, head, chunk_tokens, snap)
                ends.append(head)
        else:
            ends = list(range(chunk_tokens, len(starts), chunk_tokens))
        head = 0
        for e in ends:
            a = int(starts[head]) if head else 0  # the first chunk also owns any text before its first token
            yield Chunk(index, pending[a:int(starts[e])], e - head, pending_char0 + a)
            index += 1
            head = e
        if head:  # drop what was emitted: memory stays bounded by one chunk plus one batch of pieces
            a = int(starts[head])
            pending, pending_char0 = pending[a:], pending_char0 + a
            starts = starts[head:] - a
    if len(starts) or pending:
        yield Chunk(index, pending, len(starts), pending_char0)
