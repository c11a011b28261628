"""Scenarios in the fabric lab (real kernel GID table, soft-RoCE, systemd, NetworkManager,
systemd-networkd). Reproductions first: they show the test sees the failure without the
agent; then the agent, as its systemd service, on the same rails."""

from __future__ import annotations

import json
import time

from helpers import wait_for
from labkit import (
    addresses,
    condition,
    hold_qp,
    ipv4_gid_index,
    nm_static,
    pyverbs_and_sysfs,
    rule_priorities,
    start_agent,
    status,
)
from vm import VM

# ---------------------------------------------------------------- 1. reproductions


def test_1a_address_readded_under_a_live_qp_moves_the_gid(guest: VM) -> None:
    guest.ssh("ip addr add 10.10.0.5/24 dev ens4")
    before = wait_for(lambda: ipv4_gid_index(guest, "rxe0", "10.10.0.5"), 10, "the IPv4 GID")
    hold_qp(guest, "rxe0", before)
    guest.ssh("ip addr del 10.10.0.5/24 dev ens4 && ip addr add 10.10.0.5/24 dev ens4")
    after = wait_for(lambda: ipv4_gid_index(guest, "rxe0", "10.10.0.5"), 10, "the GID back")
    assert after != before, "the live QP keeps the old slot: the GID lands elsewhere"


def test_1b_networkmanager_deconfigures_a_rail_without_carrier(guest: VM) -> None:
    nm_static(guest, "ens4", "10.10.0.5/24")
    wait_for(lambda: addresses(guest, "ens4") == ["10.10.0.5/24"], 30, "NM's address")
    assert ipv4_gid_index(guest, "rxe0", "10.10.0.5") is not None
    guest.set_link("rail0", False)
    time.sleep(10)
    assert addresses(guest, "ens4") == [], "NM took the address away on carrier loss"
    assert ipv4_gid_index(guest, "rxe0", "10.10.0.5") is None, "and the GID with it"


def test_1c_networkd_restart_flushes_a_foreign_rule(guest: VM) -> None:
    guest.write("/etc/systemd/network/20-rail0.network",
                "[Match]\nName=ens4\n\n[Network]\nAddress=10.10.0.5/24\n")
    guest.ssh("networkctl reload && networkctl reconfigure ens4")
    wait_for(lambda: addresses(guest, "ens4") == ["10.10.0.5/24"], 30, "networkd's address")
    guest.ssh("ip rule add priority 1000 from 10.10.0.5 table 100")
    guest.ssh("systemctl restart systemd-networkd")
    wait_for(lambda: 1000 not in rule_priorities(guest), 20, "the foreign rule flushed")


# ---------------------------------------------------------------- 2. with the agent


def test_2_service_ready_only_after_the_first_pass_with_journal_fields(guest: VM) -> None:
    start_agent(guest)  # Type=notify: returns once READY=1 (after the first full pass)
    state = json.loads(guest.ssh("cat /run/nodeagent/status.json").stdout)
    assert state["daemon"]["passes"] >= 1
    show = guest.ssh("systemctl show nodeagent -p ActiveState -p StatusText").stdout
    assert "ActiveState=active" in show and "StatusText=" in show
    assert addresses(guest, "ens4") == ["10.10.0.5/24"], "the agent configured the rail"
    assert condition(guest, "RoCEGIDStable") == ("True", "GIDsPinned")
    guest.ssh("ip addr del 10.10.0.5/24 dev ens4")
    wait_for(lambda: addresses(guest, "ens4") == ["10.10.0.5/24"], 10, "restored")
    journal = guest.ssh("journalctl -u nodeagent -o json RAIL=rail0 --no-pager").stdout
    entries = [json.loads(line) for line in journal.splitlines() if line.strip()]
    assert any("repaired" in e.get("MESSAGE", "") and e.get("RAIL") == "rail0"
               for e in entries), journal[-2000:]


def test_2a_carrier_loss_keeps_address_and_gid(guest: VM) -> None:
    start_agent(guest)
    index = wait_for(lambda: ipv4_gid_index(guest, "rxe0", "10.10.0.5"), 10, "the IPv4 GID")
    hold_qp(guest, "rxe0", index)
    guest.set_link("rail0", False)
    wait_for(lambda: condition(guest, "RoCENetworkReady")[1] == "NoCarrier", 15, "NoCarrier")
    for _ in range(10):
        assert addresses(guest, "ens4") == ["10.10.0.5/24"]
        assert ipv4_gid_index(guest, "rxe0", "10.10.0.5") == index
        assert condition(guest, "RoCEGIDStable")[0] == "True"
        time.sleep(1)
    guest.set_link("rail0", True)
    wait_for(lambda: condition(guest, "RoCENetworkReady") == ("True", "RailsConfigured"), 20,
         "RoCENetworkReady back")
    assert ipv4_gid_index(guest, "rxe0", "10.10.0.5") == index


