"""The condition contract: one fold from problems to a Finding, and GID problems that name
the rail's own device."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.checks.gid import gid_finding
from nodeagent.config import parse_config
from nodeagent.model import Problem, Problems
from nodeagent.probes.gid import read_sysfs
from tests.kit.helpers import make_gid_tree, roce_entries

problem = st.builds(Problem, reason=st.sampled_from(["A", "B", "C"]),
                    message=st.text(min_size=1, max_size=5), unknown=st.booleans())


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
