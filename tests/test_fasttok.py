"""The fast tokenizer must give the reference's ids and offsets exactly, or hand the text to it."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from memagent.tokenizer import HFTokenizer  # noqa: E402

fasttok = pytest.importorskip("memagent.fasttok")


@pytest.fixture(scope="module")
def ref(smol_tokenizer):
    return smol_tokenizer  # conftest: SmolLM2's real tokenizer, the reference


@pytest.fixture(autouse=True)
def no_short_cut(monkeypatch):
    """Short texts normally go straight to the reference; here every text takes our path."""
    monkeypatch.setattr(fasttok, "SHORT_TEXT", 0)


@pytest.fixture()
def fast(ref):
    return fasttok.FastBPETokenizer(ref)


def test_short_texts_go_to_the_reference(ref, monkeypatch):
    monkeypatch.setattr(fasttok, "SHORT_TEXT", 400)
    fast = fasttok.FastBPETokenizer(ref)
    same(ref, fast, "notes 1a2b3c4d")
    same(ref, fast, "word " * 100)
    assert fast.stats["short"] == 2 and fast.stats["fast"] == 2  # encode_offsets and encode, each


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
    assert len(fast._row) <= 500


def test_threads_share_one_cache(ref, monkeypatch):
    """The driver tokenizes several documents at once in worker threads, all through one cache (small
    here, so it is also cleared while other threads read it)."""
    from concurrent.futures import ThreadPoolExecutor

    from common import essays, hotpot_paragraphs

    monkeypatch.setattr(fasttok, "CACHE_LIMIT", 3000)
    fast = fasttok.FastBPETokenizer(ref)
    texts = [essays()[i * 20_000:(i + 1) * 20_000] for i in range(6)] + \
            [hotpot_paragraphs(120_000)[i * 20_000:(i + 1) * 20_000] for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda t: [fast.encode_offsets(t[k:k + 4000]) for k in range(0, len(t), 4000)], texts * 2))
    want = [[ref.encode_offsets(t[k:k + 4000]) for k in range(0, len(t), 4000)] for t in texts * 2]
    assert got == want


def test_random_text_property(ref):
    """Hypothesis: any text over a mixed alphabet, cold and warm, matches the reference."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    fast = fasttok.FastBPETokenizer(ref)
    alphabet = st.sampled_from(list(" \n\t'sdtlmvre") + list("abcXYZ019.,!?-—é中😀\u00a0\u0301"))

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.text(alphabet, max_size=400))
    def check(text):
        same(ref, fast, text)

    check()


def test_unseeded_table_matches_reference(ref):
    """Without the vocabulary seed every piece is learned from documents: the same results."""
    from common import essays, hotpot_paragraphs, unicode_text

    fast = fasttok.FastBPETokenizer(ref, seed=False)
    assert fast._rows_used == 0
    for t in [essays()[:60_000], hotpot_paragraphs(60_000), unicode_text(30_000, seed=5)] * 2:
        same(ref, fast, t)
    assert fast.stats["learned"] >= 1 and fast.stats["misses"] > 1000


def test_seed_cache_file_is_checked(ref, tmp_path, monkeypatch):
    """A missing or damaged seed file is recomputed (and rewritten); the seed makes unseen English hit."""
    from common import hotpot_paragraphs

    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path))
    first = fasttok.FastBPETokenizer(ref)
    path = fasttok._seed_path(ref)
    assert path.is_file() and first._rows_used > 40_000
    path.write_bytes(b"not a numpy file")
    second = fasttok.FastBPETokenizer(ref)
    assert second._rows_used == first._rows_used and path.stat().st_size > 1000
    text = hotpot_paragraphs(20_000)
    same(ref, second, text)
    unseeded = fasttok.FastBPETokenizer(ref, seed=False)
    same(ref, unseeded, text)
    assert second.stats["misses"] < unseeded.stats["misses"] / 2
