"""RDMATransportVerified: the pure parts. The probe itself runs on soft-RoCE in the fabric lab
(tests/lab: test_2f); here the completion statuses against the distro's real pyverbs, the
reasons by failed step, staleness, the targets (never a shifted rail) and the agent's own
QPs counted out of a re-pin."""

from __future__ import annotations

import os
import types

import pytest
import pyverbs.enums as e
from pyverbs.cq import WC

from nodeagent.checks.transport import STEP_REASONS, transport_finding
from nodeagent.config import parse_config
from nodeagent.model.peers import TransportResult
from nodeagent.model.rdma import QueuePair, QueuePairs
from nodeagent.probes.transport import (
    CompletionWait,
    address_vector,
    completion_status,
    gid_matches,
    port_state,
)

CFG = parse_config({
    "rails": [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"},
              {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24"}],
    "transport": {"probe_interval": "60s", "timeout": "5s"}})


def test_completion_statuses_are_named_as_libibverbs_names_them() -> None:
    for status, text in ((e.IBV_WC_SUCCESS, "success"),
                         (e.IBV_WC_RETRY_EXC_ERR, "retry exceeded error"),
                         (e.IBV_WC_WR_FLUSH_ERR, "WR flush error"),
                         (e.IBV_WC_REM_ACCESS_ERR, "remote access error")):
        wc = WC(wr_id=1, status=status)  # a real pyverbs work completion
        assert completion_status(wc.status) == text
    assert completion_status(250) == "status 250"


def test_a_completion_is_spun_for_then_napped_for_so_a_slow_path_costs_no_core(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest's 50 ms round trip once cost 50 ms of CPU a read (the prober spun on its
    CQ): 30 % of a core for 2 rails x 4 peers in the lab."""
    now = [0.0]
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        now[0] += seconds

    monkeypatch.setattr("nodeagent.probes.transport.time",
                        types.SimpleNamespace(perf_counter=lambda: now[0], sleep=sleep))
    wait = CompletionWait()
    for _ in range(1000):  # polls within the spin: a fast RTT is read exactly
        now[0] += 100e-9
        wait.polled(0)
    assert naps == []
    now[0] = CompletionWait.SPIN
    for _ in range(8):
        wait.polled(0)
    assert naps == [20e-6, 40e-6, 80e-6, 160e-6, 320e-6, 500e-6, 500e-6, 500e-6]
    wait.polled(1)  # a completion: the next is expected soon, spun for again
    naps.clear()
    wait.polled(0)
    assert naps == []


def test_every_qp_addresses_its_peer_as_nccl_does_hop_limit_255_in_its_class() -> None:
    from pyverbs.addr import GID, GlobalRoute

    peer = GID("0000:0000:0000:0000:0000:ffff:0a0a:0006")
    # pyverbs' own default is an IP TTL of 1: dropped at a routed fabric's first router.
    assert GlobalRoute(dgid=peer).hop_limit == 1
    ah = address_vector(1, 3, peer, traffic_class=104, service_level=3)  # a real AHAttr
    assert (ah.hop_limit, ah.traffic_class, ah.sgid_index) == (255, 104, 3)
    assert (ah.is_global, ah.sl, ah.port_num) == (1, 3, 1)
    assert str(ah.dgid) == str(peer)
    assert address_vector(1, 3, peer).traffic_class == 0


def test_port_states_are_named_as_pyverbs_names_them() -> None:
    assert port_state(e.IBV_PORT_ACTIVE) == "Active (4)"
    assert port_state(e.IBV_PORT_DOWN) == "Down (1)"


def test_gid_text_matches_the_rail_address() -> None:
    assert gid_matches("0000:0000:0000:0000:0000:ffff:0a0a:0005", "10.10.0.5")
    assert gid_matches("::ffff:10.10.0.5", "10.10.0.5")
    assert not gid_matches("fe80:0000:0000:0000:5054:00ff:fe12:3456", "10.10.0.5")
    assert not gid_matches("garbage", "10.10.0.5")


def ok(rail: str, at: float = 100.0) -> TransportResult:
    return TransportResult(rail, True, messages=100, latency_p50_us=35.2, latency_p99_us=81.0,
                           bandwidth_gbps=1.5, gid_index=3, at=at)


def test_verified_rails_and_their_figures() -> None:
    f = transport_finding(CFG, {"rail0": ok("rail0"), "rail1": ok("rail1")}, {}, 110.0)
    assert (f.status, f.reason) == ("True", "TransportVerified")
    assert "rail0: 100 messages p50 35 us p99 81 us, 1.50 Gb/s (GID index 3)" in f.message


def test_a_failed_step_is_the_reason() -> None:
    for step, reason in STEP_REASONS.items():
        bad = TransportResult("rail1", False, step, "boom", at=100.0)
        f = transport_finding(CFG, {"rail0": ok("rail0"), "rail1": bad}, {}, 110.0)
        assert (f.status, f.reason) == ("False", reason)
        assert f"rail1: {step} failed: boom" in f.message


def test_not_probed_missing_or_stale_is_unknown() -> None:
    f = transport_finding(CFG, {"rail0": ok("rail0")},
                          {"rail1": "its GID is off its pinned index: waiting for the re-pin"},
                          110.0)
    assert (f.status, f.reason) == ("Unknown", "TransportNotVerified")
    assert "rail1: not probed: its GID is off its pinned index" in f.message
    assert "rail1: not probed yet" in transport_finding(CFG, {"rail0": ok("rail0")}, {},
                                                         110.0).message
    stale = transport_finding(CFG, {"rail0": ok("rail0"), "rail1": ok("rail1", at=0.0)}, {},
                              1000.0)
    assert stale.status == "Unknown" and "stuck?" in stale.message
    no_verbs = TransportResult("rail1", False, "pyverbs", "not importable", at=100.0)
    assert transport_finding(CFG, {"rail0": ok("rail0"), "rail1": no_verbs}, {},
                             110.0).status == "Unknown"


def test_the_agents_own_qps_never_hold_up_a_re_pin() -> None:
    mine = QueuePair("rxe0", 1, 17, "RC", "RTS", os.getpid(), "nodeagent")
    theirs = QueuePair("rxe0", 1, 18, "RC", "RTS", 4242, "nccl")
    qps = QueuePairs((mine, theirs)).excluding(os.getpid())
    assert qps.using("rxe0", 1) == [theirs]
    assert QueuePairs(error="x").excluding(1).error == "x"


def test_the_latest_probe_is_in_the_status_and_the_metrics() -> None:
    from prometheus_client import generate_latest

    from nodeagent.model.status import RailStatus, Report, Status
    from nodeagent.publish.metrics import AgentMetrics

    bad = TransportResult("rail1", False, "completion", "retry exceeded error", at=1.0)
    report = Report(node="n", findings=[], rails=[
        RailStatus("rail0", "r0", transport=ok("rail0")), RailStatus("rail1", "r1",
                                                                     transport=bad)])
    metrics = AgentMetrics()
    metrics.update(Status(report=report))
    text = generate_latest(metrics.registry).decode()
    assert 'nodeagent_rdma_transport_ok{rail="rail0"} 1.0' in text
    assert 'nodeagent_rdma_transport_ok{rail="rail1"} 0.0' in text
    assert 'nodeagent_rdma_transport_latency_seconds{quantile="0.5",rail="rail0"} 3.52e-05' \
        in text
    rails = report.as_dict()["rails"]
    assert rails[1]["transport"]["step"] == "completion"


def test_no_rails_is_not_configured_rather_than_verified() -> None:
    f = transport_finding(parse_config({"transport": {}}), {}, {}, 0.0)
    assert (f.status, f.reason) == ("True", "NotConfigured")
