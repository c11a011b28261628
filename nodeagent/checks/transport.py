"""RDMATransportVerified from the latest active probe of each rail. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.config import Config
from nodeagent.model.conditions import RDMA_TRANSPORT_VERIFIED, Finding, Problems
from nodeagent.model.peers import TransportResult, TransportStep

UNVERIFIED = "TransportNotVerified"  # not probed, stale, or failed outside the steps

# The failed step -> the reason (a failed probe names where it broke). The steps left out
# (pyverbs missing, an error outside the steps) are not the fabric's fault: Unknown.
STEP_REASONS = {
    TransportStep.DEVICE_OPEN: "TransportDeviceOpenFailed",
    TransportStep.PORT: "TransportPortNotActive",
    TransportStep.GID: "TransportGIDMismatch",
    TransportStep.RESOURCES: "TransportResourcesFailed",
    TransportStep.QP_INIT: "TransportQPSetupFailed",
    TransportStep.QP_RTR: "TransportQPSetupFailed",
    TransportStep.QP_RTS: "TransportQPSetupFailed",
    TransportStep.COMPLETION: "TransportCompletionError",
    TransportStep.TIMEOUT: "TransportTimeout",
}


def describe(r: TransportResult) -> str:
    if not r.ok:
        return f"{r.rail}: {r.step} failed: {r.error}"
    return (f"{r.rail}: {r.messages} messages p50 {r.latency_p50_us or 0:.0f} us p99 "
            f"{r.latency_p99_us or 0:.0f} us, {r.bandwidth_gbps or 0:.2f} Gb/s "
            f"(GID index {r.gid_index})")


def transport_finding(cfg: Config, results: Mapping[str, TransportResult],
                      skipped: Mapping[str, str], now: float) -> Finding:
    """False when a rail's probe failed (the reason names the step), Unknown while a rail
    was not probed (why is in the message: its GID shifted, its device unknown), has no
    result yet, or its result is stale (the probe itself is stuck), else True."""
    problems = Problems(RDMA_TRANSPORT_VERIFIED)
    tr = cfg.transport
    if tr is None:
        return problems.finding("NotConfigured", "no transport section configured")
    if not cfg.rails:
        return problems.finding("NotConfigured", "no rails configured")
    fine: list[str] = []
    stale_after = 2 * tr.probe_interval + tr.timeout * (len(cfg.rails) + 1)
    for rail in cfg.rails:
        with problems.about(rail.name):
            got = results.get(rail.name)
            if rail.name in skipped:
                problems.unknown(UNVERIFIED, f"{rail.name}: not probed: {skipped[rail.name]}")
            elif got is None:
                problems.unknown(UNVERIFIED, f"{rail.name}: not probed yet")
            elif now - got.at > stale_after:
                problems.unknown(UNVERIFIED,
                                 f"{rail.name}: last probe {now - got.at:.0f} s ago (stuck?)")
            elif got.ok:
                fine.append(describe(got))
            elif got.step in STEP_REASONS:
                problems.fail(STEP_REASONS[got.step], describe(got))
            else:
                problems.unknown(UNVERIFIED, describe(got))
    return problems.finding("TransportVerified", "; ".join(fine))
