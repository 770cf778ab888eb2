"""The fast tokenizer must give the reference's ids and offsets exactly, or hand the text to it."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from memagent import models  # noqa: E402
from memagent.tokenizer import HFTokenizer  # noqa: E402

fasttok = pytest.importorskip("memagent.fasttok")


@pytest.fixture(scope="module")
def ref():
    path = models.tokenizer_path("smollm2-135m")
    if not Path(path).is_file():
        pytest.skip("SmolLM2 tokenizer not cached")
    return HFTokenizer.from_file(path)


@pytest.fixture()
def fast(ref):
    return fasttok.FastBPETokenizer(ref)


def same(ref, fast, text):
    assert fast.encode_offsets(text) == ref.encode_offsets(text)
    assert fast.encode(text) == ref.encode(text)


def test_corpus_cold_then_warm(ref, fast):
    from common import essays, hotpot_paragraphs, unicode_text

    texts = [essays()[:120_000], hotpot_paragraphs(120_000), unicode_text(60_000, seed=3)]
    for t in texts:  # cold: learned from the reference
        same(ref, fast, t)
    for t in texts:  # warm: assembled from the cache
        same(ref, fast, t)
    assert fast.stats["fast"] >= 3 and fast.stats["learned"] >= 1 and fast.stats["disagreements"] == 0
    # a batch mixing known and new text
    batch = [texts[0][:5000], "Entirely new words: zyxquop flurbination 12345678901.", texts[2][-3000:]]
    assert fast.encode_batch_offsets(batch) == ref.encode_batch_offsets(batch)


def test_few_misses_are_filled_piece_by_piece(ref, fast):
    from common import essays

    base = essays()[:50_000]
    same(ref, fast, base)
    learned = fast.stats["learned"]
    same(ref, fast, base + " Qwertyzzz unseenword 98765.")
    assert fast.stats["learned"] == learned and fast.stats["misses"] > 0


@pytest.mark.parametrize("text", [
    "", " ", "\n", "a", "  leading and trailing  ", "tabs\tand\r\nCRLF\r\n\r\n", "x" * 5000, " " * 3000 + "y",
    "it's they're we've I'm you'll he'd 'S 'sx ''s", "1234567890 3.14159 -42 1e10 ½ ² ٣ १२",
    "naïve café — “quotes” ‘single’ …", "日本語のテキスト、中文文本。한국어 텍스트", "👨‍👩‍👧 👍🏽 🇫🇷 e\u0301",
    "ctrl\x00\x01\x1c\x1d\x1e\x1f\x7f\x85\u2028\u00a0\u3000end", "<|im_start|>user\nhi<|im_end|>",
    "mixed <|endoftext|> special", "<repo_name> and <|not_special|>", "new \U0003D000 char", "\u0558 armenian",
])
def test_edge_cases(ref, fast, text):
    same(ref, fast, text)


def test_unsafe_text_falls_back(ref, fast):
    fast.encode_offsets("a <|im_start|> b")
    fast.encode_offsets("x \U0003D000 y")  # assigned after Unicode 14: the Rust regex does not know it
    assert fast.stats["fallback"] == 2


def test_random_ascii_and_unicode_soup(ref, fast):
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0, 128)] + list("éßøœπжשع中ア한\u00a0\u2003\u3000\u0301①٣😀")
    for _ in range(30):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3000)))
        same(ref, fast, text)
        same(ref, fast, text)  # the second time from the cache


def test_ascii_classes_match_rust(ref):
    """Each ASCII character next to letters, digits, spaces, punctuation: same split as the Rust one."""
    import re

    split = re.compile(fasttok.ASCII_PATTERN)
    ctx = ["a{c}", "1{c}", " {c}", "!{c}", "{c}a", "{c}1", "{c} ", "{c}!", "\n{c}\n", "{c}{c}", "'{c}s", "{c}'ll"]
    s = "|".join("".join(x.format(c=chr(c)) for x in ctx) for c in range(128))
    assert [o for _, o in ref._tok.pre_tokenizer.pre_tokenize_str(s)] == [m.span() for m in split.finditer(s)]


def test_unicode_table_matches_installed_versions(ref):
    """UNICODE_MISMATCH is exactly where `regex` and the Rust split disagree (BMP; planes 1-3 sampled)."""
    import regex
    import tokenizers

    if (regex.__version__, tokenizers.__version__) != fasttok.CHECKED_VERSIONS:
        pytest.skip("other versions installed: the fast path leaves non-ASCII text to the reference")
    table = fasttok.UNICODE_MISMATCH

    def expected(lo, hi):
        return [(max(a, lo), min(b, hi - 1)) for a, b in table if b >= lo and a < hi]

    assert fasttok.verify_unicode_classes(ref._tok, 0, 0x10000) == expected(0, 0x10000)
    for lo in (0x10000, 0x1D000, 0x1E600, 0x1F300, 0x20000, 0x2B700):
        assert fasttok.verify_unicode_classes(ref._tok, lo, lo + 0x1000) == expected(lo, lo + 0x1000)


def test_unsupported_tokenizer_is_left_alone():
    from tokenizers import Tokenizer, models as tmodels, pre_tokenizers

    tok = Tokenizer(tmodels.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = HFTokenizer(tok)
    assert fasttok.FastBPETokenizer.wrap(wrapped) is wrapped


def test_cache_is_bounded(ref, monkeypatch):
    monkeypatch.setattr(fasttok, "CACHE_LIMIT", 500)
    fast = fasttok.FastBPETokenizer(ref)
    rng = random.Random(1)
    for _ in range(5):
        text = " ".join(f"w{rng.randrange(10**9)}" for _ in range(400))
        same(ref, fast, text)
    assert len(fast._entries) <= 500
