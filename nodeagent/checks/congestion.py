"""FabricNotCongested: each rail's pause, congestion-notification and retransmission
counters against their rates. Pure.

A path that pauses (PFC), marks (ECN, answered with CNPs) or retransmits (out of sequence,
ACK timeouts, slow restarts) loses nothing a probe sees, yet a job on it runs slow. Each
named counter's growth over the window, per second, against its configured rate; the
message carries the figures. A counter the driver does not have is left out; a rail with
none of them is Unknown (soft-RoCE has none), never a pass.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.checks.port_health import ErrorRates
from nodeagent.config import Config
from nodeagent.model.conditions import FABRIC_NOT_CONGESTED, Finding, Problems
from nodeagent.model.rdma import CongestionSample

NOT_MEASURED = "CongestionNotMeasured"
NO_COUNTERS = "NoCongestionCounters"


def kind(counter: str) -> str:
    """The reason a counter over its rate gives: what the path is doing."""
    if "pause" in counter:
        return "PFCPauseStorm"
    if "cnp" in counter or "ecn" in counter:
        return "CongestionNotified"
    return "Retransmitting"


def congestion_finding(cfg: Config, samples: Mapping[str, CongestionSample] | None,
                       skipped: Mapping[str, str], rates: ErrorRates,
                       age: float = 0.0) -> Finding:
    """`age`: seconds since the samples were read (a read that hangs stops the source)."""
    problems = Problems(FABRIC_NOT_CONGESTED)
    section = cfg.congestion
    if section is None:
        return problems.finding("NotConfigured", "no congestion section configured")
    if not cfg.rails:
        return problems.finding("NotConfigured", "no rails configured")
    if samples is not None and age > 2 * section.interval + 10:
        return Finding(FABRIC_NOT_CONGESTED, "Unknown", NOT_MEASURED,
                       f"counters last read {age:.0f} s ago (a read stuck?)")
    fine: list[str] = []
    for rail in cfg.rails:
        with problems.about(rail.name):
            sample = (samples or {}).get(rail.name)
            if rail.name in skipped:
                problems.unknown(NOT_MEASURED, f"{rail.label}: not read: {skipped[rail.name]}")
                continue
            if sample is None:
                problems.unknown(NOT_MEASURED, f"{rail.label}: not read yet")
                continue
            where = f"{rail.label} ({sample.device}/{sample.port})"
            named = [n for n in section.rates if n in sample.counters]
            if not named:
                why = f" ({'; '.join(sample.unreadable)})" if sample.unreadable else ""
                problems.unknown(NO_COUNTERS, f"{where}: none of {', '.join(section.rates)} on "
                                              f"its port or netdev{why}")
                continue
            figures = []
            for name in named:
                grown = rates.growth(rail.name, name)
                if grown is None or grown[1] <= 0:
                    continue  # one sample so far: a rate from the next
                per_second = grown[0] / grown[1]
                limit = section.rates[name]
                ratio = per_second / limit if limit else float("inf") if per_second else 0.0
                figures.append((ratio, name, per_second))
                if per_second > limit:
                    problems.fail(kind(name), f"{where}: {name} {per_second:,.1f}/s over "
                                              f"{grown[1]:.0f} s (rate {limit:,g}/s)")
            top = ", ".join(f"{n} {r:,.1f}/s" for _, n, r in sorted(figures, reverse=True)[:3])
            fine.append(f"{where}: {top or 'first sample'}")
    return problems.finding("NotCongested", "; ".join(fine))
