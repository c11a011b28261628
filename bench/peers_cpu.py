"""The agent's added CPU for probing its peers over RoCE: two rails, four peers a rail, two
traffic classes (16 probes a second at `interval: 1s`), on real soft-RoCE.

Two lab guests joined by two wires (the lab guest's ens6/ens7 to the peer node's ens4/ens5):
the lab guest runs the agent as its systemd service with two rails; the peer node plays
four peers on each wire (four addresses a wire, each answered by the agent's own responder
code, tests/lab/guest/responders.py). Per configuration, the agent's CPU (utime + stime
from /proc, over `--window` seconds of the guest's clock) and the responders' CPU for
answering the same probes (in a fleet each agent answers about as many probes as it sends).

The guests run under TCG here: their CPU seconds are not a host's. The same two
references (pure Python; TCP connects over loopback, the probe's set-up) are timed in the
guest and on this host, and the guest's figures are also given divided by each slowdown:
an estimate of the host's, not a measurement on one.

Usage: .venv/bin/python bench/peers_cpu.py [--window 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.kit.helpers import wait_for
from tests.kit.labkit import GUEST, condition, ensure_agent, start_agent, status
from tests.kit.vm import VM, boot, build_image, wheelhouse

PEERS_PER_RAIL = 4
RAILS: list[dict[str, Any]] = [
    {"name": "fab0", "interface": "ens6", "address": "10.20.0.1/24", "mtu": 4200,
     "rdma_device": "rxe2"},
    {"name": "fab1", "interface": "ens7", "address": "10.21.0.1/24", "mtu": 4200,
     "rdma_device": "rxe3"},
]
# The peer node's end of each wire: its netdev and soft-RoCE device, the rail's network.
FAR_ENDS = {"fab0": ("ens4", "rxe0", "10.20.0"), "fab1": ("ens5", "rxe1", "10.21.0")}

# Timed in the guest and on the host: what a probe's CPU is made of, apart from verbs.
REFERENCE = r"""
import socket, threading, time
t = time.process_time()
sum(i * i for i in range(2_000_000))
python = time.process_time() - t
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(64)
port = srv.getsockname()[1]
def serve():
    for _ in range(400):
        c, _ = srv.accept(); c.recv(64); c.sendall(b"x" * 48); c.close()
threading.Thread(target=serve, daemon=True).start()
t = time.process_time()
for _ in range(400):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"y" * 64); s.recv(64)
    s.close()
