"""The agent's own RDMA, per rail: what its probes (the transport probe, the peer prober,
the peer responder's served reads) may have moved through the rail's port so far, as upper
bounds (probes/volume.py). The probing threads charge it; the evaluator reads it with the
port counters, and FabricTrafficOnRDMA counts it out: without that, the agent's own probes
would be the RDMA traffic that passes a job running over TCP."""

from __future__ import annotations

import threading

from nodeagent.model.rdma import RDMAVolume


class OwnRDMA:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total: dict[str, RDMAVolume] = {}
        self._largest: dict[str, RDMAVolume] = {}

    def charge(self, rail: str, moved: RDMAVolume) -> None:
        if moved == RDMAVolume():
            return
        with self._lock:
            self._total[rail] = self._total.get(rail, RDMAVolume()) + moved
            self._largest[rail] = self._largest.get(rail, RDMAVolume()).most(moved)

    def so_far(self, rail: str) -> tuple[RDMAVolume, RDMAVolume]:
        """(all charged on `rail` so far, the largest single charge)."""
        with self._lock:
            return self._total.get(rail, RDMAVolume()), self._largest.get(rail, RDMAVolume())
