"""Kubernetes publishing against a real kube-apiserver (built by tools/testenv).

  latency  fault -> taint visible to a watching client, over N faults (p50/p99), and
           recovery -> taint removed, measured against clear_after (mean, spread)
  steady   a healthy node for M minutes, resubmitted every resync (30 s): API requests and
           writes, per node-hour
  fleet    one process simulating N agents (one per Node object, each its own identity),
           faults on 10 %: p99 fault -> taint, and the API request rate
  outage   N agents, the apiserver gone for D seconds while each has news to write: after
           it returns, the peak of sync attempts per second and each agent's time to its
           first successful write (p50/p99); --no-jitter retries as before the jitter
           (0.5 s doubling to 30 s, in lockstep)

Usage: .venv/bin/python bench/kube_publish.py latency|foreign|steady|fleet|outage [options]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import summary
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from nodeagent.checks.conditions import CONDITION_TYPES
from nodeagent.config import Kubernetes
from nodeagent.io.files import describe_error
from nodeagent.model.conditions import FABRIC_READY, Finding
from nodeagent.model.status import Report, Status
from nodeagent.publish.kube import NodeWriter
from nodeagent.publish.publisher import Publisher
from tests.kit.apiserver import AGENT_GROUP, ApiServer, build_testenv

KEY = "nodeagent.io/fabric-unready"


def report(node: str, failing: str | None) -> Status:
    findings = [Finding(t, "True", "Fine", "ok") for t in CONDITION_TYPES if t != FABRIC_READY]
    fabric = (Finding(FABRIC_READY, "False", failing, failing) if failing
              else Finding(FABRIC_READY, "True", "AllConditionsPassed", "ok"))
    return Status(Report(node=node, findings=[*findings, fabric]))


def start_server(nodes: list[str]) -> ApiServer:
    server = ApiServer(Path(tempfile.mkdtemp(prefix="nodeagent-bench-kube-")))
    server.add_identity("admin", "admin", ["system:masters"])
    for n in nodes:
        server.add_identity(f"agent-{n}", f"nodeagent:node:{n}", [AGENT_GROUP])
    server.start(build_testenv())
    server.apply_deploy()
    core = k8s.CoreV1Api(server.client("admin"))
    for n in nodes:
        core.create_node({"metadata": {"name": n},  # type: ignore[arg-type]
                          "spec": {"taints": [{"key": KEY, "value": "AgentStarting",
                                               "effect": "NoSchedule"}]}})
    return server


class TaintWatcher(threading.Thread):
    """A client watching all Nodes: when did each node's taint appear / disappear."""

    def __init__(self, server: ApiServer) -> None:
        super().__init__(daemon=True)
        self.core = k8s.CoreV1Api(server.client("admin"))
        self.state: dict[str, bool] = {}
        self.changed: dict[str, list[tuple[float, bool]]] = {}
        self.ready = threading.Event()

    def run(self) -> None:
        w = k8s_watch.Watch()
        rv = self.core.list_node().metadata.resource_version
        self.ready.set()
        while True:
            try:
                self._follow(w, rv)
            except Exception:  # the server went away at the end of the run
                return

    def _follow(self, w: Any, rv: str) -> None:
        while True:
            for ev in w.stream(self.core.list_node, resource_version=rv, timeout_seconds=300):
                node = ev["object"]
                rv = node.metadata.resource_version
                tainted = any(t.key == KEY for t in (node.spec.taints or []))
                name = node.metadata.name
                if self.state.get(name) != tainted:
                    self.state[name] = tainted
                    self.changed.setdefault(name, []).append((time.monotonic(), tainted))

    def wait(self, node: str, tainted: bool, after: float, timeout: float = 30) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, state in self.changed.get(node, []):
                if t >= after and state == tainted:
                    return t
            time.sleep(0.001)
        raise SystemExit(f"bench: {node} never became tainted={tainted}")


def publisher(server: ApiServer, node: str, conf: Kubernetes) -> Publisher:
    pub = Publisher(conf, lambda: NodeWriter(server.client(f"agent-{node}"), node, conf))
    pub.start()
    return pub


