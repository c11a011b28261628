"""The condition contract: one fold from problems to a Finding, a registry of conditions
judged from frozen facts, and GID problems that name the rail's own device."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.checks.conditions import CONDITIONS, judge_all, judge_pass
from nodeagent.checks.facts import Facts, TransportSeen
from nodeagent.checks.gid import gid_finding
from nodeagent.config import parse_config
from nodeagent.model.conditions import FABRIC_READY, Problem, Problems
from nodeagent.model.rdma import Pin
from nodeagent.probes.gid import read_sysfs
from nodeagent.run.store import FactStore
from tests.kit.helpers import make_gid_tree, roce_entries

problem = st.builds(Problem, reason=st.sampled_from(["A", "B", "C"]),
                    message=st.text(min_size=1, max_size=5), unknown=st.booleans())


@settings(deadline=None)  # a property, not a timing: no deadline under a loaded CI
@given(st.lists(problem, max_size=6))
def test_the_fold_never_lets_status_and_reason_disagree(found: list[Problem]) -> None:
    """False iff a failure was found, its reason the first failure's; Unknown with the
    first unknown's reason when only unknowns were; every problem is in the message."""
    problems = Problems("T")
    problems.extend(found)
    got = problems.finding("Fine", "all fine")
    failed = [p for p in found if not p.unknown]
    if not found:
        assert (got.status, got.reason, got.message) == ("True", "Fine", "all fine")
    elif failed:
        assert (got.status, got.reason) == ("False", failed[0].reason)
    else:
        assert (got.status, got.reason) == ("Unknown", found[0].reason)
    assert got.message.count("; ") >= len(found) - 1
    for p in found:
        assert p.message in got.message


def two_rails(sysfs: Path, **extra: object):  # type: ignore[no-untyped-def]
    return parse_config({"paths": {"sysfs": str(sysfs)}, "gid_source": "sysfs", **extra,
                         "rails": [
                             {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24",
                              "rdma_device": "mlx5_0", "gid_index": 3},
                             {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24",
                              "rdma_device": "mlx5_1", "gid_index": 3}]})


def test_one_rail_unreadable_and_one_shifted_says_shifted(tmp_path: Path) -> None:
    """Before: the first problem's reason was taken whatever its status, so a False
    RoCEGIDStable could carry the Unknown reason GIDTableUnreadable."""
    make_gid_tree(tmp_path, "mlx5_1", roce_entries("r1", "10.11.0.5", ipv4_index=6))  # at 7
    (tmp_path / "class/infiniband/mlx5_0").mkdir(parents=True)  # no ports: unreadable
    cfg = two_rails(tmp_path)
    got = gid_finding(cfg, read_sysfs(tmp_path), {}).finding
    assert (got.status, got.reason) == ("False", "GIDIndexShifted"), got
    assert got.message.startswith("rail1 r1: IPv4 RoCE v2 GID at index 7, pinned 3"), got
    assert "rail0 r0: GID table unreadable (mlx5_0: no ports readable" in got.message, got


def test_a_gid_problem_names_the_rails_own_device(tmp_path: Path) -> None:
    """An hfi1, an mlx4 and an mlx5 device, the last two without GID files (the shape of a
    public exporter's fixtures): before, both rails quoted the first device's error
    (`hfi1_0 port 1: cannot list GIDs`). Each names its own device now."""
    for device in ("hfi1_0", "mlx4_0", "mlx5_0"):
        (tmp_path / f"class/infiniband/{device}/ports/1").mkdir(parents=True)
    cfg = parse_config({"paths": {"sysfs": str(tmp_path)}, "gid_source": "sysfs", "rails": [
        {"name": "a", "interface": "ib0", "address": "10.1.0.5/24", "rdma_device": "mlx4_0"},
        {"name": "b", "interface": "ib1", "address": "10.2.0.5/24", "rdma_device": "mlx5_0"}]})
    got = gid_finding(cfg, read_sysfs(tmp_path), {}).finding
    assert (got.status, got.reason) == ("Unknown", "GIDTableUnreadable"), got
    parts = got.message.split("; ")
    assert parts[0].startswith("a ib0: GID table unreadable (mlx4_0 port 1: cannot list"), got
    assert parts[1].startswith("b ib1: GID table unreadable (mlx5_0 port 1: cannot list"), got
    assert "hfi1_0" not in got.message


