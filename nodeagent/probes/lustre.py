"""Lustre client probes: mounts, client health, server reachability, responsiveness.

A dead Lustre mount blocks statfs (and df, and `lfs`) for as long as it is dead, often in
uninterruptible sleep. So nothing here touches a mount from the agent's own process:
statfs and `lfs` run in child processes with a timeout, a child that does not finish is
left running (it may be unkillable), and while it runs no second one is started for the
same key. A dead mount therefore costs one stuck process, never a pile of them.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from nodeagent.io.bounded import Stuck, Where
from nodeagent.io.commands import BoundedRunner
from nodeagent.io.files import describe_error, read_text_bounded
from nodeagent.model.lustre import Health, HealthState, LustreObservation, MountEntry

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field_text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field_text)


def parse_mountinfo(text: str) -> tuple[list[MountEntry], list[str]]:
    """Entries of /proc/<pid>/mountinfo, and one line per line it could not parse."""
    entries: list[MountEntry] = []
    errors: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        parts, tail = left.split(), right.split()
        if not sep or len(parts) < 6 or len(tail) < 2:
            errors.append(f"mountinfo line {n}: unparsable {line[:80]!r}")
            continue
        opts = set(parts[5].split(","))
        if len(tail) >= 3:
            opts |= set(tail[2].split(","))
        entries.append(MountEntry(mountpoint=unescape(parts[4]), fstype=tail[0],
                                  source=unescape(tail[1]), options=frozenset(opts)))
    return entries, errors


MOUNTINFO_MAX = 32 << 20  # a Kubernetes node can have thousands of mounts
HEALTH_MAX = 64 << 10


def read_mountinfo(procfs_root: Path) -> tuple[list[MountEntry], list[str]]:
    path = procfs_root / "self" / "mountinfo"
    try:
        text = read_text_bounded(path, MOUNTINFO_MAX, errors="replace")
    except OSError as exc:
        return [], [f"cannot read {path}: {describe_error(exc)}"]
    return parse_mountinfo(text)


def parse_health(text: str) -> Health:
    """health_check in either layout: the verdict alone (newer clients' sysfs), or, on older
    clients' procfs, one `device <name> reported unhealthy` line per sick device followed by
    the `NOT HEALTHY` verdict (obd_proc_health_seq_show). `LBUG` anywhere wins."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return Health(HealthState.UNREADABLE, "health_check is empty")
    if any("LBUG" in ln for ln in lines):
        return Health(HealthState.LBUG, "; ".join(lines)[:500])
    devices = [ln for ln in lines if ln.startswith("device ") and "unhealthy" in ln]
    verdicts = [ln for ln in lines if ln not in devices]
    if (verdicts and verdicts[-1].startswith("NOT HEALTHY")) or (devices and not verdicts):
        return Health(HealthState.UNHEALTHY, "; ".join(devices)[:500] or "NOT HEALTHY")
    if verdicts == ["healthy"]:
        return Health(HealthState.HEALTHY)
    return Health(HealthState.UNREADABLE, f"unexpected health_check content {verdicts[0][:60]!r}")


def read_health(sysfs_root: Path, procfs_root: Path, where: Where | None = None) -> Health:
    """health_check from sysfs (newer clients) or procfs (older ones), whichever exists."""
    for path in (sysfs_root / "fs" / "lustre" / "health_check",
                 procfs_root / "fs" / "lustre" / "health_check"):
        if where is not None:
            where.path = str(path)
        try:
            return parse_health(read_text_bounded(path, HEALTH_MAX, errors="replace"))
        except FileNotFoundError:
            continue
        except OSError as exc:
            return Health(HealthState.UNREADABLE, f"{path}: {describe_error(exc)}")
    return Health(HealthState.ABSENT, "no fs/lustre/health_check (Lustre client not loaded?)")


def parse_lfs_check(text: str) -> dict[str, str]:
    """`lfs check servers` -> target -> status ('active' or the error text)."""
    targets: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, status = line.partition(":")
        name, status = name.strip(), status.strip().rstrip(".")
        if sep and name and " " not in name:
            targets[name] = status
    return targets


def statfs_argv(mountpoint: str) -> list[str]:
    # coreutils `stat -f` does exactly one statfs(2); cheaper to start than a Python child.
    return ["stat", "--file-system", "--format=%T", "--", mountpoint]


def observe_lustre(
    mounts: list[tuple[str, str, float]],  # (mountpoint, fstype, timeout)
    sysfs_root: Path,
    procfs_root: Path,
    lfs_path: str | None,
    runner: BoundedRunner,
) -> LustreObservation:
    """One look at every configured mount; blocks at most the largest timeout."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    entries, errors = read_mountinfo(procfs_root)
    by_point = {e.mountpoint: e for e in entries}
    read = runner.reads.one("lustre health_check",
                            functools.partial(read_health, sysfs_root, procfs_root))
    health = Health(HealthState.UNREADABLE, read.describe()) if isinstance(read, Stuck) else read
    present = [(mp, t) for mp, fstype, t in mounts
               if mp in by_point and by_point[mp].fstype == fstype]
    lfs = shutil.which(lfs_path) if lfs_path else None
    with ThreadPoolExecutor(max_workers=len(present) + 1) as pool:
        statfs = {mp: pool.submit(runner.run, f"statfs:{mp}", statfs_argv(mp), t)
                  for mp, t in present}
        lfs_future = None
        if lfs is not None and mounts:
            lfs_timeout = max(t for _, _, t in mounts)
            lfs_future = pool.submit(runner.run, "lfs", [lfs, "check", "servers"], lfs_timeout)
        results = {mp: f.result() for mp, f in statfs.items()}
        targets: dict[str, str] | None = None
        lfs_error = None
        if lfs_future is not None:
            got = lfs_future.result()
            if got.done:
                targets = parse_lfs_check(got.output)
                if not targets and not got.ok:
                    lfs_error = f"lfs check servers failed: {got.output.strip()[:200]}"
            else:
                targets = {}
                lfs_error = f"lfs check servers did not answer within {got.seconds:.1f}s"
    return LustreObservation(mounts=by_point, mount_errors=tuple(errors), health=health,
                             statfs=results, lfs=targets, lfs_error=lfs_error)