def cmd_latency(args: argparse.Namespace) -> None:
    server = start_server(["node-a"])
    try:
        watcher = TaintWatcher(server)
        watcher.start()
        watcher.ready.wait()
        conf = Kubernetes(clear_after=args.clear_after, lease_period=60, event_rate=1000,
                          event_burst=1000)
        pub = publisher(server, "node-a", conf)
        pub.submit(report("node-a", None))
        watcher.wait("node-a", False, 0)
        to_taint, to_clear = [], []
        for i in range(args.faults):
            t0 = time.monotonic()
            pub.submit(report("node-a", f"Fault{i % 7}"))
            to_taint.append(1000 * (watcher.wait("node-a", True, t0) - t0))
            t1 = time.monotonic()
            pub.submit(report("node-a", None))
            to_clear.append(watcher.wait("node-a", False, t1) - t1 - args.clear_after)
            flips = [s for t, s in watcher.changed["node-a"] if t >= t0]
            assert flips == [True, False], f"flapped: {flips}"
        pub.stop()
        print(f"{args.faults} faults, one node, clear_after {args.clear_after}s")
        print(summary("fault -> taint visible", to_taint))
        print(f"{'recovery -> taint removed':<28} clear_after + mean "
              f"{1000 * statistics.fmean(to_clear):.1f} ms, stdev "
              f"{1000 * statistics.pstdev(to_clear):.1f} ms, max "
              f"{1000 * max(to_clear):.1f} ms; no flapping")
    finally:
        server.stop()


def cmd_foreign(args: argparse.Namespace) -> None:
    """Another writer puts the agent's taint back on a healthy node, or removes it from a
    failing one, with a plain update (no resourceVersion): time from that write to the
    watching client seeing the agent's correction."""
    server = start_server(["node-a"])
    try:
        watcher = TaintWatcher(server)
        watcher.start()
        watcher.ready.wait()
        admin = k8s.CoreV1Api(server.client("admin"))
        conf = Kubernetes(clear_after=0, lease_period=60, event_rate=1000, event_burst=1000)
        pub = publisher(server, "node-a", conf)

        def plain(add: bool) -> float:
            started = time.monotonic()  # the correction can be seen before the reply
            node = admin.read_node("node-a")
            taints = [{"key": t.key, "value": t.value, "effect": t.effect}
                      for t in node.spec.taints or [] if t.key != KEY]
            if add:
                taints.append({"key": KEY, "value": "Manual", "effect": "NoSchedule"})
            admin.patch_node("node-a", {"spec": {"taints": taints}})
            return started

        pub.submit(report("node-a", None))
        watcher.wait("node-a", False, 0)
        time.sleep(1.0)
        lifted, restored = [], []
        for _ in range(args.count):
            t0 = plain(add=True)
            lifted.append(1000 * (watcher.wait("node-a", False, t0) - t0))
        pub.submit(report("node-a", "RuleMissing"))
        watcher.wait("node-a", True, 0)
        time.sleep(1.0)
        for _ in range(args.count):
            t0 = plain(add=False)
            restored.append(1000 * (watcher.wait("node-a", True, t0) - t0))
        assert pub.writer is not None
        print(f"{args.count} foreign writes each way, one node (requests so far "
              f"{pub.writer.counters.requests})")
        print(summary("taint re-added -> lifted", lifted))
        print(summary("taint removed -> restored", restored))
        pub.stop()
    finally:
        server.stop()


def cmd_steady(args: argparse.Namespace) -> None:
    server = start_server(["node-a"])
    try:
        conf = Kubernetes(clear_after=1)
        pub = publisher(server, "node-a", conf)
        pub.submit(report("node-a", None))
        time.sleep(3)  # first sync and the taint lift
        assert pub.writer is not None
        c = pub.writer.counters
        r0, w0, t0 = c.requests, c.writes, time.monotonic()
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(30)  # what the local loop's resync does
            pub.submit(report("node-a", None))
        hours = (time.monotonic() - t0) / 3600
        requests, writes = c.requests - r0, c.writes - w0
        pub.stop()
        print(f"steady state {args.minutes} min, lease_period {conf.lease_period:g}s, "
              f"heartbeat_interval {conf.heartbeat_interval:g}s, "
              f"reconcile_interval {conf.reconcile_interval:g}s")
        expected = 3600 / conf.lease_period + 3600 / conf.heartbeat_interval
        print(f"requests {requests} ({requests / hours:.0f} per node-hour), writes {writes} "
              f"({writes / hours:.0f} per node-hour; Lease renewals and condition heartbeats "
              f"at these periods: {expected:.0f}; goal <= 72)")
    finally:
        server.stop()


def one_at_a_time(p: Publisher, failures: collections.Counter[str]) -> None:
    """An agent syncs from its one publisher thread: never two rounds at once (the pool
    could start a heartbeat's beside a fault's), and a failed round is counted by why,
    as the publisher's loop would log it, instead of ending the pool's map."""
    plain, lock = p.sync_once, threading.Lock()

    def sync_once() -> None:
        with lock:
            try:
                plain()
            except Exception as exc:
                failures[describe_error(exc)[:160]] += 1
    p.sync_once = sync_once  # type: ignore[method-assign]


