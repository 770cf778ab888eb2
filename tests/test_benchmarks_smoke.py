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


def test_notes_model_refuses_an_hf_folder_on_llama_cpp_before_running_anything(tmp_path):
    """llama.cpp reads a GGUF: a merged adapter folder under runs/ has none, so the bench refuses the
    combination up front (argparse's exit 2, a one-line reason) instead of failing cells one by one."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_notes_model.py"), "--engine", "llama.cpp",
                           "--models", f"memagent-notes-0.5b,{tmp_path}", "--cells", "planted@4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "an HF folder runs on --engine torch" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_planted_fact_reads_on_llama_cpp_and_says_so(tmp_path):
    """A real read on the llama.cpp engine (SmolLM2-135M Q4 GGUF, one 1-chunk document): the result names
    its engine and backend, so a llama.cpp number is never mistaken for a torch one."""
    pytest.importorskip("xllamacpp")
    out = tmp_path / "planted.json"
    run("planted_fact.py", "--engine", "llama.cpp", "--model", "smollm2-135m", "--chunks", "1", "--docs", "1",
        "--chunk-tokens", "128", "--memory-tokens", "32", "--threads", "2", "--out", str(out), timeout=300)
    data = json.loads(out.read_text())
    assert data["engine"] == "llama.cpp" and "llama" in data["backend"].lower()
    (r,) = data["runs"]
    assert r["chunks"] == 1 and r["docs"] == 1 and r["samples"][0]["error"] is None
    assert r["samples"][0]["calls"] == 2  # one memory update, one answer


def test_planted_fact_takes_the_skip_gate(tmp_path):
    """`--skip-update lexical` reaches the reader: chunks that never name the vault are passed without a call,
    the fact's chunk is still read (the scripted backend keeps "access code" lines), and the run says so."""
    for gate in ("off", "lexical"):
        out = tmp_path / f"{gate}.json"
        run("planted_fact.py", "--smoke", "--chunks", "4", "--skip-update", gate, "--out", str(out))
        data = json.loads(out.read_text())
        (r,) = data["runs"]
        assert data["skip_update"] == gate and r["accuracy"] == 1.0, r
        calls = sum(x["calls"] for x in r["samples"])
        if gate == "off":
            assert r["skipped_chunks"] == 0 and calls == 2 * 5
        else:
            assert r["skipped_chunks"] > 0 and calls == 2 * 5 - r["skipped_chunks"]


def test_planted_fact_refuses_an_hf_folder_on_llama_cpp(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "planted_fact.py"), "--engine", "llama.cpp",
                           "--model", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "an HF folder runs on --engine torch" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_notes_model_rows_keep_engines_and_read_settings_apart(monkeypatch):
    """A number read with other weights or other chunk / memory sizes must land in its own row: the default
    row of a model is 512 / 64 on torch, and only that one."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_notes_model import row_key, settings

    assert row_key("memagent-notes-0.5b", "torch") == "memagent-notes-0.5b"
    assert row_key("runs/notes-qwen0.5b", "torch", 512, 64) == "notes-qwen0.5b"
    assert row_key("qwen2.5-coder-0.5b", "llama.cpp") == "qwen2.5-coder-0.5b+llama.cpp"
    assert row_key("qwen2.5-coder-0.5b", "llama.cpp", 1024, 128) == "qwen2.5-coder-0.5b+llama.cpp@1024-128"
    assert row_key("smollm2-135m", "torch", 512, 128) == "smollm2-135m@512-128"
    assert settings(1024, 128) == ["--template", "notes", "--chunk-tokens", "1024", "--memory-tokens", "128"]
    # an adapter read before shipping is named by its run (final/ is every run's folder name)
    assert row_key("qwen2.5-coder-0.5b", "llama.cpp", adapter="runs/notes-qwen0.5b-rft/final") == \
        "qwen2.5-coder-0.5b+notes-qwen0.5b-rft+llama.cpp"
    assert row_key("qwen2.5-coder-0.5b", "torch", adapter="some/adapter-dir") == "qwen2.5-coder-0.5b+adapter-dir"
    # fresh documents (--seed) are another row: a fixed-seed number and a fresh-seed one never share a cell
    assert row_key("qwen2.5-coder-0.5b", "llama.cpp", adapter="runs/x/final", seed=43) == \
        "qwen2.5-coder-0.5b+x+llama.cpp+seed43"
    # chunks cut at sentence ends (--chunk-snap) are other chunks: another row
    assert row_key("qwen2.5-coder-0.5b", "llama.cpp", adapter="runs/x/final", snap=64) == \
        "qwen2.5-coder-0.5b+x+llama.cpp+snap64"


def test_planted_fact_seed_draws_other_documents(smol_tokenizer, monkeypatch):
    """--seed must change the documents (facts and passages), or a 'fresh-seed' check would reread the
    measuring documents; the same seed must give the same documents."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from planted_fact import make_docs

    a = make_docs(smol_tokenizer, 1, 128, 3, "test")
    assert make_docs(smol_tokenizer, 1, 128, 3, "test", 0) == a
    b = make_docs(smol_tokenizer, 1, 128, 3, "test", 43)
    assert all(x["question"] != y["question"] or x["doc"] != y["doc"] for x, y in zip(a, b))
    assert [x["depth"] for x in a] == [x["depth"] for x in b]  # same depths, other facts and passages


