"""The hardware fingerprint: sysfs reads and label values."""

from __future__ import annotations

from pathlib import Path

from nodeagent.checks.hardware import fingerprint_labels, label_value
from nodeagent.model.kube import BOARD_ID, DRIVER, FW_VERSION, HCA_TYPE
from nodeagent.probes.hardware import read_fingerprint
from nodeagent.publish.node import label_patch


def device(sysfs: Path, name: str, fw: str, hca: str = "MT4129", board: str = "MT_0000000838",
           ) -> None:
    base = sysfs / "class" / "infiniband" / name
    base.mkdir(parents=True)
    (base / "fw_ver").write_text(fw + "\n")
    (base / "hca_type").write_text(hca + "\n")
    (base / "board_id").write_text(board + "\n")


def netdev(sysfs: Path, ifname: str, driver: str | None) -> None:
    dev = sysfs / "class" / "net" / ifname
    dev.mkdir(parents=True)
    if driver:
        (sysfs / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (dev / "device").mkdir()
        (dev / "device" / "driver").symlink_to(sysfs / "bus" / "pci" / "drivers" / driver)


def test_one_model_everywhere(tmp_path: Path) -> None:
    device(tmp_path, "mlx5_0", "28.39.1002")
    device(tmp_path, "mlx5_1", "28.39.1002")
    netdev(tmp_path, "ens1f0", "mlx5_core")
    netdev(tmp_path, "ens1f1", "mlx5_core")
    seen = read_fingerprint(tmp_path, ["mlx5_0", "mlx5_1"], ["ens1f0", "ens1f1"])
    assert fingerprint_labels(seen) == {HCA_TYPE: "MT4129", FW_VERSION: "28.39.1002",
                                        BOARD_ID: "MT_0000000838", DRIVER: "mlx5_core"}


def test_mixed_missing_and_odd_values(tmp_path: Path) -> None:
    device(tmp_path, "mlx5_0", "28.39.1002")
    device(tmp_path, "mlx5_1", "28.40.1000 (beta)", board="")
    netdev(tmp_path, "veth0", None)  # virtual: no device, no driver
    seen = read_fingerprint(tmp_path, ["mlx5_0", "mlx5_1", "absent"], ["veth0"])
    labels = fingerprint_labels(seen)
    assert labels[FW_VERSION] == "mixed" and labels[HCA_TYPE] == "MT4129"
    assert labels[BOARD_ID] == "MT_0000000838", "an empty attribute is not a value"
    assert DRIVER not in labels
    assert label_value("28.40.1000 (beta)") == "28.40.1000--beta"
    assert label_value("x" * 80) == "x" * 63


def test_label_patch_touches_only_ours() -> None:
    ours = [HCA_TYPE, DRIVER]
    current = {HCA_TYPE: "MT4129", DRIVER: "mlx5_core", "team": "ml"}
    assert label_patch(current, ours, {HCA_TYPE: "MT4129", DRIVER: "mlx5_core"}) == {}
    assert label_patch(current, ours, {HCA_TYPE: "MT4130"}) == {HCA_TYPE: "MT4130",
                                                                 DRIVER: None}