def cmd_fleet(args: argparse.Namespace) -> None:
    """N agents in one process: each its own identity, client and publisher state, driven
    by a pool of worker threads instead of N threads (what a real fleet spreads over N
    hosts)."""
    from concurrent.futures import ThreadPoolExecutor

    nodes = [f"fleet-{i:04d}" for i in range(args.nodes)]
    t_start = time.monotonic()
    server = start_server(nodes)
    print(f"apiserver up with {args.nodes} Nodes in {time.monotonic() - t_start:.0f}s")
    try:
        watcher = TaintWatcher(server)
        watcher.start()
        watcher.ready.wait()
        conf = Kubernetes(clear_after=0, lease_period=args.lease_period)
        pubs = {n: Publisher(conf, lambda n=n: NodeWriter(server.client(f"agent-{n}"), n, conf))
                for n in nodes}
        pool = ThreadPoolExecutor(max_workers=args.workers)
        failures: collections.Counter[str] = collections.Counter()
        for p in pubs.values():
            one_at_a_time(p, failures)
        t0 = time.monotonic()
        for n, p in pubs.items():
            p.submit(report(n, None))
        list(pool.map(lambda p: p.sync_once(), pubs.values()))
        failures.clear()  # the first sync's Lease reads: a 404 before each Lease is made
        print(f"first sync of {args.nodes} agents (conditions, Events, taint lift, Lease): "
              f"{time.monotonic() - t0:.0f}s")

        def total() -> int:
            return sum(p.writer.counters.requests for p in pubs.values() if p.writer)

        stop = threading.Event()

        def heartbeats() -> None:  # each agent renews its Lease when due
            while not stop.is_set():
                now = time.monotonic()
                due = [p for p in pubs.values() if p._due.lease <= now]
                list(pool.map(lambda p: p.sync_once(), due))
                time.sleep(0.2)

        beat = threading.Thread(target=heartbeats, daemon=True)
        beat.start()

        def errors() -> tuple[int, int]:  # non-2xx answers and failed rounds; 409s
            return (sum(p.writer.counters.errors for p in pubs.values() if p.writer),
                    sum(p.writer.counters.conflicts for p in pubs.values() if p.writer))

        r0, (e0, c0), t1 = total(), errors(), time.monotonic()
        faulty = nodes[::10]
        starts: dict[str, float] = {}
        began: dict[str, float] = {}  # when a worker took the agent's sync up

        def sync(n: str) -> None:
            began.setdefault(n, time.monotonic())
            pubs[n].sync_once()

        def heard(n: str, p: Publisher) -> None:
            """A heartbeat's sync that starts after the fault's submit writes it too: the
            first sync to start after the submit is when the agent took it up."""
            plain = p.sync_once

            def sync_once() -> None:
                if n in starts:
                    began.setdefault(n, time.monotonic())
                plain()
            p.sync_once = sync_once  # type: ignore[method-assign]

        for n, p in pubs.items():
            heard(n, p)

        futures = []
        for n in faulty:
            starts[n] = time.monotonic()
            pubs[n].submit(report(n, "NoCarrier"))
            futures.append(pool.submit(sync, n))
        seen = {n: watcher.wait(n, True, starts[n], timeout=120) for n in faulty}
        latencies = [1000 * (seen[n] - starts[n]) for n in faulty]
        # What a fleet of hosts never pays: the wait for one of this process's workers
        # (each real agent syncs on its own host at once).
        # A sync already under way at the submit may write the fault before any sync
        # starts after it: then nothing was queued, and the whole wait is the agent's.
        took = {n: began[n] if began.get(n, seen[n]) < seen[n] else starts[n]
                for n in faulty}
        queued = [1000 * (took[n] - starts[n]) for n in faulty]
        own = [1000 * (seen[n] - took[n]) for n in faulty]
        time.sleep(max(0.0, args.seconds - (time.monotonic() - t1)))
        stop.set()
        beat.join()
        elapsed = time.monotonic() - t1
        rate = (total() - r0) / elapsed
        print(f"fleet: {args.nodes} agents, {len(faulty)} faults at once, lease_period "
              f"{args.lease_period:g}s, {args.workers} workers")
        print(summary("fault -> taint visible", latencies))
        print(summary("  of which queued", queued))
        print(summary("  from sync start", own))
        e1, c1 = errors()
        print(f"API request rate over {elapsed:.0f}s (faults + Lease renewals): {rate:.1f}/s; "
              # The first sync's are left out: each agent's first Lease read is a 404
              # before it creates its Lease, counted as an error by the client.
              f"requests answered with an error since: {e1 - e0} (409 conflicts {c1 - c0})")
        for why, n in failures.most_common(5):
            print(f"  failed syncs: {n} x {why}")
    finally:
        server.stop()


