"""The C encoder must give the reference's ids and offsets exactly, or hand the text to it."""
from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from memagent import nativebpe  # noqa: E402


@pytest.fixture(scope="module")
def ref(smol_tokenizer):
    return smol_tokenizer  # conftest: SmolLM2's real tokenizer, the reference


@pytest.fixture()
def native(ref):
    if nativebpe.load_module() is None:
        pytest.skip(f"no C encoder on this machine: {nativebpe.build_error}")
    return nativebpe.NativeBPETokenizer(ref)


def same(ref, tok, text):
    assert tok.encode_offsets(text) == ref.encode_offsets(text)
    assert tok.encode(text) == ref.encode(text)


def test_corpus_cold_then_warm(ref, native):
    from common import essays, hotpot_paragraphs, unicode_text

    texts = [essays()[:200_000], hotpot_paragraphs(200_000), unicode_text(80_000, seed=3)]
    for _ in range(2):  # first from merges, then from the piece cache
        for t in texts:
            same(ref, native, t)
    stats = native.cache_stats()
    assert stats["misses"] > 1000 and stats["hits"] > 10 * stats["misses"]
    assert native.stats["fallback"] == 0
    batch = [texts[0][:5000], "Entirely new words: zyxquop flurbination 12345678901.", texts[2][-3000:]]
    assert native.encode_batch_offsets(batch) == ref.encode_batch_offsets(batch)
    starts = native.encode_batch_starts(batch)
    assert [s.tolist() for s in starts] == [o for _, o in ref.encode_batch_offsets(batch)]


@pytest.mark.parametrize("text", [
    "", " ", "\n", "a", "'", "'s", " 's", "  leading and trailing  ", "tabs\tand\r\nCRLF\r\n\r\n", "x" * 5000,
    " " * 3000 + "y", "\n" * 400 + "z", "-" * 2000, "1" * 999, "ab" * 600,
    "it's they're we've I'm you'll he'd 'S 'sx ''s '' 're'", "1234567890 3.14159 -42 1e10 ½ ² ٣ १२",
    "naïve café — “quotes” ‘single’ …", "日本語のテキスト、中文文本。한국어 텍스트", "👨‍👩‍👧 👍🏽 🇫🇷 e\u0301",
    "ctrl\x00\x01\x04\x06\x13\x14\x16\x1c\x1d\x1e\x1f\x7f\x85\u2028\u00a0\u3000end",  # \x04 etc.: dropped
    "\U00040000\U000b0000 plane-4 lead bytes (0xF1, 0xF2) the vocabulary lacks",
    "<|im_start|>user\nhi<|im_end|>", "mixed <|endoftext|> special", "<repo_name> and <|not_special|>",
    "new \U0003D000 char", "\u0558 armenian", "\u00a0\u00a0x \u00a0 y\u2003\u2003\n",
])
def test_edge_cases(ref, native, text):
    same(ref, native, text)
    same(ref, native, text)  # the second time from the cache


def test_unsafe_text_falls_back(ref, native):
    native.encode_offsets("a <|im_start|> b")  # an added token: the reference cuts it out first
    native.encode_offsets("x \U0003D000 y")  # assigned after Unicode 14: the Rust regex does not know it
    assert native.stats["fallback"] == 2
    with pytest.raises(TypeError):  # a lone surrogate: the reference's own error, not a wrong answer
        native.encode("a\ud800b")


def test_random_soup(ref, native):
    rng = random.Random(11)
    alphabet = [chr(c) for c in range(0, 128)] + list("éßøœπжשع中ア한\u00a0\u2003\u3000\u0301①٣😀\x85")
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3000)))
        same(ref, native, text)