def test_notes_model_refuses_a_seed_for_the_demo():
    """The demo is one fixed document: a '+seedN' demo row would claim fresh documents it never read."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_notes_model.py"), "--cells", "demo",
                           "--seed", "43"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "run it without --seed" in proc.stderr
    assert "Traceback" not in proc.stderr


def _row(model, task, length, acc, n=8, gate="off", s=10.0):
    return {"model": model, "gate": gate, "task": task, "length": length, "n": n, "accuracy": acc,
            "seconds_per_doc": s}


def test_notes_grid_lays_out_two_rows_and_never_calls_an_unmeasured_goal_met(tmp_path):
    """The grid is what the README quotes: a cell must show both models' counts, an unmeasured cell a dash,
    one measured miss must make a goal 'not met' even while other cells are missing, and a goal is 'met'
    only when every one of its cells is measured and good."""
    rows = [_row("base", "niah_multikey_2", 16384, 0.0, s=2351), _row("ours", "niah_multikey_2", 16384, 62.5, s=883),
            _row("ours", "niah_single_1", 16384, 100.0), _row("base", "qa_1", 4096, 25.0),
            _row("ours", "qa_1", 4096, 50.0), _row("base", "qa_1", 16384, 25.0), _row("ours", "qa_1", 16384, 37.5),
            _row("ours", "niah_single_1", 16384, 87.5, gate="lexical", s=40)]
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"rows": rows}))
    md, png = tmp_path / "g.md", tmp_path / "g.png"
    run("notes_grid.py", "--results", str(results), "--before", "base", "--after", "ours", "--md", str(md),
        "--png", str(png))
    text = md.read_text()
    assert "16K: 0/8 → **5/8** (2351 → 883 s)" in text
    assert "16K: — → **7/8** (— → 40 s)" in text  # the gate's row, the base unmeasured there
    assert "| niah_single_2 |" not in text  # a task with no cell at all is left out, not drawn empty
    verdicts = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in text.splitlines()
                if line.startswith("| NIAH") or line.startswith("| multi") or line.startswith("| qa_1 above")}
    assert verdicts["NIAH ≥ 90% at 16K"] == "not met"  # multikey 62.5% decides it, single_2/3 unmeasured
    assert verdicts["NIAH ≥ 80% at 64K"] == "not all measured"
    assert verdicts["multi-key ≥ +30 points over the base"] == "not all measured"  # +62 but 5 cells missing
    # a trained score under 30% fails the +30 goal even where the base is not measured; 0% is above no base
    rows.append(_row("ours", "niah_multikey_1", 16384, 0.0))
    rows = [r for r in rows if not (r["model"] == "base" and r["task"] == "qa_1" and r["length"] == 16384)]
    rows.append(_row("ours", "qa_1", 16384, 0.0))
    results.write_text(json.dumps({"rows": rows}))
    run("notes_grid.py", "--results", str(results), "--before", "base", "--after", "ours", "--md", str(md),
        "--no-plot")
    again = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in md.read_text().splitlines()
             if line.startswith("| multi") or line.startswith("| qa_1 above")}
    assert again["multi-key ≥ +30 points over the base"] == "not met"
    assert again["qa_1 above the base"] == "not met"  # qa_1@16K: 0% with the base unmeasured
    assert verdicts["qa_1 above the base"] == "met"
    assert png.stat().st_size > 10_000
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "notes_grid.py"), "--results", str(results),
                           "--before", "base", "--after", "nobody"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no row named 'nobody'" in proc.stderr and "Traceback" not in proc.stderr


def test_cells_keep_which_documents_were_right_and_the_grid_pairs_them(tmp_path):
    """The per-document lists come from samples.jsonl (a resumed document's last record wins, a torn last line
    is ignored, a failed one is read and wrong, partial credit gives no list), and the grid's paired table counts the documents
    only one row got right, with the exact sign test worked by hand: 0 of 5 discordant documents is
    2 / 2**5 = 0.0625, 1 of 8 is 2 * (1 + 8) / 2**8 = 0.0703. Rows of other documents are not paired."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_notes_model
    import notes_grid

    samples = tmp_path / "samples.jsonl"
    recs = [{"task": "t", "length": 4096, "index": 0, "correct": 0.0},
            {"task": "t", "length": 4096, "index": 1, "correct": 1.0},
            {"task": "t", "length": 4096, "index": 0, "correct": 1.0},  # resumed: the later record is the result
            {"task": "t", "length": 4096, "index": 2, "correct": 0.0, "error": "boom"},
            {"task": "t", "length": 16384, "index": 5, "correct": 1.0}]
    recs = [r | {"id": f"t/{r['length']}/{r['index']}"} for r in recs]
    samples.write_text("\n".join(map(json.dumps, recs)) + "\n" + '{"id": "t/4096/1", "cor')  # a run still writing
    assert bench_notes_model.documents(samples, "t", 4096, 3) == {"right_docs": [0, 1]}
    # a cell being grown: its summary still says n = 2, so the third read waits for the next summary
    assert bench_notes_model.documents(samples, "t", 4096, 2) == {"right_docs": [0, 1]}
    assert bench_notes_model.documents(samples, "t", 4096, 4) == {}  # a document missing: no lists
    samples.write_text(json.dumps({"id": "t/4096/0", "task": "t", "length": 4096, "index": 0, "correct": 0.5}) + "\n")
    assert bench_notes_model.documents(samples, "t", 4096, 1) == {}
    assert bench_notes_model.documents(tmp_path / "none.jsonl", "t", 4096, 1) == {}

    assert notes_grid.sign_test(0, 5) == 0.0625
    assert abs(notes_grid.sign_test(1, 8) - 0.0703125) < 1e-12 and notes_grid.sign_test(7, 8) == notes_grid.sign_test(1, 8)
    assert notes_grid.sign_test(0, 0) == 1.0 and notes_grid.sign_test(2, 4) == 1.0
    base = _row("base", "niah_multikey_1", 16384, 12.5) | {"right_docs": [3]}
    ours = _row("ours", "niah_multikey_1", 16384, 75.0) | {"right_docs": [0, 1, 2, 4, 5, 6]}
    assert notes_grid.paired(base, ours) == (8, 6, 1)
    # grown to 32 for one row only: paired on the 8 documents both read, the later ones left out
    assert notes_grid.paired(base, ours | {"n": 32, "right_docs": [0, 1, 2, 4, 5, 6, 9, 30]}) == (8, 6, 1)
    assert notes_grid.paired(base | {"n": 32, "right_docs": [3, 8, 31]}, ours) == (8, 6, 1)
    assert notes_grid.paired(base, _row("ours", "niah_multikey_1", 16384, 75.0)) is None
    table = notes_grid.paired_table([base, ours], "base", "ours")
    assert "| niah_multikey_1@16K | off | 8 | 6 | 1 | 0.12 |" in table  # 2 * (1 + 7) / 2**7 = 0.125
    assert notes_grid.paired_table([base, _row("ours", "niah_multikey_1", 16384, 75.0)], "base", "ours") == ""


