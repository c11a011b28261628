"""The congestion section's source: each ready rail's counters, read every interval.

The rails come from the loop's aim after each pass (their RDMA device and port as the
pass found them); a rail not ready is not read, and says why.
"""

from __future__ import annotations

import time

from nodeagent.checks.facts import CongestionSeen
from nodeagent.config import Config
from nodeagent.io.periodic import Periodic
from nodeagent.model.peers import Targets
from nodeagent.probes.congestion import read_congestion
from nodeagent.run.work import Deliver


class CongestionMonitor(Periodic):
    def __init__(self, cfg: Config, deliver: Deliver) -> None:
        super().__init__("congestion")
        self.cfg = cfg
        self.deliver = deliver
        self.targets: Targets | None = None

    def retarget(self, targets: Targets) -> None:
        first = self.targets is None
        self.targets = targets
        if first:
            self.wake()  # the first sample as soon as the rails are known

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.wake()

    def turn(self) -> float:
        section, targets = self.cfg.congestion, self.targets
        if section is None or targets is None:
            return 1.0
        interfaces = {r.name: r.interface for r in self.cfg.rails}
        samples = {rail: read_congestion(self.cfg.paths.sysfs, end.device, end.port,
                                         interfaces[rail], section.rates)
                   for rail, end in targets.ready.items() if rail in interfaces}
        if not self.halted:
            self.deliver(CongestionSeen(samples, dict(targets.skipped), time.monotonic(),
                                        section.window))
        return section.interval
