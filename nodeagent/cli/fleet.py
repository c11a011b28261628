"""The fleet view: every fabric node's conditions, taint, agent heartbeat and RDMA capacity in
one table (`nodeagent fleet`, and `kubectl fabric` through the kubectl-fabric plugin).

Two lists per view (Nodes by label selector, the agents' Leases); `--watch` keeps both
current with watches and redraws on change. Rows needing attention are flagged: a stale
agent heartbeat, zero RDMA capacity, a taint older than --taint-older.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nodeagent.checks.conditions import CONDITIONS
from nodeagent.cli.mesh import (
    GRID_MAX,
    MeshCell,
    PeerCount,
    SwitchFault,
    mesh_cells,
    mesh_document,
    peer_counts,
    peers_text,
    render_grid,
    render_switches,
    suspects,
    switch_faults,
    under_switch,
)
from nodeagent.cli.options import fleet_arguments
from nodeagent.io.files import one_line, printable
from nodeagent.kube.fields import text, timestamp
from nodeagent.kube.nodeview import read_node
from nodeagent.kube.peercard import read_aside, read_lease
from nodeagent.model.conditions import FABRIC_READY
from nodeagent.model.kube import FW_VERSION, HCA_TYPE, RailsAside, switches_of

# `-o wide`: a column for every registered condition but FabricReady (the FABRIC column).
COLUMNS = tuple(c for c in CONDITIONS if c.type != FABRIC_READY)


@dataclass
class RowRails:
    """A node's rails as the fleet sees them, each map rail -> what is said of it."""

    # its peers passing and probed, from the node's own probes (its Lease)
    peers: dict[str, PeerCount] = field(default_factory=dict)
    switches: dict[str, str] = field(default_factory=dict)  # its switch (LLDP, labels)
    # its switch, where that switch is named for failing outward (switch_faults)
    switch_faults: dict[str, str] = field(default_factory=dict)
    lent: dict[str, str] = field(default_factory=dict)  # the pod holding it (Lease)
    device_taints: dict[str, str] = field(default_factory=dict)  # its rule's reason


@dataclass
class FleetRow:
    node: str
    fabric: str  # FabricReady status, "-" when no agent published it
    reason: str
    conditions: dict[str, dict[str, str]]  # type -> status, reason, message
    tainted: bool
    taint_reason: str
    since: str  # when FabricReady last changed (the taint follows it)
    heartbeat_age: float | None  # seconds since the agent's Lease was renewed
    capacity: int
    allocatable: int
    flags: list[str] = field(default_factory=list)
    rails: RowRails = field(default_factory=RowRails)

    def as_dict(self) -> dict[str, Any]:
        """The row as -o json and -o yaml print it: one flat object (the rails' maps at the
        top level, as they always were)."""
        out = asdict(self)
        out.update(out.pop("rails"))
        return out


_SHOWN = frozenset(c.type for c in CONDITIONS)

DEFAULT_STALE = 180.0  # seconds, for a Lease that states no duration (the agent's default)


def fleet_rows(nodes: Iterable[Any], leases: Iterable[Any],
               resource: str, taint_key: str, now: float, stale_after: float | None,
               taint_older: float) -> list[FleetRow]:
    return fleet_view(nodes, leases, resource, taint_key, now, stale_after, taint_older)[0]


