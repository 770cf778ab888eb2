"""Secrets never reach a file or a terminal: API keys and URL credentials are scrubbed where text is recorded.

Why a process-wide set: a key enters at one place (`--api-key`, $OPENAI_API_KEY, a backend built in
Python) and could leave at many (a server's error echoed into an answer's `error`, then the trace, the
state file, `--json` output, eval samples). Every backend that holds a key registers it here, and the
places that record text (the driver's error field, eval records and summary, the CLI's error line) scrub
with everything registered.

What counts as the key showing: the key itself in any letter case, and any run of at least
`MIN_PIECE` characters of it (a server that echoes `sk-abc...` truncated, or upper-cased). Keys shorter
than 4 characters are redacted only where they are known to be a key (the `--api-key` value on a
recorded command line): in free text they would match ordinary words.

URL credentials (`http://user:pass@host/v1`) are refused by the OpenAI backend (a clear one-line
error; the key belongs in --api-key), and `redact_url` hides them wherever a URL is shown.
"""
from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit, urlunsplit

MIN_PIECE = 8  # characters of a key that count as the key showing
MIN_SECRET = 4  # shorter keys are not searched for in free text
MASK = "***"
SECRET_FLAGS = ("--api-key",)

_lock = threading.Lock()
_secrets: set[str] = set()
_search: re.Pattern | None = None


def register(secret: str | None) -> None:
    """Remember `secret` for every later `scrub` in this process (placeholders like 'EMPTY' are not secrets)."""
    global _search
    if not secret or not isinstance(secret, str) or secret in ("EMPTY", "none", "None"):
        return
    with _lock:
        if secret not in _secrets:
            _secrets.add(secret)
            _search = None


def _pattern() -> re.Pattern | None:
    """Overlapping search for every piece of every registered key (each MIN_PIECE-gram, any case)."""
    global _search
    with _lock:
        if _search is None:
            grams = set()
            for s in _secrets:
                if len(s) < MIN_SECRET:
                    continue
                k = min(MIN_PIECE, len(s))
                grams.update(s[i:i + k] for i in range(len(s) - k + 1))
            if grams:
                alts = "|".join(re.escape(g) for g in sorted(grams, key=len, reverse=True))
                _search = re.compile(f"(?=({alts}))", re.IGNORECASE)
        return _search


def scrub(text: str, extra: tuple[str, ...] = ()) -> str:
    """`text` with every registered key (and `extra`) masked: whole, in another case, or a piece of it."""
    if not isinstance(text, str) or not text:
        return text
    for s in extra:
        register(s)
    search = _pattern()
    if search is not None:
        covered: list[list[int]] = []
        for m in search.finditer(text):
            a, b = m.start(1), m.end(1)
            if covered and a <= covered[-1][1]:
                covered[-1][1] = max(covered[-1][1], b)
            else:
                covered.append([a, b])
        for a, b in reversed(covered):
            text = text[:a] + MASK + text[b:]
    return _URL_CREDS.sub(r"\1***@", text)


_URL_CREDS = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s?#]+@")


def has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return False
    return parts.username is not None or parts.password is not None


def redact_url(url: str) -> str:
    """The URL with any `user:pass@` replaced by `***@` (and any registered key masked)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url)
    if parts.username is not None or parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        url = urlunsplit((parts.scheme, "***@" + host, parts.path, parts.query, parts.fragment))
    elif "://" not in url:  # 'user:pass@host' without a scheme is not parsed as a URL: hide it all the same
        url = re.sub(r"^[^/@\s]*@", "***@", url.strip())
    return scrub(url)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line safe to record: the value of --api-key (either spelling) masked, URLs without
    credentials, registered keys masked anywhere."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            register(arg)
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, value = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                register(value)
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(scrub(arg))
    return out
