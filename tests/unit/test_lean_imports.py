"""The daemon's modules load pyroute2's rtnetlink parts alone, and pyroute2 stays whole
for anyone else (a fresh interpreter each: what is imported is the point)."""

from __future__ import annotations

import json
import subprocess
import sys

DAEMON = """
import json, sys
import nodeagent.run.agent, nodeagent.cli.main
print(json.dumps(sorted(m for m in sys.modules if m.startswith("pyroute2"))))
"""

WHOLE = """
import nodeagent.run.agent
from pyroute2 import IPRoute, NDB
import pyroute2
with IPRoute() as ipr:
    assert ipr.get_links(), "a working IPRoute"
print(pyroute2.__version__, IPRoute.__module__, NDB.__module__)
"""


WITHOUT_SSL = """
import sys
from nodeagent.io.lean_imports import iproute_without_ssl
iproute_without_ssl()
import nodeagent.run.agent
from pyroute2.iproute import IPRoute
with IPRoute() as ipr:
    assert ipr.get_links(), "a working IPRoute"
print("ssl" in sys.modules, "_ssl" in sys.modules)
import ssl, urllib3  # what the kubernetes client does later
from pyroute2.netlink.rtnl import probe_msg
print(probe_msg.ssl.SSLContext is ssl.SSLContext, urllib3.util.ssl_.SSLContext is ssl.SSLContext)
"""


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_daemon_loads_no_extras_of_pyroute2() -> None:
    loaded = json.loads(run(DAEMON))
    assert "pyroute2.iproute.linux" in loaded and "pyroute2.netlink.rtnl.ifinfmsg" in loaded
    for extra in ("pyroute2.ndb.main", "pyroute2.ipdb", "pyroute2.conntrack", "pyroute2.wiset",
                  "pyroute2.netlink.nl80211", "pyroute2.plan9.server"):
        assert extra not in loaded, extra


def test_pyroute2_is_whole_for_any_other_caller() -> None:
    version, iproute, ndb = run(WHOLE).split()
    assert version[0].isdigit() and iproute.startswith("pyroute2.iproute")
    assert ndb == "pyroute2.ndb.main"


def test_netlink_without_ssl_until_a_caller_needs_it() -> None:
    before, after = run(WITHOUT_SSL).splitlines()
    assert before == "False False"  # libssl not loaded by the daemon's modules
    assert after == "True True"  # then ssl whole, for pyroute2's own use too


def test_the_commands_that_open_netlink_load_no_ssl() -> None:
    # `check` on a config with nothing to check: what it imported is the point
    code = """
import sys, tempfile
from nodeagent.cli.main import main
with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
    f.write("rails: []\\n"); f.flush()
    sys.argv = ["nodeagent", "check", "--config", f.name, "--json"]
    try:
        main()
    except SystemExit:
        pass
print(file=sys.stderr)
print("ssl" in sys.modules, file=sys.stderr)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stderr.strip().splitlines()[-1] == "False", out.stderr
