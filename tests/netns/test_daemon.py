"""The daemon (`nodeagent run`) in a real network namespace: events, repairs, signals."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit.helpers import (
    Netns,
    condition,
    daemon_log,
    read_status,
    stop_daemon,
    wait_for,
    write_config,
)


def status_of(cfg: dict[str, Any]) -> dict[str, Any] | None:
    return read_status(Path(cfg["runtime_dir"]))


def cond(cfg: dict[str, Any], ctype: str) -> tuple[str, str, str] | None:
    data = status_of(cfg)
    if data is None:
        return None
    c = condition(data, ctype)
    return c["status"], c["reason"], c["message"]


def start(ns: Netns, cfg_data: dict[str, Any], path: Path) -> subprocess.Popen[str]:
    write_config(path, cfg_data)
    proc = ns.start_daemon(path)
    wait_for(lambda: (status_of(cfg_data) or {}).get("ok") is True or proc.poll() is not None,
             timeout=20, what="the daemon's first healthy pass")
    assert proc.poll() is None, daemon_log(proc)
    return proc


def stop_cleanly(proc: subprocess.Popen[str]) -> str:
    """SIGTERM: exit 0, no traceback in the log; the log."""
    code, out = stop_daemon(proc)
    assert code == 0, out
    assert "Traceback" not in out, out
    return out


@pytest.fixture
def daemon_config(agent_config: dict[str, Any]) -> dict[str, Any]:
    agent_config["resync_interval"] = "1h"  # only events may drive the repairs under test
    return agent_config


def test_event_driven_repair_of_every_drift(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    passes = status_of(daemon_config)["daemon"]["passes"]  # type: ignore[index]

    rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
    wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], what="address restored")
    wait_for(lambda: {r["dst"] for r in rails_ns.routes(100)} == {"default", "10.10.0.0/24"},
             what="routes flushed with the address restored")

    rails_ns.ip("rule", "del", "priority", "1000")
    wait_for(lambda: any(r.get("priority") == 1000 for r in rails_ns.rules()), what="rule")

    rails_ns.ip("route", "flush", "table", "101")
    wait_for(lambda: [r["dst"] for r in rails_ns.routes(101)] == ["10.11.0.0/24"], what="route")

    rails_ns.ip("link", "set", "r1", "mtu", "1500")
    wait_for(lambda: rails_ns.link("r1")["mtu"] == 4200, what="mtu")

    rails_ns.ip("link", "set", "r0", "down")
    wait_for(lambda: "UP" in rails_ns.link("r0")["flags"], what="link up")
    wait_for(lambda: len(rails_ns.routes(100)) == 2, what="routes after link up")

    wait_for(lambda: cond(daemon_config, "FabricReady")[0] == "True",  # type: ignore[index]
             what="FabricReady back to True")
    data = status_of(daemon_config)
    assert data is not None and data["daemon"]["passes"] > passes  # events, not resyncs
    # Repairs and passes over netlink with no kubernetes section: TLS never loaded
    # (lean_imports.iproute_without_ssl; 2 MB of the idle daemon's memory).
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "libssl" not in maps and "_ssl." not in maps
    code, out = stop_daemon(proc)
    assert code == 0, out
    assert "repaired rail0 r0: add address 10.10.0.5/24" in out


def test_deletions_in_a_burst_are_all_repaired_while_passes_run(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """Address, rule and default route deleted back to back, 30 times: most deletions land
    in the middle of the pass that verifies the previous repair (they are repaired between
    its stages, not after it). Nothing may be lost, and the daemon must end where it began."""
    daemon_config["repair_guard"] = {"max_repairs": 1000}  # a deliberate fight, not a manager
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    for _ in range(30):
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0", check=False)
        rails_ns.ip("rule", "del", "priority", "1001", check=False)
        rails_ns.ip("route", "del", "default", "table", "100", check=False)
    wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], what="address restored")
    wait_for(lambda: any(r.get("priority") == 1001 for r in rails_ns.rules()), what="rule")
    wait_for(lambda: {r["dst"] for r in rails_ns.routes(100)} == {"default", "10.10.0.0/24"},
             what="routes restored")
    wait_for(lambda: (status_of(daemon_config) or {}).get("ok") is True, what="fabric ready")
    assert proc.poll() is None, daemon_log(proc)
    repairs = next(r for r in status_of(daemon_config)["rails"]  # type: ignore[index]
                   if r["name"] == "rail0")["repairs_total"]
    assert repairs.get("AddressMissing", 0) >= 1, repairs
    stop_cleanly(proc)


def test_the_daemon_never_writes_an_observed_rail(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """manage_rails: false, one rail managed: the other's drift is reported as it happens,
    never repaired, and never read as a fight with another manager."""
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")  # both rails configured
    stop_daemon(proc)
    daemon_config["manage_rails"] = False
    daemon_config["rails"][0]["manage"] = True
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    for _ in range(3):
        rails_ns.ip("addr", "del", "10.11.0.5/24", "dev", "r1", check=False)
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
        wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], what="rail0 repaired")
        wait_for(lambda: (cond(daemon_config, "RoCENetworkReady") or ("",))[0] == "False",
                 what="rail1's drift reported")
        rails_ns.ip("addr", "add", "10.11.0.5/24", "dev", "r1")  # its owner puts it back
        rails_ns.ip("route", "replace", "10.11.0.0/24", "dev", "r1", "table", "101")
        wait_for(lambda: (cond(daemon_config, "RoCENetworkReady") or ("",))[0] == "True",
                 what="rail1 as configured again")
    rails_ns.ip("addr", "del", "10.11.0.5/24", "dev", "r1")
    _, reason, message = wait_for(
        lambda: (c := cond(daemon_config, "RoCENetworkReady")) and c[0] == "False" and c,
        what="rail1's drift reported")
    assert reason == "AddressMissing" and "rail1 r1" in message, message
    assert rails_ns.addresses("r1") == [], "the agent wrote an observed rail"
    code, out = stop_daemon(proc)
    assert code == 0, out
    assert "repaired rail1" not in out and "ManagedElsewhere" not in out, out


def test_carrier_loss_keeps_the_address_and_recovers(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    rails_ns.ip("link", "set", "p0", "down")
    wait_for(lambda: cond(daemon_config, "RoCENetworkReady")[1] == "NoCarrier",  # type: ignore[index]
             what="NoCarrier")
    assert cond(daemon_config, "FabricReady")[0] == "False"  # type: ignore[index]
    assert rails_ns.addresses("r0") == ["10.10.0.5/24"]
    assert cond(daemon_config, "RoCEGIDStable")[0] == "True"  # type: ignore[index]
    rails_ns.ip("link", "set", "p0", "up")
    wait_for(lambda: cond(daemon_config, "RoCENetworkReady")[0] == "True",  # type: ignore[index]
             what="carrier back")
    assert stop_daemon(proc)[0] == 0


def test_flap_storm_is_counted_reported_and_cleared(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    daemon_config["link_flap"] = {"window": "10s", "max_flaps": 5, "dwell": "2s"}
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    for _ in range(50):  # 50 flaps in about 5 s
        rails_ns.ip("link", "set", "p1", "down")
        time.sleep(0.05)
        rails_ns.ip("link", "set", "p1", "up")
        time.sleep(0.05)
    wait_for(lambda: cond(daemon_config, "RoCENetworkReady")[1] == "LinkFlapping",  # type: ignore[index]
             what="LinkFlapping")
    message = cond(daemon_config, "RoCENetworkReady")[2]  # type: ignore[index]
    assert message.startswith("rail1 r1: ") and "carrier losses in 10s (more than 5)" in message

    def rail1() -> dict[str, Any]:
        data = status_of(daemon_config) or {"rails": []}
        return next(r for r in data["rails"] if r["name"] == "rail1")

    wait_for(lambda: rail1()["carrier_losses_total"] == 50, what="all 50 flaps counted")
    # A reload keeps the counters (and may not clear the verdict by itself).
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    assert rail1()["carrier_losses_total"] == 50
    # Quiet for the dwell: the agent wakes up by itself to clear it, no event needed.
    wait_for(lambda: cond(daemon_config, "RoCENetworkReady")[0] == "True",  # type: ignore[index]
             what="LinkFlapping cleared after the dwell")
    assert rail1()["carrier_losses_total"] == 50
    assert stop_daemon(proc)[0] == 0


def test_two_writers_fighting_makes_the_agent_back_off(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    daemon_config["repair_guard"] = {"max_repairs": 3, "window": "30s", "backoff": "1h"}
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")

    def other_writer_wins() -> bool:
        rails_ns.ip("link", "set", "r1", "mtu", "1500")  # the other writer's idea of the MTU
        time.sleep(0.1)
        reason = cond(daemon_config, "RoCENetworkReady")[1]  # type: ignore[index]
        return reason == "ManagedElsewhere"

    wait_for(other_writer_wins, timeout=30, what="ManagedElsewhere")
    message = cond(daemon_config, "RoCENetworkReady")[2]  # type: ignore[index]
    assert message.startswith("rail1 r1: MTUMismatch repaired 4 times in 30s")
    # Backed off: the other writer's value now stays, and other rails are still enforced.
    rails_ns.ip("link", "set", "r1", "mtu", "1500")
    time.sleep(0.3)
    assert rails_ns.link("r1")["mtu"] == 1500
    rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
    wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], what="rail0 still repaired")
    assert stop_daemon(proc)[0] == 0


def test_a_fight_over_deletions_is_backed_off_after_exactly_as_many_repairs(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """Deletions are repaired on the netlink thread, before the loop counts them: the
    guard must still stop the fight at max_repairs + 1 repairs, not at whatever the
    netlink thread repaired before the loop caught up (its room is the guard's, less
    what is on its way). The deletions come faster than one pass a burst."""
    daemon_config["repair_guard"] = {"max_repairs": 3, "window": "30s", "backoff": "1h"}
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    for _ in range(12):
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0", check=False)
        time.sleep(0.005)
    wait_for(lambda: cond(daemon_config, "RoCENetworkReady")[1] == "ManagedElsewhere",  # type: ignore[index]
             what="ManagedElsewhere")
    message = cond(daemon_config, "RoCENetworkReady")[2]  # type: ignore[index]
    assert re.match(r"rail0 r0: (AddressMissing|RouteMissing) repaired 4 times in 30s", message)
    rail0 = next(r for r in status_of(daemon_config)["rails"]  # type: ignore[index]
                 if r["name"] == "rail0")
    assert rail0["repairs_total"]["AddressMissing"] == 4, rail0["repairs_total"]
    rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0", check=False)
    time.sleep(0.3)
    assert rails_ns.addresses("r0") == []  # backed off: a deletion now stays
    assert stop_daemon(proc)[0] == 0


def test_sigterm_writes_status_and_exits_zero(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = tmp_path / "c.yaml"
    proc = start(rails_ns, daemon_config, cfg)
    res = rails_ns.nodeagent("status", "--config", str(cfg))
    assert res.returncode == 0, res.stdout
    assert "running, last pass" in res.stdout.splitlines()[-1]

    code, _ = stop_daemon(proc, signal.SIGTERM)
    assert code == 0
    data = status_of(daemon_config)
    assert data is not None and data["daemon"]["state"] == "stopped"
    res = rails_ns.nodeagent("status", "--config", str(cfg), "--json")
    assert res.returncode == 1
    assert '"running": false' in res.stdout
    res = rails_ns.nodeagent("status", "--config", str(cfg))
    assert res.stdout.splitlines()[-1].startswith("daemon is not running (pid ")


def test_a_second_daemon_on_the_same_runtime_dir_is_refused(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = tmp_path / "c.yaml"
    first = start(rails_ns, daemon_config, cfg)
    second = rails_ns.start_daemon(cfg)
    assert second.wait(timeout=20) == 2
    lock = Path(daemon_config["runtime_dir"]) / "daemon.lock"
    assert daemon_log(second).strip().splitlines()[-1] == (
        f"nodeagent: another nodeagent daemon (pid {first.pid}) holds {lock}")
    res = rails_ns.nodeagent("status", "--config", str(cfg), "--json")
    data = json.loads(res.stdout)
    assert res.returncode == 0 and data["daemon"]["running"] is True
    assert data["daemon"]["pid"] == first.pid
    # The holder dies without a word (SIGKILL): the kernel drops the lock; status says so,
    # and a new daemon can start at once.
    first.kill()
    first.wait()
    res = rails_ns.nodeagent("status", "--config", str(cfg))
    assert res.returncode == 1
    assert res.stdout.splitlines()[-1].startswith(f"daemon is not running (pid {first.pid}")
    third = rails_ns.start_daemon(cfg)
    wait_for(lambda: (status_of(daemon_config) or {})["daemon"]["pid"] == third.pid,
             timeout=20, what="the new daemon's first pass")
    assert stop_daemon(third)[0] == 0


def test_sigint_also_stops_cleanly(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    assert stop_daemon(proc, signal.SIGINT)[0] == 0


def test_sighup_reload_keeps_last_good_config(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    proc = start(rails_ns, daemon_config, path)
    path.write_text("rails: [{name: x, interface: r0, address: nonsense}]\n")
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    rails_ns.ip("addr", "del", "10.11.0.5/24", "dev", "r1")
    wait_for(lambda: rails_ns.addresses("r1") == ["10.11.0.5/24"],
             what="old config still enforced after a bad reload")

    daemon_config["rails"][1]["mtu"] = 9000
    write_config(path, daemon_config)
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: rails_ns.link("r1")["mtu"] == 9000, what="new good config applied")
    code, out = stop_daemon(proc)
    assert code == 0
    assert ("reload rejected, keeping the last good config: "
            f"{path}: rails[0].address: 'nonsense' has no prefix length") in out


BAD_CONFIGS: dict[str, tuple[str | bytes | None, str]] = {
    # name: (file content; None = a FIFO in its place, b"" = removed), what the error says
    "schema": ("rails: [{name: x, interface: r0, address: nonsense}]\n", "no prefix length"),
    "yaml": ("rails: [\n", "invalid YAML"),
    "alias bomb": ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join(['*a' if i == 1 else f'*a{i - 1}'] * 10)}]\n"
        for i in range(1, 8)), "once aliases are expanded"),
    "deep": ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper than 32 levels"),
    "huge int": ("resync_interval: " + "9" * 5000 + "\n", "integer with more than"),
    "duplicate": ("rails: []\nrails: []\n", "duplicate key 'rails'"),
    "not utf-8": (b"rails: \xff\n", "not utf-8 text"),
    "nan": ("resync_interval: .nan\n", "NaN is not a duration"),
    "fifo": (None, "a FIFO, not a regular file"),
    "gone": (b"", "config file not found"),
    # Valid, but the agent would let go of every rail: an emptied or truncated file.
    "empty": ("", "the new config names no rails (2 run now)"),
}


def test_sighup_never_kills_whatever_the_file_holds(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    daemon_config["repair_guard"] = {"max_repairs": 100}  # the test deletes r1's address often
    proc = start(rails_ns, daemon_config, path)
    for name, (content, expected) in BAD_CONFIGS.items():
        path.unlink(missing_ok=True)
        if content is None:
            os.mkfifo(path)
        elif isinstance(content, bytes):
            if content:
                path.write_bytes(content)
        else:
            path.write_text(content)
        proc.send_signal(signal.SIGHUP)
        # Wait for this reload's own verdict: a pass the previous case's repair triggered
        # may come first, still carrying the previous error.
        wait_for(lambda e=expected: (d := status_of(daemon_config))
                        and e in (d["daemon"].get("reload_error") or "") and d,
                        what=f"the {name} reload rejected")
        assert proc.poll() is None, (name, daemon_log(proc))
        # the old config is still the one enforced
        rails_ns.ip("addr", "del", "10.11.0.5/24", "dev", "r1")
        wait_for(lambda: rails_ns.addresses("r1") == ["10.11.0.5/24"],
                 what=f"old config enforced after the {name} reload")
    path.unlink(missing_ok=True)
    write_config(path, daemon_config)
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: (status_of(daemon_config) or {}).get("daemon", {}).get("reload_error", 1)
             is None, what="a good reload clears the error")
    stop_cleanly(proc)


def test_netlink_overflow_forces_a_resync_not_a_crash(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    daemon_config["netlink_rcvbuf"] = 4096
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    rails_ns.veth("noise0", "noise1")  # not a rail: its events are pure noise
    batch = tmp_path / "batch"
    batch.write_text("".join(f"addr add 172.16.{i // 250}.{i % 250 + 1}/32 dev noise0\n"
                             for i in range(2000)))
    rails_ns.ip("-batch", str(batch))
    rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
    wait_for(lambda: rails_ns.addresses("r0") == ["10.10.0.5/24"], what="repair after overflow")
    assert proc.poll() is None
    code, out = stop_daemon(proc)
    assert code == 0
    assert "netlink receive buffer overflowed (1 times); full resync" in out


def test_a_crashed_daemon_restarts_with_its_learned_pins(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    from tests.kit.helpers import make_gid_tree, roce_entries

    daemon_config["gid_repin"] = "never"
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    proc.kill()
    proc.wait()
    # While it was down, the GID moved: the restarted daemon must see a shift, not re-learn.
    make_gid_tree(Path(daemon_config["paths"]["sysfs"]), "mlx5_1",
                  roce_entries("r1", "10.11.0.5", ipv4_index=6))
    res = rails_ns.nodeagent("status", "--config", str(tmp_path / "c.yaml"))
    assert res.returncode == 1 and "daemon is not running" in res.stdout
    proc = rails_ns.start_daemon(tmp_path / "c.yaml")
    wait_for(lambda: (cond(daemon_config, "RoCEGIDStable") or ("",))[0] == "False",
             timeout=20, what="shift seen after restart")
    assert cond(daemon_config, "RoCEGIDStable")[1:] == (  # type: ignore[index]
        "GIDIndexShifted", "rail1 r1: IPv4 RoCE v2 GID at index 7, pinned 3 (mlx5_1 port 1); "
        "re-pinning is off (gid_repin: never)")
    assert stop_daemon(proc)[0] == 0


def test_pins_that_cannot_be_saved_are_retried_until_they_land(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """Disk full: a real 64 KiB tmpfs as the state dir, filled up before the first pass."""
    state = Path(daemon_config["state_dir"])
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(state)], check=True)
    try:
        filler = state / "filler"
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * (1 << 20))  # ENOSPC once the 64 KiB are used
        daemon_config["resync_interval"] = "1s"
        write_config(tmp_path / "c.yaml", daemon_config)
        proc = rails_ns.start_daemon(tmp_path / "c.yaml")
        data = wait_for(lambda: (d := status_of(daemon_config)) and any(
            "cannot save learned GID pins" in e for e in d["errors"]) and d,
            timeout=20, what="the failed save reported")
        assert any("No space left on device" in e for e in data["errors"]), data["errors"]
        assert not (state / "pins.json").exists()
        filler.unlink()
        wait_for(lambda: (state / "pins.json").exists(), what="pins saved once space returns")
        wait_for(lambda: not any("cannot save" in e
                                 for e in (status_of(daemon_config) or {"errors": ["x"]})[
                                     "errors"]), what="the error cleared")
        pins = json.loads((state / "pins.json").read_text())
        assert {n: p["index"] for n, p in pins.items()} == {"rail0": 3, "rail1": 3}
        assert stop_daemon(proc)[0] == 0
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_a_shifted_gid_is_repinned_once_its_last_qp_is_gone(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """The QP list (a fake `rdma` reading a file the test rewrites) names a job's QP: the
    daemon reports and waits, looking again every gid_repin_poll; the QP ends: the address
    is deleted and re-added at once with its routes. The fixture GID table cannot follow,
    so the rail stays shifted and the next attempt waits twice as long."""
    from tests.kit.helpers import make_gid_tree, roce_entries

    qps = tmp_path / "qps.json"
    qps.write_text(json.dumps([
        {"ifname": "mlx5_1", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS",
         "comm": "ib_core"},
        {"ifname": "mlx5_1", "port": 1, "lqpn": 90, "type": "RC", "state": "RTS",
         "pid": 777, "comm": "nccl-tests"}]))
    rdma = tmp_path / "rdma"
    rdma.write_text(f"#!/bin/sh\ncat {qps}\n")
    rdma.chmod(0o755)
    daemon_config["paths"]["rdma"] = str(rdma)
    daemon_config["gid_repin_poll"] = "0.5s"
    daemon_config["rails"][1]["gid_index"] = 3
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")
    make_gid_tree(Path(daemon_config["paths"]["sysfs"]), "mlx5_1",
                  roce_entries("r1", "10.11.0.5", ipv4_index=6))
    os.kill(proc.pid, signal.SIGHUP)  # a pass now (the GID table sends no events)
    wait_for(lambda: "re-pin waits for 1 QP(s)" in (cond(daemon_config, "RoCEGIDStable")
                                                    or ("", "", ""))[2], what="waiting")
    assert "pid 777 nccl-tests" in cond(daemon_config, "RoCEGIDStable")[2]  # type: ignore[index]
    time.sleep(1.5)  # three polls
    assert "re-pin: remove" not in daemon_log(proc), "never while a QP uses the port"
    qps.write_text(json.dumps([json.loads(qps.read_text())[0]]))  # the job ended
    wait_for(lambda: "re-pin: add address 10.11.0.5/24" in daemon_log(proc), what="re-pin")
    wait_for(lambda: rails_ns.routes(101) != [], what="the rail's route back")
    assert rails_ns.addresses("r1") == ["10.11.0.5/24"]

    def repins() -> int:  # the status file follows the log line at the end of the pass
        rails = (status_of(daemon_config) or {}).get("rails", [])
        rail1 = next((r for r in rails if r["name"] == "rail1"), {})
        return int(rail1.get("repairs_total", {}).get("GIDIndexShifted", 0))

    wait_for(lambda: repins() >= 2, what="the re-pin counted (delete + add)")
    assert stop_daemon(proc)[0] == 0


def test_a_rails_gids_that_vanish_in_place_stay_watched_until_they_return(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """A driver rewrites rail1's GID table in place, no netlink event (resync 1 h): every
    slot zeroed, then refilled at a new index, then restored. rail1 pins index 3 by
    config but names no RDMA device: its device is the one its GIDs were last seen on, so
    its slots stay watched while they are empty, the final state (GIDIndexShifted) is
    published from the slot watch, and the restore is seen from it too. (Before: the rail
    left the watch with its GIDs, said RDMADeviceNotFound, and only the resync saw more.)"""
    from tests.kit.helpers import make_gid_tree, roce_entries

    daemon_config["rails"][1]["gid_index"] = 3
    daemon_config["gid_repin"] = "never"
    sysfs = Path(daemon_config["paths"]["sysfs"])
    proc = start(rails_ns, daemon_config, tmp_path / "c.yaml")

    make_gid_tree(sysfs, "mlx5_1", [])  # every slot zeroed, the default GIDs too
    wait_for(lambda: (cond(daemon_config, "RoCEGIDStable") or ("",))[0] == "False",
             what="the vanished GID reported")
    time.sleep(2.0)  # the passes that saw it are over; the slot watch is set for what follows
    make_gid_tree(sysfs, "mlx5_1", roce_entries("r1", "10.11.0.5", ipv4_index=6))  # at 7
    got = wait_for(lambda: (c := cond(daemon_config, "RoCEGIDStable")) and
                   c[1] == "GIDIndexShifted" and c, timeout=15,
                   what="the GID's new index seen without a resync")
    assert "index 7, pinned 3" in got[2] and "mlx5_1" in got[2], got
    make_gid_tree(sysfs, "mlx5_1", roce_entries("r1", "10.11.0.5"))  # back at 3
    wait_for(lambda: (cond(daemon_config, "RoCEGIDStable") or ())[:2] == ("True", "GIDsPinned"),
             timeout=15, what="the restore seen without a resync")
    stop_cleanly(proc)


def test_reloads_leave_no_thread_behind(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """40 good SIGHUP reloads: the daemon's thread count stays where it was (before, each
    reload's new evaluator started read workers of its own and the old ones never ended:
    28 -> 68 threads)."""
    path = tmp_path / "c.yaml"
    proc = start(rails_ns, daemon_config, path)
    tasks = Path(f"/proc/{proc.pid}/task")

    before = len(list(tasks.iterdir()))
    for i in range(40):
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda i=i: daemon_log(proc).count("config reloaded") == i + 1,
                 what=f"reload {i + 1} applied")
    # Each reload's loader and its slow-read timer end within RELOAD_SLOW (5 s).
    wait_for(lambda: len(list(tasks.iterdir())) <= before + 2, timeout=20,
             what=f"the thread count back near {before} after 40 reloads")
    stop_cleanly(proc)


def test_a_hard_link_planted_as_the_lock_is_refused_and_left_untouched(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """daemon.lock a hard link to a file elsewhere: O_NOFOLLOW does not stop it, so before
    the agent wrote its pid into that file. Now: exit 2, one line, the file unchanged."""
    run = Path(daemon_config["runtime_dir"])
    run.mkdir(parents=True)
    elsewhere = tmp_path / "precious"
    elsewhere.write_text("not yours\n")
    os.link(elsewhere, run / "daemon.lock")
    proc = rails_ns.start_daemon(write_config(tmp_path / "c.yaml", daemon_config))
    assert proc.wait(timeout=20) == 2
    assert daemon_log(proc).strip().splitlines()[-1] == (
        f"nodeagent: cannot lock {run / 'daemon.lock'}: it has 2 links: refusing to write "
        "through it")
    assert elsewhere.read_text() == "not yours\n"


@pytest.mark.parametrize("a_pass_between", [True, False])
def test_a_deleted_lock_file_admits_no_second_daemon(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path, a_pass_between: bool
) -> None:
    """daemon.lock deleted under a running daemon: before, a second daemon created a new
    one, locked it and ran beside the first. With a pass between, the first has locked the
    path again; without one (resync is 1 h: the case the pass-time re-lock left open), the
    runtime dir's abstract socket refuses the second. Either way it names the first."""
    cfg = tmp_path / "c.yaml"
    first = start(rails_ns, daemon_config, cfg)
    lock = Path(daemon_config["runtime_dir"]) / "daemon.lock"
    lock.unlink()
    if a_pass_between:
        rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")
        wait_for(lambda: lock.exists() and lock.read_text().strip() == str(first.pid),
                 what="the lock file made again by its daemon")
    second = rails_ns.start_daemon(cfg)
    assert second.wait(timeout=20) == 2
    assert daemon_log(second).strip().splitlines()[-1] == (
        f"nodeagent: another nodeagent daemon (pid {first.pid}) holds {lock}")
    assert first.poll() is None
    stop_cleanly(first)


