"""Lustre mounts and their health as the probes see them."""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.model.words import Words


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str
    options: frozenset[str]  # per-mount and superblock options, 'flock', 'rw', 'user_xattr'...


class HealthState(Words):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # NOT HEALTHY, or a device reported unhealthy
    LBUG = "lbug"  # the client hit an LBUG: it stays broken until a reboot
    UNREADABLE = "unreadable"
    ABSENT = "absent"  # no health_check: the client is not loaded


@dataclass(frozen=True)
class Health:
    """The Lustre client's own verdict (health_check)."""

    state: HealthState
    detail: str = ""


@dataclass
class ProbeResult:
    done: bool  # finished within the timeout
    ok: bool  # finished and succeeded
    seconds: float  # how long it took, or how long it has been running
    output: str = ""
    already_running: bool = False  # a previous probe is still stuck: none was started


@dataclass(frozen=True)
class LustreObservation:
    mounts: dict[str, MountEntry]  # by mountpoint (the last entry wins, as in the kernel)
    mount_errors: tuple[str, ...]
    health: Health
    statfs: dict[str, ProbeResult]  # by configured mountpoint, only for mounts present
    lfs: dict[str, str] | None  # target -> status; None when `lfs` is not there
    lfs_error: str | None = None


@dataclass(frozen=True)
class LustreProbeStatus:
    mountpoint: str
    probe_seconds: float  # how long its statfs took, or has been running
    hung: bool
