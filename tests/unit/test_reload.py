"""SIGHUP reloads: the config read on a thread of its own, one read at a time."""

from __future__ import annotations

import threading
from typing import Any

from nodeagent.run.reload import ConfigReloader
from nodeagent.run.work import Reloaded
from tests.kit.helpers import wait_for


def test_a_sighup_during_a_read_is_queued_and_the_last_edit_is_applied() -> None:
    """Before, a SIGHUP that came while a reload was still reading was dropped: the daemon
    kept port 18600 while the file said 18611 (2 of 5 trials, SIGHUPs 1 ms apart). The
    read here takes the file's content when it starts, then waits, as a read does."""
    file = {"port": 18600}
    release = threading.Event()
    got: list[Any] = []

    def load() -> Any:
        seen = dict(file)
        release.wait(10)
        return seen

    reloader = ConfigReloader(load, lambda item: got.append(item))  # type: ignore[arg-type]
    file["port"] = 18610
    reloader.start()  # reads 18610, and waits
    wait_for(lambda: reloader._reading_for() is not None, 5, "the read started")
    file["port"] = 18611
    reloader.start()  # during the read: queued
    reloader.start()  # and again: still one read queued, not two
    release.set()
    wait_for(lambda: len([g for g in got if isinstance(g, Reloaded)]) == 2, 5, "two reads")
    assert [g.cfg for g in got if isinstance(g, Reloaded)] == [{"port": 18610},
                                                                 {"port": 18611}]
    wait_for(lambda: reloader._reading_for() is None, 5, "the reads over")
    reloader.start()  # and the next SIGHUP reads again
    wait_for(lambda: len([g for g in got if isinstance(g, Reloaded)]) == 3, 5, "a third read")


def test_a_failing_read_does_not_lose_the_queued_one() -> None:
    calls = []
    release = threading.Event()

    def load() -> Any:
        calls.append(1)
        if len(calls) == 1:
            release.wait(10)
            raise OSError("the file went away")
        return {"ok": True}

    got: list[Any] = []
    reloader = ConfigReloader(load, lambda item: got.append(item))  # type: ignore[arg-type]
    reloader.start()
    wait_for(lambda: calls, 5, "the read started")
    reloader.start()
    release.set()
    wait_for(lambda: len([g for g in got if isinstance(g, Reloaded)]) == 2, 5, "two reads")
    first, second = [g for g in got if isinstance(g, Reloaded)]
    assert isinstance(first.error, OSError) and second.cfg == {"ok": True}


def test_a_reload_that_removes_a_section_stops_its_source() -> None:
    """Before, a reload without `peers` left the responder listening and answering the old
    peers (and the prober probing), with no reload error. Real threads: the peer service
    (prober and responder) and the transport prober, started from their sections."""
    from nodeagent.config import parse_config
    from nodeagent.run.peers import PeerService
    from nodeagent.run.sources import Sources
    from nodeagent.run.transport import TransportMonitor

    rails = [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"}]
    full = parse_config({"rails": rails, "transport": {},
                         "peers": {"static": {"rail0": [{"address": "10.10.0.6"}]},
                                   "port": 18999}})
    sources = Sources(lambda item: None)
    sources.start_missing(full)
    peers, transport = sources.get(PeerService), sources.get(TransportMonitor)
    assert peers is not None and transport is not None
    threads = [peers.prober, peers.responder, transport]
    wait_for(lambda: all(t.is_alive() for t in threads), 5, "the sources running")
    sources.reconfigure(parse_config({"rails": rails}))
    assert sources.get(PeerService) is None and sources.get(TransportMonitor) is None
    wait_for(lambda: not any(t.is_alive() for t in threads), 10, "the sources stopped")
    assert peers not in sources.started and transport not in sources.started
    sources.reconfigure(full)  # and a reload that brings them back starts them anew
    sources.start_missing(full)
    assert sources.get(PeerService) not in (None, peers)
    sources.stop()
