"""What an eval reports (issue 11 item 18): 4k = 4096, the served model and package version recorded,
n and a standard error per row, and a plot with error bars, n, visible overlaps and the model's name."""
import asyncio
import json

import pytest

from memagent import eval as ev
from memagent.backends.scripted import ScriptedBackend
from memagent.clihelp import version
from memagent.tasks import format_length, parse_length


@pytest.mark.parametrize("text,value", [("4k", 4096), ("128k", 131072), ("1k", 1024), ("7k", 7000),
                                        ("28k", 28000), ("1.75m", 1_750_000), ("4096", 4096), ("4000", 4000)])
def test_powers_of_two_k_are_rulers_1024s(text, value):
    assert parse_length(text) == value
    assert parse_length(format_length(value)) == value  # labels read back as the same length


def test_help_says_4k_is_4096(capsys):
    from memagent.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--help"])
    assert "4k = 4096" in " ".join(capsys.readouterr().out.split())


def test_standard_error():
    assert ev.standard_error([1.0]) is None
    assert ev.standard_error([1.0, 1.0, 1.0]) == 0.0
    assert ev.standard_error([1.0, 0.0, 1.0, 0.0]) == pytest.approx(100 * (1 / 3 / 4) ** 0.5, abs=0.01)


class Named(ScriptedBackend):
    """A scripted backend that, like a server, reports the model it served."""

    reported_model = "Qwen/Qwen2.5-7B-Instruct"
    model = None


def _run(out, tok, backend, **kw):
    base = dict(tasks=["niah_single_1"], lengths=[1500], n=3, method="memagent", backend="openai", model=None,
                chunk_tokens=600, memory_tokens=64, template="notes", answer_tokens=32, concurrency=2)
    base.update(kw)
    return asyncio.run(ev.arun_eval(out, ev.EvalConfig(**base), backend, tok, plot_png=False))


def test_summary_records_served_model_version_n_and_se(tmp_path, smol_tokenizer):
    summary = _run(tmp_path / "a", smol_tokenizer, Named(policy=lambda r: "\\boxed{0}"))
    assert summary["served_model"] == "Qwen/Qwen2.5-7B-Instruct" and summary["memagent_version"] == version()
    row = summary["results"][0]
    assert row["n"] == 3 and row["accuracy"] == 0.0 and row["accuracy_se"] == 0.0
    saved = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert saved["served_model"] == summary["served_model"]


def test_openai_backend_keeps_the_model_the_server_reports():
    from memagent.backends.openai_http import OpenAIBackend, _parse_completion

    gen = _parse_completion(json.dumps({"model": "served-name", "choices": [{"message": {"content": "x"},
                                                                            "finish_reason": "stop"}]}))
    b = OpenAIBackend("http://127.0.0.1:9/v1", model="alias")
    b._account(gen)
    assert b.reported_model == "served-name" and ev.served_model(b) == "served-name"


def test_plot_has_error_bars_n_model_names_and_visible_overlaps(tmp_path, smol_tokenizer):
    from matplotlib.container import ErrorbarContainer

    from memagent.evalplot import figure

    a, b = tmp_path / "a", tmp_path / "b"
    _run(a, smol_tokenizer, Named(policy=lambda r: "\\boxed{0}"), lengths=[1500, 3000])
    _run(b, smol_tokenizer, Named(policy=lambda r: "\\boxed{0}"), lengths=[1500, 3000], memory_tokens=32)
    fig = figure([a, b])
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one per run, with error bars
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all("Qwen/Qwen2.5-7B-Instruct" in x and "n=3" in x for x in labels), labels
    assert not any(x.endswith("/ openai") for x in labels)
    # identical accuracies: the two lines must not sit exactly on top of each other
    l1, l2 = bars[0].lines[0], bars[1].lines[0]
    assert list(l1.get_xdata()) != list(l2.get_xdata()) or l1.get_marker() != l2.get_marker()
    assert l1.get_marker() != l2.get_marker() and l1.get_linestyle() != l2.get_linestyle()
