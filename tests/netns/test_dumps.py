"""The pass's netlink reads (each rail's link, then three dumps) run on pyroute2's event loop
at once (probes/netlink.py `_dumps`): the same messages as pyroute2's synchronous calls,
on a real kernel, a missing link None, and the same again through the synchronous
fallback for an IPRoute without its async face."""

from __future__ import annotations

import sys

from tests.kit.helpers import Netns

SCRIPT = """
import json, socket
from pyroute2 import IPRoute
from nodeagent.probes.netlink import _dumps

def shape(msgs):
    return [(m["header"]["type"], m["index"] if "index" in m else None,
             sorted((a[0], str(a[1])) for a in m["attrs"] if a[0] != "IFA_CACHEINFO"))
            for m in msgs]

class Plain:  # an IPRoute without the async face: only the synchronous calls
    def __init__(self, ipr): self._ipr = ipr
    def __getattr__(self, name):
        if name in ("asyncore", "_run_with_cleanup"):
            raise AttributeError(name)
        return getattr(self._ipr, name)

with IPRoute() as ipr:
    names = ["d0", "d3", "missing"]
    sync = ({n: [m["index"] for m in ipr.link("get", ifname=n)] for n in names[:2]},
            list(ipr.get_addr()), list(ipr.get_rules(family=socket.AF_INET)),
            list(ipr.get_routes(family=socket.AF_INET)))
    once, plain = _dumps(ipr, names, routes=True), _dumps(Plain(ipr), names, routes=True)
    def links(got):
        return {n: [m["index"]] for n, m in got[0].items() if m is not None}
    print(json.dumps({"sync": [sync[0], *(shape(x) for x in sync[1:])],
                      "once": [links(once), *(shape(x) for x in once[1:])],
                      "plain": [links(plain), *(shape(x) for x in plain[1:])],
                      "missing": [once[0]["missing"], plain[0]["missing"]],
                      "no_routes": len(_dumps(ipr, [], routes=False)[3])}))
"""


def test_the_dumps_at_once_are_the_synchronous_calls_messages(netns: Netns) -> None:
    import json

    for i in range(4):  # enough of each kind that a dump is several messages
        netns.veth(f"d{i}", f"e{i}")
        netns.ip("link", "set", f"d{i}", "up")
        netns.ip("addr", "add", f"10.6{i}.0.5/24", "dev", f"d{i}")
        netns.ip("route", "add", "default", "via", f"10.6{i}.0.1", "table", str(600 + i))
        netns.ip("rule", "add", "from", f"10.6{i}.0.5", "table", str(600 + i),
                 "priority", str(600 + i))
    got = json.loads(netns.exec(sys.executable, "-c", SCRIPT).stdout)
    assert got["once"] == got["sync"] == got["plain"]
    links, addrs, rules, routes = got["once"]
    assert set(links) == {"d0", "d3"} and got["missing"] == [None, None]
    assert len(addrs) >= 8 and len(rules) >= 7 and len(routes) >= 8, got["once"]
    assert got["no_routes"] == 0