def fleet_view(nodes: Iterable[Any], leases: Iterable[Any],
               resource: str, taint_key: str, now: float, stale_after: float | None,
               taint_older: float) -> tuple[list[FleetRow], list[SwitchFault]]:
    """Rows from the API's objects, and the switches named for their nodes' failures; a
    field of the wrong shape reads as absent, never as a crash (the objects are another
    program's data). An agent is stale past `stale_after`, or by default past its own
    Lease's duration (what it promised when it renewed)."""
    leases = list(leases)
    renewed, holds, aside = _agents(leases)
    rows = []
    firmware: dict[str, tuple[str, str]] = {}  # node -> (HCA type, firmware) from labels
    cells = mesh_cells(leases)
    views = list(map(read_node, nodes))
    faults = switch_faults(cells, {(n.name, rail): switch for n in views
                                   for rail, switch in switches_of(n.labels).items()})
    named, suspect = _blamed(cells, faults)
    counts = peer_counts(cells)
    for node in views:
        name = node.name
        fabric = node.condition(FABRIC_READY)
        taint = node.taint(taint_key)
        since = fabric.last_transition if fabric else ""
        renew = renewed.get(name)
        row = FleetRow(
            node=name, fabric=(fabric.status if fabric else "") or "-",
            reason=fabric.reason if fabric else "",
            conditions={c.type: {"status": c.status, "reason": c.reason, "message": c.message}
                        for c in node.conditions if c.type in _SHOWN},
            tainted=taint is not None, taint_reason=text((taint or {}).get("value")),
            since=since, heartbeat_age=None if renew is None else max(0.0, now - renew),
            capacity=node.capacity.get(resource, 0),
            allocatable=node.allocatable.get(resource, 0))
        limit = stale_after if stale_after is not None else holds.get(name, DEFAULT_STALE)
        if row.heartbeat_age is None or row.heartbeat_age > limit:
            row.flags.append("agent-stale" if renew is not None else "no-agent")
        if row.capacity == 0 or row.allocatable == 0:
            row.flags.append("no-rdma")
        set_aside = aside.get(name, RailsAside())
        row.rails = RowRails(
            peers=counts.get(name, {}), switches=switches_of(node.labels),
            switch_faults=dict(sorted(named.get(name, {}).items())),
            lent=dict(set_aside.lent), device_taints=dict(set_aside.tainted))
        if row.rails.device_taints:
            row.flags.append("device-taint")
        if name in suspect:
            row.flags.append("peer-suspect")
        if row.rails.switch_faults:
            row.flags.append("switch-suspect")
        changed = timestamp(since)
        if row.tainted and changed is not None and now - changed > taint_older:
            row.flags.append("taint-old")
        rows.append(row)
        firmware[row.node] = (node.labels.get(HCA_TYPE, ""), node.labels.get(FW_VERSION, ""))
    for row in rows:
        if firmware_minority(firmware, row.node):
            row.flags.append("fw-minority")
    return sorted(rows, key=lambda r: (not r.flags, r.fabric == "True", r.node)), faults


def _blamed(cells: Sequence[MeshCell], faults: Sequence[SwitchFault]) -> tuple[
        dict[str, dict[str, str]], dict[str, list[str]]]:
    """Node -> rail -> the switch named for it; node -> the rails where the node itself
    is suspect (a node under a switch named for the rail is not: the switch is)."""
    named: dict[str, dict[str, str]] = defaultdict(dict)
    for f in faults:
        for n in f.nodes:
            named[n][f.rail] = f.switch
    suspect = {node: rails for node, got in suspects(cells).items()
               if (rails := [r for r in got if r not in named.get(node, {})])}
    return named, suspect


def _agents(leases: Iterable[Any]) -> tuple[dict[str, float | None], dict[str, float],
                                             dict[str, RailsAside]]:
    """What each agent's Lease says: when it was renewed, for how long it holds, and the
    rails it set aside (by node)."""
    renewed: dict[str, float | None] = {}
    holds: dict[str, float] = {}
    aside: dict[str, RailsAside] = {}
    for raw in leases:
        lease = read_lease(raw)
        if lease is None:
            continue
        renewed[lease.node] = lease.renewed
        if lease.duration is not None:
            holds[lease.node] = lease.duration
        aside[lease.node] = read_aside(raw)
    return renewed, holds, aside


def firmware_minority(firmware: Mapping[str, tuple[str, str]], node: str) -> bool:
    """Whether the node's firmware differs from what most nodes of its HCA type run (from
    the agents' hardware labels; "mixed" or missing labels count for nothing)."""
    hca, fw = firmware.get(node, ("", ""))
    if not hca or not fw or "mixed" in (hca, fw):
        return False
    same = Counter(f for h, f in firmware.values() if h == hca and f and f != "mixed")
    (top, count), *rest = same.most_common()
    tied = bool(rest) and rest[0][1] == count
    return not tied and count > 1 and fw != top


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


