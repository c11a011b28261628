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
