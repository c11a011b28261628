"""RDMAHardwareHealthy and CustomChecksPassed in the running daemon (real namespace, rails on
veths, ports as mlx5-like fixture trees, checks as real executables): the ports are read at
their own cadence with no netlink event at all, a climbing error counter or a failing check
fails FabricReady, and the rails' repairs go on meanwhile."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from tests.kit.helpers import (
    Netns,
    condition,
    daemon_log,
    make_port_tree,
    read_status,
    stop_daemon,
    wait_for,
    write_config,
)


def hardware(cfg: dict[str, Any]) -> dict[str, str]:
    status = read_status(Path(cfg["runtime_dir"]))
    return condition(status, "RDMAHardwareHealthy") if status else {}


def test_ports_are_read_at_their_own_cadence_and_gate_the_fabric(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    sysfs = Path(agent_config["paths"]["sysfs"])
    for dev in ("mlx5_0", "mlx5_1"):
        make_port_tree(sysfs, dev, counters={"symbol_error": 0})
    agent_config["resync_interval"] = "1h"  # only the hardware cadence reads the ports
    agent_config["hardware"] = {"interval": "0.5s", "expect_rate": 200, "error_window": "1m",
                                "error_limits": {"symbol_error": 10}}
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", agent_config))
    try:
        wait_for(lambda: hardware(agent_config).get("reason") == "HardwareHealthy", 20,
                 "healthy ports")
        assert (read_status(Path(agent_config["runtime_dir"])) or {}).get("ok") is True
        make_port_tree(sysfs, "mlx5_1", counters={"symbol_error": 50})
        wait_for(lambda: hardware(agent_config).get("reason") == "ErrorCountersRising", 20,
                 "the counter's growth seen without any event")
        status = read_status(Path(agent_config["runtime_dir"])) or {}
        assert status["ok"] is False
        assert condition(status, "FabricReady")["reason"] == "ErrorCountersRising"
        assert "rail1 mlx5_1/1: symbol_error +50" in hardware(agent_config)["message"]
        rails = {r["name"]: r for r in status["rails"]}
        assert rails["rail1"]["port"]["counters"] == {"symbol_error": 50}
        # The rails are still repaired from events meanwhile.
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
        wait_for(lambda: "10.10.0.5/24" in rails_ns.ip("-br", "addr", "show", "r0").stdout, 20,
                 "the address repaired")
        make_port_tree(sysfs, "mlx5_0", rate="100 Gb/sec (2X HDR)")
        wait_for(lambda: "rail0 mlx5_0/1: rate 100 Gb/sec (2X HDR)"
                 in hardware(agent_config).get("message", ""), 20, "the degraded rate")
    finally:
        code, out = stop_daemon(proc)
    assert code == 0 and "Traceback" not in out, daemon_log(proc)


def test_custom_checks_feed_their_condition_and_gate_the_fabric(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    """A site's script (exit 0/1 on a flag file) run by the daemon at its interval: its
    problem fails CustomChecksPassed with the configured reason and FabricReady with it; a
    hanging one is killed and counts unknown, never holding the loop."""
    flag = tmp_path / "ecc-errors"
    flag.write_text("0\n")
    ecc = tmp_path / "check-ecc"
    ecc.write_text(f'#!/bin/sh\nn=$(cat {flag})\n[ "$n" = 0 ] && {{ echo clean; exit 0; }}\n'
                   'echo "GPU 0: $n uncorrectable ECC errors"; exit 1\n')
    ecc.chmod(0o755)
    agent_config["resync_interval"] = "1h"
    agent_config["custom_checks"] = {"checks": [
        {"name": "gpu-ecc", "command": [str(ecc)], "interval": "0.3s",
         "reason": "GPUMemoryErrors"}]}
    cfg_path = write_config(tmp_path / "c.yaml", agent_config)
    proc = rails_ns.start_daemon(cfg_path)

    def custom() -> dict[str, str]:
        status = read_status(Path(agent_config["runtime_dir"]))
        return condition(status, "CustomChecksPassed") if status else {}
    try:
        wait_for(lambda: custom().get("reason") == "CustomChecksPassed", 20, "the check passing")
        flag.write_text("12\n")
        wait_for(lambda: custom().get("reason") == "GPUMemoryErrors", 20, "the check failing")
        status = read_status(Path(agent_config["runtime_dir"])) or {}
        assert custom()["message"] == "gpu-ecc: GPU 0: 12 uncorrectable ECC errors"
        assert condition(status, "FabricReady")["reason"] == "GPUMemoryErrors"
        assert status["ok"] is False
        # A hanging check on reload: killed at its timeout, Unknown; the rails still repair.
        hang = tmp_path / "hang"
        hang.write_text("#!/bin/sh\nsleep 600\n")
        hang.chmod(0o755)
        agent_config["custom_checks"]["checks"] = [
            {"name": "stuck", "command": [str(hang)], "timeout": "0.5s", "interval": "1s"}]
        write_config(cfg_path, agent_config)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: custom().get("reason") == "CustomCheckUnknown"
                 and "no answer within 0.5 s" in custom().get("message", ""), 20,
                 "the hung check reported unknown")
        rails_ns.ip("addr", "del", "10.11.0.5/24", "dev", "r1")
        wait_for(lambda: "10.11.0.5/24" in rails_ns.ip("-br", "addr", "show", "r1").stdout, 20,
                 "the address repaired while checks run")
    finally:
        code, out = stop_daemon(proc)
    assert code == 0 and "Traceback" not in out, daemon_log(proc)


def test_sigterm_kills_a_check_that_is_still_running(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    """A ten-minute check and the child it started, running when the daemon is told to
    stop: the daemon exits 0 and neither outlives it (before, both ran on)."""
    pidfile = tmp_path / "check.pid"
    long = tmp_path / "long-check"
    long.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nsleep 600 &\necho $! >> {pidfile}\n"
                    "wait\n")
    long.chmod(0o755)
    agent_config["custom_checks"] = {"checks": [
        {"name": "burn-in", "command": [str(long)], "timeout": "15m", "interval": "1h"}]}
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", agent_config))
    try:
        wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2, 20,
                 "the check and its child running")
    finally:
        code, out = stop_daemon(proc)
    assert code == 0 and "Traceback" not in out, daemon_log(proc)
    pids = [int(p) for p in pidfile.read_text().split()]

    def gone(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        except OSError:
            return True
    wait_for(lambda: all(gone(pid) for pid in pids), 10, "the check and its child killed")
