"""Read per-interface sysctls from the procfs root (never from the sysctl tool)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nodeagent.config import RAIL_SYSCTLS


def sysctl_path(procfs_root: Path, ifname: str, key: str) -> Path:
    subtree = RAIL_SYSCTLS[key][0]
    return procfs_root / "sys" / subtree / ifname / key


def read_rail_sysctls(procfs_root: Path, ifname: str, keys: Iterable[str]) -> dict[str, str | None]:
    """key -> value text, None when the file is missing or unreadable (e.g. IPv6 disabled)."""
    values: dict[str, str | None] = {}
    for key in keys:
        try:
            values[key] = sysctl_path(procfs_root, ifname, key).read_text().strip()
        except OSError:
            values[key] = None
    return values
