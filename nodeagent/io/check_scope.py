"""A custom check's scope: the small process between the agent and the check, which the
check and everything it starts cannot leave, so that nothing of a check outlives it.

A process group is not such a scope: `setsid cmd &` leaves it, and the agent's kill of the
group misses what left. A cgroup of the check's own would be, but the agent may not write
the cgroup tree (the unit's ProtectControlGroups=yes; a container's read-only
/sys/fs/cgroup). So this process makes itself a child subreaper (prctl(2),
PR_SET_CHILD_SUBREAPER): every process the check orphans, however it detached (setsid,
double fork), is re-parented to it, not to init. When the check ends, or when the agent asks
(SIGTERM: a timeout, the daemon stopping), or when the agent dies (PR_SET_PDEATHSIG), it
kills the check's group and then every child it has, until it has none, and exits with the
check's status (killed by the same signal when the check was).

Run by path with `python -I -S`, so it imports nothing but the standard library: a
check costs one small interpreter more, not the agent's imports.
Usage: check_scope.py -- ARGV...
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

TYPE_CHECKING = False  # read by mypy as typing.TYPE_CHECKING; typing costs each check
if TYPE_CHECKING:
    from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SWEEP_SECONDS = 2.0  # a child in uninterruptible sleep cannot die: given up after this


def children() -> list[int]:
    """This process's children (it has one thread): from procfs's children list when the
    kernel has it (CONFIG_PROC_CHILDREN), else by the parent field of every process."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(me):
            found.append(int(name))
    return found


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill(how: Callable[[int, int], None], target: int) -> None:
    # try/except, not contextlib.suppress: contextlib's imports cost each check 4 ms.
    try:  # noqa: SIM105
        how(target, signal.SIGKILL)
    except OSError:
        pass


def sweep(check: int) -> None:
    """Kill the check's group, then every child this process has (the check's orphans come
    here), until none is left or SWEEP_SECONDS have passed."""
    _kill(os.killpg, check)
    until = time.monotonic() + SWEEP_SECONDS
    while True:
        reap()
        left = children()
        if not left or time.monotonic() > until:
            return
        for pid in left:
            _kill(os.kill, pid)
        time.sleep(0.01)


class Stop(Exception):
    """The agent asked (SIGTERM): a timeout, or the daemon stopping."""


def _stop(signum: int, frame: object) -> None:
    raise Stop


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: check_scope.py -- ARGV...", file=sys.stderr)
        return 2
    argv = argv[1:]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # the check still runs: bounded by its group alone
        pass
    # SIGTERM held until the check runs and the wait below can take it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, _stop)
    check = os.fork()
    if check == 0:
        try:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        os._exit(127)
    status = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        while status is None:
            pid, got = os.wait()  # the check, or an orphan of it that ended
            if pid == check:
                status = got
    except (Stop, ChildProcessError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the sweep is not interrupted
    sweep(check)
    if status is None:  # asked to stop: the check was killed
        return 128 + signal.SIGKILL
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: said the same way to the agent
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
