"""Help text that tells a new user what every option does when left out, and the version.

Why a formatter and not "(default ...)" typed into each help string: a default typed by hand drifts
from the code. The formatter appends the parser's own default to every option whose help does not
already state one (flags read "default: off"); options whose default depends on the model (chunk and
memory sizes, the template) say so in words built from the model registry (`reading_help`), so the
embedded model's own 512/64 show, not only the server values.

A subcommand whose module fails to import (a missing optional dependency) is still listed, and running
it says why (`add_unavailable`), instead of the command silently disappearing from `memagent --help`.
"""
from __future__ import annotations

import argparse
import sys


def version() -> str:
    """The installed package version (what pip knows), else the source tree's."""
    try:
        from importlib.metadata import PackageNotFoundError, version as _v

        try:
            return _v("memagent")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    from . import __version__

    return __version__


class HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text.lower() or action.default is argparse.SUPPRESS
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        if action.nargs == 0:  # a flag
            return f"{text} (default: {'on' if action.default else 'off'})".strip()
        if action.default is None:
            return text  # its help must say what leaving it out means (tests/test_clihelp.py checks)
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose subcommands (which argparse builds with the parent's class) share the formatter."""

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*a, **kw)


def reading_help(what: str) -> str:
    """Help for --chunk-tokens / --memory-tokens / --template: each registry model's own default, then servers'."""
    from . import models

    field, server = {"chunk": ("chunk_tokens", 5000), "memory": ("memory_tokens", 1024),
                     "template": ("default_template", "memagent")}[what]
    per_model = ", ".join(f"{getattr(s, field)} for {n}"
                          + (" (the embedded default)" if n == models.DEFAULT_MODEL else "")
                          for n, s in models.MODELS.items())
    return f"default: {per_model}; {server} for server backends"


def add_unavailable(sub, name: str, module: str, error: BaseException) -> None:
    """List `name` with the reason its module failed to import; running it prints that reason (exit 2)."""
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    p = sub.add_parser(name, help=f"(unavailable: {reason})", add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def unavailable(args) -> int:
        print(f"memagent: error: `memagent {name}` is unavailable: importing {module} failed ({reason})",
              file=sys.stderr)
        return 2

    p.set_defaults(func=unavailable)
