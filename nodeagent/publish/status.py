"""The running daemon's status file: what `nodeagent status` reads.

Written atomically after every pass; it carries the daemon's pid and the time of the pass so
a reader can tell a dead daemon or a wedged loop from a healthy one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import math
import os
import socket
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.config import MAX_DURATION
from nodeagent.io.files import (
    STATUS_MAX,
    make_dirs,
    parse_json_state,
    read_text_bounded,
    write_json_atomic,
)

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
LOCK_FILE = "daemon.lock"


class AlreadyRunning(Exception):
    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(f"another nodeagent daemon ({holder}) holds {path}")
        self.pid = pid


def _lock_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        pid = int(text)
        return pid if 0 < pid < 2**22 else None
    return None


class LockRefused(OSError):
    """The lock file is not one the agent may write: a hard link (writing the pid would
    change a file elsewhere) or not a regular file."""


def _runtime_name(runtime_dir: Path) -> str:
    """The abstract unix socket name of a runtime dir (its resolved path, hashed to fit)."""
    where = str(Path(runtime_dir).resolve())
    return "\0nodeagent-daemon:" + hashlib.sha256(where.encode()).hexdigest()[:40]


def _claim_name(runtime_dir: Path) -> socket.socket | None:
    """The runtime dir's name bound, or None when another process holds it. An abstract
    socket has no file: nothing can unlink or replace it, and the kernel frees it when its
    holder dies, however it dies. It is per network namespace, which the daemon shares with
    every other that manages the same interfaces."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(_runtime_name(runtime_dir))
        sock.listen(1)  # never accepted: a reader's connect tells it is held, and by whom
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return sock


