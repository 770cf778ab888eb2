"""A faster path to the *same* token ids and offsets for GPT-2-style byte-level BPE tokenizers (SmolLM2).

Why it is possible: such a tokenizer has no normalizer; its pre-tokenizer splits the text with one fixed
regex into pieces (a word with its leading space, a digit run, a punctuation run, whitespace), and BPE
then runs on each piece alone. So a piece's ids depend only on the piece's text, and natural text
repeats the same few tens of thousands of pieces. We split with the same regex in C (`re`/`regex`),
look each piece up in a dict (filled by the Rust tokenizer itself on a miss), and build the offsets
with numpy. Most of the work becomes a regex scan plus dict lookups.

Why it stays exact: a text with many unknown pieces (a new document's first block) is encoded by the
reference, which gives the result, and its tokens are then filed under our pieces for next time; a few
unknown pieces are encoded alone by the reference, after the Rust pre-tokenizer confirms each is one
piece on its own. Text we cannot vouch for goes to the reference tokenizer whole:
- text containing an added token (`<|im_start|>` ...), which the reference cuts out before splitting;
- lone surrogates (the reference cannot take them);
- non-ASCII text when the installed `regex`/`tokenizers` are not the versions whose Unicode classes we
  compared codepoint by codepoint (`CHECKED_VERSIONS`), and, with those versions, characters on which
  they disagree (`UNICODE_MISMATCH`: characters assigned after Unicode 14, which the Rust library's
  regex engine does not know). ASCII text needs no such table: its classes never change.
`tests/test_fasttok.py` checks all of this id-for-id and offset-for-offset against the reference.
"""
from __future__ import annotations

import json
import os
import re
import threading
from itertools import repeat
from pathlib import Path
from typing import Sequence

# The GPT-2 split as written in the Rust library (pre_tokenizers/byte_level.rs).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The same split for ASCII-only text, where \p{L}, \p{N} and \s are these fixed sets; stdlib `re`
# runs it about twice as fast as `regex` runs the Unicode one.
_ASCII_SPACE = r"\t\n\x0b\x0c\r "
ASCII_PATTERN = (rf"""'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]+| ?[^{_ASCII_SPACE}A-Za-z0-9]+"""
                 rf"""|[{_ASCII_SPACE}]+(?![^{_ASCII_SPACE}])|[{_ASCII_SPACE}]+""")

# (regex, tokenizers) versions for which UNICODE_MISMATCH was measured (verify_unicode_classes()).
CHECKED_VERSIONS = ("2026.11.19", "0.23.3")
# Codepoint ranges (inclusive) where `regex`'s \p{L}/\p{N}/\s differ from the Rust library's.
UNICODE_MISMATCH = [
    (1368, 1368), (1419, 1420), (2191, 2191), (3164, 3164), (3292, 3292), (8335, 8335), (8349, 8351),
    (42958, 42959), (42962, 42962), (42964, 42964), (42973, 42973), (42978, 42978), (42993, 42993),
    (43884, 43885), (67515, 67519), (67904, 67929), (69317, 69319), (69337, 69358), (72458, 72458),
    (73136, 73179), (73184, 73193), (73201, 73201), (74863, 74863), (74869, 74879), (75088, 75398),
    (93856, 93880), (93883, 93907), (94194, 94198), (100344, 100351), (101590, 101594), (101641, 101664),
    (101760, 101874), (101888, 102801), (102816, 102866), (110883, 110888), (110952, 110952),
    (120486, 120486), (122655, 122660), (122667, 122753), (122768, 122774), (122829, 122879),
    (124608, 124638), (124640, 124642), (124644, 124645), (124647, 124653), (124656, 124660),
    (124670, 124671), (177978, 177983), (178206, 178206), (183970, 183981), (205744, 210041),
    (249856, 261183),
]
SEGMENT_CHARS = 512  # mixed text is scanned in segments about this long (see _split)
MISS_SHARE = 3  # over 1 new piece in 3 (a new script, random junk): the reference encodes the text whole
SHORT_TEXT = 400  # characters; shorter texts go to the reference (see _encode_batch_locked)
SEED_FORMAT = 1  # bump when the seed rows' meaning changes: old cache files are then ignored
CACHE_LIMIT = 1 << 18  # pieces remembered; a document of random junk must not grow memory without bound


