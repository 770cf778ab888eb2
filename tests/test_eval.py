"""The eval harness with a deterministic scripted backend: records, scoring, failures counted, resume
(finished skipped, failed retried, torn last line tolerated), direct baseline truncation, summary, plot."""
import asyncio
import json
import re

import pytest

from memagent import eval as ev
from memagent.backends.scripted import ScriptedBackend
from memagent.protocol import BackendError

_SECTION = re.compile(r"<section>\n(.*)\n</section>", re.S)
_NOTES = re.compile(r"<notes>\n(.*?)\n</notes>", re.S)


def reader_policy(req):
    """A perfect reader for niah_single_1: remember every 7-digit number, box the last one."""
    prompt = req.messages[-1]["content"]
    sec = _SECTION.search(prompt)
    notes = _NOTES.search(prompt).group(1)
    if sec is None:
        nums = re.findall(r"\b\d{7}\b", notes)
        return f"\\boxed{{{nums[-1] if nums else 'none'}}}"
    return " ".join(re.findall(r"\b\d{7}\b", notes) + re.findall(r"\b\d{7}\b", sec.group(1))) or notes


def config(**kw):
    base = dict(tasks=["niah_single_1"], lengths=[1500, 3000], n=3, method="memagent", backend="scripted",
                model="scripted", chunk_tokens=600, memory_tokens=64, template="notes", answer_tokens=32,
                concurrency=2)
    base.update(kw)
    return ev.EvalConfig(**base)


def run(out, cfg, backend, tok, plot=False):
    return asyncio.run(ev.arun_eval(out, cfg, backend, tok, plot_png=plot))


def lines(out):
    return [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]


def test_records_scores_and_summary(tmp_path, smol_tokenizer):
    summary = run(tmp_path, config(), ScriptedBackend(policy=reader_policy), smol_tokenizer, plot=True)
    recs = lines(tmp_path)
    assert len(recs) == 6 and len({r["id"] for r in recs}) == 6
    for r in recs:
        assert r["error"] is None and r["correct"] == 1.0 and r["prediction"] == r["gold"][0]
        assert r["scores"] == {"string_match_all": 1.0} and r["metric"] == "string_match_all"
        assert r["calls"] == r["chunks"] + 1 and r["chunks"] >= 2  # several chunks read, then one answer
        assert r["doc_tokens"] > 0.95 * r["length"] and r["prompt_tokens"] > 0
        for key in ("question", "gold", "seconds", "completion_tokens", "task", "length"):
            assert key in r
    rows = {(r["task"], r["length"]): r for r in summary["results"]}
    assert set(rows) == {("niah_single_1", 1500), ("niah_single_1", 3000)}
    assert all(r["accuracy"] == 100.0 and r["n"] == 3 and r["failures"] == 0 for r in rows.values())
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["results"] == summary["results"] and saved["config"]["method"] == "memagent"
    assert "string_match_all" in json.dumps(saved["results"])  # the metric is named next to the number
    assert (tmp_path / "accuracy_vs_length.png").stat().st_size > 1000


def test_wrong_answers_score_zero(tmp_path, smol_tokenizer):
    backend = ScriptedBackend(policy=lambda req: "\\boxed{1234567}" if "<section>" not in req.messages[-1]["content"]
                              else "nothing")
    summary = run(tmp_path, config(lengths=[1500], n=2), backend, smol_tokenizer)
    assert summary["results"][0]["accuracy"] == 0.0 and summary["totals"]["failures"] == 0


def test_failures_are_counted_then_retried_and_finished_skipped(tmp_path, smol_tokenizer):
    # one call in five fails (concurrency 1 keeps the pattern deterministic)
    failing = ScriptedBackend(policy=reader_policy, fail_on=lambda i, req: i % 5 == 3)
    s1 = run(tmp_path, config(concurrency=1), failing, smol_tokenizer)
    recs = lines(tmp_path)
    failed = [r for r in recs if r["error"]]
    assert failed and all(r["correct"] == 0.0 and "scripted failure" in r["error"] for r in failed)
    assert s1["totals"]["failures"] == len(failed) == sum(r["failures"] for r in s1["results"])
    assert s1["totals"]["samples"] == 6  # failures are in the denominator
    ok_before = {r["id"] for r in recs if not r["error"]}
    # rerun: only the failed samples are run again
    healthy = ScriptedBackend(policy=reader_policy)
    s2 = run(tmp_path, config(concurrency=1), healthy, smol_tokenizer)
    rerun_ids = [r["id"] for r in lines(tmp_path)[len(recs):]]
    assert sorted(rerun_ids) == sorted(r["id"] for r in failed)
    assert not ok_before & set(rerun_ids)
    assert s2["totals"]["failures"] == 0 and s2["totals"]["samples"] == 6
    assert all(r["accuracy"] == 100.0 for r in s2["results"])


