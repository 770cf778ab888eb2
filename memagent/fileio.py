"""Files we write: exclusive locks, atomic replacement, appends that never glue onto a torn line.

Why one module: the state file, the trace and an eval folder fail the same ways (a second process on the
same file, a full disk, an unwritable folder, a line torn by a kill), and each failure must be one line
that names the file, found before a model call is spent, with no temporary files left behind.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; a second process is not detected there
    fcntl = None


class FileError(ValueError):
    """A file we cannot write or lock; the message is one line that names the file."""


def describe(e: OSError) -> str:
    return e.strerror or type(e).__name__


@contextlib.contextmanager
def exclusive(path: str | Path, what: str):
    """Hold an exclusive lock for `path` (a file or a folder) while the block runs; refuse a second holder.

    The lock is a sidecar `.NAME.lock` next to a file (a file we replace atomically cannot be locked itself:
    each replace is a new inode) and `.lock` inside a folder. It is removed on release; the inode check
    after locking closes the race with a holder that unlinks it at that moment.
    """
    path = Path(path)
    lock = path / ".lock" if path.is_dir() else path.with_name(f".{path.name}.lock")
    if fcntl is None:
        yield
        return
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise FileError(f"cannot write {what} {path}: {describe(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise FileError(f"{what} {path} is in use by another memagent process (lock {lock}); "
                            f"wait for it or use another one") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder unlinked it between our open and our lock: take the new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def atomic_write(path: str | Path, text: str, what: str = "file") -> None:
    """Replace `path` with `text` all at once (temp file, fsync, rename); on failure remove the temp file
    and raise one line that names `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise FileError(f"cannot write {what} {path}: {describe(e)}") from None


def repair_tail(path: str | Path) -> None:
    """Cut an unterminated last line (a kill mid-write) so the next append starts on a line of its own."""
    path = Path(path)
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)
    except OSError as e:
        raise FileError(f"cannot repair {path}: {describe(e)}") from None


class Appender:
    """Appends whole lines to a file, flushed each line; a torn last line from a killed run is cut first.

    Opened at construction, so an unwritable path fails before any model call; a write error (full disk)
    is one line naming the file."""

    def __init__(self, path: str | Path, what: str = "file"):
        self.path, self.what = Path(path), what
        repair_tail(self.path)
        try:
            self.f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise FileError(f"cannot write {what} {self.path}: {describe(e)}") from None

    def write_line(self, line: str) -> None:
        try:
            self.f.write(line + "\n")
            self.f.flush()
        except OSError as e:
            raise FileError(f"cannot write {self.what} {self.path}: {describe(e)}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.f.close()


def check_writable(path: str | Path, what: str) -> None:
    """Fail now, not after the first model call, when `path` cannot be created or replaced: its folder
    must exist and take a new file (a probe file, removed at once)."""
    path = Path(path)
    if path.is_dir():
        raise FileError(f"{what} {path} is a directory")
    probe = path.with_name(f".{path.name}.probe{os.getpid()}")
    try:
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise FileError(f"cannot write {what} {path}: {describe(e)}") from None


def same_file(a: str | Path | None, b: str | Path | None) -> bool:
    """Whether two paths name one existing file (through links, `..` or case-folding file systems)."""
    if a is None or b is None:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