def _cell(condition: Mapping[str, str] | None) -> str:
    """A condition in a wide column: its status, and its reason unless True."""
    if not condition or not condition.get("status"):
        return "-"
    status = condition["status"]
    return status if status == "True" else f"{status} {condition.get('reason', '')}".rstrip()


def _pod(holder: str) -> str:
    """A lent rail's holder in a column: the pod's namespace/name ("pod ns/x (claim c)")."""
    words = holder.split()
    return words[1] if len(words) > 1 and words[0] == "pod" else "?"


def render_table(rows: list[FleetRow], now: float, wide: bool = False,
                 color: bool = False, faults: Sequence[SwitchFault] = ()) -> str:
    """The table, then a line for each switch named (once, with its nodes)."""
    table = _table(rows, now, wide, color)
    if not faults:
        return table
    return table + "\n" + "".join(f"{f.words}\n" for f in faults)


def _table(rows: list[FleetRow], now: float, wide: bool, color: bool) -> str:
    head = ["NODE", "FABRIC", "REASON", "TAINT", "SINCE", "HEARTBEAT", "RDMA", "PEERS"]
    if wide:
        head[3:3] = [c.column for c in COLUMNS]
        head += ["SWITCHES", "LENT", "DEVICE-TAINTS"]
    head.append("FLAGS")
    lines = [head]
    for r in rows:
        since = timestamp(r.since)
        line = [r.node, r.fabric, r.reason or "-",
                r.taint_reason if r.tainted else "-",
                _age(None if since is None else now - since), _age(r.heartbeat_age),
                f"{r.allocatable}/{r.capacity}",
                peers_text(r.rails.peers, per_rail=wide)]
        if wide:
            line[3:3] = [_cell(r.conditions.get(c.type)) for c in COLUMNS]
            line += [",".join(f"{k}={v}" for k, v in sorted(rails.items())) or "-"
                     for rails in (r.rails.switches,
                                   {k: _pod(v) for k, v in r.rails.lent.items()},
                                   r.rails.device_taints)]
        line.append(",".join(r.flags) or "-")
        lines.append([printable(cell) for cell in line])  # names and reasons are not ours
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        text = "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        if color and n and rows[n - 1].flags:
            text = f"\033[1;31m{text}\033[0m"  # what needs attention stands out
        out.append(text)
    return "\n".join(out) + "\n"


def render(rows: list[FleetRow], output: str, now: float, color: bool,
           headers: bool = True, faults: Sequence[SwitchFault] = ()) -> str:
    if output in ("json", "yaml"):
        doc = {"apiVersion": "v1", "kind": "List", "metadata": {},
               "items": [r.as_dict() for r in rows]}
        if output == "yaml":
            import yaml

            return str(yaml.safe_dump(doc, sort_keys=False))
        return json.dumps(doc, indent=2) + "\n"
    if output == "name":
        return "".join(f"node/{printable(r.node)}\n" for r in rows)
    table = render_table(rows, now, wide=output == "wide", color=color, faults=faults)
    return table if headers else table.split("\n", 1)[1]


def render_mesh(leases: Iterable[Any], rail: str | None, output: str, color: bool,
                nodes: Iterable[Any] = (), switch: str | None = None) -> str:
    """The mesh: a grid of nodes, or for more than GRID_MAX nodes with their switches
    known (the agents' LLDP labels) the switch x switch summary; `switch` draws the grid
    of the probes from and to one switch's nodes."""
    cells = mesh_cells(leases)
    switch_of = {(n.name, r): sw for n in map(read_node, nodes)
                 for r, sw in switches_of(n.labels).items()}
    if switch is not None:
        cells = under_switch(cells, switch_of, switch)
        if not cells:
            return f"no peer results published for switch {printable(switch)}\n"
    if output in ("json", "yaml"):
        doc = mesh_document(cells, rail)
        if output == "yaml":
            import yaml

            return str(yaml.safe_dump(doc, sort_keys=False))
        return json.dumps(doc, indent=2) + "\n"
    probed = {c.prober for c in cells} | {c.target for c in cells}
    if switch is None and switch_of and len(probed) > GRID_MAX:
        return render_switches(cells, switch_of, rail, color)
    return render_grid(cells, rail, color)


