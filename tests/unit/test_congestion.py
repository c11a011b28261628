"""FabricNotCongested: a path that pauses, marks or retransmits, named with its figures.

The port tree is a ConnectX port in the layout of leptonai/gpud's captured H100 node
(components/accelerator/nvidia/infiniband/class/testdata/sys-class-infiniband-h100.0,
Apache-2.0: `mlx5_bond_0/ports/1/hw_counters/` holds out_of_sequence,
local_ack_timeout_err, roce_slow_restart among the q counters, one decimal count per file),
plus the congestion counters mlx5 adds on a RoCE port (drivers/infiniband/hw/mlx5/
counters.c, cong_cnts: rp_cnp_ignored, rp_cnp_handled, np_ecn_marked_roce_packets,
np_cnp_sent). The files are read by the real reader; only time is simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.checks.congestion import congestion_finding
from nodeagent.checks.facts import CongestionSeen
from nodeagent.config import ConfigError, parse_config
from nodeagent.model.rdma import CongestionSample
from nodeagent.probes.congestion import read_congestion
from tests.kit.helpers import make_port_tree

# gpud's capture, mlx5_bond_0 port 1 hw_counters (the q counters), and mlx5's cong_cnts.
Q_COUNTERS = ["duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
              "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
              "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request",
              "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
              "resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans",
              "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
              "roce_slow_restart_trans", "rx_atomic_requests", "rx_dct_connect",
              "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests"]
CONG_COUNTERS = ["rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets",
                 "np_cnp_sent"]
RAIL = {"name": "rail0", "interface": "bond0", "address": "10.10.0.5/24",
        "rdma_device": "mlx5_bond_0"}


def config(**section: Any) -> Any:
    return parse_config({"rails": [RAIL], "congestion": section})


def port(root: Path, **grown: int) -> None:
    values: dict[str, int | str] = dict.fromkeys(Q_COUNTERS + CONG_COUNTERS, 0)
    values.update(grown)
    values["lifespan"] = 10
    make_port_tree(root, "mlx5_bond_0", hw_counters=values, pcie=None)


def judged(root: Path, cfg: Any, readings: list[dict[str, int]], every: float = 10.0) -> Any:
    """Each reading written to the tree and read back by the real reader, `every` s apart,
    folded as the store folds them."""
    seen: CongestionSeen | None = None
    for i, grown in enumerate(readings):
        port(root, **grown)
        sample = read_congestion(root, "mlx5_bond_0", 1, "nodeagent-none0",
                                 cfg.congestion.rates)
        seen = CongestionSeen({"rail0": sample}, {}, 100.0 + i * every,
                              cfg.congestion.window).after(seen)
    assert seen is not None
    return congestion_finding(cfg, seen.samples, seen.skipped, seen.rates)


def test_a_quiet_port_is_not_congested_and_says_its_figures(tmp_path: Path) -> None:
    f = judged(tmp_path, config(), [{"np_cnp_sent": 0}, {"np_cnp_sent": 50}])
    assert (f.status, f.reason) == ("True", "NotCongested")
    assert "rail0 bond0 (mlx5_bond_0/1): np_cnp_sent 5.0/s" in f.message


def test_the_first_sample_gives_no_rate_yet(tmp_path: Path) -> None:
    f = judged(tmp_path, config(), [{"np_cnp_sent": 10**9}])
    assert (f.status, f.message) == ("True", "rail0 bond0 (mlx5_bond_0/1): first sample")


@pytest.mark.parametrize(("counter", "per_10s", "reason"), [
    ("np_cnp_sent", 20_000, "CongestionNotified"),
    ("np_ecn_marked_roce_packets", 20_000, "CongestionNotified"),
    ("rp_cnp_handled", 20_000, "CongestionNotified"),
    ("out_of_sequence", 500, "Retransmitting"),
    ("local_ack_timeout_err", 30, "Retransmitting"),
    ("roce_slow_restart", 30, "Retransmitting"),
])
def test_a_counter_over_its_rate_names_what_the_path_does(
        tmp_path: Path, counter: str, per_10s: int, reason: str) -> None:
    f = judged(tmp_path, config(), [{counter: 7}, {counter: 7 + per_10s // 2},
                                    {counter: 7 + per_10s}], every=5.0)
    assert (f.status, f.reason) == ("False", reason)
    limit = config().congestion.rates[counter]
    assert f"{counter} {per_10s / 10:,.1f}/s over 10 s (rate {limit:,g}/s)" in f.message


def test_a_pause_storm_is_named_from_the_netdevs_counters(tmp_path: Path) -> None:
    """The per-priority pause counters are the netdev's; the judge takes them by name
    whatever their source (the ethtool read itself: tests/netns/test_congestion_daemon.py)."""
    cfg = config(rates={"rx_prio3_pause": 100})
    rates_seen: CongestionSeen | None = None
    for i, value in enumerate([0, 5_000, 10_000]):
        sample = CongestionSample("mlx5_bond_0", 1, "bond0", {"rx_prio3_pause": value})
        rates_seen = CongestionSeen({"rail0": sample}, {}, 10.0 * i, 60.0).after(rates_seen)
    assert rates_seen is not None
    f = congestion_finding(cfg, rates_seen.samples, {}, rates_seen.rates)
    assert (f.status, f.reason) == ("False", "PFCPauseStorm")
    assert "rx_prio3_pause 500.0/s over 20 s (rate 100/s)" in f.message


def test_a_counter_reset_is_no_burst(tmp_path: Path) -> None:
    """A driver reload starts its counters again: the history starts there."""
    f = judged(tmp_path, config(), [{"out_of_sequence": 10**6}, {"out_of_sequence": 3},
                                    {"out_of_sequence": 5}])
    assert f.status == "True" and "out_of_sequence 0.2/s" in f.message


def test_a_port_without_the_counters_is_unknown_never_a_pass(tmp_path: Path) -> None:
    """Soft-RoCE's hw_counters (rxe_hw_counters.c: sent_pkts, rcvd_pkts, out_of_seq_request,
    rcvd_seq_err, ...) have none of mlx5's names; the netdev (here: none at all) neither."""
    make_port_tree(tmp_path, "rxe0", hw_counters={"sent_pkts": 5, "rcvd_seq_err": 0},
                   pcie=None)
    cfg = config()
    sample = read_congestion(tmp_path, "rxe0", 1, "nodeagent-none0", cfg.congestion.rates)
    assert sample.counters == {} and "nodeagent-none0 ethtool statistics" in sample.unreadable[0]
    seen = CongestionSeen({"rail0": sample}, {}, 0.0, 60.0).after(None)
    f = congestion_finding(cfg, seen.samples, {}, seen.rates)
    assert (f.status, f.reason) == ("Unknown", "NoCongestionCounters")
    assert "none of rx_prio3_pause" in f.message and "ethtool statistics" in f.message


