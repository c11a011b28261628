"""What the daemon remembers between passes, in three small objects with one job each.

`FactStore`: the latest of every fact (the rails' netlink state, the GID table, what each
source last reported, the counter histories) and the read workers. One per daemon life: a
reload keeps it whole, and forgets only what belonged to rails that changed.
`PinKeeper`: the learned GID pins, saved until a save lands.
`RepinSchedule`: when a shifted rail may be re-pinned again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from nodeagent.checks.facts import D, Delivered, latest
from nodeagent.checks.gid import GidVerdict
from nodeagent.config import Config, Rail
from nodeagent.io.bounded import BoundedReads
from nodeagent.io.files import describe_error
from nodeagent.model.conditions import Finding
from nodeagent.model.kube import ClaimsObservation, DeviceRef, Lending
from nodeagent.model.network import RailObservation
from nodeagent.model.rdma import GidTable, Pin, QueuePairs
from nodeagent.run.own_rdma import OwnRDMA
from nodeagent.run.rails import RailHistory
from nodeagent.state import LentRecord, load_lent_record, load_pins, save_lent, save_pins

log = logging.getLogger(__name__)

# How long a netdev a probe found gone waits for the kernel to say where it went.
LEAVING_FOR = 1.0


class LeavingRails(dict[str, float]):
    """rail -> when a probe found its netdev gone before the kernel said how it left.

    A netdev moved to another namespace is unlisted first; its RTM_DELLINK, which names the
    namespace it went to, follows after an RCU barrier (18 ms on an idle machine, more on a
    busy one). A pass in between called a rail being lent to a pod missing, and the node
    stayed tainted for `kubernetes.clear_after`. Such a rail is not judged until the kernel
    says (moved: lent; deleted: missing) or LEAVING_FOR passes (a rename, a lost event:
    missing)."""

    def __init__(self) -> None:
        super().__init__()
        self.said_gone: set[str] = set()  # rails whose netdev the kernel said was deleted

    def vanished(self, rail: str, now: float) -> None:
        """A probe found the rail's netdev gone, having seen it before."""
        if rail not in self.said_gone:
            self.setdefault(rail, now)

    def said(self, rail: str, deleted: bool) -> None:
        """The kernel's RTM_DELLINK of the rail's netdev: deleted, or moved to another
        namespace (lent). Not an RTM_NEWLINK: the one dev_close sends before the move can
        be taken after a pass that found the netdev gone already."""
        self.pop(rail, None)
        if deleted:
            self.said_gone.add(rail)

    def seen(self, rail: str) -> None:
        """A probe found the rail's netdev here."""
        self.pop(rail, None)
        self.said_gone.discard(rail)

    def waiting(self, now: float) -> set[str]:
        """The rails not judged now: gone, no word yet, and not for long."""
        return {rail for rail, since in self.items() if now - since < LEAVING_FOR}

    def due(self, now: float) -> float | None:
        """When the first of them is judged with no word (missing)."""
        return min((since + LEAVING_FOR for since in self.values()
                    if since + LEAVING_FOR > now), default=None)


class LentRails(dict[str, float]):
    """rail -> when its netdev left for another network namespace (monotonic): lent to a
    pod (a DRA driver, a CNI), not missing; judged again when it comes back. Kept in the
    state dir with the boot's id (state.py), so a restart while a job runs taints nothing."""

    def __init__(self) -> None:
        super().__init__()
        # as last saved: the rails, their holders, their pods' ends
        self.saved: tuple[dict[str, float], dict[str, Lending], dict[str, float]] = ({}, {}, {})
        self.holders: dict[str, Lending] = {}  # rail -> the pod and claim that hold it
        self.ended: dict[str, float] = {}  # rail -> when its holder's pod was seen gone

    def account(self, devices: Mapping[str, DeviceRef], claims: ClaimsObservation | None,
                now: float) -> None:
        """Who holds each lent rail, by its device in the slices and the claims on this
        node; and since when its holder is gone (unknown while the claims cannot be read)."""
        for table in (self.holders, self.ended):
            for rail in [r for r in table if r not in self]:
                del table[rail]
        if claims is None or claims.error is not None:
            return
        for rail in self:
            device = devices.get(rail)
            held = claims.holder(device) if device is not None else None
            if held is not None and held.pod in claims.pods:
                self.holders[rail] = held
                self.ended.pop(rail, None)
            elif rail in self.holders and self.holders[rail].pod not in claims.pods:
                self.ended.setdefault(rail, now)

    def overdue(self, now: float, bound: float) -> dict[str, str]:
        """rail -> why it counts as failed: its holder ended more than `bound` ago and its
        netdev is not back."""
        return {rail: f"its netdev is not back {now - since:.0f} s after "
                      f"{self.holders[rail]} ended (bound {bound:.0f} s): held by a leaked "
                      "network namespace?"
                for rail, since in self.ended.items() if now - since > bound}

    def follow(self, rail: str, moved_away: bool, back: bool, now: float) -> None:
        """A link event of the rail's netdev: gone to another namespace, or here again."""
        if moved_away:
            self.setdefault(rail, now)
            log.info("%s: its netdev moved to another network namespace: lent, not checked "
                     "or repaired until it returns", rail)
        elif self.pop(rail, None) is not None:
            log.info("%s: %s", rail, "back in this network namespace: checked again"
                     if back else "its netdev was deleted")

    def load(self, cfg: Config, clock: Callable[[], float]) -> None:
        """The rails lent when the last daemon stopped (this boot): lent until seen here,
        with their holders and their pods' ends as the last daemon knew them."""
        now_wall, now = time.time(), clock()
        record = load_lent_record(cfg)
        for rail, since in record.rails.items():
            self.setdefault(rail, now - (now_wall - since))
        for rail, held in record.holders.items():
            self.holders.setdefault(rail, held)
        for rail, since in record.ended.items():
            self.ended.setdefault(rail, now - (now_wall - since))
        self.saved = self._snapshot()

    def _snapshot(self) -> tuple[dict[str, float], dict[str, Lending], dict[str, float]]:
        return dict(self), dict(self.holders), dict(self.ended)

    def keep(self, cfg: Config, clock: Callable[[], float]) -> None:
        """Saved when they changed (a failed save is tried again at the next pass)."""
        now_state = self._snapshot()
        if now_state == self.saved:
            return
        now_wall, now = time.time(), clock()

        def wall(times: Mapping[str, float]) -> dict[str, float]:
            return {r: now_wall - (now - t) for r, t in times.items()}

        try:
            save_lent(cfg, LentRecord(wall(self), dict(self.holders), wall(self.ended)))
        except OSError as exc:
            log.warning("cannot save the lent rails: %s", exc.strerror or exc)
            return
        self.saved = now_state