def test_2b_address_deleted_under_a_live_qp_is_restored_and_the_shift_reported(
    guest: VM,
) -> None:
    start_agent(guest)
    index = wait_for(lambda: ipv4_gid_index(guest, "rxe0", "10.10.0.5"), 10, "the IPv4 GID")
    hold_qp(guest, "rxe0", index)
    guest.ssh("ip addr del 10.10.0.5/24 dev ens4")
    wait_for(lambda: addresses(guest, "ens4") == ["10.10.0.5/24"], 10, "restored")
    moved = wait_for(lambda: ipv4_gid_index(guest, "rxe0", "10.10.0.5"), 10, "the GID back")
    assert moved != index
    guest.ssh("systemctl kill -s HUP nodeagent")  # a pass now, not at the next resync
    wait_for(lambda: condition(guest, "RoCEGIDStable") == ("False", "GIDIndexShifted"), 20,
         "the shift reported")
    message = next(c["message"] for c in status(guest)["conditions"]
                   if c["type"] == "RoCEGIDStable")
    assert f"index {moved}, pinned {index}" in message


def test_2c_networkd_restart_the_agent_restores_the_rules(guest: VM) -> None:
    guest.write("/etc/systemd/network/20-rail0.network",
                "[Match]\nName=ens4\n\n[Network]\nAddress=10.10.0.5/24\n")
    guest.ssh("networkctl reload && networkctl reconfigure ens4")
    start_agent(guest)
    wait_for(lambda: 1000 in rule_priorities(guest), 10, "the agent's rule")
    guest.ssh("systemctl restart systemd-networkd")
    # networkd flushes foreign rules on restart (1c); the agent puts ours back at once.
    wait_for(lambda: 1000 in rule_priorities(guest), 10, "the rule restored")
    # With the role's setting networkd leaves them alone.
    guest.write("/etc/systemd/networkd.conf.d/nodeagent.conf",
                "[Network]\nManageForeignRoutingPolicyRules=no\nManageForeignRoutes=no\n")
    guest.ssh("systemctl stop nodeagent && systemctl restart systemd-networkd")
    guest.ssh("ip rule add priority 1000 from 10.10.0.5 table 100 2>/dev/null; true")
    guest.ssh("systemctl restart systemd-networkd")
    time.sleep(3)
    assert 1000 in rule_priorities(guest), "ManageForeignRoutingPolicyRules=no keeps it"


def test_2d_pyverbs_and_sysfs_agree_at_every_step(guest: VM) -> None:
    guest.ssh("ip addr add 10.10.0.5/24 dev ens4 && ip addr add 10.11.0.5/24 dev ens5")
    steps = ["true", "ip addr del 10.10.0.5/24 dev ens4",
             "ip addr add 10.10.0.5/24 dev ens4", "ip addr add 10.10.0.6/24 dev ens4",
             "ip link set ens5 down", "ip link set ens5 up"]
    for step in steps:
        guest.ssh(step)
        time.sleep(1)
        via_pyverbs, via_sysfs = pyverbs_and_sysfs(guest)
        assert via_pyverbs == via_sysfs, step
        assert via_pyverbs, "the table is not empty"


def test_2_watchdog_restarts_a_wedged_agent(guest: VM) -> None:
    start_agent(guest)
    pid = guest.ssh("systemctl show -p MainPID --value nodeagent").stdout.strip()
    guest.ssh("systemctl kill -s SIGSTOP nodeagent")
    wait_for(lambda: guest.ssh("systemctl show -p MainPID --value nodeagent").stdout.strip()
         not in (pid, "0"), 90, "a new agent process after the watchdog fired")
    log = guest.ssh("journalctl -u nodeagent --no-pager").stdout
    assert "Watchdog timeout" in log, log[-2000:]
    wait_for(lambda: guest.ssh("systemctl is-active nodeagent", check=False).stdout.strip()
         == "active", 120, "active again")
