"""RailCablingVerified with a real LLDP daemon playing the switch: Debian's lldpd runs in
its own namespace on the far end of each rail's veth (as a leaf switch's port would) and
the agent names the switch and port per rail; a rail cabled to another rail's "leaf" is
RailMiscabled; a rail with no LLDP is Unknown and never holds FabricReady."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.helpers import Netns, new_netns, wait_for
from tests.netns.test_daemon import cond, start, status_of, stop_cleanly


class Switch:
    """One lldpd, in its own namespace, sending every second as `hostname`."""

    def __init__(self, hostname: str) -> None:
        if shutil.which("lldpd") is None:
            pytest.fail("lldpd is not installed (tools/bootstrap installs it): the cabling "
                        "tests need a real LLDP daemon to play the switch")
        self.ns = new_netns()
        # lldpd runs lldpcli on the config after dropping privileges: the socket and the
        # file must be where its user can reach them (not the tests' 0700 tmp dirs).
        self.dir = Path("/run") / f"nodeagent-test-lldpd-{self.ns.name}"
        self.dir.mkdir(mode=0o755)
        (self.dir / "lldpd.conf").write_text(
            f"configure system hostname {hostname}\nconfigure lldp portidsubtype ifname\n"
            "configure lldp tx-interval 1\n")
        self.proc: subprocess.Popen[str] | None = None

    def plug(self, rails: Netns, peer: str) -> None:
        """The rail's far end moved into the switch, up, and lldpd started on it."""
        rails.ip("link", "set", peer, "netns", self.ns.name)
        self.ns.ip("link", "set", peer, "up")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns.name, "lldpd", "-d", "-u",
             str(self.dir / "lldpd.sock"), "-O", str(self.dir / "lldpd.conf"), "-I", peer],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        self.ns.delete()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def switches() -> Iterator[dict[str, Switch]]:
    made = {name: Switch(name) for name in ("leaf-07-r0", "leaf-07-r1")}
    try:
        yield made
    finally:
        for s in made.values():
            s.close()


def rail(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in (status_of(cfg) or {}).get("rails", []) if r["name"] == name)


def test_each_rails_switch_is_named_and_a_crossed_cable_is_miscabled(
        rails_ns: Netns, agent_config: dict[str, Any], switches: dict[str, Switch],
        tmp_path: Path) -> None:
    agent_config["lldp"] = {"switch_name": "leaf-*-r{n}", "gate": True}
    # rail0 cabled to its leaf; rail1 not plugged into anything that speaks LLDP yet.
    switches["leaf-07-r0"].plug(rails_ns, "p0")
    proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
    try:
        # rail1 hears nothing yet: Unknown, and FabricReady holds (no LLDP never counts).
        wait_for(lambda: "lldp" in rail(agent_config, "rail0"), 15, "rail0's switch heard")
        assert rail(agent_config, "rail0")["lldp"]["switch"] == "leaf-07-r0"
        assert rail(agent_config, "rail0")["lldp"]["port"] == "p0"
        assert "lldp" not in rail(agent_config, "rail1")
        # The switch as a node label (the publisher puts the status' labels on the Node).
        assert (status_of(agent_config) or {})["labels"] == {
            "nodeagent.io/switch-rail0": "leaf-07-r0"}
        status, reason, message = cond(agent_config, "RailCablingVerified") or ("", "", "")
        assert (status, reason) == ("Unknown", "NoLLDPSeen"), message
        assert "rail1 r1: no LLDP seen" in message
        assert (cond(agent_config, "FabricReady") or ("",))[0] == "True"

        other = Switch("leaf-07-r0")  # rail1 plugged into rail0's leaf
        try:
            other.plug(rails_ns, "p1")
            wait_for(lambda: (cond(agent_config, "RailCablingVerified") or ("",))[0]
                     == "False", 15, "RailMiscabled")
            _, reason, message = cond(agent_config, "RailCablingVerified") or ("", "", "")
            assert reason == "RailMiscabled"
            assert message == ("rail1 r1: leaf-07-r0 port p1, expected a switch matching "
                               "leaf-*-r1"), message
            # Gated: the miscabled rail holds FabricReady.
            wait_for(lambda: (cond(agent_config, "FabricReady") or ("",))[0] == "False",
                     10, "FabricReady held by the cabling")
        finally:
            other.close()  # the cable pulled: its veth goes with the namespace

        # Recabled into its own leaf (a fresh veth pair, the far end in leaf-07-r1). The
        # kernel dismantles a deleted namespace on a work queue: the old pair's near end
        # outlives `ip netns del` for a moment (a CI run under load met "File exists").
        wait_for(lambda: rails_ns.ip("link", "show", "dev", "r1", check=False).returncode
                 != 0, 10, "the pulled cable's r1 gone")
        rails_ns.veth("r1", "p1")
        switches["leaf-07-r1"].plug(rails_ns, "p1")
        wait_for(lambda: (cond(agent_config, "RailCablingVerified") or ("",))[0] == "True",
                 30, "cabling as expected")
        _, reason, message = cond(agent_config, "RailCablingVerified") or ("", "", "")
        assert reason == "CablingAsExpected"
        assert "rail0 r0: leaf-07-r0 port p0" in message
        assert "rail1 r1: leaf-07-r1 port p1" in message
    finally:
        stop_cleanly(proc)


