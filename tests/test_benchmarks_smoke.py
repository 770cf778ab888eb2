"""Each benchmark script's seconds-long version runs and writes a well-formed result file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def run(script: str, *args: str, timeout: float = 120) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def result(stem: str) -> dict:
    data = json.loads((RESULTS / f"{stem}.smoke.json").read_text())
    assert data["smoke"] is True and data["command"] and data["date"] and data["machine"]["cpu_count"]
    return data


def test_linear_smoke():
    run("bench_linear.py", "--smoke", "--fast-tokenizer", "--repeats", "1")
    data = result("linear_fasttok")
    assert data["doc_tokens"]["long"] > 5 * data["doc_tokens"]["short"] > 0
    assert data["ratio_long_vs_short"] > 0


def test_overhead_smoke():
    run("bench_overhead.py", "--smoke", "--docs", "8", "--repeats", "1")
    data = result("overhead")
    assert data["requests_per_run"] >= 8 * 5 and data["ratio_ours_vs_bare"] > 0


def test_tokenize_smoke():
    run("bench_tokenize.py", "--smoke", "--repeats", "1")
    data = result("tokenize")
    for kind, checked in data["verified"].items():  # "fast" always; "native" where a C compiler is found
        assert checked["tokens"] > 50_000 and checked["special_tokens_fallback_ok"], kind


def test_memory_smoke():
    run("bench_memory.py", "--smoke", "--small-mb", "0.5", "--big-mb", "2", "--tokenizer", "fast")
    data = result("memory_chunks_fasttok")
    assert data["big"]["tokens"] > 3 * data["small"]["tokens"] > 0
    assert not list(Path("/tmp").glob("memagent-bench-*"))  # temporary documents are deleted


@pytest.mark.parametrize("name", ["linear"])
def test_run_all_smoke_prints_table(name):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--smoke", "--only", name,
                           "--fast-tokenizer"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "per-token time long / short" in proc.stdout


def test_notes_model_refuses_planted_cells_on_llama_cpp_before_running_anything():
    """planted_fact.py has no engine switch: a llama.cpp row for it would be a torch number under a
    llama.cpp name, so the bench refuses the combination up front (argparse's exit 2, a one-line reason)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_notes_model.py"), "--engine", "llama.cpp",
                           "--models", "memagent-notes-0.5b", "--cells", "niah_single_1@4k,planted@4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "planted-fact cells run on torch only" in proc.stderr
    assert "Traceback" not in proc.stderr
