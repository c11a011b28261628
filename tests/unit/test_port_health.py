"""RDMAHardwareHealthy on fixture sysfs trees in mlx5's shapes (tests/kit/helpers.py:
make_port_tree; texts as the kernel's sysfs code prints them), driven over time for the
error-counter rates. The probe's reads, the check's reasons, resets, missing and garbage
files, and the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from nodeagent.checks.port_health import ErrorRates, hardware_finding
from nodeagent.config import Config, parse_config
from nodeagent.model.conditions import Finding
from nodeagent.model.rdma import PortHealth
from nodeagent.model.status import RailStatus, Report, Status
from nodeagent.probes.port import parse_link_speed, parse_rate, read_port_health
from nodeagent.publish.metrics import AgentMetrics
from tests.kit.helpers import make_port_tree

LIMITS = {"symbol_error": 10, "link_downed": 1, "out_of_sequence": 100}


def cfg(**hardware: Any) -> Config:
    return parse_config({
        "rails": [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24",
                   "rdma_device": "mlx5_0"}],
        "hardware": {"error_limits": LIMITS, **hardware}})


def read(root: Path) -> PortHealth:
    return read_port_health(root, "mlx5_0", 1, list(LIMITS))


def judge(root: Path, rates: ErrorRates | None = None, **hardware: Any) -> Finding:
    return hardware_finding(cfg(**hardware), {"rail0": read(root)}, rates or ErrorRates())


def test_kernel_texts_parse() -> None:
    assert parse_rate("200 Gb/sec (4X HDR)") == 200
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("garbage") is None and parse_rate(None) is None
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0
    assert parse_link_speed("8 GT/s") == 8.0  # older kernels
    assert parse_link_speed("Unknown") is None


def test_a_healthy_port(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", counters={"symbol_error": 0, "link_downed": 1},
                   hw_counters={"out_of_sequence": 7})
    port = read(tmp_path)
    assert (port.state, port.phys_state, port.link_layer) == ("ACTIVE", "LinkUp", "Ethernet")
    assert port.rate_gbps == 200 and port.fw_ver == "20.31.1014"
    assert port.counters == {"symbol_error": 0, "link_downed": 1, "out_of_sequence": 7}
    assert port.pcie is not None and (port.pcie.width, port.pcie.max_width) == (16, 16)
    f = judge(tmp_path, expect_rate=200)
    assert (f.status, f.reason) == ("True", "HardwareHealthy")
    assert "mlx5_0/1 ACTIVE 200 Gb/sec (4X HDR)" in f.message


def test_port_state_and_physical_link(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", state="1: DOWN", phys_state="3: Disabled")
    f = judge(tmp_path)
    assert (f.status, f.reason) == ("False", "PortNotActive")
    assert "port DOWN, want ACTIVE" in f.message and "physical link Disabled" in f.message
    make_port_tree(tmp_path, "mlx5_0", phys_state="2: Polling")
    assert judge(tmp_path).reason == "PortPhysicalLinkDown"


def test_port_states_are_the_kernels_words(tmp_path: Path) -> None:
    """Every word the kernel writes (drivers/infiniband/core/sysfs.c: state_name[] and
    phys_state_to_str()) reads as its member; a word the kernel has no name for
    ("<unknown>") or one newer than the agent is Unknown, with the word in the message,
    never a port that passes or fails on a guess."""
    from nodeagent.model.rdma import PhysState, PortState

    for number, word in enumerate(["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"]):
        make_port_tree(tmp_path, "mlx5_0", state=f"{number}: {word}")
        assert read(tmp_path).state is PortState(word)
    for number, word in enumerate(["Sleep", "Polling", "Disabled", "PortConfigurationTraining",
                                   "LinkUp", "LinkErrorRecovery", "Phy Test"], start=1):
        make_port_tree(tmp_path, "mlx5_0", phys_state=f"{number}: {word}")
        assert read(tmp_path).phys_state is PhysState(word)
    make_port_tree(tmp_path, "mlx5_0", state="4: ACTIVE", phys_state="0: <unknown>")
    port = read(tmp_path)
    assert port.phys_state is None and port.state is PortState.ACTIVE
    f = judge(tmp_path)
    assert (f.status, f.reason) == ("Unknown", "HardwareNotReadable")
    assert "physical state not readable (phys_state: unknown word '<unknown>')" in f.message


def test_rate_below_the_expected(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", rate="100 Gb/sec (2X HDR)")
    f = judge(tmp_path, expect_rate=200)
    assert (f.reason, f.status) == ("PortRateDegraded", "False")
    assert "100 Gb/sec (2X HDR), want at least 200 Gb/s" in f.message
    assert judge(tmp_path).status == "True"  # no expect_rate: not checked


def test_link_layer(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", link_layer="InfiniBand")
    assert judge(tmp_path).reason == "LinkLayerMismatch"
    assert judge(tmp_path, link_layer=None).status == "True"


def test_pcie_trained_narrow_or_slow(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", pcie=("0000:3b:00.0", "16.0 GT/s PCIe", "8",
                                             "16.0 GT/s PCIe", "16"))
    f = judge(tmp_path)
    assert f.reason == "PCIeLinkDegraded"
    assert "PCIe 0000:3b:00.0 trained at 16 GT/s x8, want 16 GT/s x16" in f.message
    make_port_tree(tmp_path, "mlx5_0", pcie=("0000:3b:00.0", "8.0 GT/s PCIe", "16",
                                             "16.0 GT/s PCIe", "16"))
    assert judge(tmp_path).reason == "PCIeLinkDegraded"
    assert judge(tmp_path, pcie=False).status == "True"
    # Configured minimums instead of the device's maximum.
    assert judge(tmp_path, pcie=False, min_pcie_speed=8.0, min_pcie_width=16).status == "True"
    assert judge(tmp_path, min_pcie_speed=16.0).reason == "PCIeLinkDegraded"


def test_no_pci_function_is_not_a_problem(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", pcie=None)  # soft-RoCE has none
    assert read(tmp_path).pcie is None
    assert judge(tmp_path).status == "True"


def test_error_counter_growth_within_the_window(tmp_path: Path) -> None:
    rates = ErrorRates()
    c = cfg(error_window="60s")
    for t, errors in ((0, 100), (20, 105), (40, 111)):
        make_port_tree(tmp_path, "mlx5_0", counters={"symbol_error": errors})
        rates.observe(t, 60, {"rail0": read(tmp_path)})
    f = hardware_finding(c, {"rail0": read(tmp_path)}, rates)
    assert (f.status, f.reason) == ("False", "ErrorCountersRising")
    assert "symbol_error +11 in 40 s (limit 10 per 60 s)" in f.message
    # Quiet for a window: the old samples age out.
    for t in (80, 100, 120):
        rates.observe(t, 60, {"rail0": read(tmp_path)})
    assert hardware_finding(c, {"rail0": read(tmp_path)}, rates).status == "True"


def test_a_counter_reset_is_not_a_burst(tmp_path: Path) -> None:
    rates = ErrorRates()
    for t, downed in ((0, 5), (10, 0), (20, 1)):  # reset to 0, then one link_downed
        make_port_tree(tmp_path, "mlx5_0", counters={"link_downed": downed})
        rates.observe(t, 300, {"rail0": read(tmp_path)})
    assert rates.growth("rail0", "link_downed") == (1, 10)
    assert judge(tmp_path, rates).status == "True"  # +1 is within the limit of 1
    make_port_tree(tmp_path, "mlx5_0", counters={"link_downed": 3})
    rates.observe(30, 300, {"rail0": read(tmp_path)})
    assert judge(tmp_path, rates).reason == "ErrorCountersRising"


def test_missing_and_garbage_counters_are_left_out(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", counters={"symbol_error": "garbage"},
                   hw_counters={"out_of_sequence": -5})
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/link_downed").mkdir()  # EINVAL-like
    port = read(tmp_path)
    assert port.counters == {}
    assert "link_downed" in port.unreadable
    assert judge(tmp_path).status == "True"  # nothing to judge a rate by; the port is fine


def test_unreadable_state_is_unknown_not_false(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0")
    state = tmp_path / "class/infiniband/mlx5_0/ports/1/state"
    state.unlink()
    state.mkdir()
    f = judge(tmp_path)
    assert (f.status, f.reason) == ("Unknown", "HardwareNotReadable")
    assert "port state not readable" in f.message


def test_firmware_the_fleet_accepts(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", fw_ver="20.28.1002")
    f = judge(tmp_path, firmware={"MT4123": ["20.31.1014", "20.32.1010"]})
    assert f.reason == "FirmwareMismatch"
    assert "MT4123 firmware 20.28.1002, accepted: 20.31.1014, 20.32.1010" in f.message
    assert judge(tmp_path, firmware={"MT4129": ["28.39.1002"]}).status == "True"


def test_a_rail_without_a_known_device_is_unknown() -> None:
    f = hardware_finding(cfg(), {}, ErrorRates())
    assert (f.status, f.reason) == ("Unknown", "HardwareNotReadable")
    off = hardware_finding(parse_config({}), {}, ErrorRates())
    assert (off.status, off.reason) == ("True", "NotConfigured")


def test_every_counter_is_a_metric(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_0", counters={"symbol_error": 3},
                   hw_counters={"out_of_sequence": 9},
                   pcie=("0000:3b:00.0", "16.0 GT/s PCIe", "8", "16.0 GT/s PCIe", "16"))
    port = read(tmp_path)
    report = Report(node="n", findings=[], rails=[RailStatus("rail0", "r0", port=port)])
    metrics = AgentMetrics()
    metrics.update(Status(report=report))
    text = generate_latest(metrics.registry).decode()
    assert ('nodeagent_rdma_port_errors_total{counter="symbol_error",device="mlx5_0",port="1",'
            'rail="rail0"} 3.0') in text
    assert 'counter="out_of_sequence"' in text
    assert 'nodeagent_rdma_port_rate_gbps{device="mlx5_0",port="1",rail="rail0"} 200.0' in text
    assert 'nodeagent_rdma_pcie_link{device="mlx5_0",rail="rail0",what="current_width"} 8.0' \
        in text
    assert report.as_dict()["rails"][0]["port"]["pcie"]["width"] == 8
