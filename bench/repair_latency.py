"""Repair latency: delete a rail's address, rule or route while the daemon runs.

For each kind, N deletions (default 200); the time from issuing the deletion (netlink,
in-process) to the kernel announcing it restored (a netlink event on our own monitor
socket). The same driver then runs against bench/bare_repair.py, a bare pyroute2 loop that
only re-adds what was deleted: both are printed, with the agent/bare ratio of p50 and p99.
Goals: p99 <= 20 ms; agent within 1.5x of the bare loop.

--busy N starts N busy processes per core for the whole run, so the agent and the bare loop
meet the same load (a training node's cores are taken: data loaders, NCCL's proxy threads);
--nice K runs both the agent and the bare loop at that niceness (what a unit's Nice= or a
pod's priority can buy). Each side's CPU time per deletion is printed (from /proc), with
the agent's passes per deletion: one pass verifies the deletions of a burst, so --gap S
(seconds between deletions, default 0.01) shows an isolated deletion's cost with S > 0.2.
--cgroup SYSTEM:PODS puts the agent (and then the bare loop) in one CPU cgroup and the busy
processes in a sibling, with those weights (cgroup v2 cpu.weight, or v1 cpu.shares scaled
as systemd does): on a node, the unit's slice against kubepods.slice, whose weight the
kubelet sets from the node's CPUs (e.g. 100:5000 for system.slice on a 128-core node).
Usage: sudo .venv/bin/python bench/repair_latency.py [--count N] [--rails N --position K]
       [--busy N] [--nice K] [--gap S] [--cgroup SYSTEM:PODS]
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from common import make_rails, pct, reexec_in_netns, summary
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV4_RULE


class Unrepaired(Exception):
    """A deletion whose repair was not seen within the timeout."""


class Events:
    """The kernel's address, rule and route announcements, read on a thread of their own
    (pyroute2's get() blocks), so a wait can end at its deadline."""

    def __init__(self) -> None:
        self.got: queue.SimpleQueue[Any] = queue.SimpleQueue()
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        ready.wait(5)

    def _read(self, ready: threading.Event) -> None:
        # Made on the thread that reads it: pyroute2's socket belongs to its thread's loop.
        with IPRoute() as mon:
            mon.bind(groups=RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_RULE | RTMGRP_IPV4_ROUTE)
            ready.set()
            while True:
                for msg in mon.get():
                    self.got.put((time.perf_counter(), msg))

    def drain(self) -> None:
        while not self.got.empty():
            self.got.get_nowait()

    def wait(self, wanted: list[Callable[[Any], bool]], timeout: float = 5.0) -> float:
        """When the last of the wanted events came (each matched once, in any order)."""
        left = list(wanted)
        deadline = time.perf_counter() + timeout
        while left:
            try:
                at, msg = self.got.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                raise Unrepaired(f"{len(left)} of {len(wanted)} repairs not seen within "
                                 f"{timeout:g} s") from None
            left = [w for w in left if not w(msg)]
        return float(at)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_load(per_core: int, cgroup: Path | None = None) -> list[subprocess.Popen[bytes]]:
    """per_core spinning processes for each core (niceness 0, like a job's threads)."""
    spin = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(spin, preexec_fn=joiner(cgroup))
            for _ in range(per_core * (os.cpu_count() or 1))]


class CpuGroups:
    """Three sibling CPU cgroups made for the run (in v1's cpu hierarchy where there is
    one, else in v2's), removed after it: `system` for the agent and the bare loop, `pods`
    for the load, `driver` for the bench itself. A bench killed by hand leaves them
    (nodeagent-bench-*): move their processes out and rmdir them."""

    def __init__(self, weights: str, tmp: Path) -> None:
        system, pods = (int(w) for w in weights.split(":"))
        # `ip netns exec` mounts a fresh /sys without the cgroup file systems: mount the
        # cpu hierarchy again (the same one) in this mount namespace.
        self.mount = tmp / "cpu-cgroup"
        self.mount.mkdir()
        if subprocess.run(["mount", "-t", "cgroup", "-o", "cpu", "cgroup", str(self.mount)],
                          capture_output=True).returncode == 0:
            root, knob, scale = self.mount, "cpu.shares", 10.24  # systemd: w * 1024 / 100
        else:
            subprocess.run(["mount", "-t", "cgroup2", "cgroup2", str(self.mount)], check=True)
            root, knob, scale = self.mount, "cpu.weight", 1.0
            (root / "cgroup.subtree_control").write_text("+cpu")
        self.system = root / f"nodeagent-bench-system-{os.getpid()}"
        self.pods = root / f"nodeagent-bench-pods-{os.getpid()}"
        # The bench itself times the repairs from its own netlink events: in a group of
        # the highest weight, so its wake-ups are not what is measured.
        self.driver = root / f"nodeagent-bench-driver-{os.getpid()}"
        for group, weight in ((self.system, system), (self.pods, pods), (self.driver, 10000)):
            group.mkdir()
            (group / knob).write_text(str(round(weight * scale)))
        self.root = root
        (self.driver / "cgroup.procs").write_text(str(os.getpid()))
        self.text = f"{knob} {system}:{pods} (system:pods, as CPUWeight)"

    def remove(self) -> None:
        (self.root / "cgroup.procs").write_text(str(os.getpid()))
        for group in (self.system, self.pods, self.driver):
            with contextlib.suppress(OSError):
                group.rmdir()
        subprocess.run(["umount", str(self.mount)], check=False)