def _name_holder(runtime_dir: Path) -> int | None:
    """The pid holding the runtime dir's name (0: held, the pid not told), None when it is
    free. A connect, never a bind: a reader must not take the name from a starting daemon."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC
                         | socket.SOCK_NONBLOCK)
    try:
        sock.connect(_runtime_name(runtime_dir))
    except BlockingIOError:
        return 0  # its one-connection queue is full: held
    except OSError:
        return None  # refused: nobody listens on the name
    else:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return int.from_bytes(creds[:4], "little") or 0  # struct ucred: pid, uid, gid
    finally:
        sock.close()


def _pid_at(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _lock_pid(fd)
    finally:
        os.close(fd)


class DaemonLock:
    """One daemon per runtime dir, by two locks held for the daemon's life: its name as an
    abstract unix socket (nothing on disk: a deleted or replaced lock file cannot let a
    second daemon in, not even between two passes), and an exclusive flock on
    runtime_dir/daemon.lock with the holder's pid in it for `status` and the refusal
    message. The file is re-checked after the flock and on every pass: deleted or replaced,
    it is locked again, so `status` keeps finding the daemon."""

    def __init__(self, runtime_dir: Path) -> None:
        self.path = Path(runtime_dir) / LOCK_FILE
        self.fd: int | None = None
        self.name: socket.socket | None = None
        self.problem: str | None = None  # why the path could not be locked again

    def keep(self) -> bool:
        """reassert() for every pass. False when another daemon holds the file at the path
        now (this one must stop). A file the agent may not write there is logged once and
        kept in `problem` (for the status file); the lock already held stays."""
        try:
            self.reassert()
        except AlreadyRunning as exc:
            log.error("stopping: %s", exc)
            return False
        except OSError as exc:
            problem = f"cannot lock {self.path} again: {exc.strerror or exc}"
            if problem != self.problem:
                log.error("%s (the lock already held is kept)", problem)
            self.problem = problem
            return True
        self.problem = None
        return True

    def acquire(self) -> None:
        make_dirs(self.path.parent)
        name = _claim_name(self.path.parent)
        if name is None:
            raise AlreadyRunning(self.path, _name_holder(self.path.parent)
                                 or _pid_at(self.path))
        try:
            self.fd = self._acquire()
        except BaseException:
            name.close()
            raise
        self.name = name

    def reassert(self) -> None:
        """Each pass: still the file at the path? If it was deleted or replaced, lock the
        one there now (made anew if gone) and let the old one go. AlreadyRunning when
        another daemon holds that one (this one must stop); LockRefused when it is not a file
        the agent may write (the old lock is kept; the caller reports it)."""
        if self.fd is None or self._is_at_path(self.fd):
            return
        fd = self._acquire()
        os.close(self.fd)
        self.fd = fd

    def _acquire(self) -> int:
        make_dirs(self.path.parent)
        for _ in range(5):
            fd = self._lock_path()
            if self._is_at_path(fd):
                os.ftruncate(fd, 0)  # ours: a regular file with one link, locked
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
            os.close(fd)  # replaced or removed between open and flock: lock the one there
        raise LockRefused(errno.EAGAIN, "it keeps being replaced")

    def _lock_path(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o644)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LockRefused(errno.EINVAL, "it is not a regular file")
            if st.st_nlink > 1:  # O_NOFOLLOW stops symlinks, not hard links
                raise LockRefused(errno.EMLINK, f"it has {st.st_nlink} links: refusing "
                                                "to write through it")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AlreadyRunning(self.path, _lock_pid(fd)) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _is_at_path(self, fd: int) -> bool:
        try:
            at_path = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.name is not None:
            self.name.close()
            self.name = None


def daemon_holding(runtime_dir: Path) -> int | None:
    """The pid of the daemon that holds the runtime dir's lock (0 when it cannot be told),
    or None when no daemon holds it."""
    path = Path(runtime_dir) / LOCK_FILE
    if Path(runtime_dir).is_dir():
        holder = _name_holder(Path(runtime_dir))
        if holder is not None:  # held, whatever became of the file
            return holder or _pid_at(path) or 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _lock_pid(fd) or 0
        return None  # we could take it: nobody holds it
    finally:
        os.close(fd)


def status_path(runtime_dir: Path) -> Path:
    return Path(runtime_dir) / STATUS_FILE


def write_status(runtime_dir: Path, report: dict[str, Any], daemon: dict[str, Any]) -> None:
    data = dict(report)
    data["daemon"] = {**daemon, "pid": os.getpid(), "updated_at": time.time()}
    write_json_atomic(status_path(runtime_dir), data, durable=False)


@dataclass(frozen=True)
class ConditionLine:
    type: str
    status: str
    reason: str
    message: str
    problems: tuple[str, ...]  # as the writer listed them; the message alone when it did not


@dataclass(frozen=True)
class RailLine:
    name: str
    address: str | None = None
    rdma_device: str | None = None
    rdma_port: int | None = None
    gid_index_pinned: int | None = None
    nccl_default_gid_index: int | None = None
    # With peers: traffic class -> (peers failing over RoCE in it, peers probed in it)
    classes: Mapping[int, tuple[int, int]] = field(default_factory=dict)


MAX_LINES = 64  # rails, mounts, actions and errors read from one file, at most


@dataclass(frozen=True)
class StatusDocument:
    """The status file (or a fresh report's document), parsed once for every reader:
    `status` and `check` print it, preflight takes its verdict from it."""

    node: str
    ok: bool
    conditions: tuple[ConditionLine, ...]
    rails: tuple[RailLine, ...] = ()
    lustre: tuple[str, ...] = ()  # the mountpoints
    actions: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    pid: int | None = None
    updated_at: float = 0.0
    resync_interval: Any = None  # as written: stale_after() judges what it is worth

    def condition(self, kind: str) -> ConditionLine | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @classmethod
    def parse(cls, raw: Any, written: bool = True) -> StatusDocument:
        """ValueError names the first part that is not a status file's (`written`: by the
        daemon, with its daemon section)."""
        raw = validate_status(raw, written)
        daemon = raw.get("daemon") or {}
        return cls(
            node=raw["node"], ok=raw["ok"],
            conditions=tuple(ConditionLine(c["type"], c["status"], c["reason"], c["message"],
                                           _problems(c)) for c in raw["conditions"]),
            rails=tuple(_rail(r) for r in raw.get("rails", [])[:MAX_LINES]
                        if isinstance(r, dict)) if isinstance(raw.get("rails"), list) else (),
            lustre=tuple(_text(m.get("mountpoint")) for m in _items(raw.get("lustre"))
                         if isinstance(m, dict) and _text(m.get("mountpoint"))),
            actions=tuple(str(a) for a in raw["actions"][:MAX_LINES]),
            errors=tuple(str(e) for e in raw["errors"][:MAX_LINES]),
            pid=_int(daemon.get("pid")), updated_at=float(daemon.get("updated_at", 0)),
            resync_interval=daemon.get("resync_interval"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _items(value: Any) -> list[Any]:
    return value[:MAX_LINES] if isinstance(value, list) else []


def _problems(condition: dict[str, Any]) -> tuple[str, ...]:
    got = condition.get("problems")
    items = got if isinstance(got, list) and got else [condition["message"]]
    return tuple(str(x) for x in items)


def _rail(r: dict[str, Any]) -> RailLine:
    return RailLine(_text(r.get("name")), _text(r.get("address")) or None,
                    _text(r.get("rdma_device")) or None, _int(r.get("rdma_port")),
                    _int(r.get("gid_index_pinned")), _int(r.get("nccl_default_gid_index")),
                    _classes(r.get("peers")))


# The outcomes that say the fabric dropped RoCE while TCP reached the peer (PeerOutcome's
# ROCE_FAILED, MTU_FAILED): a dead peer fails in every class alike and says nothing of one.
_FABRIC_FAILED = ("RoCE failed", "MTU failed")


def _classes(peers: Any) -> dict[int, tuple[int, int]]:
    """Each traffic class the rail's peers were probed in: how many fail there over RoCE."""
    out: dict[int, tuple[int, int]] = {}
    for p in _items(peers):
        tc = _int(p.get("traffic_class")) if isinstance(p, dict) else None
        if tc is None or not 0 <= tc <= 255:
            continue
        failing, total = out.get(tc, (0, 0))
        bad = p.get("failing") is True and p.get("outcome") in _FABRIC_FAILED
        out[tc] = (failing + bad, total + 1)
    return out


