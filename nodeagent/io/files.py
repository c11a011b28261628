"""Small file helpers: bounded reads of other people's files, atomic JSON writes.

Everything the agent reads (sysfs and procfs attributes, its config, its own state and status
files, a kubeconfig) goes through `read_bounded`: only regular files (a FIFO, device or socket
in a fixture root, or planted by someone, is refused instead of blocking the open), at most a
size cap per kind, and a clear one-line reason when it is refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Size caps per kind of file (bytes). A sysfs attribute is at most a page.
ATTRIBUTE_MAX = 4096
CONFIG_MAX = 1 << 20
STATE_MAX = 1 << 20
STATUS_MAX = 8 << 20


_EXHAUSTED = (errno.EMFILE, errno.ENFILE)
_descriptor_faults = 0


def descriptor_faults() -> int:
    """How many opens failed for want of a file descriptor (EMFILE/ENFILE) so far. Such a
    failure says nothing about the fabric: a pass that met one must not turn it into a
    verdict (the caller compares this count before and after)."""
    return _descriptor_faults


def open_counted(path: str | os.PathLike[str], flags: int, dir_fd: int | None = None) -> int:
    global _descriptor_faults
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _EXHAUSTED:
            _descriptor_faults += 1
        raise


class NotARegularFile(OSError):
    """The path is a FIFO, device, socket or directory: reading it could block or mislead."""


class TooLarge(OSError):
    """The file is larger than the reader allows."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _require_regular(fd: int, path: str | os.PathLike[str]) -> None:
    """Checked on the open descriptor, so a rename in between cannot fool it."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise NotARegularFile(errno.EINVAL, f"{_kind(mode)}, not a regular file", str(path))


def read_bytes_bounded(path: str | os.PathLike[str], limit: int, dir_fd: int | None = None,
                       follow: bool = True) -> bytes:
    """The bytes of a regular file, at most `limit` of them (TooLarge past that).

    The open never blocks on a FIFO (O_NONBLOCK), and the file type is checked on the open
    descriptor (no race with a rename). `follow=False` refuses a symlink as the last
    component. Raises OSError (NotARegularFile, TooLarge, or the system's error).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = open_counted(path, flags, dir_fd=dir_fd)
    try:
        _require_regular(fd, path)
        # A regular file ignores O_NONBLOCK; procfs and sysfs report size 0 or 4096 whatever
        # they hold, so the cap is enforced on what is read, not on st_size.
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise TooLarge(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_tail(path: str | os.PathLike[str], size: int) -> bytes:
    """The last `size` bytes of a regular file (a log's newest lines), whatever its length.
    Same guards as read_bytes_bounded: no FIFO wait, type checked on the descriptor."""
    fd = open_counted(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _require_regular(fd, path)
        end = os.fstat(fd).st_size
        start = max(0, end - size)
        return os.pread(fd, end - start, start)
    finally:
        os.close(fd)


def _attribute_text(data: bytes) -> str:
    return data.decode("ascii", errors="replace").strip()


def read_attribute(path: str | os.PathLike[str], dir_fd: int | None = None) -> str:
    """A sysfs or procfs attribute: a regular file read once, at most a page (the kernel
    shows an attribute in one page). Text, stripped; undecodable bytes replaced."""
    fd = open_counted(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        _require_regular(fd, path)
        return _attribute_text(os.read(fd, ATTRIBUTE_MAX))
    finally:
        os.close(fd)


class KeptAttribute:
    """A sysfs attribute kept open and read again from its start: one pread and one fstat
    a look instead of a path walk, fstat, read and close (a sixth of the time here). The
    kernel renders an attribute anew on every read at offset 0 (how sysfs attributes are
    polled), and a removed device's attribute answers ENODEV. A look that fails closes it,
    and so does a file unlinked or replaced under it (a fixture tree, anything not sysfs):
    the next look opens the path again. One thread reads it and closes it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self) -> str:
        """The attribute's text, as read_attribute gives it; OSError as it raises."""
        if self._fd is not None:
            try:
                data = os.pread(self._fd, ATTRIBUTE_MAX, 0)
                if os.fstat(self._fd).st_nlink > 0:
                    return _attribute_text(data)
            except OSError:
                pass
            self.close()
        fd = open_counted(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            _require_regular(fd, self.path)
            data = os.pread(fd, ATTRIBUTE_MAX, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return _attribute_text(data)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def read_text_bounded(path: str | os.PathLike[str], limit: int, dir_fd: int | None = None,
                      encoding: str = "utf-8", errors: str = "strict") -> str:
    """Text of a regular file (see read_bytes_bounded); UnicodeDecodeError on bad bytes
    unless `errors` says otherwise."""
    return read_bytes_bounded(path, limit, dir_fd).decode(encoding, errors)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json_state(text: str) -> Any:
    """Strict JSON for files the agent reads back: no NaN/Infinity; nesting that exhausts
    the parser is a ValueError like any other bad content."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def printable(text: Any) -> str:
    """Text from files or the API, safe for a terminal: control characters (escape
    sequences among them) shown escaped, never sent to the terminal."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """Any exception as one line for a message: the first non-blank line of its text, else
    its type's name (an exception raised with no message, a text of blank lines); cut at
    `limit`. Never raises, so a caller that promises not to raise can use it."""
    try:
        text = str(exc)
    except Exception:  # a foreign __str__ that fails: the type still says something
        text = ""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (first or type(exc).__name__)[:limit]


def describe_error(exc: BaseException) -> str:
    """An OSError or decoding error as a short phrase for a one-line message."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not {exc.encoding} text (byte {exc.start})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def write_attribute(root: Path, parts: Sequence[str], text: str) -> None:
    """Write a procfs/sysfs attribute at root/parts[0]/.../parts[-1] without following a
    symlink anywhere below the root (each component opened with O_NOFOLLOW), never creating
    a file, and only into a regular file: a planted link cannot redirect a root write."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            if part in ("", ".", "..") or "/" in part:
                raise OSError(errno.EINVAL, f"refusing path component {part!r}")
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
        try:
            _require_regular(leaf, root.joinpath(*parts))
            os.write(leaf, text.encode("ascii"))
        finally:
            os.close(leaf)
    finally:
        os.close(fd)


def write_regular(path: Path, data: bytes) -> None:
    """`data` as the whole content of a regular file at `path` (made if absent), written
    through nothing else: not a symlink (it would write elsewhere), not a FIFO (an open
    for writing waits for a reader for ever: ENXIO instead), not a device."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC, 0o644)
    try:
        _require_regular(fd, path)
        os.ftruncate(fd, 0)
        os.write(fd, data)
    finally:
        os.close(fd)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """`path` and its missing parents, each made with `mode` exactly, whatever the umask:
    under umask 000, `mkdir -p` made them 0777, so anyone could plant files where the agent
    writes (the unit's UMask=0077 hid it; the agent does not rely on it)."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, left as it is
        os.chmod(directory, mode)


def write_json_atomic(path: Path, data: Any, durable: bool = True) -> None:
    """Write JSON so readers see the old file or the new one, never half of one.
    `durable` also waits for the disk (state that must survive a power loss); the status
    file, rewritten every pass into the runtime directory, skips that wait."""
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