def joiner(cgroup: Path | None) -> Callable[[], None] | None:
    """A preexec_fn that moves the child into the cgroup (None: stays where it is)."""
    if cgroup is None:
        return None

    def join() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    return join


def prepare(nice: int, cgroup: Path | None) -> Callable[[], None] | None:
    """A preexec_fn: the niceness, then the cgroup."""
    if not nice and cgroup is None:
        return None
    join = joiner(cgroup)

    def run() -> None:
        if nice:
            os.nice(nice)
        if join is not None:
            join()
    return run


def start_daemon(tmp: Path, data: dict[str, Any], nice: int = 0,
                 cgroup: Path | None = None) -> subprocess.Popen[bytes]:
    (tmp / "c.yaml").write_text(yaml.safe_dump(data))
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen([sys.executable, "-m", "nodeagent", "run", "--config",
                               str(tmp / "c.yaml"), "--log-level", "WARNING"],
                              stdout=log, stderr=subprocess.STDOUT,
                              preexec_fn=prepare(nice, cgroup))
    status = tmp / "run" / "status.json"
    # This daemon's own healthy status: after a restart the last one's file still says ok
    # (which made the first repair after a start look 250 ms slow: it was the start).
    while not (status.exists() and (got := json.loads(status.read_text()))["ok"]
               and got["daemon"]["pid"] == daemon.pid):
        if daemon.poll() is not None:
            raise SystemExit(f"bench: the daemon exited: {(tmp / 'daemon.log').read_text()}")
        time.sleep(0.01)
    return daemon


def end(proc: subprocess.Popen[Any]) -> int:
    """SIGTERM, then SIGKILL after 20 s: nothing this bench starts outlives it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--rails", type=int, default=1, help="rails the daemon manages")
    ap.add_argument("--position", type=int, default=0,
                    help="which of them is deleted from (scale: does a rail's place cost?)")
    ap.add_argument("--busy", type=int, default=0, help="busy processes per core")
    ap.add_argument("--nice", type=int, default=0, help="the agent's and the bare loop's")
    ap.add_argument("--cgroup", metavar="SYSTEM:PODS",
                    help="the agent's and the load's CPU cgroup weights (as CPUWeight=)")
    ap.add_argument("--gap", type=float, default=0.01,
                    help="seconds between one repair and the next deletion")
    ap.add_argument("--kinds", default="address,rule,default route",
                    help="what is deleted, comma-separated (one kind alone: its CPU per "
                    "deletion on its own)")
    ap.add_argument("--first", type=int, default=0, metavar="N",
                    help="instead: N starts, each timing the first repair right after the "
                    "first healthy status, then one 3 s later")
    args = ap.parse_args()
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not kinds or set(kinds) - {"address", "rule", "default route"}:
        ap.error(f"--kinds: of address, rule, default route, not {args.kinds!r}")
    reexec_in_netns()
    tmp = Path(tempfile.mkdtemp(prefix="nodeagent-bench-"))
    data = make_rails(args.rails, tmp, slots=16 if args.rails > 8 else 255)
    data["resync_interval"] = "1h"  # repairs must come from events
    data["repair_guard"] = {"max_repairs": 100_000}  # the bench is a deliberate fight
    rail = data["rails"][args.position]
    if args.first:
        first_repairs(tmp, data, rail, args.first)
        return
    groups = CpuGroups(args.cgroup, tmp) if args.cgroup else None
    system = groups.system if groups else None
    load = busy_load(args.busy, groups.pods if groups else None) if args.busy else []
    try:
        daemon = start_daemon(tmp, data, args.nice, system)
        try:
            before, passes = cpu_seconds(daemon.pid), passes_of(tmp)
            agent = drive(rail, args.count, kinds, gap=args.gap)
            time.sleep(0.3)  # the pass that verifies the last burst
            agent_cpu = cpu_seconds(daemon.pid) - before
            passes = passes_of(tmp) - passes
        finally:
            print(f"daemon exit: {end(daemon)}")
        bare = subprocess.Popen([sys.executable, str(Path(__file__).parent / "bare_repair.py"),
                                 rail["interface"], rail["address"], str(rail["table"]),
                                 str(rail["rule_priority"]), rail["gateway"]],
                                stdout=subprocess.PIPE, text=True,
                                preexec_fn=prepare(args.nice, system))
        try:
            assert bare.stdout is not None and bare.stdout.readline().strip() == "ready"
            before = cpu_seconds(bare.pid)
            reference = drive(rail, args.count, kinds, gap=args.gap)
            bare_cpu = cpu_seconds(bare.pid) - before
        finally:
            bare.kill()
            bare.wait()
    finally:
        for spinner in load:
            spinner.kill()
            spinner.wait()
        if groups is not None:
            groups.remove()
    deletions = len(kinds) * args.count
    print(f"load: {args.busy} busy process(es) per core; niceness {args.nice}; "
          f"{groups.text if groups else 'one CPU cgroup'}")
    print(f"CPU per deletion: agent {agent_cpu / deletions * 1000:.2f} ms, bare loop "
          f"{bare_cpu / deletions * 1000:.2f} ms "
          f"({agent_cpu / bare_cpu if bare_cpu else float('inf'):.1f}x); the agent's passes "
          f"per deletion {passes / deletions:.2f} (gap {args.gap:g} s)")
    print(f"repair latency: deletion -> restored (netlink events), {args.count} each; an "
          "address is restored when it and the two routes the kernel dropped with it are back")
    for kind in agent:
        a, b = agent[kind], reference[kind]
        if not a or not b:
            print(f"{kind}: no sample ({len(a)} agent, {len(b)} bare)")
            continue
        print(summary(f"{kind} agent", a))
        print(summary(f"{kind} bare loop", b))
        print(f"{'':28} agent/bare: p50 {pct(a, 50) / pct(b, 50):.2f}x, "
              f"p99 {pct(a, 99) / pct(b, 99):.2f}x")


def first_repairs(tmp: Path, data: dict[str, Any], rail: dict[str, Any], starts: int) -> None:
    """The first repair after a start (the status says ok, a deletion at once) against one
    made 3 s later, each start a new daemon on the same, already configured rail."""
    first, settled = [], []
    for _ in range(starts):
        daemon = start_daemon(tmp, data)
        try:
            first.extend(drive(rail, 1, kinds=("address",))["address"])
            time.sleep(3.0)
            settled.extend(drive(rail, 1, kinds=("address",))["address"])
        finally:
            end(daemon)
    print(summary("first repair after start", first))
    print(summary("a repair 3 s later", settled))


def present(ipr: Any, rail: dict[str, Any], kind: str) -> bool:
    """Whether the thing a phase deletes is there (a repair of the last phase may still
    be on its way)."""
    if kind == "rule":
        return any(r.get("priority") == rail["rule_priority"] for r in ipr.get_rules(
            family=socket.AF_INET))
    if kind == "default route":
        return any(r["dst_len"] == 0 for r in ipr.get_routes(table=rail["table"],
                                                               family=socket.AF_INET))
    ip_ = rail["address"].split("/")[0]
    return any(a.get_attr("IFA_ADDRESS") == ip_ for a in ipr.get_addr(family=socket.AF_INET))


def passes_of(tmp: Path) -> int:
    """The daemon's passes so far (its status file)."""
    return int(json.loads((tmp / "run" / "status.json").read_text())["daemon"]["passes"])


