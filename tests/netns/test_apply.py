"""`check` and `apply` against real kernels state in throwaway network namespaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.kit.helpers import Netns, condition, write_config


def run_json(ns: Netns, verb: str, cfg: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = ns.nodeagent(verb, "--config", str(cfg), "--json", *extra)
    assert res.stderr == "" or res.returncode != 2, res.stderr
    return res.returncode, json.loads(res.stdout)


def rule_for(ns: Netns, src: str) -> list[dict[str, Any]]:
    return [r for r in ns.rules() if r.get("src") == src]


def assert_rails_as_configured(ns: Netns) -> None:
    assert ns.addresses("r0") == ["10.10.0.5/24"]
    assert ns.addresses("r1") == ["10.11.0.5/24"]
    for ifname in ("r0", "r1"):
        link = ns.link(ifname)
        assert link["mtu"] == 4200 and "UP" in link["flags"]
        assert ns.sysctl(ifname, "arp_ignore") == "1"
        assert ns.sysctl(ifname, "arp_announce") == "2"
        assert ns.sysctl(ifname, "rp_filter") == "2"
        assert ns.sysctl(ifname, "accept_ra", "ipv6") == "0"
    t100 = {(r["dst"], r.get("gateway")) for r in ns.routes(100)}
    assert t100 == {("default", "10.10.0.1"), ("10.10.0.0/24", None)}
    assert {(r["dst"], r.get("gateway")) for r in ns.routes(101)} == {("10.11.0.0/24", None)}
    assert [(r["priority"], r["table"]) for r in rule_for(ns, "10.10.0.5")] == [(1000, "100")]
    assert [(r["priority"], r["table"]) for r in rule_for(ns, "10.11.0.5")] == [(1001, "101")]


def test_check_changes_nothing_and_names_every_problem(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    before = rails_ns.ipj("addr")
    code, out = run_json(rails_ns, "check", cfg)
    assert code == 1 and out["ok"] is False and out["actions"] == []
    assert rails_ns.ipj("addr") == before
    net = condition(out, "RoCENetworkReady")
    assert (net["status"], net["reason"]) == ("False", "LinkDown")
    assert "rail0 r0: address 10.10.0.5/24 missing" in net["message"]
    assert "rail1 r1: MTU 1500, want 4200" in net["message"]
    assert [c["type"] for c in out["conditions"]] == [
        "RoCENetworkReady", "RoCEGIDStable", "RDMADevicePluginReady", "LustreReady",
        "FabricReady", "FabricTrafficOnRDMA"]
    assert not (Path(agent_config["state_dir"]) / "pins.json").exists()


def test_dry_run_prints_the_exact_actions_and_changes_nothing(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    before = (rails_ns.ipj("addr"), rails_ns.rules(), rails_ns.sysctl("r0", "arp_ignore"))
    code, out = run_json(rails_ns, "apply", cfg, "--dry-run")
    assert code == 1
    assert out["actions"][:10] == [
        "rail0 r0: set link up",
        "rail0 r0: set mtu 4200",
        "rail0 r0: set sysctl accept_ra=0",
        "rail0 r0: set sysctl arp_announce=2",
        "rail0 r0: set sysctl arp_ignore=1",
        "rail0 r0: set sysctl rp_filter=2",
        "rail0 r0: add address 10.10.0.5/24",
        "rail0 r0: route 10.10.0.0/24 dev r0 table 100",
        "rail0 r0: route default via 10.10.0.1 dev r0 table 100",
        "rail0 r0: add rule from 10.10.0.5 lookup 100 priority 1000",
    ]
    assert (rails_ns.ipj("addr"), rails_ns.rules(), rails_ns.sysctl("r0", "arp_ignore")) == before


def test_apply_repairs_everything_then_is_idempotent(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 0, out
    assert len(out["actions"]) == 19
    assert_rails_as_configured(rails_ns)
    gid = condition(out, "RoCEGIDStable")
    assert (gid["status"], gid["reason"]) == ("True", "GIDsPinned")
    assert "learned pin mlx5_0/1 index 3" in gid["message"]
    pins = json.loads((Path(agent_config["state_dir"]) / "pins.json").read_text())
    assert pins["rail0"] == {"address": "10.10.0.5/24", "device": "mlx5_0", "index": 3, "port": 1}

    code, again = run_json(rails_ns, "apply", cfg)
    assert code == 0 and again["actions"] == []
    code, checked = run_json(rails_ns, "check", cfg)
    assert code == 0 and checked["ok"] is True
    assert condition(checked, "FabricReady")["status"] == "True"


def test_apply_repairs_each_kind_of_drift(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    assert run_json(rails_ns, "apply", cfg)[0] == 0
    breakages = {
        "ip addr del": lambda: rails_ns.ip("addr", "del", "10.10.0.5/24", "dev", "r0"),
        "ip rule del": lambda: rails_ns.ip("rule", "del", "priority", "1001"),
        "ip route flush table": lambda: rails_ns.ip("route", "flush", "table", "100"),
        "ip link set mtu": lambda: rails_ns.ip("link", "set", "r1", "mtu", "1500"),
        "ip link set down": lambda: rails_ns.ip("link", "set", "r0", "down"),
        "sysctl": lambda: rails_ns.exec(
            "sh", "-c", "echo 0 > /proc/sys/net/ipv4/conf/r1/rp_filter"),
        "wrong prefix": lambda: (
            rails_ns.ip("addr", "del", "10.11.0.5/24", "dev", "r1"),
            rails_ns.ip("addr", "add", "10.11.0.5/16", "dev", "r1"),
        ),
    }
    for what, breakage in breakages.items():
        breakage()
        assert run_json(rails_ns, "check", cfg)[0] == 1, what
        code, out = run_json(rails_ns, "apply", cfg)
        assert code == 0, (what, out)
        assert out["actions"], what
        assert_rails_as_configured(rails_ns)


def test_stale_rule_priority_is_moved(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    rails_ns.ip("rule", "add", "from", "10.10.0.5", "lookup", "100", "priority", "900")
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 0, out
    assert "rail0 r0: remove rule from 10.10.0.5 lookup 100 priority 900" in out["actions"]
    assert [r["priority"] for r in rule_for(rails_ns, "10.10.0.5")] == [1000]


def test_foreign_addresses_kept_unless_the_rail_is_exclusive(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    assert run_json(rails_ns, "apply", cfg)[0] == 0
    rails_ns.ip("addr", "add", "2001:db8::5/64", "dev", "r0", "nodad")
    rails_ns.ip("addr", "add", "192.0.2.9/24", "dev", "r0")
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 0 and out["actions"] == []
    assert "2001:db8::5/64" in rails_ns.addresses("r0", "inet6")

    agent_config["rails"][0]["exclusive"] = True
    write_config(cfg, agent_config)
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 0, out
    assert sorted(out["actions"]) == [
        "rail0 r0: remove address 192.0.2.9/24",
        "rail0 r0: remove address 2001:db8::5/64",
    ]
    assert rails_ns.addresses("r0") == ["10.10.0.5/24"]
    assert "2001:db8::5/64" not in rails_ns.addresses("r0", "inet6")
    assert any(a.startswith("fe80::") for a in rails_ns.addresses("r0", "inet6"))


def test_no_carrier_is_reported_not_repaired(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    assert run_json(rails_ns, "apply", cfg)[0] == 0
    rails_ns.ip("link", "set", "p0", "down")  # the far end: carrier loss on r0
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 1 and out["actions"] == []
    net = condition(out, "RoCENetworkReady")
    assert (net["reason"], net["message"]) == (
        "NoCarrier", "rail0 r0: no carrier (cable, switch port or peer down)")
    # Carrier loss must not cost the address (nor the GID that hangs on it).
    assert rails_ns.addresses("r0") == ["10.10.0.5/24"]


def test_missing_interface(netns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    netns.veth("r1", "p1")
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    code, out = run_json(netns, "apply", cfg)
    assert code == 1
    net = condition(out, "RoCENetworkReady")
    assert (net["reason"], net["message"]) == ("InterfaceMissing",
                                               "rail0 r0: interface does not exist")
    assert netns.addresses("r1") == ["10.11.0.5/24"]  # the other rail is still repaired


def fake_rdma(path: Path, qps: list[dict[str, Any]]) -> str:
    """An `rdma` tool that lists the given QPs (`rdma -j res show qp`)."""
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(qps)}\nEOF\n")
    path.chmod(0o755)
    return str(path)


GSI = {"ifindex": 0, "ifname": "mlx5_0", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS",
       "comm": "ib_core"}
USER_QP = {"ifindex": 0, "ifname": "mlx5_0", "port": 1, "lqpn": 77, "type": "RC",
           "state": "RTS", "pid": 4242, "comm": "all_reduce_perf"}


def shifted(agent_config: dict[str, Any], tmp_path: Path, qps: list[dict[str, Any]]) -> Path:
    """rail0 pinned at 3 with its GID at 5 (the fixture table), QPs as given."""
    from tests.kit.helpers import make_gid_tree, roce_entries

    agent_config["rails"][0]["gid_index"] = 3
    agent_config["paths"]["rdma"] = fake_rdma(tmp_path / "rdma", qps)
    make_gid_tree(Path(agent_config["paths"]["sysfs"]), "mlx5_0",
                  roce_entries("r0", "10.10.0.5", ipv4_index=4))
    return write_config(tmp_path / "c.yaml", agent_config)


def test_gid_shift_under_a_live_qp_is_reported_and_left_alone(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = shifted(agent_config, tmp_path, [GSI, USER_QP])
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 1
    gid = condition(out, "RoCEGIDStable")
    assert (gid["status"], gid["reason"]) == ("False", "GIDIndexShifted")
    assert gid["message"] == (
        "rail0 r0: IPv4 RoCE v2 GID at index 5, pinned 3 (mlx5_0 port 1); re-pin waits for "
        "1 QP(s) on mlx5_0 port 1: QP 77 RC RTS (pid 4242 all_reduce_perf)")
    assert not any("re-pin" in a for a in out["actions"])
    assert out["gid_source"] == "sysfs"


def test_gid_shift_with_no_qp_left_is_repinned_by_apply(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    """The address is deleted and re-added (on a real kernel), its routes come back in the
    same run. The fixture GID table does not move, so the shift is still reported after."""
    cfg = shifted(agent_config, tmp_path, [GSI])
    assert run_json(rails_ns, "apply", cfg)[0] == 1  # rails set up, the shift stays
    _, dry = run_json(rails_ns, "apply", cfg, "--dry-run")
    assert dry["actions"] == [
        "rail0 r0: re-pin: remove address 10.10.0.5/24 (GID index 5 back to 3 on mlx5_0 "
        "port 1)", "rail0 r0: re-pin: add address 10.10.0.5/24"]
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 1 and out["actions"][:2] == dry["actions"]
    # the kernel dropped the rail's routes with the address: proof it went, and they are back
    assert "route 10.10.0.0/24 dev r0 table 100" in " ".join(out["actions"][2:])
    assert_rails_as_configured(rails_ns)
    gid = condition(out, "RoCEGIDStable")
    assert gid["message"].endswith("re-pinning: no QP uses the port")

    agent_config["gid_repin"] = "never"
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 1 and out["actions"] == []
    assert condition(out, "RoCEGIDStable")["message"].endswith(
        "re-pinning is off (gid_repin: never)")


def test_human_output_explains_itself(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    res = rails_ns.nodeagent("check", "--config", str(cfg))
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    # Many problems: one per line under their condition, the condition's line first.
    at = next(i for i, line in enumerate(lines) if line.split()[:3] == [
        "RoCENetworkReady", "False", "LinkDown"])
    below = [line.strip() for line in lines[at + 1:at + 4]]
    assert below == ["rail0 r0: link is administratively down",
                     "rail0 r0: address 10.10.0.5/24 missing", "rail0 r0: MTU 1500, want 4200"]
    assert "rail1 r1: MTU 1500, want 4200" in [line.strip() for line in lines]

    res = rails_ns.nodeagent("apply", "--config", str(cfg))
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert lines[0] == "node node-a: fabric ready"
    assert "repaired:" in lines
    assert any(line.split()[:3] == ["RoCENetworkReady", "True", "RailsConfigured"]
               for line in lines)


def test_an_observed_rail_is_checked_and_reported_but_never_written(
    rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path
) -> None:
    """manage: false (another tool owns the rail): every check and condition as usual, no
    kernel write at all, in apply as in dry-run; the managed rail beside it is repaired."""
    agent_config["rails"][1]["manage"] = False
    cfg = write_config(tmp_path / "c.yaml", agent_config)
    before = (rails_ns.addresses("r1"), rails_ns.link("r1")["mtu"],
              rails_ns.sysctl("r1", "arp_ignore"), rule_for(rails_ns, "10.11.0.5"))
    code, planned = run_json(rails_ns, "apply", cfg, "--dry-run")
    assert code == 1 and planned["actions"]
    assert not any(a.startswith("rail1") for a in planned["actions"]), planned["actions"]
    code, out = run_json(rails_ns, "apply", cfg)
    assert code == 1, out
    assert not any(a.startswith("rail1") for a in out["actions"]), out["actions"]
    assert (rails_ns.addresses("r1"), rails_ns.link("r1")["mtu"],
            rails_ns.sysctl("r1", "arp_ignore"), rule_for(rails_ns, "10.11.0.5")) == before
    assert rails_ns.addresses("r0") == ["10.10.0.5/24"]  # the managed rail is repaired
    net = condition(out, "RoCENetworkReady")
    assert net["status"] == "False" and net["reason"] != "ManagedElsewhere", net
    assert "rail1 r1: address 10.11.0.5/24 missing" in net["message"]
    assert "rail0" not in net["message"]
    # Its owner configures it: the same check passes, still without a write by the agent.
    rails_ns.ip("link", "set", "r1", "mtu", "4200", "up")
    rails_ns.ip("addr", "add", "10.11.0.5/24", "dev", "r1")
    rails_ns.ip("route", "add", "10.11.0.0/24", "dev", "r1", "table", "101")
    rails_ns.ip("rule", "add", "from", "10.11.0.5", "lookup", "101", "priority", "1001")
    for key, value in (("arp_ignore", 1), ("arp_announce", 2), ("rp_filter", 2)):
        rails_ns.exec("sh", "-c", f"echo {value} > /proc/sys/net/ipv4/conf/r1/{key}")
    rails_ns.exec("sh", "-c", "echo 0 > /proc/sys/net/ipv6/conf/r1/accept_ra")
    code, out = run_json(rails_ns, "apply", cfg)
    assert out["actions"] == [], out
    assert code == 0, condition(out, "RoCENetworkReady")["message"]