class Unsupported(ValueError):
    """The tokenizer is not a plain byte-level BPE; use the reference."""


def check_structure(tok) -> None:
    """Raise Unsupported unless `tok` (a tokenizers.Tokenizer) is the shape this module reproduces.

    Read from the Python objects, not from `to_str()`: serialising and parsing the 2 MB JSON cost more
    than everything else a new FastBPETokenizer does."""
    from tokenizers import models, pre_tokenizers, processors

    pre, model, post = tok.pre_tokenizer, tok.model, tok.post_processor
    if tok.normalizer is not None:
        raise Unsupported("the tokenizer has a normalizer")
    if type(pre) is not pre_tokenizers.ByteLevel or not pre.use_regex or pre.add_prefix_space:
        raise Unsupported("the pre-tokenizer is not a plain GPT-2 ByteLevel split")
    if type(model) is not models.BPE or model.dropout:
        raise Unsupported("the model is not a deterministic BPE")
    if post is not None and type(post) is not processors.TemplateProcessing:
        raise Unsupported(f"post-processor {type(post).__name__} may move offsets")  # ByteLevel trims them


class FastBPETokenizer:
    """Same `Tokenizer` protocol and same results as `HFTokenizer`, from a cache of per-piece ids."""

    tokenize_in_thread = False  # its work holds the GIL: the driver runs it inline (see driver._Prefetch)

    def __init__(self, reference, seed: bool = True):
        """`reference`: a memagent.tokenizer.HFTokenizer; everything we cannot vouch for goes to it.
        `seed`: start with the vocabulary's own words in the table (see `_seed`)."""
        import regex
        import tokenizers

        self.ref = reference
        self._tok = reference._tok
        check_structure(self._tok)
        self.name = reference.name
        self._ascii_split = re.compile(ASCII_PATTERN).findall
        self._unicode_ok = (regex.__version__, tokenizers.__version__) == CHECKED_VERSIONS
        self._unicode_split = regex.compile(GPT2_PATTERN).findall
        # A set, not a regex class: `isdisjoint` scans a segment in C at dict speed, where a 50-range
        # character class costs more than the whole split.
        self._unsafe = frozenset(chr(c) for a, b in [*UNICODE_MISMATCH, (0xD800, 0xDFFF)] for c in range(a, b + 1))
        self._added = added_token_search(self._tok)
        self._boundary = re.compile(r"[\x00-\x08\x0e-\x1f\x21-\x7f][\t\n\x0b\x0c\r ]").search
        self._lock = threading.Lock()
        self._seed_rows = None
        self._clear()
        self.stats = {"fast": 0, "learned": 0, "fallback": 0, "short": 0, "misses": 0, "disagreements": 0}
        if seed:
            self._seed()
            self.stats.update(misses=0, learned=0)

    @classmethod
    def wrap(cls, reference):
        """`reference` made fast when its shape allows, else `reference` itself."""
        try:
            return cls(reference)
        except (Unsupported, AttributeError, ImportError):
            return reference

    # ---- splitting --------------------------------------------------------------------------------
    def _split(self, text: str) -> list[str] | None:
        """The pre-tokenizer's pieces, or None when the reference must handle `text`."""
        if self._added is not None and self._added(text):
            return None
        if text.isascii():
            return self._ascii_split(text)
        if not self._unicode_ok:
            return None
        # Mostly-ASCII text (English with a few accents or dashes) is cut into segments at positions
        # where a piece always starts (ASCII whitespace after ASCII non-whitespace: no piece can run
        # across it and the split has no look-behind), so the ASCII segments get the faster scan.
        out: list[str] = []
        pos, n, boundary = 0, len(text), self._boundary
        ascii_split, unicode_split, unsafe = self._ascii_split, self._unicode_split, self._unsafe
        while pos < n:
            m = boundary(text, pos + SEGMENT_CHARS) if pos + SEGMENT_CHARS < n else None
            end = m.start() + 1 if m else n
            seg = text[pos:end]
            if seg.isascii():
                out += ascii_split(seg)
            elif unsafe.isdisjoint(seg):
                out += unicode_split(seg)
            else:
                return None
            pos = end
        return out

    def _lookup(self, text: str):
        """(pieces, rows) with every row known; (pieces, None) when too much is new (the reference
        encodes the text and we learn from it); None when the reference must handle the text alone."""
        import numpy as np

        pieces = self._split(text)
        if pieces is None:
            return None
        n, generation = len(pieces), self._generation
        rows = np.fromiter(map(self._row.get, pieces, repeat(-1)), dtype=np.int64, count=n)
        holes = np.flatnonzero(rows < 0).tolist()
        if not holes:
            return pieces, rows
        missing = list(dict.fromkeys(pieces[i] for i in holes))
        if len(missing) * MISS_SHARE > n:
            return pieces, None
        if not self._fill(missing):
            return None
        if self._generation != generation:  # the table was cleared to make room: every row is stale
            rows = np.fromiter(map(self._row.get, pieces, repeat(-1)), dtype=np.int64, count=n)
        else:
            get = self._row.get
            rows[holes] = [get(pieces[i], -1) for i in holes]
        return (pieces, rows) if (rows >= 0).all() else None  # -1: evicted again (a text over the limit)

    def _fill(self, missing: list[str]) -> bool:
        """Encode the new pieces; False if one cannot be vouched for (the reference takes the text).

        Why joined: the reference costs ~20 us per call however short the text, while a document's
        new pieces are mostly short words. Joined with newlines, they are one call; a newline cannot
        merge with a neighbouring piece unless that piece is itself whitespace (those few are encoded
        one by one), and our split of the joined text must give back exactly the pieces and the
        newlines, or nothing is learned from it.
        """
        self.stats["misses"] += len(missing)
        words = [p for p in missing if not p.isspace()]
        alone = [p for p in missing if p.isspace()]
        if words:
            joined = "\n".join(words)
            pieces = self._split(joined)
            if pieces is None or pieces[::2] != words or any(p != "\n" for p in pieces[1::2]):
                alone = missing
            else:
                self._make_room(len(words) + 1)
                ids, starts = self.ref.encode_offsets(joined)
                if not self._learn(pieces, ids, starts, count=False):
                    alone = missing
        if alone:
            pre = self._tok.pre_tokenizer.pre_tokenize_str
            for p in alone:
                split = pre(p)
                if len(split) != 1 or split[0][1] != (0, len(p)):
                    return False
            self._make_room(len(alone))
            for p, (ids, starts) in zip(alone, self.ref.encode_batch_offsets(alone)):
                self._add(p, ids, starts)
        return True

    def _learn(self, pieces: list[str], ids: list[int], starts: list[int], count: bool = True) -> bool:
        """Cache the pieces of a text the reference has just encoded whole (a new document's first block).

        Each token is assigned to the piece its start falls in. As a cheap consistency check every piece
        must begin exactly at one of its tokens; if not, our split and the reference's disagree here and
        nothing is learned. (The check cannot see every disagreement; that the two splits are the same
        is what tests/test_fasttok.py establishes, character class by character class.)
        """
        import numpy as np

        n = len(pieces)
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=n)
        piece_starts = np.cumsum(lengths) - lengths
        token_starts = np.asarray(starts, dtype=np.int64)
        owner = np.searchsorted(piece_starts, token_starts, side="right") - 1
        counts = np.bincount(owner, minlength=n) if len(owner) else np.zeros(n, dtype=np.int64)
        first = np.cumsum(counts) - counts
        if len(counts) != n or not (counts > 0).all() or not (token_starts[first] == piece_starts).all():
            self.stats["disagreements"] += 1
            return False
        first_seen = dict(zip(reversed(pieces), range(n - 1, -1, -1)))  # later keys overwrite: first index wins
        new = {p: i for p, i in first_seen.items() if p not in self._row}
        if count:
            self.stats["misses"] += len(new)
            self._make_room(len(new))
        if new:
            at = np.fromiter(new.values(), dtype=np.int64, count=len(new))
            width = counts[at]
            out_first = np.cumsum(width) - width
            flat = np.repeat(first[at] - out_first, width) + np.arange(int(width.sum()))
            self._add_many(list(new), np.asarray(ids, dtype=np.int64)[flat],
                           token_starts[flat] - np.repeat(piece_starts[at], width), width, lengths[at])
        return True

    # ---- the seed -----------------------------------------------------------------------------------
    def _seed(self) -> None:
        """Put every vocabulary entry that is a whole piece on its own (' the', ' house', 'ing') in the
        table, so a new document mostly hits from its first block (measured: 3.5x less time chunking
        unseen text; benchmarks/bench_tokenize.py). The rows are computed once per tokenizer, through
        the same verified path as any new piece, and cached on disk (~1 s the first time)."""
        import numpy as np

        path = _seed_path(self.ref)
        try:
            with np.load(path) as z:
                rows = (json.loads(str(z["pieces"])), z["ids"], z["rel"], z["width"], z["chars"])
        except (OSError, ValueError, KeyError):
            rows = None
        if rows is not None and len(rows[0]) > CACHE_LIMIT // 2:
            return  # a table this small (tests) has no room for a seed
        if rows is None:
            decode = _byte_decoder()
            words = []
            for token in self._tok.get_vocab():
                try:
                    text = bytes(decode[c] for c in token).decode("utf-8")
                except (KeyError, UnicodeDecodeError):
                    continue  # an added token, or part of a multi-byte character
                if text and not text.isspace() and self._split(text) == [text]:
                    words.append(text)
            if len(words) > CACHE_LIMIT // 2 or not self._fill(sorted(words)):
                return
            n, t = self._rows_used, self._tokens_used
            rows = (list(self._row), self._ids[:t].copy(), self._rel[:t].copy(), self._width[:n].copy(),
                    self._chars[:n].copy())
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
                np.savez(tmp, pieces=np.array(json.dumps(rows[0])), ids=rows[1], rel=rows[2], width=rows[3],
                         chars=rows[4])
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only cache: the seed is recomputed next time
        self._seed_rows = rows
        self._clear()

    # ---- the table ----------------------------------------------------------------------------------
    # Every known piece is a row: its tokens' ids and start offsets (relative to the piece) sit in two
    # flat arrays at [first, first + width), and its length in characters in `chars`. A text is then
    # assembled by fancy indexing in numpy, with no Python work per token.
    def _clear(self) -> None:
        import numpy as np

        self._row: dict[str, int] = {}
        self._generation = getattr(self, "_generation", -1) + 1
        self._rows_used = self._tokens_used = 0
        self._first = np.zeros(1024, dtype=np.int64)
        self._width = np.zeros(1024, dtype=np.int64)
        self._chars = np.zeros(1024, dtype=np.int64)
        self._ids = np.zeros(4096, dtype=np.int64)
        self._rel = np.zeros(4096, dtype=np.int64)
        if self._seed_rows is not None:
            self._add_many(*self._seed_rows)

    def _add(self, piece: str, ids: Sequence[int], rel: Sequence[int]) -> None:
        import numpy as np

        r, t, w = self._rows_used, self._tokens_used, len(ids)
        if r == len(self._first):  # grow by doubling: amortised O(1) per row
            self._first, self._width, self._chars = (np.resize(a, 2 * r) for a in (self._first, self._width, self._chars))
        while t + w > len(self._ids):
            self._ids, self._rel = np.resize(self._ids, 2 * len(self._ids)), np.resize(self._rel, 2 * len(self._rel))
        self._first[r], self._width[r], self._chars[r] = t, w, len(piece)
        self._ids[t:t + w], self._rel[t:t + w] = ids, rel
        self._row[piece] = r
        self._rows_used, self._tokens_used = r + 1, t + w

    def _add_many(self, pieces: list[str], ids, rel, width, chars) -> None:
        """Append many rows at once (numpy arrays: the flat ids and offsets, and per row its width and
        length): a new document's first blocks bring thousands of new pieces."""
        import numpy as np

        r, t, k, w = self._rows_used, self._tokens_used, len(pieces), len(ids)
        grow = lambda a, need: np.resize(a, max(need, 2 * len(a))) if need > len(a) else a  # noqa: E731
        self._first, self._width, self._chars = (grow(a, r + k) for a in (self._first, self._width, self._chars))
        self._ids, self._rel = grow(self._ids, t + w), grow(self._rel, t + w)
        self._first[r:r + k] = t + np.cumsum(width) - width
        self._width[r:r + k], self._chars[r:r + k] = width, chars
        self._ids[t:t + w], self._rel[t:t + w] = ids, rel
        self._row.update(zip(pieces, range(r, r + k)))
        self._rows_used, self._tokens_used = r + k, t + w

    def _make_room(self, k: int) -> None:
        if self._rows_used + k > CACHE_LIMIT:
            self._clear()

    def _assemble(self, rows):
        """(ids, token starts) of a text, as numpy arrays, from its pieces' rows."""
        import numpy as np

        width, chars = self._width[rows], self._chars[rows]
        piece_start = np.cumsum(chars) - chars
        out_first = np.cumsum(width) - width
        flat = np.repeat(self._first[rows] - out_first, width) + np.arange(int(out_first[-1] + width[-1]) if len(rows) else 0)
        return self._ids[flat], np.repeat(piece_start, width) + self._rel[flat]

    # ---- the Tokenizer protocol ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        ids, _ = self._encode_batch([text])[0]
        return ids.tolist() if hasattr(ids, "tolist") else ids  # no list of offsets built for nothing

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        return self.encode_batch_offsets([text])[0]

    def encode_batch_offsets(self, texts: list[str]) -> list[tuple[list[int], list[int]]]:
        return [(ids.tolist(), starts.tolist()) if hasattr(ids, "tolist") else (ids, starts)
                for ids, starts in self._encode_batch(texts)]

    def encode_batch_starts(self, texts: list[str]) -> list:
        """Token start offsets only, as numpy arrays: all the chunker needs, without building lists."""
        import numpy as np

        return [np.asarray(starts, dtype=np.int64) for _, starts in self._encode_batch(texts)]

    def _encode_batch(self, texts: list[str]) -> list[tuple]:
        """Known pieces are assembled here; texts with too much new go to the reference in one batch
        (both cores) and are learned from.

        One lock around it all: the driver tokenizes several documents at once in worker threads, and
        the table (rows appended, arrays regrown, cleared when full) must not change under a reader.
        It costs no parallelism: the fast path holds the GIL anyway."""
        with self._lock:
            return self._encode_batch_locked(texts)

    def _encode_batch_locked(self, texts: list[str]) -> list[tuple]:
        # A short text (a memory reply being capped) costs the reference ~20 us; our path's fixed numpy
        # costs are more than that, so short texts go straight to the reference.
        looks = [self._lookup(t) if len(t) > SHORT_TEXT else None for t in texts]
        out: list = [None] * len(texts)
        hard = [i for i, got in enumerate(looks) if got is None or got[1] is None]
        if hard:
            encoded = self.ref.encode_batch_offsets([texts[i] for i in hard]) if len(hard) > 1 \
                else [self.ref.encode_offsets(texts[hard[0]])]
            for i, (ids, starts) in zip(hard, encoded):
                if looks[i] is None:
                    self.stats["short" if len(texts[i]) <= SHORT_TEXT else "fallback"] += 1
                else:
                    self.stats["learned"] += 1
                    self._learn(looks[i][0], ids, starts)
                out[i] = (ids, starts)
        for i, got in enumerate(looks):
            if out[i] is None:
                self.stats["fast"] += 1
                out[i] = self._assemble(got[1])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.ref.decode(ids)

    def safe_cut(self, text: str, before: int) -> int:
        """The reference's choice of cut, from our split of the window (the same pieces, ~20x cheaper
        than asking the Rust pre-tokenizer for its offsets)."""
        from itertools import accumulate

        from .tokenizer import SAFE_WINDOW, choose_cut

        lo = max(0, before - SAFE_WINDOW)
        window = text[lo:before]
        pieces = self._split(window)
        if pieces is None:
            return self.ref.safe_cut(text, before)
        return lo + choose_cut(window, list(accumulate(map(len, pieces), initial=0))[:-1])