def test_torn_last_line_is_tolerated(tmp_path, smol_tokenizer):
    run(tmp_path, config(lengths=[1500]), ScriptedBackend(policy=reader_policy), smol_tokenizer)
    path = tmp_path / "samples.jsonl"
    text = path.read_text().splitlines()
    # simulate a kill in the middle of writing the last record
    path.write_text("\n".join(text[:-1]) + "\n" + text[-1][: len(text[-1]) // 2])
    torn_id = json.loads(text[-1])["id"]
    backend = ScriptedBackend(policy=reader_policy)
    summary = run(tmp_path, config(lengths=[1500]), backend, smol_tokenizer)
    recs = lines(tmp_path)  # every line parses again
    assert [r["id"] for r in recs].count(torn_id) == 1 and len(recs) == 3
    assert summary["totals"]["samples"] == 3 and summary["results"][0]["accuracy"] == 100.0
    assert len(backend.requests) > 0  # only the torn sample was rerun
    assert len(backend.requests) == recs[-1]["calls"]


def test_damaged_middle_line_is_an_error(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="damaged"):
        ev.read_records(tmp_path / "samples.jsonl")


def test_other_settings_in_same_dir_are_refused_but_more_lengths_are_fine(tmp_path, smol_tokenizer):
    run(tmp_path, config(lengths=[1500], n=1), ScriptedBackend(policy=reader_policy), smol_tokenizer)
    with pytest.raises(ValueError, match="chunk_tokens"):
        run(tmp_path, config(lengths=[1500], n=1, chunk_tokens=300), ScriptedBackend(policy=reader_policy),
            smol_tokenizer)
    s = run(tmp_path, config(lengths=[1500, 3000], n=2), ScriptedBackend(policy=reader_policy), smol_tokenizer)
    assert s["totals"]["samples"] == 4


def test_direct_method_truncates_the_middle(tmp_path, smol_tokenizer):
    seen = []

    def policy(req):
        seen.append(req.messages[-1]["content"])
        return "\\boxed{" + " ".join(re.findall(r"\b\d{7}\b", req.messages[-1]["content"])) + "}"

    cfg = config(method="direct", lengths=[3000], n=2, context_window=1200)
    summary = run(tmp_path, cfg, ScriptedBackend(policy=policy), smol_tokenizer)
    recs = lines(tmp_path)
    assert all(r["calls"] == 1 and r["truncated"] for r in recs)
    for prompt, r in zip(seen, recs):
        n = len(smol_tokenizer.encode(prompt))
        assert n <= 1200 - cfg.answer_tokens - ev.CHAT_OVERHEAD + 2
        assert ev.OMITTED in prompt and r["question"] in prompt
    assert summary["results"][0]["n"] == 2
    with pytest.raises(ValueError, match="context-window"):
        ev.Runner(config(method="direct"), ScriptedBackend(), smol_tokenizer)


def test_truncate_middle_keeps_head_and_tail(smol_tokenizer):
    text = " ".join(f"w{i}" for i in range(20000))
    cut, truncated = ev.truncate_middle(text, smol_tokenizer, 500)
    assert truncated and cut.startswith("w0 w1 ") and cut.endswith("w19999")
    assert 490 <= len(smol_tokenizer.encode(cut.replace(ev.OMITTED, " "))) <= 510
    short, t2 = ev.truncate_middle("a short text", smol_tokenizer, 500)
    assert short == "a short text" and not t2


def test_backend_error_in_direct_is_recorded(tmp_path, smol_tokenizer):
    class Down:
        name = "down"

        async def generate(self, req):
            raise BackendError("server unreachable")

        async def aclose(self):
            pass

    summary = run(tmp_path, config(method="direct", lengths=[1500], n=2, context_window=4096), Down(), smol_tokenizer)
    assert summary["totals"]["failures"] == 2 and summary["results"][0]["accuracy"] == 0.0
    assert all("server unreachable" in r["error"] for r in lines(tmp_path))


def test_plot_merges_runs(tmp_path, smol_tokenizer):
    a, b = tmp_path / "a", tmp_path / "b"
    run(a, config(lengths=[1500], n=1), ScriptedBackend(policy=reader_policy), smol_tokenizer)
    run(b, config(method="direct", lengths=[1500, 3000], n=1, context_window=4096),
        ScriptedBackend(policy=lambda r: "\\boxed{0}"), smol_tokenizer)
    from memagent.evalplot import plot

    png = plot([a, b], tmp_path / "fig.png", title="t")
    assert png.stat().st_size > 1000
    with pytest.raises(ValueError, match="not an eval directory"):
        plot([tmp_path / "missing"], tmp_path / "x.png")


def test_cli_tasks_export_and_plot(tmp_path, capsys):
    from memagent.cli import main

    assert main(["eval", "tasks"]) == 0
    assert "ruler-hotpotqa" in capsys.readouterr().out
    out = tmp_path / "s.jsonl"
    assert main(["eval", "--task", "vt", "--lengths", "1k", "--n", "2", "--tokenizer", "smollm2-135m",
                 "--export", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["vt/1024/0", "vt/1024/1"] and rows[0]["gold"]  # 1k = 1024 (RULER)
    assert main(["eval", "--task", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown task" in capsys.readouterr().err
