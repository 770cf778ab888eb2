"""The C byte-level BPE (memagent/native/bpe.c): the reference's ids and offsets at ~20x its speed.

Why compile at first use rather than at install: memagent installs as pure Python (editable or from a
wheel) and must keep working on a machine with no C compiler. Here the source is compiled once per
(source, Python, platform) into the cache folder with whatever `cc` the machine has, and loaded from
there (Linux and macOS); without a compiler, on Windows, or with MEMAGENT_NATIVE=0, `NativeBPETokenizer.wrap` returns None and
memagent.fasttok's numpy path is used instead. The build takes ~2 s and only the standard C library.

Why it stays exact: it accepts only the tokenizer shape fasttok accepts (plain GPT-2 ByteLevel split, a
deterministic BPE with no prefixes, suffixes or byte fallback), reproduces the Rust library's merge
order including its tie-breaking, and gives back to the reference any text with an added token
(`<|im_start|>` ...) or a character whose Unicode class the two regex engines disagree on.
`tests/test_nativebpe.py` compares it id-for-id and offset-for-offset with the reference.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from .fasttok import (CHECKED_VERSIONS, UNICODE_MISMATCH, Unsupported, _byte_decoder, added_token_search,
                      check_structure, file_identity)

SOURCE = Path(__file__).resolve().parent / "native" / "bpe.c"
MODULE = "memagent_bpe"  # must match PyInit_memagent_bpe in the C file
LETTER, NUMBER, SPACE, UNSAFE = 1, 2, 3, 4  # the C file's enum; 0 is "other"
N_CODEPOINTS = 0x110000

build_error: str | None = None  # why the last build failed (shown by benchmarks and tests)


@functools.cache
def load_module():
    """The compiled module, building it if needed; None when it cannot be built or is turned off."""
    global build_error
    if os.environ.get("MEMAGENT_NATIVE", "1") == "0":
        build_error = "turned off by MEMAGENT_NATIVE=0"
        return None
    from .models import cache_root

    if sys.platform == "win32":
        build_error = "not built on Windows (the numpy path is used)"
        return None
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    include = sysconfig.get_paths()["include"]
    try:
        key = hashlib.sha256(SOURCE.read_bytes() + f"|{sys.version}|{platform.machine()}|{include}".encode())
        path = cache_root() / "native" / f"{MODULE}-{key.hexdigest()[:16]}{suffix}"
        if not path.exists():
            build_error = _build(path, include)
            if build_error:
                return None
    except OSError as e:  # the source not shipped, or a cache folder we cannot write
        build_error = f"{type(e).__name__}: {e}"
        return None
    try:
        spec = importlib.util.spec_from_file_location(MODULE, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:  # a half-written or foreign file: rebuild next time
        build_error = f"cannot load {path}: {e}"
        try:
            path.unlink(missing_ok=True)  # rebuilt next time
        except OSError:
            pass
        return None
    build_error = None
    return module


def _build(path: Path, include: str) -> str | None:
    """Compile SOURCE to `path`; the error text on failure, None on success."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return "no C compiler found (set CC, or install gcc)"
    if not Path(include, "Python.h").exists():
        return f"no Python.h in {include} (install the Python development headers)"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
    link = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []  # symbols from the interpreter
    cmd = [*cc.split(), "-O3", "-shared", "-fPIC", *link, f"-I{include}", str(SOURCE), "-o", str(tmp)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(cmd)}: {e}"
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}"
    os.replace(tmp, path)  # atomic: a concurrent build by another process finds a whole file or none
    return None


def class_table() -> bytes | None:
    """One byte per codepoint: its class in the GPT-2 split (see the C file), from the `regex` module
    whose classes tests/test_fasttok.py verified against the Rust library's for CHECKED_VERSIONS; the
    codepoints where they disagree, and lone surrogates, are UNSAFE. None (ASCII only) for other versions."""
    import regex
    import tokenizers

    if (regex.__version__, tokenizers.__version__) != CHECKED_VERSIONS:
        return None
    return _class_table_cached()


@functools.cache
def _class_table_cached() -> bytes:
    import numpy as np

    from .models import cache_root

    key = hashlib.sha256(f"{CHECKED_VERSIONS}|{UNICODE_MISMATCH}".encode()).hexdigest()[:16]
    path = cache_root() / "native" / f"classes-{key}.npy"
    try:
        table = np.load(path)
        if table.shape == (N_CODEPOINTS,) and table.dtype == np.uint8:
            return table.tobytes()
    except (OSError, ValueError):
        pass
    import regex

    every = "".join(map(chr, range(N_CODEPOINTS)))  # position == codepoint
    table = np.zeros(N_CODEPOINTS, dtype=np.uint8)
    for value, pattern in ((LETTER, r"\p{L}+"), (NUMBER, r"\p{N}+"), (SPACE, r"\s+")):
        for m in regex.finditer(pattern, every):
            table[m.start():m.end()] = value
    for a, b in [*UNICODE_MISMATCH, (0xD800, 0xDFFF)]:
        table[a:b + 1] = UNSAFE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, table)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: computed again next time (~1 s)
    return table.tobytes()