def test_a_lock_replaced_by_a_hard_link_is_said_in_the_status_and_left_alone(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """daemon.lock swapped for a hard link to a file elsewhere while the daemon runs: it
    keeps the lock it holds, writes nothing through the link, and says so in the status
    file's errors at every pass (before: one log line, nothing in the status)."""
    cfg = tmp_path / "c.yaml"
    proc = start(rails_ns, daemon_config, cfg)
    lock = Path(daemon_config["runtime_dir"]) / "daemon.lock"
    elsewhere = tmp_path / "precious"
    elsewhere.write_text("not yours\n")
    lock.unlink()
    os.link(elsewhere, lock)
    rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0")  # a pass (resync is 1 h)
    want = f"cannot lock {lock} again: it has 2 links: refusing to write through it"
    wait_for(lambda: want in (status_of(daemon_config) or {}).get("errors", []),
             what="the refused lock in the status file's errors")
    assert elsewhere.read_text() == "not yours\n"
    assert proc.poll() is None
    stop_cleanly(proc)


def _caught(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (SigCgt in /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def test_signals_during_start_up_neither_kill_nor_trace(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """Signals sent while the daemon is still importing (as soon as its first handler is
    there, before pydantic and pyroute2 are loaded): a SIGHUP (`systemctl reload` during a
    start) is a reload once it runs, SIGUSR1/SIGUSR2/SIGALRM are logged and ignored, at any
    time; a SIGINT ends it quietly. Before: SIGHUP and SIGUSR1 killed it, SIGINT printed a
    KeyboardInterrupt traceback from an import."""
    cfg = write_config(tmp_path / "c.yaml", daemon_config)
    proc = rails_ns.start_daemon(cfg)
    wait_for(lambda: _caught(proc.pid, signal.SIGUSR1) or proc.poll() is not None,
             timeout=20, what="the daemon's first signal handler")
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        proc.send_signal(signum)
    wait_for(lambda: (status_of(daemon_config) or {}).get("ok") is True or
             proc.poll() is not None, timeout=30, what="the first healthy pass")
    wait_for(lambda: "config reloaded" in daemon_log(proc) or proc.poll() is not None,
             what="the early SIGHUP acted on as a reload")
    proc.send_signal(signal.SIGUSR1)  # and once it runs
    time.sleep(0.5)
    assert proc.poll() is None, daemon_log(proc)
    log = daemon_log(proc)
    for name in ("SIGUSR1", "SIGUSR2", "SIGALRM"):
        assert f"ignoring signal {name}" in log, log
    stop_cleanly(proc)

    early = rails_ns.start_daemon(cfg)
    wait_for(lambda: _caught(early.pid, signal.SIGUSR1) or early.poll() is not None,
             timeout=20, what="the daemon's first signal handler")
    early.send_signal(signal.SIGINT)
    assert early.wait(timeout=20) in (0, 128 + signal.SIGINT)
    assert "Traceback" not in daemon_log(early), daemon_log(early)


def test_a_reload_takes_what_it_can_and_says_what_waits_for_a_restart(
    rails_ns: Netns, daemon_config: dict[str, Any], tmp_path: Path
) -> None:
    """A reload that moves the runtime directory is refused (the daemon's lock stays in the
    old one); one that adds the metrics section is applied, and the status file says the
    section takes effect at a restart (before: both taken silently)."""
    path = tmp_path / "c.yaml"
    proc = start(rails_ns, daemon_config, path)
    moved = {**daemon_config, "runtime_dir": str(tmp_path / "elsewhere")}
    write_config(path, moved)
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "is taken only at a restart: the daemon's lock is in the running one"
             in ((status_of(daemon_config) or {}).get("daemon", {}).get("reload_error") or ""),
             what="the move refused")
    assert not (tmp_path / "elsewhere").exists()
    daemon_config["rails"][1]["mtu"] = 4000  # and a change that is applied now
    write_config(path, {**daemon_config, "metrics": {"listen": "127.0.0.1:1"}})
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: rails_ns.link("r1")["mtu"] == 4000, what="the new mtu enforced")
    wait_for(lambda: ((status_of(daemon_config) or {}).get("daemon", {}).get("reload_error")
                      or "") == "applied, but the metrics section takes effect at a restart",
             what="the restart-only section named")
    stop_cleanly(proc)
