"""Argument checks shared by the Python API and the CLI.

Why a module of its own: a bad value must fail where it enters, with one sentence that names it, not
deep inside a tokenizer or an HTTP client as a bare TypeError ("'float' object cannot be interpreted as
an integer") or, worse, run on: `temperature=nan` sampled garbage, `threads=-3` reached torch.
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Iterable


def positive_int(name: str, value, minimum: int = 1) -> int:
    """`value` as an int of at least `minimum`; a bool, a float (1.5, even 2.0) or a str is refused
    (numpy integers are fine)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def finite(name: str, value, minimum: float | None = None, maximum: float | None = None,
           strict: bool = False) -> float:
    """`value` as a finite float in [minimum, maximum] (`strict`: above minimum)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be {'above' if strict else 'at least'} {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum:g}, got {value:g}")
    return float(value)


def text(name: str, value: str) -> str:
    """A str that can be written as UTF-8: a command-line byte that was not UTF-8 arrives as a lone
    surrogate (\\udcff) and would fail later, when the state or trace file is written."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid UTF-8 text (an undecodable byte or lone surrogate at "
                         f"character {e.start + 1})") from None
    return value


def questions(qs) -> list[str]:
    """The questions of one read, as a list of non-empty valid strs.

    A single str is one question (iterating it would ask one question per letter)."""
    if isinstance(qs, str):
        qs = [qs]
    try:
        qs = list(qs)
    except TypeError:
        raise TypeError(f"questions must be a list of str, got {type(qs).__name__}") from None
    if not qs:
        raise ValueError("no question given")
    for i, q in enumerate(qs, 1):
        if not isinstance(q, str):
            raise TypeError(f"question {i} must be a str, got {type(q).__name__}")
        if not q.strip():
            raise ValueError(f"question {i} is empty")
        text(f"question {i}", q)
    return qs


def cli_numbers(args) -> None:
    """The numeric options of ask / eval, checked before anything loads or is written."""
    checks: Iterable[tuple[str, str, dict]] = (
        ("threads", "int", {}), ("concurrency", "int", {}), ("max_retries", "int", {"minimum": 0}),
        ("answer_tokens", "int", {}), ("n", "int", {}), ("context_window", "int", {}),
        ("timeout", "float", {"minimum": 0.0, "strict": True}),
        ("temperature", "float", {"minimum": 0.0, "maximum": 100.0}),
    )
    for attr, kind, kw in checks:
        value = getattr(args, attr, None)
        if value is None:
            continue
        flag = "--" + attr.replace("_", "-")
        if kind == "int":
            positive_int(flag, value, **kw)
        else:
            finite(flag, value, **kw)
    if getattr(args, "threads", None) and args.threads > (os.cpu_count() or 1) * 8:
        raise ValueError(f"--threads {args.threads} is far more than this machine's {os.cpu_count()} cores")
