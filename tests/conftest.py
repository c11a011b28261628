from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import Netns, make_gid_tree, new_netns, roce_entries


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = new_netns()
    try:
        yield ns
    finally:
        ns.delete()


RAILS = [
    {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24", "mtu": 4200,
     "table": 100, "rule_priority": 1000, "gateway": "10.10.0.1"},
    {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24", "mtu": 4200,
     "table": 101, "rule_priority": 1001},
]


@pytest.fixture
def rails_ns(netns: Netns) -> Netns:
    """A namespace with two veth rails (r0, r1) whose peers are up: carrier present."""
    netns.veth("r0", "p0")
    netns.veth("r1", "p1")
    return netns


@pytest.fixture
def agent_config(tmp_path: Path) -> dict[str, Any]:
    """A two-rail config whose GID table is a fixture tree matching the rails."""
    sysfs = tmp_path / "sys"
    make_gid_tree(sysfs, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    make_gid_tree(sysfs, "mlx5_1", roce_entries("r1", "10.11.0.5"))
    return {
        "node_name": "node-a",
        "paths": {"sysfs": str(sysfs), "procfs": "/proc"},
        "state_dir": str(tmp_path / "state"),
        "runtime_dir": str(tmp_path / "run"),
        "rails": [dict(r) for r in RAILS],
    }
