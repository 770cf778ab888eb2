"""First contact with the CLI (issue 11 item 17): --version, defaults in every help line, a description
for `ask`, and a subcommand whose import fails says why instead of disappearing."""
import argparse
import importlib

import pytest

from memagent import cli
from memagent.clihelp import version

OURS = ("ask", "eval", "eval plot", "models")  # serve/train/sft parsers belong to their modules' owners


def _options(parser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _options(sp, (*path, name))
        elif a.option_strings and a.help is not argparse.SUPPRESS:
            yield " ".join(path), parser, a


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"memagent {version()}"
    assert version().count(".") >= 1


def test_every_option_states_its_default():
    missing = []
    for path, parser, a in _options(cli.build_parser()):
        if path not in OURS and path != "" or isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
            continue
        text = parser._get_formatter()._expand_help(a) if a.help is not None else ""
        if "default" not in text.lower():
            missing.append(f"{path} {a.option_strings[-1]}")
    assert not missing, missing


def test_embedded_defaults_shown_not_only_server_ones(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["ask", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "512 for smollm2-135m" in out and "64 for smollm2-135m" in out and "notes for smollm2-135m" in out
    assert "5000 for server backends" in out and "1024 for server backends" in out
    assert "(default: 256)" in out  # --answer-tokens: appended from the parser's own default


def test_ask_has_a_description():
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices["ask"].description and "memory" in sub.choices["ask"].description


def test_failed_subcommand_import_says_why(monkeypatch, capsys):
    real = importlib.import_module

    def broken(name, *a, **kw):
        if name == "memagent.rl.trainer":
            raise ImportError("No module named 'torch'")
        return real(name, *a, **kw)

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    listing = capsys.readouterr().out
    assert "train" in listing and "unavailable" in listing and "torch" in listing
    assert cli.main(["train", "--steps", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "memagent train" in err and "No module named 'torch'" in err