tcp = time.process_time() - t
print(python, tcp)
"""


def reference(run: Callable[[str], str]) -> tuple[float, float]:
    python, tcp = run(REFERENCE).split()
    return float(python), float(tcp)


def in_guest(vm: VM) -> Callable[[str], str]:
    return lambda code: vm.ssh(f"python3 -c '{code.replace(chr(39), chr(34))}'",
                               timeout=600).stdout


def on_host(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout


def cpu_and_clock(vm: VM, pid: int) -> tuple[float, float]:
    """(the process's CPU seconds, the guest's uptime), read in one go."""
    out = vm.ssh(f"cat /proc/uptime /proc/{pid}/stat; getconf CLK_TCK").stdout.split("\n")
    uptime = float(out[0].split()[0])
    fields = out[1].rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / int(out[2]), uptime


def cpu_share(vm: VM, pids: list[int], window: float) -> list[float]:
    """Each process's CPU over `window` seconds of the guest's clock, in % of a core."""
    before = [cpu_and_clock(vm, pid) for pid in pids]
    time.sleep(window)
    after = [cpu_and_clock(vm, pid) for pid in pids]
    return [100 * (a[0] - b[0]) / (a[1] - b[1]) for a, b in zip(after, before, strict=True)]


def agent_pid(vm: VM) -> int:
    return int(vm.ssh("systemctl show -p MainPID --value nodeagent").stdout)


def answered(vm: VM) -> int:
    vm.ssh("pkill -USR1 -f '/root/guest/[r]esponders.py'; sleep 0.5")
    lines = vm.ssh("grep answered /root/responders.out || true").stdout.split()
    return int(lines[-1]) if lines else 0


def peers_config(classes: list[int]) -> dict[str, Any]:
    static = {rail: [{"address": f"{FAR_ENDS[rail][2]}.{10 + i}", "node": f"peer-{i}"}
                     for i in range(PEERS_PER_RAIL)] for rail in FAR_ENDS}
    # max_rtt: an emulated guest's round trip over soft-RoCE is tens of ms (a host's: tens
    # of us); the default 10 ms would make every peer PeerLatencyHigh here.
    return {"static": static, "interval": "1s", "timeout": "1s", "classes": classes,
            "traffic_class": classes[-1], "max_rtt": "500ms"}


def setup(a: VM, b: VM, wheels: Path) -> None:
    def lab() -> None:
        a.put(wheels, "/root/wheels")
        ensure_agent(a)
        a.ssh("rdma link add rxe2 type rxe netdev ens6 && "
              "rdma link add rxe3 type rxe netdev ens7")

    def peer() -> None:
        b.put(wheels, "/root/wheels")
        b.put(GUEST, "/root/guest")
        ensure_agent(b)
        ends = []
        for netdev, device, net in FAR_ENDS.values():
            b.ssh(f"ip link set {netdev} mtu 4200 up && "
                  f"rdma link add {device} type rxe netdev {netdev}")
            for i in range(PEERS_PER_RAIL):
                b.ssh(f"ip addr add {net}.{10 + i}/24 dev {netdev}")
                ends.append(f"{device}:{net}.{10 + i}")
        probers = ",".join(r["address"].split("/")[0] for r in RAILS)
        b.ssh(f"nohup /opt/nodeagent/venv/bin/python /root/guest/responders.py {probers} "
              f"{' '.join(ends)} > /root/responders.out 2>&1 < /dev/null &")
        wait_for(lambda: "ready" in b.ssh("cat /root/responders.out").stdout, 60,
                 "the responders")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for step in [pool.submit(lab), pool.submit(peer)]:
            step.result()


def diagnose(a: VM, b: VM) -> None:
    """What a failed start looked like, on both guests."""
    for c in status(a).get("conditions", []):
        print(f"  lab: {c['type']}={c['status']} ({c['reason']}): {c.get('message', '')}")
    print(a.ssh("journalctl -u nodeagent --no-pager | tail -20; ip -br addr; rdma link",
                check=False).stdout)
    print(b.ssh("tail -20 /root/responders.out; ip -br addr; rdma link", check=False).stdout)


def measure(a: VM, b: VM, peers: dict[str, Any] | None, window: float) -> None:
    a.ssh("systemctl stop nodeagent; rm -rf /var/lib/nodeagent /run/nodeagent")
    extra = {"peers": peers} if peers else {}
    start_agent(a, rails=RAILS, **extra)
    try:
        if peers:
            wait_for(lambda: condition(a, "RDMAPeersReachable") == ("True", "PeersReachable"),
                     180, "every peer reached")
        else:
            wait_for(lambda: condition(a, "RoCENetworkReady")[0] == "True", 120, "the rails")
    except AssertionError:
        diagnose(a, b)
        raise
    time.sleep(10)  # past the start's first passes and probes
    responders = int(b.ssh("pgrep -f '/root/guest/[r]esponders.py'").stdout.split()[0])
    got = answered(b)
    with ThreadPoolExecutor(max_workers=2) as pool:  # both guests over the same window
        agent_cpu = pool.submit(cpu_share, a, [agent_pid(a)], window)
        answer_cpu = pool.submit(cpu_share, b, [responders], window)
        agent, answering = agent_cpu.result()[0], answer_cpu.result()[0]
    rate = (answered(b) - got) / window
    label = f"classes {peers['classes']}" if peers else "no peers section"
    print(f"{label:>22}: agent {agent:.2f} % of a core; responders {answering:.2f} %; "
          f"{rate:.1f} probes/s answered", flush=True)
    RESULTS.append((label, agent, answering, rate))


RESULTS: list[tuple[str, float, float, float]] = []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=float, default=60)
    args = p.parse_args()
    image = build_image()
    work = Path(tempfile.mkdtemp(prefix="nodeagent-bench-peers-"))
    a = boot(image, work / "a", second_wire=True)
    try:
        b = boot(image, work / "b", peer_of=a.fab_port, fab1_port=a.fab1_port)
        try:
            print(f"guests booted ({a.accel})")
            setup(a, b, wheelhouse(work / "wheels"))
            for peers in (None, peers_config([0]), peers_config([0, 104])):
                measure(a, b, peers, args.window)
            host, guest = reference(on_host), reference(in_guest(a))
            slow = [g / h for g, h in zip(guest, host, strict=True)]
            print(f"guest slowdown against this host: pure Python {slow[0]:.1f}x, TCP "
                  f"connects {slow[1]:.1f}x")
            base = RESULTS[0][1]
            for label, agent, answering, rate in RESULTS[1:]:
                added = agent - base + answering
                print(f"{label:>22}: added {added:.2f} % of a core in the guest "
                      f"({rate:.1f} probes/s sent and answered); on this host about "
                      f"{added / max(slow):.2f}-{added / min(slow):.2f} %")
        finally:
            b.kill()
    finally:
        a.kill()


if __name__ == "__main__":
    main()
