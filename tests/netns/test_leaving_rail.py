"""A rail's netdev gone before the kernel has said where it went.

The kernel unlists a netdev it moves to another namespace first, and sends the RTM_DELLINK
that names the namespace after an RCU barrier (18 ms apart on an idle machine, `ip monitor`;
more on a busy one). A pass that ran in between called a rail being lent to a pod
InterfaceMissing, and the node stayed tainted for `kubernetes.clear_after` (CI caught it:
tests/kube/test_lent_claims.py found the node tainted InterfaceMissing after the lend).

Here the race is held open on purpose: the daemon's parts (Agent, Evaluator, the pass) run
in this thread inside the rails' namespace on the real kernel, and the kernel's own events,
read from a netlink socket bound before the move, are handed to the agent only after the
pass that finds the netdev gone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute

from nodeagent.config import load_config
from nodeagent.model.conditions import Finding
from nodeagent.model.network import EventKind, KernelEvent
from nodeagent.model.status import Report
from nodeagent.probes.netlink import kernel_event
from nodeagent.run.agent import Agent
from nodeagent.run.evaluate import Evaluator, fabric_pass
from nodeagent.run.store import LEAVING_FOR
from tests.kit.helpers import Netns, entered, write_config
from tests.netns.test_lent_rail import pod_ns  # noqa: F401 (a fixture)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def daemon(rails_ns: Netns, agent_config: dict[str, Any],
           tmp_path: Path) -> Iterator[tuple[Agent, IPRoute, Clock]]:
    """The daemon's parts inside the rails' namespace, the rails applied, and a socket
    that hears the kernel's link events from then on."""
    cfg = load_config(write_config(tmp_path / "c.yaml", agent_config))
    clock = Clock()
    with entered(rails_ns):
        ipr, events = IPRoute(), IPRoute()
        try:
            agent = Agent(cfg, reload=lambda: cfg, clock=clock)
            agent.evaluator = Evaluator(cfg, ipr, persist_pins=False, store=agent.store,
                                        clock=clock)
            first, _ = fabric_pass(agent.evaluator, repair=True)
            assert ready(first).status == "True", first.findings
            events.bind()
            yield agent, events, clock
        finally:
            events.close()
            ipr.close()


def ready(report: Report) -> Finding:
    return next(f for f in report.findings if f.type == "RoCENetworkReady")


def kernel_said(events: IPRoute, ifname: str) -> tuple[list[KernelEvent], KernelEvent]:
    """The kernel's events up to the RTM_DELLINK of `ifname`: those before it (the
    RTM_NEWLINK dev_close sends, the address and route deletions), and it."""
    before: list[KernelEvent] = []
    while True:
        for msg in events.get():
            event = kernel_event(msg)
            if event is None:
                continue
            if msg["event"] == "RTM_DELLINK" and event.ifname == ifname:
                return before, event
            before.append(event)


def tell(agent: Agent, events: Iterable[KernelEvent]) -> None:
    """Handed to the agent as its netlink thread would."""
    for event in events:
        agent.rails_for(event)


def test_a_netdev_moved_away_is_not_missing_while_the_kernel_has_not_said_where(
        daemon: tuple[Agent, IPRoute, Clock], rails_ns: Netns, pod_ns: Netns) -> None:  # noqa: F811
    agent, events, clock = daemon
    assert agent.evaluator is not None
    rails_ns.ip("link", "set", "r1", "netns", pod_ns.name)
    before_word, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert ready(before_word).status == "True", ready(before_word)
    # Not judged either way, and still in the status: a reader of the status file never
    # finds a configured rail gone from it (CI: test_lent_rail read the status in this
    # window and found no row for rail1).
    row = next(r for r in before_word.rails if r.name == "rail1")
    assert row.link.carrier is None and row.link.drift == () and row.lent is None, row
    assert agent.next_verdict_change() == pytest.approx(clock.now + LEAVING_FOR, abs=0.02)

    before, dellink = kernel_said(events, "r1")
    assert dellink.moved_away, dellink
    # What came before the word, taken after that pass (its RTM_NEWLINK among them): no
    # word on where the netdev went, so still not judged.
    tell(agent, before)
    assert any(e.kind is EventKind.LINK and e.link is not None for e in before), before
    clock.now += 0.1
    still_no_word, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert ready(still_no_word).status == "True", ready(still_no_word)

    tell(agent, [dellink])
    clock.now += 0.1
    lent, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert ready(lent).status == "True"
    assert "rail1 r1 lent to another network namespace" in ready(lent).message
    clock.now += LEAVING_FOR * 2  # lent is not bounded by the wait for the kernel's word
    still, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert ready(still).status == "True", ready(still)


def test_a_netdev_deleted_is_missing_the_moment_the_kernel_says_so(
        daemon: tuple[Agent, IPRoute, Clock], rails_ns: Netns) -> None:
    agent, events, _ = daemon
    assert agent.evaluator is not None
    rails_ns.ip("link", "del", "r1")
    before_word, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert ready(before_word).status == "True", ready(before_word)

    before, dellink = kernel_said(events, "r1")
    assert not dellink.moved_away, dellink
    tell(agent, [*before, dellink])
    said, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)  # no time has passed
    assert (ready(said).status, ready(said).reason) == ("False", "InterfaceMissing"), \
        ready(said)
    again, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)  # stays missing
    assert ready(again).reason == "InterfaceMissing"
    assert agent.next_verdict_change() is None


def test_a_netdev_gone_with_no_word_is_missing_once_the_wait_runs_out(
        daemon: tuple[Agent, IPRoute, Clock], rails_ns: Netns) -> None:
    """Renamed: no RTM_DELLINK ever comes (a lost event looks the same)."""
    agent, _, clock = daemon
    assert agent.evaluator is not None
    rails_ns.ip("link", "set", "r1", "down")
    rails_ns.ip("link", "set", "r1", "name", "r1-old")
    waiting, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert ready(waiting).status == "True", ready(waiting)
    clock.now += LEAVING_FOR / 2
    assert ready(fabric_pass(agent.evaluator, {"rail1"}, repair=True)[0]).status == "True"
    clock.now += LEAVING_FOR / 2
    gone, _ = fabric_pass(agent.evaluator, {"rail1"}, repair=True)
    assert (ready(gone).status, ready(gone).reason) == ("False", "InterfaceMissing"), \
        ready(gone)