@dataclass
class FactStore:
    observations: dict[str, RailObservation] = field(default_factory=dict)
    gid_table: GidTable = field(default_factory=lambda: GidTable(source="none"))
    # rail -> the RDMA device and port its GIDs were last seen on: while they are gone (a
    # table rewritten, an address away) the rail's slots stay watched and its device read.
    rail_seen: dict[str, tuple[str, int]] = field(default_factory=dict)
    qps: QueuePairs | None = None  # looked at only while a GID is shifted
    own_rdma: OwnRDMA = field(default_factory=OwnRDMA)  # the probes' share, charged by them
    lent: LentRails = field(default_factory=LentRails)  # rails lent to a pod, and since when
    leaving: LeavingRails = field(default_factory=LeavingRails)  # gone, where to not yet said
    # What the sources delivered: the latest of each kind (checks/facts.py, Delivered).
    seen: dict[type[Delivered], Delivered] = field(default_factory=dict)
    # The daemon's rail history (flaps, the repair guard, repair counts); None for a
    # one-shot command. And the last complete pass's findings (kept through an EMFILE).
    history: RailHistory | None = None
    last_findings: tuple[Finding, ...] | None = None
    reads: BoundedReads = field(default_factory=BoundedReads)  # driver reads off-thread

    def keep_rails(self, rails: Iterable[Rail], before: Iterable[Rail]) -> None:
        """After a reload: what was seen of a rail whose config changed (or that is gone)
        is forgotten, so it is never reported under the new config; the rest is kept."""
        now, before = list(rails), list(before)
        same = {r.name for r in before if r in now}
        changed = {r.name for r in (*before, *now)} - same
        for facts in (self.observations, self.rail_seen, self.lent, self.leaving):
            for name in [n for n in facts if n not in same]:
                del facts[name]
        # The kernel's word that a netdev was deleted was of the old rail: kept, the new
        # one's netdev found gone would be judged missing at once, lent or not.
        self.leaving.said_gone &= same
        self.seen = {kind: item.without_rails(changed) for kind, item in self.seen.items()}

    def deliver(self, item: Delivered) -> None:
        """A source's observation, kept as the latest of its kind (folded onto the one
        before, for a kind that accumulates)."""
        kind = type(item)
        self.seen[kind] = item.after(self.seen.get(kind))

    def get(self, kind: type[D]) -> D | None:
        return latest(self.seen, kind)


class PinKeeper:
    """The learned GID pins: loaded once (a bad file set aside and reported), and saved
    every pass until the save lands. A pin lost to a full disk would let a restart learn a
    shifted GID as the new pin."""

    def __init__(self, cfg: Config, persist: bool) -> None:
        self.cfg = cfg
        self.persist = persist
        loaded = load_pins(cfg, set_aside=persist)
        self.pins: dict[str, Pin] = loaded.pins
        self.problems = loaded.problems  # reported until the pins are saved anew
        self._unsaved = False

    def keep(self, verdict: GidVerdict | None) -> str | None:
        """Keep what the latest judgement learned; save unless this is a check. Returns
        why the save failed (it is tried again next pass)."""
        if verdict is not None and verdict.learned:
            self.pins.update(verdict.learned)
            self._unsaved = True
        if self._unsaved and self.persist:
            try:
                save_pins(self.cfg, self.pins)
            except OSError as exc:
                return (f"cannot save learned GID pins in {self.cfg.state_dir} "
                        f"(retried every pass): {describe_error(exc)}")
            self._unsaved = False
            self.problems = []
        return None


@dataclass
class RepinSchedule:
    """A rail still shifted after a re-pin waits twice as long before the next
    (gid_repin_poll, doubling up to 128x): something the QP list does not show holds the
    slot, and the rail's address must not blink every few seconds."""

    next_at: dict[str, float] = field(default_factory=dict)  # rail -> earliest next attempt
    attempts: dict[str, int] = field(default_factory=dict)  # rail -> attempts while shifted

    def due(self, rail: str, now: float) -> bool:
        return now >= self.next_at.get(rail, 0.0)

    def attempted(self, rail: str, now: float, poll: float) -> None:
        n = self.attempts.get(rail, 0)
        self.attempts[rail] = n + 1
        self.next_at[rail] = now + poll * 2 ** min(n, 7)

    def settled(self, shifted: Iterable[str]) -> None:
        """Rails back on their pin start afresh next time."""
        still = set(shifted)
        for name in [n for n in self.attempts if n not in still]:
            del self.attempts[name]