def test_best_untrained_goal_needs_more_accuracy_and_at_most_1_5x_the_seconds():
    """The issue's last goal, cell by cell: the yardstick is the most accurate untrained option (the faster of
    a tie), a trained row no more accurate misses at once, and a too-slow or passing cell stays undecided
    while an option is unmeasured (a more accurate one would become the yardstick). Planted facts are ~8K
    tokens: 16 chunks at 512, 8 at the @1024-128 row's chunk, gate or no gate."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import notes_grid as grid
    opts = [("small", "off"), ("small", "lexical"), ("big@1024-128", "off")]
    cells = [("planted_fact", "16 chunks", "8 chunks"), ("niah_single_1", "16384", "16384"),
             ("niah_multikey_2", "16384", "16384")]

    def rows_with(trained, small_lex_single=(75.0, 90.0), small_lex_planted=True):
        rows = []
        for task, at512, at1024 in cells:
            rows.append(_row("small", task, at512, 25.0, s=100.0))
            rows.append(_row("big@1024-128", task, at1024, 50.0, s=300.0))
            if task != "planted_fact" or small_lex_planted:
                acc, s = {"niah_single_1": small_lex_single, "planted_fact": (25.0, 20.0)}.get(task, (0.0, 60.0))
                rows.append(_row("small", task, at512, acc, gate="lexical", s=s))
            acc, s = trained[task]
            rows.append(_row("ours", task, at512, acc, s=s))
        return rows

    # planted: beats big (50% in 300 s) at 1.0x; single_1: beats small+gate (75% in 90 s) at 1.5x exactly;
    # multikey_2: beats big (50% in 300 s, more accurate than small+gate's 0%) at 0.5x
    good = {"planted_fact": (87.5, 300.0), "niah_single_1": (100.0, 135.0), "niah_multikey_2": (62.5, 150.0)}
    verdict, evidence = grid.beats_best_untrained(rows_with(good), "ours", "off", opts)
    assert verdict == "met", evidence
    assert evidence[1] == "niah_single_1@16K: 8/8 in 135 s vs small lexical 6/8 in 90 s (1.50x)"
    assert "big@1024-128 off 4/8 in 300 s" in evidence[0]  # the 8-chunk row stands for the 1024 chunk
    slow = dict(good, niah_single_1=(100.0, 136.0))
    assert grid.beats_best_untrained(rows_with(slow), "ours", "off", opts)[0] == "not met"
    # a tie at the top: the faster option is the yardstick (60 s, not 300 s)
    tie = rows_with(good, small_lex_single=(50.0, 60.0))  # small+gate and big both 50% on single_1
    assert grid.beats_best_untrained(tie, "ours", "off", opts)[0] == "not met"  # 135 s is 2.25x of 60 s
    # with an option unmeasured: a slow cell is undecided, an out-scored cell a miss
    partial = [r for r in rows_with(slow) if r["model"] != "big@1024-128"]
    assert grid.beats_best_untrained(partial, "ours", "off", opts)[0] == "not all measured"
    outscored = dict(slow, niah_multikey_2=(25.0, 150.0))
    partial = [r for r in rows_with(outscored) if not (r["model"] == "big@1024-128" and r["task"] != "niah_multikey_2")]
    verdict, evidence = grid.beats_best_untrained(partial, "ours", "off", opts)
    assert verdict == "not met" and "unmeasured: big@1024-128 off" in evidence[0]
    # the gated trained row: undecided without its planted cell, and while small's gated planted cell is
    # missing; met once both are read (planted facts take the gate like any other cell)
    gated = rows_with(good, small_lex_planted=False) + [_row("ours", t, "16384", 100.0, gate="lexical", s=30.0)
                                                        for t, _, _ in cells[1:]]
    verdict, evidence = grid.beats_best_untrained(gated, "ours", "lexical", opts)
    assert verdict == "not all measured" and evidence[0] == "planted_fact@8K: trained row unmeasured"
    gated.append(_row("ours", "planted_fact", "16 chunks", 100.0, gate="lexical", s=20.0))
    verdict, evidence = grid.beats_best_untrained(gated, "ours", "lexical", opts)
    assert verdict == "not all measured" and evidence[0].endswith("unmeasured: small lexical"), evidence
    gated.append(_row("small", "planted_fact", "16 chunks", 62.5, gate="lexical", s=15.0))
    verdict, evidence = grid.beats_best_untrained(gated, "ours", "lexical", opts)
    assert verdict == "met", evidence
    assert evidence[0] == "planted_fact@8K: 8/8 in 20 s vs small lexical 5/8 in 15 s (1.33x)"


def heldout_folder(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("The keeper wrote that the answer is instant.\n")
    (tmp_path / "b.txt").write_text("Nothing to see.\n")
    (tmp_path / "questions.tsv").write_text("# doc, question, gold\n"
                                            "a.txt\tWhat is the answer?\tinstant\n"
                                            "a.txt\tWho wrote it?\tBob|Robert\n"
                                            "b.txt\tWhat is there?\tINSTANT!\n")
    return tmp_path


def test_heldout_docs_scores_each_question_and_records_failed_passes(tmp_path):
    folder = heldout_folder(tmp_path)
    run("heldout_docs.py", str(folder), "--label", "inst", "--", "--backend", "instant")
    rows = [json.loads(x) for x in (folder / "results-inst.jsonl").read_text().splitlines()]
    assert [r["right"] for r in rows] == [True, False, True]  # "INSTANT!" normalises to the answer "instant"
    assert rows[1]["golds"] == ["Bob", "Robert"] and all(r["answer"] == "instant" for r in rows)
    summary = json.loads((folder / "summary-inst.json").read_text())
    assert (summary["right"], summary["questions"], summary["failed"], summary["documents"]) == (2, 3, 0, 2)

    run("heldout_docs.py", str(folder), "--label", "bad", "--", "--backend", "instant", "--chunk-tokens", "0")
    rows = [json.loads(x) for x in (folder / "results-bad.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["error"] and not r["right"] for r in rows)  # recorded, never dropped


def test_heldout_docs_refuses_a_malformed_line(tmp_path):
    folder = heldout_folder(tmp_path)
    (folder / "questions.tsv").write_text("a.txt\tno gold here\n")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "heldout_docs.py"), str(folder), "--label", "x"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "questions.tsv:1: expected doc<TAB>question<TAB>gold" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_reads_where_lost_counts_the_update_that_dropped_the_answer(tmp_path):
    import gzip

    reads = [  # held after chunk 1, dropped at chunk 2; held throughout; never held; several answers, all needed
        {"answers": ["1,288"], "memories": ["orders failed: 1288", "it lasted 63 minutes"], "correct": False},
        {"answers": ["Ilse Vandermeer"], "memories": ["commander: Ilse Vandermeer", "Ilse Vandermeer led it"],
         "correct": True},
        {"answers": ["42"], "memories": ["no notes yet", "nothing"], "correct": False},
        {"answers": ["7", "9"], "match": "all", "memories": ["7 only", "7 and 9"], "correct": False},
    ]
    path = tmp_path / "rollouts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in reads))
    run("reads_where_lost.py", str(path), "--smoke")
    data = result("reads_where_lost")
    t = data["files"][str(path)]
    assert (t["reads"], t["right"], t["held_after_chunk_1"], t["dropped_later"], t["kept_to_end"]) == (4, 1, 2, 1, 1)
    assert t["never_held"] == 1 and t["final_notes_hold_but_answer_wrong"] == 1  # the last read: notes hold 7 and 9


def test_merged_weights_smoke(tmp_path):
    """bench_merged_weights.py on the small trained model (SmolLM2-135M + LoRA), one 1K document per mode."""
    out = tmp_path / "merged.json"
    run("bench_merged_weights.py", "--model", "memagent-notes-135m", "--docs", "1", "--task", "niah_single_1",
        "--length", "1024", "--out", str(out), timeout=300)
    data = json.loads(out.read_text())
    r = data["reads_one_at_a_time"]
    assert data["command"] and data["date"] and data["machine"]["cpu_count"] and data["model"] == "memagent-notes-135m"
    for mode in ("runtime", "merged"):
        assert r[mode]["calls"] >= 2 and r[mode]["prompt_tokens_per_s_median"] > 0 and r[mode]["seconds_per_doc"] > 0
    assert r["prompt_speedup"] > 0 and 0 <= r["same_answer"] <= 1 and len(r["rows"]) == 1


def test_chunk_snap_cuts_counts_a_cut_needle(smol_tokenizer, monkeypatch):
    """benchmarks/chunk_snap_cuts.py: a needle sentence a token-exact boundary cuts (single_1 document 11
    at 4K with SmolLM2's tokenizer) is counted, and a 64-token snap window leaves it whole."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from chunk_snap_cuts import by_cut, cut_ids, needle_sentence, paired

    from memagent.tasks import iter_samples

    doc = "One of the special magic numbers for a-b is: 1. Filler. One of the special magic numbers for c-d is: 22."
    assert needle_sentence(doc, "22") == "One of the special magic numbers for c-d is: 22"
    samples = list(iter_samples(["niah_single_1"], [4096], 16, smol_tokenizer, 42))
    exact, n_exact = cut_ids(samples, smol_tokenizer, 512, 0)
    snapped, n_snapped = cut_ids(samples, smol_tokenizer, 512, 64)
    assert exact == {"niah_single_1/4096/11"} and snapped == set() and len(samples) == 16
    assert n_snapped >= n_exact == 16 * 8
    right = {"a": True, "b": False, "c": True}
    assert by_cut(right, {"b", "c"}) == {"n": 3, "cut": 2, "cut_right": 1, "whole": 1, "whole_right": 1}
    got = paired(right, {"a": False, "b": True, "c": True})
    assert (got["only_snapped"], got["only_exact"], got["p"]) == (1, 1, 1.0)
    grown = paired(right, {"a": False, "b": True})  # a snapped row read only the first two documents
    assert (grown["n"], grown["right_exact"], grown["only_snapped"], grown["only_exact"]) == (2, 1, 1, 1)
    shape = {}
    cut_ids(samples[:2], smol_tokenizer, 512, 64, shape)
    assert shape["inner_ends"] == sum(len(v) for v in shape["openings"].values()) - 2  # 2 documents' last chunks
    assert shape["ends_at_sentence"] == shape["inner_ends"]  # a 64-token window finds a sentence end in noise


def test_chunk_snap_cuts_finds_notes_that_kept_a_chunks_first_sentence(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from chunk_snap_cuts import ends_at_sentence, opening_words, read_folder, rights, wrong_quoting_opening

    assert ends_at_sentence("He left.\n") and ends_at_sentence('She said "no." ') and not ends_at_sentence("the keeper's")
    chunks = ["The view of it will be obstructed by the flawed one you write. More.", "short"]
    openings = {"d1": [w for w in map(opening_words, chunks) if w], "d2": ["One of the special magic numbers for x-"]}
    assert openings["d1"] == ["The view of it will be obstructed by the"]
    rows = [{"id": "d1", "correct": 0, "memory": "The view of it will be obstructed by the flawed one."},
            {"id": "d2", "correct": 0, "memory": "The special magic number for x-y is 5%."},
            {"id": "d3", "correct": 1, "memory": "The view of it will be obstructed by the"}]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    openings["d3"] = openings["d1"]
    recs = read_folder(tmp_path, {"d1", "d2", "d3"})
    assert wrong_quoting_opening(recs, openings) == {"wrong": 2, "notes_quote_an_opening": 1,
                                                     "quoted_opening_begins_with_the": 1, "notes_begin_with_the_quote": 1}
    rows.append({"id": "d4", "correct": 0, "memory": "Kept: In math you don't choose abstractions because."})
    openings["d4"] = ["In math you don't choose abstractions be"]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = wrong_quoting_opening(read_folder(tmp_path, {"d1", "d2", "d4"}), openings)
    assert got == {"wrong": 3, "notes_quote_an_opening": 2, "quoted_opening_begins_with_the": 1,
                   "notes_begin_with_the_quote": 1}
    assert rights(recs) == {"d1": False, "d2": False, "d3": True}
    assert wrong_quoting_opening(read_folder(tmp_path, {"d1"}), openings)["notes_quote_an_opening"] == 1
    assert wrong_quoting_opening(read_folder(tmp_path / "none", {"d1"}), openings) is None
    assert rights(read_folder(tmp_path / "none", {"d1"})) is None


def test_needle_chunk_alone_builds_each_shape_of_the_needles_chunk(smol_tokenizer, monkeypatch):
    """benchmarks/needle_chunk_alone.py: on the single_1 4K document whose needle a token-exact boundary
    cuts (document 11 with SmolLM2's tokenizer) there is no exact shape; the snapped chunk holds the needle
    and starts at a sentence start, the marked one is it behind the mark, and from_second drops exactly
    its first sentence."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from chunk_snap_cuts import needle_sentence
    from needle_chunk_alone import MARK, holding, opens_with_the, shaped

    from memagent.tasks import iter_samples

    s = list(iter_samples(["niah_single_1"], [4096], 12, smol_tokenizer, 42))[11]
    needle = needle_sentence(s.document, s.gold[0])
    assert holding(s.document, needle, smol_tokenizer, 512, 0) is None
    snapped = holding(s.document, needle, smol_tokenizer, 512, 64)
    assert needle in snapped and shaped("exact", None, snapped, needle) is None
    assert shaped("snapped", None, snapped, needle) == snapped
    assert shaped("marked", None, snapped, needle) == MARK + snapped.lstrip()
    rest = shaped("from_second", None, snapped, needle)
    assert needle in rest and snapped.endswith(rest) and len(rest) < len(snapped)
    first = snapped[:len(snapped) - len(rest)].strip()
    assert first[-1] in ".!?" and first.count(". ") == 0  # one sentence, and all of it
    assert shaped("from_second", None, "One of the special magic numbers for a is: 1. More.", "One of the special "
                  "magic numbers for a is: 1") is None  # the needle is the first sentence: no such shape
    text = " The sky is red. Dogs bark! One of the special magic numbers for a is: 1. Rest."
    swapped = shaped("swapped", None, text, "One of the special magic numbers for a is: 1")
    assert swapped == " Dogs bark! The sky is red. One of the special magic numbers for a is: 1. Rest."
    assert opens_with_the(text) and not opens_with_the(swapped)
    assert shaped("swapped", None, "The sky. One of the special magic numbers for a is: 1.",
                  "One of the special magic numbers for a is: 1") is None  # the needle is the second sentence
    fronted = shaped("the_front", None, snapped, needle, s.document)  # the last "The ..." sentence before the chunk
    assert fronted.endswith(snapped.lstrip()) and opens_with_the(fronted)
    lead = fronted[:len(fronted) - len(snapped.lstrip())].strip()
    assert lead in s.document[:s.document.index(snapped.strip())] and lead[-1] in ".!?"
    doc = "A cat sat. The sky is red. The sea is wide! Dogs bark. One of the special magic numbers for a is: 1."
    chunk = " Dogs bark. One of the special magic numbers for a is: 1."
    assert shaped("the_front", None, chunk, "One of", doc) == "The sea is wide! " + chunk.strip()
    assert shaped("the_front", None, "A cat sat. Dogs bark.", "Dogs", doc) is None  # nothing before the chunk
    other = next(t for t in iter_samples(["niah_single_1"], [4096], 12, smol_tokenizer, 42) if t.id != s.id)
    n2 = needle_sentence(other.document, other.gold[0])
    assert n2 in holding(other.document, n2, smol_tokenizer, 512, 0)


def test_needle_chunk_alone_compare_pairs_documents_by_their_wrong_reads(monkeypatch):
    """--compare: a document wrong before and right after is gained, the reverse lost, one wrong in both
    neither; shapes only one file read are left out, and cells that are not the same documents refuse."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from needle_chunk_alone import compare

    def result(wrong: dict, task="niah_single_2", seed=None):
        shapes = {k: {"read": 4, "right": 4 - len(v), "wrong": [{"id": i} for i in v]} for k, v in wrong.items()}
        return {"cells": [{"task": task, "length": 65536, "shapes": shapes}], **({"seed": seed} if seed else {})}

    old = result({"the_front": ["a", "b", "c"], "snapped": ["a"], "exact": []})
    new = result({"the_front": ["c", "d"], "snapped": ["a"]})
    got = compare([(old, new)])
    front = next(c for c in got["cells"] if c["shape"] == "the_front")
    assert (front["right_before"], front["right_after"], front["gained"], front["lost"]) == (1, 2, 2, 1)
    assert [c["shape"] for c in got["cells"]] == ["snapped", "the_front"]
    assert got["total"] == {"gained": 2, "lost": 1, "p": 1.0}
    with pytest.raises(SystemExit, match="not paired"):
        compare([(old, result({"snapped": []}, task="niah_single_3"))])
    with pytest.raises(SystemExit, match="not paired"):
        compare([(old, result({"snapped": []}, seed=43))])
    with pytest.raises(SystemExit, match="not paired"):
        compare([(old, {"cells": []})])  # a cell missing from one file is refused, not dropped by zip


def test_reads_copying_openings_counts_round_29s_kept_reads(monkeypatch):
    """benchmarks/reads_copying_openings.py on round 29's kept reads: the one-chunk reads from the middle of
    a text show the copy (10 of 25 wrong), the two-chunk ones never do; a config that draws other
    questions is refused instead of counted."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from reads_copying_openings import count

    from memagent import models
    from memagent.rl.config import load_config
    from memagent.rl.data import make_task
    from memagent.rl.rft import load_rollouts
    from memagent.tokenizer import HFTokenizer

    reads = load_rollouts(ROOT / "benchmarks/results/dapo29_notes_0.5b/rollouts.jsonl.gz")
    config = load_config(ROOT / "configs/notes-qwen0.5b-dapo29-collect.toml")
    tok = HFTokenizer.from_file(models.tokenizer_path(config.model))
    got = count(reads, make_task(config, tok))
    assert got["middle, 1 chunk"] == {"documents": 7, "reads": 56, "right": 31, "mixed_groups": 4,
                                      "wrong_notes_quote_an_opening": 10}
    assert got["middle, 2 chunks"]["wrong_notes_quote_an_opening"] == 0
    assert sum(t["reads"] for t in got.values()) == 192
    with pytest.raises(SystemExit, match="another question"):
        count(reads, make_task(load_config(ROOT / "configs/notes-qwen0.5b-dapo28-collect.toml"), tok))
