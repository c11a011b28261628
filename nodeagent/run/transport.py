"""The transport-probe thread: every `transport.probe_interval` (and at start) it probes
each rail the loop says may be probed, off the main loop, and delivers the results.

The loop hands over the targets after each pass (`retarget`): a rail whose GID is shifted,
or whose device, pin or address is not known, is left out with the reason, so a probe never
holds a GID entry while the agent re-pins it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from nodeagent.checks.facts import TransportSeen
from nodeagent.config import Config, Transport
from nodeagent.io.periodic import Periodic
from nodeagent.model.peers import Targets, TransportResult
from nodeagent.probes.transport import probe_rail
from nodeagent.run.own_rdma import OwnRDMA
from nodeagent.run.work import Deliver


def probe_targets(targets: Targets, tr: Transport,
                  halted: Callable[[], bool] = lambda: False) -> TransportSeen:
    """One round: each target probed in turn (until `halted`), the others with why not.
    The daemon's thread and the CLI's one-shot check share it."""
    results: dict[str, TransportResult] = {}
    for rail, target in targets.ready.items():
        if halted():
            break
        got = probe_rail(rail, target.device, target.port, target.gid_index, target.address,
                         tr.messages, tr.timeout)
        results[rail] = replace(got, at=time.monotonic())
    return TransportSeen(results, dict(targets.skipped))


class TransportMonitor(Periodic):
    """The transport source: probes every target rail each `probe_interval`, and at once
    when the loop wakes it (new targets)."""

    def __init__(self, cfg: Config, deliver: Deliver, own_rdma: OwnRDMA | None = None) -> None:
        super().__init__("transport-probe")
        self.cfg = cfg
        self.deliver = deliver
        self.own_rdma = own_rdma or OwnRDMA()
        self.targets: Targets | None = None  # the loop's, after each pass (retarget)

    def retarget(self, targets: Targets) -> None:
        self.targets = targets

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg  # the next probe, after the loop's next aim

    def turn(self) -> float:
        tr, targets = self.cfg.transport, self.targets
        if tr is None or targets is None:
            return 1.0
        seen = probe_targets(targets, tr, lambda: self.halted)
        for rail, result in seen.results.items():
            self.own_rdma.charge(rail, result.moved)
        if not self.halted:
            self.deliver(seen)
        return tr.probe_interval