def test_an_agent_without_cap_net_raw_says_so_instead_of_hearing_a_silent_switch(
        rails_ns: Netns) -> None:
    """The DaemonSet and the unit grant NET_ADMIN only; an lldp section needs NET_RAW too.
    Without it the rail reads LLDPNotReadable naming the capability, not NoLLDPSeen."""
    script = (
        "import time\n"
        "from nodeagent.checks.cabling import cabling_finding\n"
        "from nodeagent.config import parse_config\n"
        "from nodeagent.run.lldp import LLDPListener\n"
        "cfg = parse_config({'rails': [{'name': 'rail0', 'interface': 'r0',"
        " 'address': '10.10.0.5/24'}], 'lldp': {}})\n"
        "got = []\n"
        "listener = LLDPListener(cfg, got.append)\n"
        "listener.start()\n"
        "deadline = time.monotonic() + 10\n"
        "while not got and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "listener.stop()\n"
        "f = cabling_finding(cfg, got[-1].heard, time.monotonic(), got[-1].unopened)\n"
        "print(f.status, f.reason, f.message)\n")
    out = rails_ns.exec("setpriv", "--inh-caps=-net_raw", "--bounding-set=-net_raw",
                        sys.executable, "-c", script).stdout
    assert out.strip() == "Unknown LLDPNotReadable rail0 r0: cannot listen for LLDP: " \
                          "no CAP_NET_RAW", out


FLOOD = r'''
import json, socket, time
from nodeagent.config import parse_config
from nodeagent.run.lldp import LLDPListener

def tlv(kind, value):
    return ((kind << 9) | len(value)).to_bytes(2, "big") + value

def frame(name, ttl):
    body = (tlv(1, b"\x07chassis") + tlv(2, b"\x05Eth1") + tlv(3, ttl.to_bytes(2, "big"))
            + tlv(5, name) + tlv(0, b""))
    return bytes.fromhex("0180c200000e02000000000188cc") + body

cfg = parse_config({"rails": [{"name": "rail0", "interface": "r0",
                               "address": "10.10.0.5/24"}], "lldp": {}})
got = []
listener = LLDPListener(cfg, lambda seen: got.append((time.monotonic(), seen)))
listener.start()
time.sleep(0.5)
far = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
far.bind(("p0", 0))
start = time.monotonic()
sent = 0
while time.monotonic() - start < 3.0:  # a hostile far end: a new "switch" every frame
    far.send(frame(b"leaf-%d" % sent, 120))
    sent += 1
flood = len(got)
time.sleep(0.5)  # the socket's queue drained (frames past its buffer were dropped)
far.send(frame(b"leaf-bye", 0))  # a shutdown LLDPDU: TTL 0
time.sleep(3.0)
listener.stop()
after = [seen for at, seen in got if at > start + 5.0]
print(json.dumps({"sent": sent, "flood": flood, "total": len(got),
                  "last": sorted(got[-1][1].heard), "late": len(after)}))
'''


def test_a_hostile_far_end_costs_at_most_a_delivery_a_second(rails_ns: Netns) -> None:
    """Thousands of frames each naming a new switch, then a TTL-0 withdrawal: the loop is
    handed at most one observation a second (each would be a pass), the withdrawn switch
    is gone, and nothing keeps being delivered after it."""
    import json

    rails_ns.ip("link", "set", "r0", "up")  # the agent's job, here without the agent
    ran = rails_ns.exec(sys.executable, "-c", FLOOD, check=False)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["sent"] > 1000, out
    assert out["flood"] <= 5, out  # 3 s of flood (and the first at once)
    assert out["last"] == [], out
    assert out["late"] == 0, out
