"""Assertions shared by the CLI tests (imported as `from clicheck import ...`, like servers.py)."""


def one_error_line(p, pattern):
    """A user's mistake: exit 2 and exactly one 'memagent: error:' line that names it."""
    err = p.stderr.decode() if isinstance(p.stderr, bytes) else p.stderr
    assert p.returncode == 2, (p.returncode, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("memagent: error:"), err
    assert pattern.lower() in lines[0].lower(), lines[0]
