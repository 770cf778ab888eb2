"""Where a wrong read lost the answer (memagent/where_lost.py): the hold test per metric, the outcome of
hand-written note sequences, and `memagent eval` records and summaries with scripted readers that fail
in each of the three ways."""
import asyncio
import json
import re

import pytest

from memagent import eval as ev
from memagent.backends.scripted import ScriptedBackend
from memagent.tasks.scoring import notes_hold
from memagent.where_lost import attribute, count_outcomes, describe_outcomes

_SECTION = re.compile(r"<section>\n(.*)\n</section>", re.S)
_NOTES = re.compile(r"<notes>\n(.*?)\n</notes>", re.S)
_NUM = re.compile(r"\b\d{7}\b")


def test_notes_hold_uses_the_tasks_metric():
    assert notes_hold("string_match_all", "Key A is 123 and B is 456.", ["123", "456"])
    assert not notes_hold("string_match_all", "Key A is 123.", ["123", "456"])  # one of two is not held
    assert notes_hold("string_match_part", "Key A is 123.", ["123", "456"])
    assert notes_hold("string_match_part", "VISTULA river", ["Vistula River"])  # case-insensitive
    assert notes_hold("sub_em", "The answer: the Vistula, river!", ["Vistula River"])  # normalised
    # sub_em's reverse direction (the prediction inside the gold) is not a hold: short notes would hold all
    assert not notes_hold("sub_em", "Vistula", ["Vistula River"])
    assert not notes_hold("sub_em", "", ["x"]) and not notes_hold("string_match_part", "abc", [])
    with pytest.raises(ValueError, match="unknown metric"):
        notes_hold("bleu", "x", ["x"])


@pytest.mark.parametrize("notes, correct, error, outcome, first, lost", [
    ([(0, "none"), (1, "is 123"), (2, "is 123")], 1.0, None, "right", 1, []),
    ([(0, "none"), (1, "is 123"), (2, "is 123")], 0.0, None, "answer_missed", 1, []),
    ([(0, "is 123"), (3, "is 999"), (5, "is 999")], 0.0, None, "lost_in_notes", 0, [3]),
    # held, dropped, held again, dropped again: both drops are listed and the last notes decide
    ([(0, "is 123"), (1, "x"), (2, "123"), (4, "y")], 0.0, None, "lost_in_notes", 0, [1, 4]),
    ([(0, "is 123"), (1, "x"), (2, "123")], 0.0, None, "answer_missed", 0, [1]),
    ([(0, "none"), (1, "is 999")], 0.0, None, "never_in_notes", None, []),
    ([], 0.0, None, "never_in_notes", None, []),
    ([(0, "is 123")], 0.0, "BackendError: down", "failed", 0, []),
    ([(0, "is 123")], 0.5, None, "answer_missed", 0, []),  # a partial string_match_all is a wrong answer
])
def test_attribute_outcomes(notes, correct, error, outcome, first, lost):
    got = attribute(notes, "string_match_all", ["123"], correct, error)
    assert got == {"read_outcome": outcome, "notes_first_held": first, "notes_lost_at": lost}


def test_counts_and_description():
    assert count_outcomes([{"correct": 1.0}]) is None and describe_outcomes(None) == ""
    counts = count_outcomes([{"read_outcome": "right"}, {"read_outcome": "lost_in_notes"},
                             {"read_outcome": "lost_in_notes"}, {}])
    assert counts == {"right": 1, "answer_missed": 0, "lost_in_notes": 2, "never_in_notes": 0, "failed": 0,
                      "not_recorded": 1}
    assert describe_outcomes(counts) == ("wrong: lost in notes 2, never in notes 0, answer missed 0, "
                                         "not recorded 1")


# ---- through `memagent eval`, with readers that fail in each way ---------------------------------------

def reader(keep: bool, write: bool = True, answer: bool = True):
    """niah_single_1 reader: notes the 7-digit needle when `write`; a later chunk without one keeps the notes
    when `keep`, else replaces them with a made-up number; the answer boxes the notes' number when
    `answer`."""
    def policy(req):
        prompt = req.messages[-1]["content"]
        sec, notes = _SECTION.search(prompt), _NOTES.search(prompt).group(1)
        if sec is None:
            nums = _NUM.findall(notes)
            return f"\\boxed{{{nums[-1] if nums and answer else 'none'}}}"
        found = _NUM.findall(sec.group(1)) if write else []
        if found:
            return f"The number is {found[-1]}."
        return notes if keep or not _NUM.findall(notes) else "The number is 1111111."
    return policy


def run_eval(tmp_path, policy, smol_tokenizer, **kw):
    cfg = ev.EvalConfig(**{**dict(tasks=["niah_single_1"], lengths=[3000], n=3, method="memagent",
                                  backend="scripted", model="scripted", chunk_tokens=400, memory_tokens=64,
                                  template="notes", answer_tokens=32, concurrency=2), **kw})
    summary = asyncio.run(ev.arun_eval(tmp_path, cfg, ScriptedBackend(policy=policy), smol_tokenizer,
                                       plot_png=False))
    recs = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    return summary["results"][0], recs