def test_a_rail_whose_gids_vanished_is_judged_on_the_device_they_were_on(
        tmp_path: Path) -> None:
    """No rdma_device in the config, its GIDs gone from mlx5_1 (a table being rewritten):
    GIDMissing on mlx5_1, not RDMADeviceNotFound, and another device's errors are not its."""
    make_gid_tree(tmp_path, "mlx5_1", [])
    (tmp_path / "class/infiniband/hfi1_0").mkdir(parents=True)
    cfg = parse_config({"paths": {"sysfs": str(tmp_path)}, "gid_source": "sysfs", "rails": [
        {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24", "gid_index": 3}]})
    got = gid_finding(cfg, read_sysfs(tmp_path), {}, seen={"rail1": ("mlx5_1", 1)}).finding
    assert (got.status, got.reason) == ("False", "GIDMissing"), got
    assert "from mlx5_1" in got.message and "hfi1_0" not in got.message, got
    unseen = gid_finding(cfg, read_sysfs(tmp_path), {}).finding  # never seen: any device's
    assert (unseen.status, unseen.reason) == ("Unknown", "GIDTableUnreadable"), unseen


def test_judging_the_same_facts_twice_gives_the_same_report(tmp_path: Path) -> None:
    """Judgement reads nothing and changes nothing: the same Facts, the same report."""
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    make_gid_tree(tmp_path, "mlx5_1", roce_entries("r1", "10.11.0.5", ipv4_index=6))
    cfg = two_rails(tmp_path, hardware={}, transport={})
    table = read_sysfs(tmp_path)
    facts = Facts(now=100.0, gid_table=table, pins={"rail0": Pin(3, "mlx5_0", 1, learned=True)})
    first, second = judge_pass(cfg, facts), judge_pass(cfg, facts)
    assert first.as_dict() == second.as_dict()
    types = [f.type for f in first.findings]
    assert types == [c.type for c in CONDITIONS if c.type in types]
    assert "RDMAHardwareHealthy" in types and "CustomChecksPassed" not in types
    fabric = next(f for f in first.findings if f.type == FABRIC_READY)
    assert (fabric.status, fabric.reason) == ("False", "GIDIndexShifted"), fabric


def test_fabric_ready_is_over_the_gated_conditions_only(tmp_path: Path) -> None:
    """transport.gate off: a transport never verified leaves FabricReady alone."""
    make_gid_tree(tmp_path, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    cfg = parse_config({"paths": {"sysfs": str(tmp_path)}, "gid_source": "sysfs",
                        "transport": {"gate": False}, "rails": [
                            {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24",
                             "rdma_device": "mlx5_0", "gid_index": 3}]})
    table = read_sysfs(tmp_path)
    findings = {f.type: f for f in judge_all(cfg, Facts(now=0.0, gid_table=table))}
    assert findings["RDMATransportVerified"].status == "Unknown"
    assert findings[FABRIC_READY].reason != "TransportNotVerified"
    assert "RDMATransportVerified" not in findings[FABRIC_READY].message


def test_a_reload_forgets_what_it_saw_of_a_changed_rail_only(tmp_path: Path) -> None:
    cfg = two_rails(tmp_path)
    store = FactStore(rail_seen={"rail0": ("mlx5_0", 1), "rail1": ("mlx5_1", 1)},
                      seen={TransportSeen: TransportSeen({}, {"rail0": "no pin",
                                                              "rail1": "no pin"})})
    changed = cfg.rails[1].model_copy(update={"interface": "r9"})
    store.keep_rails([cfg.rails[0], changed], cfg.rails)
    assert store.rail_seen == {"rail0": ("mlx5_0", 1)}
    assert store.get(TransportSeen) == TransportSeen({}, {"rail0": "no pin"})


def test_a_reload_forgets_the_kernels_word_on_a_changed_rails_netdev(tmp_path: Path) -> None:
    """The old rail1's netdev was deleted (RTM_DELLINK, said before the reload); the new
    rail1's netdev found gone waits for the kernel's word like any other, it is not
    judged missing at once on the old one's."""
    cfg = two_rails(tmp_path)
    store = FactStore()
    for rail in cfg.rails:
        store.leaving.said(rail.name, deleted=True)
    changed = cfg.rails[1].model_copy(update={"interface": "r9"})
    store.keep_rails([cfg.rails[0], changed], cfg.rails)
    assert store.leaving.said_gone == {"rail0"}, "the unchanged rail keeps its word"
    store.leaving.vanished("rail1", now=10.0)
    store.leaving.vanished("rail0", now=10.0)
    assert store.leaving.waiting(10.5) == {"rail1"}