def verify_unicode_classes(tok, start: int = 0, stop: int = 0x110000, batch: int = 4096) -> list[tuple[int, int]]:
    """Codepoint ranges in [start, stop) where `regex`'s split differs from the Rust pre-tokenizer's.

    Each codepoint is tried next to a letter, a digit, a space, punctuation and itself, so any
    difference in its \\p{L} / \\p{N} / \\s membership changes some piece boundary. Batches that agree
    are skipped whole; the others are halved until the culprits are found.
    """
    import regex

    split = regex.compile(GPT2_PATTERN)
    pre = tok.pre_tokenizer
    contexts = ["a{c}", "1{c}", " {c}", "!{c}", "{c}a", "{c}1", "{c} ", "{c}!", "\n{c}\n", "{c}{c}"]

    def agree(cps):
        s = "|" + "|".join("".join(x.format(c=chr(c)) for x in contexts) for c in cps) + "|"
        return [o for _, o in pre.pre_tokenize_str(s)] == [m.span() for m in split.finditer(s)]

    bad: list[int] = []

    def walk(cps):
        if agree(cps):
            return
        if len(cps) == 1:
            bad.append(cps[0])
            return
        half = len(cps) // 2
        walk(cps[:half])
        walk(cps[half:])

    cps = [c for c in range(start, stop) if not 0xD800 <= c <= 0xDFFF]
    for lo in range(0, len(cps), batch):
        walk(cps[lo:lo + batch])
    ranges: list[tuple[int, int]] = []
    for c in sorted(bad):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    return ranges


def _seed_path(reference):
    """Where the seed rows of this exact tokenizer (and these library versions) are cached: keyed by
    the tokenizer file's identity when it has one (cheap), else by its full serialisation."""
    import hashlib

    from .models import cache_root

    ident = file_identity(reference) or reference._tok.to_str()
    key = hashlib.sha256(f"{SEED_FORMAT}|{CHECKED_VERSIONS}|{ident}".encode()).hexdigest()[:20]
    return cache_root() / "fasttok" / f"seed-{key}.npz"


def added_token_search(tok):
    """A search for the tokenizer's added tokens (`<|im_start|>` ...), or None when it has none: the
    reference cuts them out before splitting, so a text holding one must go to the reference."""
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    if not added:
        return None
    return re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True)))).search


def file_identity(reference) -> str | None:
    """The tokenizer file's path, size and mtime (cheap to read, changes when the file does); None when
    the tokenizer was not loaded from a file."""
    file = Path(str(reference.name))
    try:
        st = file.stat()
    except OSError:
        return None
    return f"{file.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE writes each byte as one printable character; this maps them back to bytes
    (the printable Latin-1 ones stand for themselves, the other 68 bytes are moved to 256 and up)."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}
