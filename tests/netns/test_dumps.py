"""The pass's netlink reads (each rail's link, then three dumps) run on pyroute2's event loop
at once (probes/netlink.py `_Dumps.read`): on a real kernel, the same typed values as
through pyroute2's synchronous calls (the fallback for an IPRoute without its async
face), a missing link absent."""

from __future__ import annotations

import json
import sys

from tests.kit.helpers import Netns

SCRIPT = """
import json
from dataclasses import asdict
from pyroute2 import IPRoute
from nodeagent.config import parse_config
from nodeagent.probes.netlink import _Dumps

cfg = parse_config({"rails": [
    {"name": f"rail{i}", "interface": f"d{i}", "address": f"10.6{i}.0.5/24",
     "table": 600 + i} for i in range(4)] + [
    {"name": "gone", "interface": "missing", "address": "10.70.0.5/24"}]})

class Plain:  # an IPRoute without the async face: only the synchronous calls
    def __init__(self, ipr): self._ipr = ipr
    def __getattr__(self, name):
        if name in ("asyncore", "_run_with_cleanup"):
            raise AttributeError(name)
        return getattr(self._ipr, name)

def typed(d):
    return {"links": {n: l.index for n, l in d.links.items()},
            "addresses": {str(k): [asdict(a) for a in v] for k, v in d.addresses.items()},
            "routes": {str(k): [asdict(r) for r in v] for k, v in d.routes.items()},
            "rules": [asdict(r) for r in d.rules]}

with IPRoute() as ipr:
    once, plain = _Dumps.read(ipr, list(cfg.rails)), _Dumps.read(Plain(ipr), list(cfg.rails))
    untabled = _Dumps.read(ipr, [cfg.rails[4]])
    print(json.dumps({"once": typed(once), "plain": typed(plain),
                      "untabled_routes": len(untabled.routes)}))
"""


def test_the_reads_at_once_are_the_synchronous_calls_values(netns: Netns) -> None:
    for i in range(4):  # enough of each kind that a dump is several messages
        netns.veth(f"d{i}", f"e{i}")
        netns.ip("link", "set", f"d{i}", "up")
        netns.ip("addr", "add", f"10.6{i}.0.5/24", "dev", f"d{i}")
        netns.ip("route", "add", "default", "via", f"10.6{i}.0.1", "table", str(600 + i))
        netns.ip("rule", "add", "from", f"10.6{i}.0.5", "table", str(600 + i),
                 "priority", str(600 + i))
    got = json.loads(netns.exec(sys.executable, "-c", SCRIPT).stdout)
    once = got["once"]
    assert once == got["plain"]
    assert set(once["links"]) == {"d0", "d1", "d2", "d3"}, "the missing link is absent"
    assert sum(len(v) for v in once["addresses"].values()) >= 4
    assert set(once["routes"]) == {"600", "601", "602", "603"}, once["routes"]
    assert len(once["rules"]) >= 7 and got["untabled_routes"] == 0



RELEASE = """
import gc, json, weakref
from pyroute2 import IPRoute
from nodeagent.config import parse_config
import nodeagent.probes.netlink as netlink

cfg = parse_config({"rails": [{"name": "rail0", "interface": "d0",
                               "address": "10.60.0.5/24", "table": 600}]})
refs = {}

class Watched(netlink._Dumps):  # each message the pass reads, watched as it goes by
    def link(self, name, msg):
        refs.setdefault("link", []).append(weakref.ref(msg))
        super().link(name, msg)
    def addr(self, msg):
        refs.setdefault("addresses", []).append(weakref.ref(msg))
        super().addr(msg)
    def rule(self, msg):
        refs.setdefault("rules", []).append(weakref.ref(msg))
        super().rule(msg)
    def route(self, msg):
        refs.setdefault("routes", []).append(weakref.ref(msg))
        super().route(msg)

gc.disable()  # what frees a message here is reference counting, or nothing
out = {}
with IPRoute() as ipr:
    for let_go in (True, False):
        refs.clear()
        if not let_go:
            netlink.release = lambda msg: None
        Watched.read(ipr, list(cfg.rails))
        out["released" if let_go else "kept"] = {
            kind: [r() is None for r in got] for kind, got in refs.items()}
print(json.dumps(out))
"""


def test_a_released_message_is_freed_without_the_cyclic_collector(netns: Netns) -> None:
    """pyroute2's messages are cycles (each `chain` lists itself; an address attribute
    holds its message): each lived until the collector came, which then scanned a pass's
    thousands mid-pass. Released as the pass reads them, each goes when its last
    reference does; the control, not released, is all still there with the collector off
    (the test can fail)."""
    netns.veth("d0", "e0")
    netns.ip("link", "set", "d0", "up")
    netns.ip("addr", "add", "10.60.0.5/24", "dev", "d0")
    netns.ip("route", "add", "default", "via", "10.60.0.1", "table", "600")
    netns.ip("rule", "add", "from", "10.60.0.5", "table", "600", "priority", "600")
    got = json.loads(netns.exec(sys.executable, "-c", RELEASE).stdout)
    assert set(got["released"]) == {"link", "addresses", "rules", "routes"}, got
    for kind, freed in got["released"].items():
        assert freed and all(freed), (kind, got)
        assert not any(got["kept"][kind]), (kind, got)
