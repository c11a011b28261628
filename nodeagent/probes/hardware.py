"""The RDMA hardware fingerprint of this host, from sysfs. Read-only.

Node labels under the agent's own prefix say which HCA model, firmware and driver a node
has, so a rollout can target the hardware variants that staging lacks.
"""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.io.bounded import Where
from nodeagent.io.files import read_attribute
from nodeagent.model.kube import BOARD_ID, DRIVER, FINGERPRINT_LABELS, FW_VERSION, HCA_TYPE


def _text(path: Path, where: Where) -> str | None:
    where.path = str(path)
    try:
        text = read_attribute(path)
    except OSError:
        return None
    return text or None


def read_fingerprint(sysfs: Path, devices: list[str], netdevs: list[str],
                     where: Where | None = None) -> dict[str, set[str]]:
    """Label -> the values seen on the rails' RDMA devices and netdevs."""
    where = where or Where()
    seen: dict[str, set[str]] = {k: set() for k in FINGERPRINT_LABELS}
    for dev in devices:
        base = sysfs / "class" / "infiniband" / dev
        for label, name in ((HCA_TYPE, "hca_type"), (FW_VERSION, "fw_ver"),
                            (BOARD_ID, "board_id")):
            value = _text(base / name, where)
            if value:
                seen[label].add(value)
    for ifname in netdevs:
        try:
            driver = os.readlink(sysfs / "class" / "net" / ifname / "device" / "driver")
        except OSError:
            continue  # a virtual netdev has no device
        seen[DRIVER].add(os.path.basename(driver))
    return seen