def test_random_text_property(ref, native):
    """Hypothesis over an alphabet built to hit contractions, space runs and class changes."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    alphabet = st.sampled_from(list(" \n\t\r'sdtlmvreS") + list("abcXYZ019.,!?-—é中😀\u00a0\u0301\x04\x13\U00040000\U000b0123"))

    @hypothesis.settings(max_examples=400, deadline=None)
    @hypothesis.given(st.text(alphabet, max_size=300))
    def check(text):
        same(ref, native, text)

    check()


def test_small_cache_is_cleared_and_stays_exact(ref):
    if nativebpe.load_module() is None:
        pytest.skip(nativebpe.build_error)
    from common import hotpot_paragraphs

    tok = nativebpe.NativeBPETokenizer(ref, max_entries=300)
    text = hotpot_paragraphs(100_000)
    for _ in range(2):
        same(ref, tok, text)
    stats = tok.cache_stats()
    assert stats["clears"] > 5 and stats["entries"] <= 300


def test_threads_share_one_encoder(ref):
    """The encoder releases the GIL; its cache must not change under a concurrent reader."""
    if nativebpe.load_module() is None:
        pytest.skip(nativebpe.build_error)
    from common import essays, hotpot_paragraphs, unicode_text

    tok = nativebpe.NativeBPETokenizer(ref, max_entries=2000)  # small: clears happen mid-run
    texts = [essays()[i * 30_000:(i + 1) * 30_000] for i in range(3)] + [hotpot_paragraphs(30_000),
                                                                          unicode_text(20_000, seed=9)]
    want = [ref.encode_offsets(t) for t in texts]
    errors = []

    def work(k):
        for r in range(4):
            i = (k + r) % len(texts)
            if tok.encode_offsets(texts[i]) != want[i]:
                errors.append(i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_safe_cut_matches_reference(ref, native):
    from common import essays, unicode_text

    for text in (essays()[:300_000], unicode_text(100_000, seed=4)):
        for before in range(5000, len(text), 37_001):
            assert native.safe_cut(text, before) == ref.safe_cut(text, before)
    assert native.safe_cut("x <|im_end|> y " * 400, 5000) == ref.safe_cut("x <|im_end|> y " * 400, 5000)


def test_chunks_identical_to_reference(ref, native):
    from common import hotpot_paragraphs

    from memagent.chunking import iter_chunks

    text = hotpot_paragraphs(400_000)
    want = [(c.text, c.n_tokens) for c in iter_chunks(text, ref, 777)]
    assert [(c.text, c.n_tokens) for c in iter_chunks(text, native, 777)] == want


def test_unchecked_versions_take_ascii_only(ref, native, monkeypatch):
    """With other `regex`/`tokenizers` versions the Unicode classes are unverified: non-ASCII text
    goes to the reference, ASCII text still takes the C path."""
    monkeypatch.setattr(nativebpe, "CHECKED_VERSIONS", ("0", "0"))
    tok = nativebpe.NativeBPETokenizer(ref)
    same(ref, tok, "plain ascii text, 123 and more")
    same(ref, tok, "naïve café")
    assert tok.stats == {"native": 2, "fallback": 2}


def test_without_a_compiler_the_numpy_path_is_used(ref, tmp_path, monkeypatch):
    from memagent.backends import fast
    from memagent.fasttok import FastBPETokenizer

    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    nativebpe.load_module.cache_clear()
    try:
        assert nativebpe.load_module() is None and "no-such-cc" in nativebpe.build_error
        assert nativebpe.NativeBPETokenizer.wrap(ref) is None
        assert isinstance(fast(ref), FastBPETokenizer)
    finally:
        nativebpe.load_module.cache_clear()
        monkeypatch.undo()


def test_off_switch(ref, monkeypatch):
    from memagent.backends import fast

    monkeypatch.setenv("MEMAGENT_NATIVE", "0")
    nativebpe.load_module.cache_clear()
    try:
        assert type(fast(ref)).__name__ == "FastBPETokenizer"
    finally:
        nativebpe.load_module.cache_clear()
        monkeypatch.undo()
    monkeypatch.setenv("MEMAGENT_FAST_TOKENIZER", "0")
    assert fast(ref) is ref


def test_fresh_build_loads(tmp_path, monkeypatch):
    """The compile step itself, into an empty cache (what a new machine does once)."""
    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path))
    nativebpe.load_module.cache_clear()
    try:
        module = nativebpe.load_module()
        if module is None:
            pytest.skip(nativebpe.build_error)
        assert list((tmp_path / "native").glob("memagent_bpe-*")) and hasattr(module, "Encoder")
    finally:
        nativebpe.load_module.cache_clear()


def test_unwritable_cache_falls_back(ref, tmp_path, monkeypatch):
    """A cache folder that cannot be created is a reason to use the numpy path, not a crash."""
    from memagent.backends import fast
    from memagent.fasttok import FastBPETokenizer

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MEMAGENT_CACHE", str(blocker / "cache"))
    nativebpe.load_module.cache_clear()
    try:
        assert nativebpe.load_module() is None and "Error" in nativebpe.build_error
        assert isinstance(fast(ref), FastBPETokenizer)
    finally:
        nativebpe.load_module.cache_clear()
        monkeypatch.undo()
