"""Read per-interface sysctls from the procfs root (never from the sysctl tool)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nodeagent.config import sysctl_parts
from nodeagent.io.files import read_attribute


def sysctl_path(procfs_root: Path, ifname: str, key: str) -> Path:
    return procfs_root.joinpath(*sysctl_parts(ifname, key))


def read_rail_sysctls(procfs_root: Path, ifname: str, keys: Iterable[str]) -> dict[str, str | None]:
    """key -> value text, None when the file is missing or unreadable (e.g. IPv6 disabled),
    or is not a regular file."""
    values: dict[str, str | None] = {}
    for key in keys:
        try:
            values[key] = read_attribute(sysctl_path(procfs_root, ifname, key))
        except OSError:
            values[key] = None
    return values
