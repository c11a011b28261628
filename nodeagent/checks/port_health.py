"""RDMAHardwareHealthy: what NHC-style checks assert on every rail's RDMA port. Pure.

One tiny assertion each, one line when it fails: the port ACTIVE, its physical link up, the
expected link layer, at least the expected rate, the HCA's PCIe link at its full speed and
width (a x16 card trained at x8 halves its bandwidth silently), no error counter growing
faster than its limit within the window, and firmware the fleet accepts for the HCA type.
A fact that cannot be read makes the condition Unknown, never False.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.config import Config, Hardware
from nodeagent.model.conditions import RDMA_HARDWARE_HEALTHY, Finding, Problems
from nodeagent.model.rdma import PhysState, PortHealth, PortState


class Counted(Protocol):
    """What carries a rail's counters by name (a port's health, its congestion sample)."""

    @property
    def counters(self) -> Mapping[str, int]: ...


@dataclass
class ErrorRates:
    """Each rail's counters over the window. A counter that goes down was reset (driver
    reload, port reset, a wrapped 32-bit counter): its history starts again there, so a
    reset never reads as a burst of errors."""

    _samples: dict[tuple[str, str], deque[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, now: float, window: float, ports: Mapping[str, Counted]) -> None:
        seen = set()
        for rail, port in ports.items():
            for name, value in port.counters.items():
                key = (rail, name)
                seen.add(key)
                samples = self._samples.setdefault(key, deque())
                if samples and value < samples[-1][1]:
                    samples.clear()
                samples.append((now, value))
                while len(samples) > 1 and samples[0][0] < now - window:
                    samples.popleft()
        for key in set(self._samples) - seen:
            del self._samples[key]  # a rail or counter no longer read

    def growth(self, rail: str, name: str) -> tuple[int, float] | None:
        """How much the counter grew, over how many seconds, within the window (None:
        fewer than two samples yet)."""
        samples = self._samples.get((rail, name))
        if not samples or len(samples) < 2:
            return None
        return samples[-1][1] - samples[0][1], samples[-1][0] - samples[0][0]


UNREADABLE = "HardwareNotReadable"


def _why_unread(port: PortHealth, attribute: str) -> str:
    """What the probe noted for an attribute it could not read (an error, a new word)."""
    noted = [u for u in port.unreadable if u == attribute or u.startswith(f"{attribute}:")]
    return f" ({noted[0]})" if noted else ""


def _port_problems(where: str, port: PortHealth, hw: Hardware, problems: Problems) -> None:
    if port.state is None:
        problems.unknown(UNREADABLE, f"{where}: port state not readable"
                                     f"{_why_unread(port, 'state')}")
    elif port.state is not PortState.ACTIVE:
        problems.fail("PortNotActive", f"{where}: port {port.state}, want ACTIVE")
    if port.phys_state is None:
        problems.unknown(UNREADABLE, f"{where}: physical state not readable"
                                     f"{_why_unread(port, 'phys_state')}")
    elif port.phys_state is not PhysState.LINK_UP:
        problems.fail("PortPhysicalLinkDown",
                      f"{where}: physical link {port.phys_state}, want LinkUp")
    if hw.link_layer and port.link_layer and port.link_layer != hw.link_layer:
        problems.fail("LinkLayerMismatch",
                      f"{where}: link layer {port.link_layer}, want {hw.link_layer}")
    if hw.expect_rate is not None:
        if port.rate_gbps is None:
            problems.unknown(UNREADABLE, f"{where}: rate not readable ({port.rate or 'absent'})")
        elif port.rate_gbps < hw.expect_rate:
            problems.fail("PortRateDegraded",
                          f"{where}: rate {port.rate}, want at least {hw.expect_rate:g} Gb/s")


def _pcie_problem(where: str, port: PortHealth, hw: Hardware) -> tuple[str, str] | None:
    pcie = port.pcie
    if pcie is None or not (hw.pcie or hw.min_pcie_speed or hw.min_pcie_width):
        return None  # no PCI function (soft-RoCE), or not asked
    want_speed = hw.min_pcie_speed or (pcie.max_speed if hw.pcie else None)
    want_width = hw.min_pcie_width or (pcie.max_width if hw.pcie else None)
    slow = pcie.speed is not None and want_speed is not None and pcie.speed < want_speed
    narrow = pcie.width is not None and want_width is not None and pcie.width < want_width
    if not (slow or narrow):
        return None
    return ("PCIeLinkDegraded",
            f"{where}: PCIe {pcie.address} trained at {pcie.speed:g} GT/s x{pcie.width}, "
            f"want {want_speed:g} GT/s x{want_width}"
            if pcie.speed is not None and pcie.width is not None
            and want_speed is not None and want_width is not None
            else f"{where}: PCIe {pcie.address} trained below its "
                 f"{'speed' if slow else 'width'} ({pcie.speed} GT/s x{pcie.width}, "
                 f"device max {pcie.max_speed} GT/s x{pcie.max_width})")


def hardware_finding(cfg: Config, ports: Mapping[str, PortHealth | None],
                     rates: ErrorRates) -> Finding:
    problems = Problems(RDMA_HARDWARE_HEALTHY)
    hw = cfg.hardware
    if hw is None:
        return problems.finding("NotConfigured", "no hardware section configured")
    if not cfg.rails:
        return problems.finding("NotConfigured", "no rails configured")
    fine: list[str] = []
    for rail in cfg.rails:
        with problems.about(rail.name):
            port = ports.get(rail.name)
            if port is None:
                problems.unknown(UNREADABLE, f"{rail.name}: its RDMA port is not known yet")
                continue
            where = f"{rail.name} {port.device}/{port.port}"
            before = len(problems.found)
            _port_problems(where, port, hw, problems)
            pcie = _pcie_problem(where, port, hw)
            if pcie:
                problems.fail(*pcie)
            for name, limit in hw.error_limits.items():
                grew = rates.growth(rail.name, name)
                if grew is not None and grew[0] > limit:
                    problems.fail("ErrorCountersRising",
                                  f"{where}: {name} +{grew[0]} in {grew[1]:.0f} s "
                                  f"(limit {limit} per {hw.error_window:g} s)")
            accepted = hw.firmware.get(port.hca_type or "")
            if accepted and port.fw_ver not in accepted:
                problems.fail("FirmwareMismatch",
                              f"{where}: {port.hca_type} firmware {port.fw_ver or 'unreadable'}, "
                              f"accepted: {', '.join(accepted)}")
            if not any(not p.unknown for p in problems.found[before:]):
                fine.append(f"{rail.name} {port.device}/{port.port} {port.state} "
                            f"{port.rate or ''}".strip())
    return problems.finding("HardwareHealthy", "; ".join(fine))
