"""The netlink source: rtnetlink multicast events, forwarded to the loop as they come.

The kernel drops events when the socket's receive buffer overflows (ENOBUFS); then nothing
is known of what changed, so one resync is queued for any number of overflows, once a fresh
socket listens: what changes after that comes as an event, what changed before it the resync
reads.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any

from pyroute2.iproute import IPRoute
from pyroute2.netlink.rtnl import (
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV4_ROUTE,
    RTMGRP_IPV4_RULE,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_LINK,
)

from nodeagent.model.network import KernelEvent
from nodeagent.probes.netlink import kernel_event, release
from nodeagent.remedies.repairs import Repairs
from nodeagent.run.fastlane import FastLane
from nodeagent.run.work import Deliver, EventsLost, NetlinkEvent

log = logging.getLogger(__name__)

GROUPS = (
    RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV4_RULE
)


class NetlinkMonitor(threading.Thread):
    """The netlink source: blocks on rtnetlink multicast and delivers every message (a
    deletion the fast lane repaired with what it did); never raises."""

    def __init__(self, deliver: Deliver, rcvbuf: int, fast: FastLane | None = None) -> None:
        super().__init__(name="netlink-monitor", daemon=True)
        self.deliver = deliver
        self.rcvbuf = rcvbuf
        self.fast = fast
        self._halt = threading.Event()
        self.ready = threading.Event()
        # One queued resync serves any number of overflows: a storm of ENOBUFS (tens of
        # thousands a second while the kernel floods the socket) must not flood the loop.
        self.resync_pending = threading.Event()

    def stop(self) -> None:
        """Ends at the next message: the thread is a daemon, blocked in a receive."""
        self._halt.set()

    def _resync(self) -> None:
        if not self.resync_pending.is_set():
            self.resync_pending.set()
            self.deliver(EventsLost())

    def run(self) -> None:
        try:
            self._run()
        finally:
            if self.fast is not None:
                self.fast.close()

    def _run(self) -> None:
        self._overflows, self._last_log = 0, 0.0
        missed = False  # events were lost before this socket listened
        if self.fast is not None:
            try:
                self.fast.open()
            except Exception as exc:  # the loop repairs instead; it says why if it fails too
                log.warning("netlink: no socket for repairs on this thread (%s)", exc)
        while not self._halt.is_set():
            ipr = None
            try:
                ipr = IPRoute(rcvbuf=self.rcvbuf)
                ipr.bind(groups=GROUPS)
                self.ready.set()
                if missed:
                    # Queued only now: a resync queued while no socket listened could read
                    # the state before a change whose event nobody received.
                    self._resync()
                    missed = False
                missed = self._pump(ipr)
            except Exception as exc:  # a broken socket: reopen, and resync what we missed
                log.error("netlink monitor failed (%s); reopening", exc)
                missed = True
                self._halt.wait(1.0)
            finally:
                if ipr is not None:
                    _close(ipr)

    def _pump(self, ipr: Any) -> bool:
        """Forwards events until the socket overflows (True: events were lost, run() opens
        a fresh one) or the monitor stops (False). (Read on after ENOBUFS, pyroute2's
        socket kept raising it, tens of thousands of times a second, and later events came
        late or not at all: measured with 2,000 addresses added at once.)"""
        while not self._halt.is_set():
            try:
                msgs = ipr.get()
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._overflows += 1
                    if time.monotonic() - self._last_log >= 1.0:  # a storm logs once a second
                        log.warning("netlink receive buffer overflowed (%d times); full resync",
                                    self._overflows)
                        self._overflows, self._last_log = 0, time.monotonic()
                    return True
                raise
            for msg in msgs:
                try:
                    event = kernel_event(msg)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("an rtnetlink message of a shape not known (%s): full resync",
                                exc)
                    self._resync()
                    continue
                if event is not None:
                    self.deliver(NetlinkEvent(event, self._repair(event)))
                release(msg)  # after the repair: it waits for nothing
        return False


    def _repair(self, event: KernelEvent) -> Repairs | None:
        if self.fast is None or event.deletion is None:
            return None
        try:
            return self.fast.repair(event.deletion)
        except Exception as exc:  # never lose the event: the loop repairs it instead
            log.error("netlink: the fast repair of a deletion failed (%s); the loop repairs",
                      exc)
            return None


def _close(ipr: Any) -> None:
    """Close a socket whatever it went through. pyroute2 (0.9) keeps a socket's error and
    raises it again from close(), before the event loop and the socket are released: 4
    descriptors were left behind per overflow. So the kept error is cleared first (a
    private field: where a release lacks it, the close is only made quiet)."""
    kept = getattr(getattr(ipr, "asyncore", None), "_error_event", None)
    if isinstance(kept, threading.Event):
        kept.clear()
    try:
        ipr.close()
    except Exception as exc:
        log.debug("closing the netlink socket: %s", exc)