@pytest.mark.parametrize("keep, write, answer, outcome", [
    (True, True, True, "right"),
    (True, True, False, "answer_missed"),
    (False, True, True, "lost_in_notes"),
    (True, False, True, "never_in_notes"),
])
def test_eval_records_where_each_read_lost_the_gold(tmp_path, smol_tokenizer, keep, write, answer, outcome):
    row, recs = run_eval(tmp_path, reader(keep, write, answer), smol_tokenizer)
    assert len(recs) == 3 and row["read_outcomes"]["failed"] == 0
    for r in recs:
        assert r["chunks"] >= 4  # several updates, so a needle can be held and then dropped
        if not write:
            assert r["notes_first_held"] is None and r["notes_lost_at"] == []
            continue
        held = r["notes_first_held"]
        assert held is not None and held < r["chunks"]
        if keep:
            assert r["notes_lost_at"] == [] and r["gold"][0] in r["memory"]
        elif held < r["chunks"] - 1:  # a forgetful reader drops the needle at the very next chunk
            assert r["notes_lost_at"] == [held + 1] and r["gold"][0] not in r["memory"]
    # a forgetful reader whose needle sits in the last chunk has nothing left to drop it: right
    expected = [outcome if keep or r["notes_first_held"] < r["chunks"] - 1 else "right" for r in recs]
    assert [r["read_outcome"] for r in recs] == expected
    assert row["read_outcomes"][outcome] == expected.count(outcome) >= 1
    assert sum(row["read_outcomes"].values()) == 3


def test_direct_runs_and_old_folders_have_no_outcomes(tmp_path, smol_tokenizer):
    cfg = ev.EvalConfig(tasks=["niah_single_1"], lengths=[1500], n=2, method="direct", backend="scripted",
                        model="scripted", context_window=4096, answer_tokens=32, concurrency=1)
    summary = asyncio.run(ev.arun_eval(tmp_path, cfg, ScriptedBackend(policy=lambda req: "\\boxed{1}"),
                                       smol_tokenizer, plot_png=False))
    assert "read_outcomes" not in summary["results"][0]
    recs = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all("read_outcome" not in r for r in recs)


# ---- benchmarks/where_lost_niah.py: what the dropping chunk held ------------------------------------------

def where_lost_niah():
    """The benchmark script as a module (it lives outside the package, beside its `common` helper)."""
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import where_lost_niah as wl

    return wl


def test_niah_drops_are_sorted_by_what_the_chunk_held(tmp_path, smol_tokenizer):
    wl = where_lost_niah()

    from memagent.models import tokenizer_path

    assert wl.needle_keys("x. One of the special magic numbers for odd-rancher is: 1089879. y One of the "
                          "special magic uuids for big-cat is: 1a2b. z") == ["odd-rancher", "big-cat"]
    assert wl.asked_key("What is the special magic number for soft-obesity mentioned in the provided text?") \
        == "soft-obesity"
    chunks = [[], ["soft-obesity"], [], ["other-key"], []]
    rec = {"notes_lost_at": [2, 3, 1]}
    assert wl.classify_drops(rec, chunks, "soft-obesity") == {"look_alike": 1, "no_needle": 1, "own_needle": 1}

    # end to end on a real eval folder: a forgetful reader on niah_multikey_1 drops the needle at the chunk
    # after it; the report rebuilds the same documents and finds every drop where the records put it
    row, recs = run_eval(tmp_path, reader(keep=False), smol_tokenizer, tasks=["niah_multikey_1"], lengths=[4000])
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["config"]["tokenizer"] = str(tokenizer_path("smollm2-135m"))  # the fixture's tokenizer has no name
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    report = wl.folder_report(tmp_path)
    assert report["n"] == 3 and sum(report["outcomes"].values()) == 3
    total_drops = sum(len(r["notes_lost_at"]) for r in recs)
    assert sum(report["drops"].values()) == total_drops >= 1
    for s in report["samples"]:
        assert s["gold_chunks"] and all(c < s["chunks"] for c in s["look_alike_chunks"])


def test_niah_report_survives_a_cleared_tokenizer_cache(tmp_path, smol_tokenizer):
    # a run records the absolute cache path of its tokenizer; on another machine that file is gone, and
    # the report must rebuild the same documents from the run's model name, or say clearly why it cannot
    wl = where_lost_niah()

    from memagent.models import tokenizer_path

    run_eval(tmp_path, reader(keep=False), smol_tokenizer, tasks=["niah_multikey_1"], lengths=[4000])
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["config"]["tokenizer"] = str(tokenizer_path("smollm2-135m"))
    cfg_path.write_text(json.dumps(cfg))
    expected = wl.folder_report(tmp_path)

    cfg["config"]["tokenizer"] = str(tmp_path / "gone" / "tokenizer.json")
    cfg["config"]["model"] = "smollm2-135m"
    cfg_path.write_text(json.dumps(cfg))
    assert wl.folder_report(tmp_path)["samples"] == expected["samples"]

    cfg["config"]["model"] = None
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match="is gone and its config names no model"):
        wl.folder_report(tmp_path)
