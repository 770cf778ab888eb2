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
import re
from itertools import chain
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
MISS_SHARE = 10  # over 1 new piece in 10: the reference encodes the text (a piece alone costs ~4 tokens)
CACHE_LIMIT = 1 << 18  # pieces remembered; a document of random junk must not grow memory without bound


class Unsupported(ValueError):
    """The tokenizer is not a plain byte-level BPE; use the reference."""


def check_structure(tok) -> None:
    """Raise Unsupported unless `tok` (a tokenizers.Tokenizer) is the shape this module reproduces."""
    spec = json.loads(tok.to_str())
    pre, model, post = spec.get("pre_tokenizer") or {}, spec.get("model") or {}, spec.get("post_processor")
    if spec.get("normalizer") is not None:
        raise Unsupported("the tokenizer has a normalizer")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise Unsupported("the pre-tokenizer is not a plain GPT-2 ByteLevel split")
    if model.get("type") != "BPE" or model.get("dropout"):
        raise Unsupported("the model is not a deterministic BPE")
    if post is not None and post.get("type") not in ("TemplateProcessing",):
        raise Unsupported(f"post-processor {post.get('type')} may move offsets")  # ByteLevel trims them


class FastBPETokenizer:
    """Same `Tokenizer` protocol and same results as `HFTokenizer`, from a cache of per-piece ids."""

    def __init__(self, reference):
        """`reference`: a memagent.tokenizer.HFTokenizer; everything we cannot vouch for goes to it."""
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
        added = [t.content for t in self._tok.get_added_tokens_decoder().values()]
        self._added = re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True)))).search if added else None
        self._boundary = re.compile(r"[\x00-\x08\x0e-\x1f\x21-\x7f][\t\n\x0b\x0c\r ]").search
        self._entries: dict[str, tuple[int, ...]] = {}
        self.stats = {"fast": 0, "learned": 0, "fallback": 0, "misses": 0, "disagreements": 0}

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
        """(pieces, entries); entries None when too much is new (learn from the reference); None: fall back."""
        pieces = self._split(text)
        if pieces is None:
            return None
        get = self._entries.get
        entries = list(map(get, pieces))
        if None not in entries:
            return pieces, entries
        missing = {p for p, e in zip(pieces, entries) if e is None}
        if len(missing) * MISS_SHARE > len(pieces):
            return pieces, None
        if not self._fill(list(missing)):
            return None
        entries = list(map(get, pieces))
        return (pieces, entries) if None not in entries else None  # None: cleared by another thread

    def _fill(self, missing: list[str]) -> bool:
        """Encode a few missing pieces alone; False if one is not a single pre-token on its own."""
        self.stats["misses"] += len(missing)
        pre = self._tok.pre_tokenizer
        for p in missing:
            split = pre.pre_tokenize_str(p)
            if len(split) != 1 or split[0][1] != (0, len(p)):
                return False
        self._make_room(len(missing))
        for p, (ids, starts) in zip(missing, self.ref.encode_batch_offsets(missing)):
            # (id, start, id, start, ...): one lookup and one flat sequence give both ids and offsets
            self._entries[p] = tuple(chain.from_iterable(zip(ids, starts)))
        return True

    def _learn(self, pieces: list[str], ids: list[int], starts: list[int]) -> None:
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
            return
        entries = self._entries
        first_seen = dict(zip(reversed(pieces), range(n - 1, -1, -1)))  # later keys overwrite: first index wins
        new = {p: i for p, i in first_seen.items() if p not in entries}
        self.stats["misses"] += len(new)
        self._make_room(len(new))
        first_l, counts_l, piece_starts_l = first.tolist(), counts.tolist(), piece_starts.tolist()
        for p, i in new.items():
            f, c, base = first_l[i], counts_l[i], piece_starts_l[i]
            entries[p] = tuple(chain.from_iterable(zip(ids[f:f + c], [s - base for s in starts[f:f + c]])))

    def _make_room(self, k: int) -> None:
        if len(self._entries) + k > CACHE_LIMIT:
            self._entries.clear()

    # ---- the Tokenizer protocol ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        got = self._lookup(text)
        if got is None:
            self.stats["fallback"] += 1
            return self.ref.encode(text)
        if got[1] is None:
            return self.encode_offsets(text)[0]
        self.stats["fast"] += 1
        return list(chain.from_iterable(got[1]))[::2]

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        return self.encode_batch_offsets([text])[0]

    def encode_batch_offsets(self, texts: list[str]) -> list[tuple[list[int], list[int]]]:
        """Known pieces are assembled here; texts with too much new go to the reference in one batch
        (both cores) and are learned from."""
        looks = [self._lookup(t) for t in texts]
        out: list = [None] * len(texts)
        hard = [i for i, got in enumerate(looks) if got is None or got[1] is None]
        if hard:
            encoded = self.ref.encode_batch_offsets([texts[i] for i in hard]) if len(hard) > 1 \
                else [self.ref.encode_offsets(texts[hard[0]])]
            for i, (ids, starts) in zip(hard, encoded):
                if looks[i] is None:
                    self.stats["fallback"] += 1
                else:
                    self.stats["learned"] += 1
                    self._learn(looks[i][0], ids, starts)
                out[i] = (ids, starts)
        for i, got in enumerate(looks):
            if out[i] is None:
                self.stats["fast"] += 1
                out[i] = _assemble(*got)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.ref.decode(ids)

    def safe_cut(self, text: str, before: int) -> int:
        return self.ref.safe_cut(text, before)


def _assemble(pieces: list[str], entries: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """Ids and token starts of a text from its pieces' cached (id, start, id, start, ...) entries."""
    import numpy as np

    n = len(pieces)
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=n)
    widths = np.fromiter(map(len, entries), dtype=np.int64, count=n)
    flat = np.fromiter(chain.from_iterable(entries), dtype=np.int64, count=int(widths.sum()))
    pairs = flat.reshape(-1, 2)
    starts = np.repeat(np.cumsum(lengths) - lengths, widths // 2) + pairs[:, 1]
    return pairs[:, 0].tolist(), starts.tolist()


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