# ---------------------------------------------------------------- reading the API


@dataclass
class FleetSource:
    """Where the rows come from: the API, with the agent's default names."""

    api: Any
    selector: str
    lease_namespace: str
    counters: Any = None

    def __post_init__(self) -> None:
        from nodeagent.kube.api import Counters

        self.counters = self.counters or Counters()

    def list_once(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        from nodeagent.kube.api import call

        query = [("labelSelector", self.selector)] if self.selector else []
        nodes = call(self.api, self.counters, "GET", "/api/v1/nodes", query=query)
        leases = call(self.api, self.counters, "GET",
                      f"/apis/coordination.k8s.io/v1/namespaces/{self.lease_namespace}/leases")
        for what, got in (("nodes", nodes), ("leases", leases)):
            if not isinstance(got.get("items"), list):
                raise ValueError(f"the {what} list has no 'items' list")
        return nodes["items"], leases["items"]

    def watch(self, redraw: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None],
              stop: threading.Event, coalesce: float = 0.5) -> None:
        """Calls `redraw` with the current objects after every burst of changes."""
        from nodeagent.kube.watch import WatchedCollection

        changed = threading.Event()
        query = [("labelSelector", self.selector)] if self.selector else []
        nodes = WatchedCollection(self.api, self.counters, "/api/v1/nodes", query, changed.set)
        leases = WatchedCollection(
            self.api, self.counters,
            f"/apis/coordination.k8s.io/v1/namespaces/{self.lease_namespace}/leases", [],
            changed.set)
        nodes.start()
        leases.start()
        try:
            while not stop.is_set():
                changed.wait(5.0)  # also redraw now and then: ages move on
                stop.wait(coalesce)
                changed.clear()
                (n, n_err), (le, l_err) = nodes.snapshot(), leases.snapshot()
                if n_err or l_err:
                    print(f"fleet: {n_err or l_err}", file=sys.stderr)
                redraw(n, le)
        finally:
            nodes.stop()
            leases.stop()


def run(args: argparse.Namespace, out: Any = None, stop: threading.Event | None = None) -> int:
    from nodeagent.kube.api import user_client

    out = out or sys.stdout
    try:
        api = user_client(args.kubeconfig, args.context, args.request_timeout)
    except Exception as exc:  # no kubeconfig, unreadable, not in a cluster
        print(f"fleet: {one_line(exc, 1000)}", file=sys.stderr)
        return 1
    source = FleetSource(api, args.selector, args.lease_namespace)
    # Colour on a terminal only, and never with NO_COLOR set (no-color.org).
    color = bool(getattr(out, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")

    view = getattr(args, "view", "nodes")
    if view == "mesh" and args.output not in ("table", "json", "yaml"):
        print(f"fleet: mesh is drawn as a table, json or yaml, not {args.output}",
              file=sys.stderr)
        return 2

    def draw(nodes: list[dict[str, Any]], leases: list[dict[str, Any]]) -> None:
        now = time.time()
        if view == "mesh":
            text = render_mesh(leases, getattr(args, "rail", None), args.output, color,
                               nodes, getattr(args, "switch", None))
        else:
            rows, faults = fleet_view(nodes, leases, args.resource, args.taint_key, now,
                                      args.stale_after, args.taint_older)
            text = render(rows, args.output, now, color, headers=not args.no_headers,
                          faults=faults)
        if args.watch and color:
            out.write("\033[H\033[J")  # redraw in place on a terminal
        out.write(text)
        out.flush()

    if not args.watch:
        try:
            objects = source.list_once()
        except Exception as exc:  # refused, 403, bad kubeconfig: one line, not a trace
            from nodeagent.kube.watch import describe

            print(f"fleet: cannot list nodes and leases: {printable(describe(exc))}",
                  file=sys.stderr)
            return 1
        draw(*objects)
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        source.watch(draw, stop or threading.Event())
    return 0


def kubectl_main() -> None:
    """`kubectl fabric ...` (kubectl finds kubectl-fabric on PATH)."""
    p = argparse.ArgumentParser(prog="kubectl fabric", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    fleet_arguments(p)
    sys.exit(run(p.parse_args()))
