"""Issue 11, items 4 and 6 for `memagent eval`: a template is recorded by its content, every flag is checked
before config.json is written, and one folder has one writer at a time. The real CLI (its main, in-process:
flock conflicts between two opens in one process as between two processes), instant backend, one
1K-token sample each."""
import contextlib
import io
import json

import pytest
from pathlib import Path

from memagent.fileio import exclusive
from clicheck import one_error_line  # noqa: E402

TEMPLATE = 'update = "{question}|{memory}|{chunk}"\nfinal = "%s {question}|{memory}"\nempty_memory = "-"\n'


class Result:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


def evaluate(out, *args):
    """`memagent eval ...` through the CLI's own main (in-process: the sample builders stay warm)."""
    from memagent.cli import main

    argv = ["eval", "--task", "niah_single_1", "--lengths", "1k", "--n", "1", "--backend", "instant", "--no-plot",
            "--out", str(out), *args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return Result(code, err.getvalue())


def test_edited_template_file_is_another_template(tmp_path):
    t, out = tmp_path / "my.toml", tmp_path / "run"
    t.write_text(TEMPLATE % "Answer:")
    assert evaluate(out, "--template", str(t)).returncode == 0
    assert evaluate(out, "--template", str(t), "--n", "2").returncode == 0  # same wording: resumes and grows
    t.write_text(TEMPLATE % "Reply:")
    p = evaluate(out, "--template", str(t), "--n", "3")
    one_error_line(p, "template_digest")
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2  # nothing mixed in


def test_flags_checked_before_config_is_written(tmp_path):
    out = tmp_path / "direct"
    one_error_line(evaluate(out, "--method", "direct"), "--context-window")
    assert not (out / "config.json").exists()
    p = evaluate(out, "--method", "direct", "--context-window", "4096")  # the corrected command is not refused
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "config.json").read_text())["identity"]["context_window"] == 4096
    one_error_line(evaluate(tmp_path / "t", "--temperature", "nan"), "--temperature must be a finite")
    assert not (tmp_path / "t").exists()


def test_second_eval_on_one_folder_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with exclusive(out, "eval folder"):
        one_error_line(evaluate(out), "in use by another memagent process")
    assert sorted(x.name for x in out.iterdir()) == []
    assert evaluate(out).returncode == 0
    assert ".lock" not in [x.name for x in out.iterdir()] and not list(out.glob("*.tmp*"))


def test_tokenizer_is_compared_by_what_it_is_not_where_it_sits(tmp_path, monkeypatch):
    """A registered model's tokenizer lives at its HF folder once converted and at a tokenizers/ copy before,
    so the same run resumed after the cache changed must not be refused; another model's tokenizer, or a
    file with other content, still is."""
    from memagent.eval import EvalConfig, _check_dir
    from memagent.models import MODELS, _gguf_tokenizer_dir, cache_root, tokenizer_owner

    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
    key = "qwen2.5-coder-0.5b"  # split over packages: its GGUF is assembled in the cache, installed or not
    assert len(MODELS[key].parts) > 1
    converted = cache_root() / key / "hf" / "tokenizer.json"
    read_from_gguf = _gguf_tokenizer_dir(cache_root() / key / f"{key}.gguf") / "tokenizer.json"
    other = cache_root() / "smollm2-135m" / "hf" / "tokenizer.json"
    assert tokenizer_owner(converted) == tokenizer_owner(read_from_gguf) == key
    assert tokenizer_owner(cache_root() / "memagent-notes-0.5b" / "hf" / "tokenizer.json") == key  # an adapter's
    assert tokenizer_owner(cache_root() / "tokenizers" / "0123456789abcdef" / "tokenizer.json") is None

    def cfg(tok):
        return EvalConfig(tasks=["niah_single_1"], lengths=[4096], model=key, tokenizer=str(tok))

    run = tmp_path / "run"
    _check_dir(run, cfg(converted))  # written when the HF folder existed (neither file needs to be here)
    _check_dir(run, cfg(read_from_gguf))  # resumed on a machine that never converted it
    with pytest.raises(ValueError, match="tokenizer:"):
        _check_dir(run, cfg(other))

    a, b = tmp_path / "a" / "tokenizer.json", tmp_path / "b" / "tokenizer.json"
    for f, text in ((a, '{"v": 1}'), (b, '{"v": 1}')):
        f.parent.mkdir()
        f.write_text(text)
    own = tmp_path / "own"
    _check_dir(own, cfg(a))
    _check_dir(own, cfg(b))  # a moved copy: same content
    b.write_text('{"v": 2}')
    with pytest.raises(ValueError, match="tokenizer:"):
        _check_dir(own, cfg(b))