def bpe_tables(tok) -> tuple[bytes, bytes]:
    """(the 256 bytes' token ids, (left, right, merged) id triples in merge order) as int32 bytes.

    SmolLM2's vocabulary has no token for 21 bytes (a few control characters, bytes UTF-8 never uses);
    the reference silently drops them (there is no unknown token), and so does the C encoder."""
    import numpy as np

    model = json.loads(tok.to_str())["model"]
    vocab, merges = model["vocab"], model["merges"]
    char_of = {b: c for c, b in _byte_decoder().items()}
    try:
        byte_ids = [vocab.get(char_of[b], -1) for b in range(256)]  # -1: dropped, as the reference does
        pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
        triples = [(vocab[a], vocab[b], vocab[a + b]) for a, b in pairs]
    except (KeyError, ValueError) as e:
        raise Unsupported(f"vocabulary lacks a byte or a merge result: {e}") from None
    return (np.asarray(byte_ids, dtype=np.int32).tobytes(),
            np.asarray(triples, dtype=np.int32).reshape(-1, 3).tobytes())


_TABLES: dict[str, tuple[bytes, bytes]] = {}


def _tables_of(reference) -> tuple[bytes, bytes]:
    """bpe_tables, kept per tokenizer file for the process: serialising and parsing the tokenizer
    costs ~0.2 s, and every reader, eval job and benchmark run builds its own tokenizer object."""
    ident = file_identity(reference)
    if ident is None:
        return bpe_tables(reference._tok)  # not from a file: nothing stable to key it by
    if ident not in _TABLES:
        _TABLES[ident] = bpe_tables(reference._tok)
    return _TABLES[ident]


def check_model(tok) -> None:
    """Raise Unsupported unless the BPE model has none of the options the C encoder leaves out."""
    check_structure(tok)
    m = tok.model
    if m.continuing_subword_prefix or m.end_of_word_suffix or m.byte_fallback or m.ignore_merges:
        raise Unsupported("the BPE model uses prefixes, suffixes, byte fallback or ignore_merges")


class NativeBPETokenizer:
    """Same `Tokenizer` protocol and same results as `HFTokenizer`, from the C encoder.

    The encoder releases the GIL, so callers in threads (the eval harness, a user's pool) run it in
    parallel. The driver still calls it inline (`tokenize_in_thread = False`): a batch of ~32K tokens
    takes ~3 ms here, about what handing it to a worker thread and getting the GIL back costs, and
    measured with 256 concurrent documents inline was faster (0.66 vs 0.74 s, median of 6)."""

    tokenize_in_thread = False

    def __init__(self, reference, max_entries: int = 1 << 20):
        module = load_module()
        if module is None:
            raise Unsupported(f"the C encoder is not available: {build_error}")
        check_model(reference._tok)
        self.ref, self.name = reference, reference.name
        self._enc = module.Encoder(*_tables_of(reference), class_table(), max_entries)
        self._added = added_token_search(reference._tok)
        self.stats = {"native": 0, "fallback": 0}

    @classmethod
    def wrap(cls, reference):
        """A NativeBPETokenizer for `reference`, or None when the shape or the machine does not allow it."""
        try:
            return cls(reference)
        except (Unsupported, AttributeError, ImportError):
            return None

    def _encode(self, text: str):
        """(int32 ids, int64 starts) as numpy arrays, or None when the reference must encode `text`."""
        import numpy as np

        if self._added is not None and self._added(text):
            got = None
        else:
            got = self._enc.encode(text)
        if got is None:
            self.stats["fallback"] += 1
            return None
        self.stats["native"] += 1
        return np.frombuffer(got[0], dtype=np.int32), np.frombuffer(got[1], dtype=np.int64)

    def encode(self, text: str) -> list[int]:
        got = self._encode(text)
        return got[0].tolist() if got is not None else self.ref.encode(text)

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        got = self._encode(text)
        return (got[0].tolist(), got[1].tolist()) if got is not None else self.ref.encode_offsets(text)

    def encode_batch_offsets(self, texts: list[str]) -> list[tuple[list[int], list[int]]]:
        return [self.encode_offsets(t) for t in texts]

    def encode_batch_starts(self, texts: list[str]) -> list:
        """Token start offsets only, as numpy arrays: all the chunker needs."""
        import numpy as np

        out = []
        for t in texts:
            got = self._encode(t)
            out.append(got[1] if got is not None else np.asarray(self.ref.encode_offsets(t)[1], dtype=np.int64))
        return out

    def decode(self, ids) -> str:
        return self.ref.decode(ids)

    def safe_cut(self, text: str, before: int) -> int:
        """The reference's choice of cut, from our split of the window (same pieces, no Rust call)."""
        from .tokenizer import SAFE_WINDOW, choose_cut

        lo = max(0, before - SAFE_WINDOW)
        window = text[lo:before]
        starts = None if self._added is not None and self._added(window) else self._enc.piece_starts(window)
        if starts is None:
            return self.ref.safe_cut(text, before)
        return lo + choose_cut(window, starts)

    def cache_stats(self) -> dict:
        return self._enc.stats()