def cmd_outage(args: argparse.Namespace) -> None:
    """Each agent's retry loop as the publisher runs it (a failed round waits its backoff),
    scheduled on a pool of workers: N hosts' loops in one process."""
    import heapq
    from concurrent.futures import ThreadPoolExecutor

    from nodeagent.kube.backoff import Backoff

    nodes = [f"fleet-{i:04d}" for i in range(args.nodes)]
    server = start_server(nodes)
    try:
        conf = Kubernetes(clear_after=0)
        pubs = {n: Publisher(conf, lambda n=n: NodeWriter(server.client(f"agent-{n}"), n, conf))
                for n in nodes}
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            for n, p in pubs.items():
                p.submit(report(n, None))
            list(pool.map(lambda p: p.sync_once(), pubs.values()))
            server.stop()
            down_at = time.monotonic()
            for n, p in pubs.items():  # news to write while it is away
                p.submit(report(n, "NoCarrier"))
            lock = threading.Lock()
            due: list[tuple[float, str]] = [(down_at, n) for n in nodes]
            backoff = {n: Backoff() for n in nodes}
            waited = dict.fromkeys(nodes, 0.0)  # the unjittered doubling, as before
            first_ok: dict[str, float] = {}
            attempts: list[float] = []
            up_at: list[float] = []

            def attempt(n: str) -> None:
                attempts.append(time.monotonic())
                try:
                    pubs[n].sync_once()
                except Exception:
                    if args.no_jitter:
                        waited[n] = min(30.0, max(0.5, waited[n] * 2))
                        wait = waited[n]
                    else:
                        wait = backoff[n].next()
                    with lock:
                        heapq.heappush(due, (time.monotonic() + wait, n))
                else:
                    first_ok.setdefault(n, time.monotonic())

            def restart() -> None:
                time.sleep(args.down)
                server.start(build_testenv())
                up_at.append(time.monotonic())

            back = threading.Thread(target=restart, daemon=True)
            back.start()
            while len(first_ok) < len(nodes) and time.monotonic() - down_at < args.down + 600:
                now = time.monotonic()
                batch = []
                with lock:
                    while due and due[0][0] <= now:
                        batch.append(heapq.heappop(due)[1])
                for n in batch:
                    pool.submit(attempt, n)
                time.sleep(0.01)
        back.join()
        up = up_at[0]
        after = [t - up for t in attempts if t >= up]
        buckets: dict[int, int] = {}
        for t in after:
            buckets[int(t)] = buckets.get(int(t), 0) + 1
        times = [1000 * (first_ok[n] - up) for n in nodes if n in first_ok]
        kind = "unjittered doubling" if args.no_jitter else "jittered (random exponential)"
        print(f"outage: {args.nodes} agents, apiserver away {args.down:g}s, retries {kind}, "
              f"{args.workers} workers")
        print(f"sync attempts after it returned: peak {max(buckets.values(), default=0)}/s "
              f"(first 10 s: {[buckets.get(i, 0) for i in range(10)]}); "
              f"{len(first_ok)}/{args.nodes} wrote")
        print(summary("back -> first write", times))
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--faults", type=int, default=100)
    lat.add_argument("--clear-after", type=float, default=2.0)
    fo = sub.add_parser("foreign")
    fo.add_argument("--count", type=int, default=100)
    st = sub.add_parser("steady")
    st.add_argument("--minutes", type=float, default=10.0)
    fl = sub.add_parser("fleet")
    fl.add_argument("--nodes", type=int, default=1000)
    fl.add_argument("--lease-period", type=float, default=20.0)
    fl.add_argument("--seconds", type=float, default=60.0)
    fl.add_argument("--workers", type=int, default=32)
    ou = sub.add_parser("outage")
    ou.add_argument("--nodes", type=int, default=1000)
    ou.add_argument("--down", type=float, default=60.0)
    ou.add_argument("--workers", type=int, default=32)
    ou.add_argument("--no-jitter", action="store_true")
    args = ap.parse_args()
    commands: dict[str, Any] = {"latency": cmd_latency, "foreign": cmd_foreign,
                                "steady": cmd_steady, "fleet": cmd_fleet, "outage": cmd_outage}
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