@dataclass(frozen=True)
class StatusView:
    data: dict[str, Any]  # as written: `status --json` passes it on
    doc: StatusDocument
    running: bool
    age: float
    stale: bool
    holder: int | None = None  # pid holding the daemon lock

    @property
    def problem(self) -> str | None:
        pid = self.doc.pid
        if not self.running:  # nobody holds the daemon lock
            age = "" if math.isinf(self.age) else f"; last status is {self.age:.0f}s old"
            return f"daemon is not running (pid {pid} is gone){age}"
        if self.holder and self.holder != pid:
            return (f"the status file was written by pid {pid}, but pid {self.holder} holds "
                    "the daemon lock: it has not finished a pass yet")
        if math.isinf(self.age):
            return "status is dated in the future (updated_at is ahead of this clock)"
        if self.stale:
            return f"status is stale: last pass {self.age:.0f}s ago (daemon pid {pid} wedged?)"
        return None


_SHAPE = {"node": str, "ok": bool, "conditions": list, "daemon": dict}


def validate_status(raw: Any, written: bool = True) -> dict[str, Any]:
    """The parts `status` reads, checked for shape; ValueError names the first bad one.
    A report not `written` by the daemon (`check`'s) has no daemon section."""
    if not isinstance(raw, dict):
        raise ValueError("not a nodeagent status file (not a JSON object)")
    doc: dict[str, Any] = raw if written else {**raw, "daemon": {}}
    for key, kind in _SHAPE.items():
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"not a nodeagent status file ({key!r} is not a {kind.__name__})")
    for i, c in enumerate(doc["conditions"]):
        if not isinstance(c, dict) or not all(isinstance(c.get(k), str)
                                              for k in ("type", "status", "reason", "message")):
            raise ValueError(f"not a nodeagent status file (conditions[{i}] is malformed)")
    for key in ("actions", "errors"):
        if not isinstance(doc.setdefault(key, []), list):
            raise ValueError(f"not a nodeagent status file ({key!r} is not a list)")
    updated = doc["daemon"].get("updated_at", 0)
    if isinstance(updated, bool) or not isinstance(updated, int | float) \
            or not math.isfinite(updated):
        raise ValueError("not a nodeagent status file (daemon.updated_at is not a time)")
    return doc


def stale_after(resync_interval: Any) -> float:
    """Seconds after which the daemon's last pass is stale: two resyncs and 10 s. One rule
    for `nodeagent status` (its config's interval) and preflight (the interval the status
    file says): a value no config could hold (a forged 1e300) counts as the default 30 s,
    or a year-old status would pass."""
    every = resync_interval if isinstance(resync_interval, int | float) \
        and not isinstance(resync_interval, bool) and 1.0 <= resync_interval <= MAX_DURATION \
        else 30.0
    return 2 * every + 10


def read_status(runtime_dir: Path, stale_seconds: float) -> StatusView:
    """Raises FileNotFoundError when the daemon never wrote one, ValueError when corrupt.
    Whether a daemon runs is told by the daemon lock, not by guessing from a pid."""
    raw = parse_json_state(read_text_bounded(status_path(runtime_dir), STATUS_MAX))
    doc = StatusDocument.parse(raw)
    # A time in the future (a clock stepped back, or a forged file) counts as old, not fresh.
    age = time.time() - doc.updated_at
    age = age if age >= 0 else math.inf
    holder = daemon_holding(runtime_dir)
    return StatusView(data=raw, doc=doc, running=holder is not None, age=age,
                      stale=age > stale_seconds, holder=holder)
