"""A rail lent to a pod: its netdev moved into another network namespace with the daemon
running, the way a DRA driver (dranet moves the netdev into the pod's namespace at sandbox
creation) or a CNI does (`ip link set ... netns`). Before, the rail looked missing:
`InterfaceMissing`, the node tainted the moment a job started on it. Now it is lent: no
drift, no repair, its status row and RoCENetworkReady's message say so; back, it is
checked and repaired as usual."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kit.helpers import Netns, new_netns, wait_for
from tests.netns.test_daemon import cond, start, status_of, stop_cleanly


@pytest.fixture
def pod_ns() -> Any:
    pod = new_netns()
    try:
        yield pod
    finally:
        pod.delete()


def rail_row(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in (status_of(cfg) or {}).get("rails", []) if r["name"] == name)


def test_a_rail_moved_into_a_pods_namespace_is_lent_not_missing_and_checked_on_return(
        rails_ns: Netns, agent_config: dict[str, Any], pod_ns: Netns, tmp_path: Path) -> None:
    agent_config["resync_interval"] = "1h"  # events alone drive what follows
    proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
    rails_ns.ip("link", "set", "r1", "netns", pod_ns.name)
    wait_for(lambda: "lent_seconds" in rail_row(agent_config, "rail1"), 10,
             "rail1 lent in the status")
    status = status_of(agent_config) or {}
    assert status["ok"] is True, status
    ready = cond(agent_config, "RoCENetworkReady")
    assert ready is not None and ready[0] == "True", ready
    assert "rail1 r1 lent to another network namespace" in ready[2], ready
    assert not status["errors"] and not status["actions"], status
    assert rail_row(agent_config, "rail0").get("drift") == []
    # Returned with its address gone (a pod's namespace keeps nothing of ours): repaired.
    pod_ns.ip("link", "set", "r1", "netns", rails_ns.name)
    wait_for(lambda: rails_ns.addresses("r1") == ["10.11.0.5/24"], 10,
             "rail1 checked and repaired on its return")
    wait_for(lambda: "lent_seconds" not in rail_row(agent_config, "rail1")
             and (status_of(agent_config) or {}).get("ok") is True, 10, "no longer lent")
    log = stop_cleanly(proc)
    assert "rail1: its netdev moved to another network namespace" in log, log
    assert "rail1: back in this network namespace" in log, log


def test_a_rail_deleted_outright_is_still_missing(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    """The same rail deleted in place (no namespace to go to): InterfaceMissing, as before."""
    agent_config["resync_interval"] = "1h"
    proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
    rails_ns.ip("link", "del", "r1")
    wait_for(lambda: (cond(agent_config, "RoCENetworkReady") or ("",))[0] == "False", 10,
             "the rail missing")
    assert "InterfaceMissing" in (cond(agent_config, "RoCENetworkReady") or ("", "", ""))[1]
    assert "lent_seconds" not in rail_row(agent_config, "rail1")
    stop_cleanly(proc)


def test_a_restart_while_the_rail_is_lent_keeps_it_lent_this_boot_only(
        rails_ns: Netns, agent_config: dict[str, Any], pod_ns: Netns, tmp_path: Path) -> None:
    """The agent restarted (an upgrade, a crash) while a job holds the rail: the new daemon
    cannot see where it went, so the last one's word is kept in the state dir (lent.json,
    with this boot's id): no InterfaceMissing, no taint. From another boot it is not
    trusted (a reboot gives every netdev back)."""
    import json

    agent_config["resync_interval"] = "1h"
    cfg_path = tmp_path / "c.yaml"
    proc = start(rails_ns, agent_config, cfg_path)
    rails_ns.ip("link", "set", "r1", "netns", pod_ns.name)
    wait_for(lambda: "lent_seconds" in rail_row(agent_config, "rail1"), 10, "lent")
    stop_cleanly(proc)
    lent = Path(agent_config["state_dir"]) / "lent.json"
    assert set(json.loads(lent.read_text())["rails"]) == {"rail1"}
    proc = rails_ns.start_daemon(cfg_path)
    # Its own first status (the last daemon's file says ok too): ok, so not InterfaceMissing.
    wait_for(lambda: (s := status_of(agent_config) or {}).get("daemon", {}).get("pid")
             == proc.pid and s.get("ok") is True, 20, "the new daemon's first healthy pass")
    assert "lent_seconds" in rail_row(agent_config, "rail1")
    stop_cleanly(proc)
    # Another boot's file: not trusted, the rail is missing.
    doc = json.loads(lent.read_text())
    lent.write_text(json.dumps({**doc, "boot_id": "another-boot"}))
    proc = rails_ns.start_daemon(cfg_path)
    try:
        wait_for(lambda: (cond(agent_config, "RoCENetworkReady") or ("",))[0] == "False", 20,
                 "rail1 missing after a boot")
        assert "InterfaceMissing" in (cond(agent_config, "RoCENetworkReady") or ("", ""))[1]
    finally:
        stop_cleanly(proc)
    pod_ns.ip("link", "set", "r1", "netns", rails_ns.name)