def test_garbage_in_a_counter_file_is_left_out(tmp_path: Path) -> None:
    make_port_tree(tmp_path, "mlx5_bond_0", pcie=None, hw_counters={
        "np_cnp_sent": "lots", "out_of_sequence": "-4", "roce_slow_restart": "1" * 30,
        "local_ack_timeout_err": 7})
    sample = read_congestion(tmp_path, "mlx5_bond_0", 1, "nodeagent-none0",
                             config().congestion.rates)
    assert sample.counters == {"local_ack_timeout_err": 7}


def test_a_rail_not_ready_or_not_read_yet_is_unknown() -> None:
    cfg = config()
    f = congestion_finding(cfg, None, {}, CongestionSeen({}).rates)
    assert (f.status, f.reason) == ("Unknown", "CongestionNotMeasured")
    assert "not read yet" in f.message
    f = congestion_finding(cfg, {}, {"rail0": "its GID is not at its pinned index"},
                           CongestionSeen({}).rates)
    assert "not read: its GID is not at its pinned index" in f.message


@pytest.mark.parametrize(("section", "words"), [
    ({"window": "10s", "interval": "10s"}, "at least twice the interval"),
    ({"rates": {"../../etc/passwd": 1}}, "a counter's name, not a path"),
    ({"rates": {"np_cnp_sent": -1}}, "0 or more per second"),
    ({"rates": {}}, "name at least one counter"),
])
def test_a_bad_congestion_section_is_one_line(section: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(**section)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_counters_not_read_for_long_are_unknown_not_a_stale_pass(tmp_path: Path) -> None:
    """The source's reads are not bounded (a wedged sysfs read stops it): the judge ages
    what it has instead of passing on it forever."""
    cfg = config()
    port(tmp_path)
    sample = read_congestion(tmp_path, "mlx5_bond_0", 1, "nodeagent-none0", cfg.congestion.rates)
    seen = CongestionSeen({"rail0": sample}, {}, 0.0, 60.0).after(None)
    fresh = congestion_finding(cfg, seen.samples, {}, seen.rates, age=29.0)
    stale = congestion_finding(cfg, seen.samples, {}, seen.rates, age=31.0)
    assert fresh.status == "True"
    assert (stale.status, stale.reason) == ("Unknown", "CongestionNotMeasured")
    assert stale.message == "counters last read 31 s ago (a read stuck?)"