def drive(rail: dict[str, Any], count: int,
          kinds: tuple[str, ...] = ("address", "rule", "default route"),
          gap: float = 0.01) -> dict[str, list[float]]:
    """Deletes the rail's address, rule and default route in turn, `count` times each,
    and times each until the kernel announces everything it took back. A deletion that
    cannot be made (the thing is not there yet) waits for it; a repair never seen is
    counted and the phase goes on."""
    ip_, plen = rail["address"].split("/")
    network = str(ipaddress.ip_interface(rail["address"]).network)
    table = rail["table"]
    results: dict[str, list[float]] = {kind: [] for kind in kinds}
    missed = dict.fromkeys(results, 0)

    def route_back(dst_len: int) -> Callable[[Any], bool]:
        return lambda m: (m["event"] == "RTM_NEWROUTE" and m.get("table") == table
                          and m["dst_len"] == dst_len and (dst_len == 0 or m.get_attr(
                              "RTA_DST") == network.split("/")[0]))

    events = Events()
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=rail["interface"])[0]
        for _ in range(count):
            for kind in results:
                deadline = time.monotonic() + 5
                while not present(ipr, rail, kind) and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(gap)  # let the previous repair's own events settle
                events.drain()
                try:
                    t0 = time.perf_counter()
                    if kind == "address":
                        ipr.addr("del", index=idx, address=ip_, prefixlen=int(plen))
                        done = events.wait([
                            lambda m: m["event"] == "RTM_NEWADDR" and m.get_attr(
                                "IFA_ADDRESS") == ip_,
                            route_back(0), route_back(int(network.split("/")[1]))])
                    elif kind == "rule":
                        ipr.rule("del", priority=rail["rule_priority"], family=socket.AF_INET)
                        done = events.wait([lambda m: m["event"] == "RTM_NEWRULE"
                                                 and m.get("priority") == rail["rule_priority"]])
                    else:
                        ipr.route("del", dst="0.0.0.0/0", table=table)
                        done = events.wait([route_back(0)])
                except (Unrepaired, NetlinkError) as exc:
                    missed[kind] += 1
                    print(f"{kind}: {exc}", file=sys.stderr)
                    continue
                results[kind].append(1000 * (done - t0))
        time.sleep(0.2)  # the last repair's routes
    if any(missed.values()):
        print(f"missed: {missed}")
    return results


if __name__ == "__main__":
    main()
