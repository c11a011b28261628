"""The flags of `alerts`, `fleet` and `preflight`, apart from their commands: every start
builds the whole parser (the daemon's too), and the daemon need not import the alert
rules, the fleet view or the preflight to say what their flags are."""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from nodeagent.config import parse_duration


@dataclass(frozen=True)
class Windows:
    """How long each state must last before its alert fires (Prometheus durations)."""

    not_ready_for: str = "15m"  # DaemonSet ready < desired
    never_ready_window: str = "1h"  # no pod Ready at any moment in this window ...
    never_ready_for: str = "5m"  # ... and still so after this
    taint_for: str = "30m"  # a node carrying the fabric taint
    lease_stale_after: int = 0  # seconds since the agent's last heartbeat; 0: the Lease's
    #   duration (kubernetes.lease_duration, default 3x lease_period)
    lease_stale_for: str = "2m"
    no_resource_for: str = "10m"  # a fabric node advertising no RDMA resource
    cannot_run_for: str = "5m"  # an agent says the plugin cannot run on its node
    peer_suspect_for: str = "2m"  # most probers of a node fail while the rail is healthy
    switch_suspect_for: str = "2m"  # the nodes under a switch fail most of their probes


def fleet_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("view", nargs="?", choices=["nodes", "mesh"], default="nodes",
                   help="nodes (the default): one row a node; mesh: the peer probes' "
                   "prober x target matrix, from the agents' Leases")
    p.add_argument("--rail", help="mesh: this rail only (default: each rail in turn)")
    p.add_argument("--switch", help="mesh: the probes from and to this switch's nodes (a "
                   "mesh of more than 64 nodes is otherwise summarised by switch)")
    p.add_argument("--kubeconfig", help="kubeconfig, found as kubectl does: this flag, else "
                   "the first existing file in $KUBECONFIG, else ~/.kube/config, else the "
                   "in-cluster service account")
    p.add_argument("--context", help="the kubeconfig context to use (default: its current)")
    p.add_argument("-l", "--selector", default="",
                   help="label selector of the fabric nodes (default: every node)")
    p.add_argument("-o", "--output", choices=["table", "wide", "json", "yaml", "name"],
                   default="table", help="json and yaml: a v1 List of rows; name: node/<name>")
    p.add_argument("--no-headers", action="store_true", help="tables without the header line")
    p.add_argument("-w", "--watch", action="store_true", help="redraw on every change")
    p.add_argument("--resource", default="rdma/rdma_shared_device_a",
                   help="the RDMA extended resource")
    p.add_argument("--taint-key", default="nodeagent.io/fabric-unready")
    p.add_argument("--lease-namespace", default="nodeagent-system")
    p.add_argument("--stale-after", type=float, default=None, metavar="SECONDS",
                   help="flag an agent heartbeat older than this (default: each agent's own "
                   "Lease duration, leaseDurationSeconds)")
    p.add_argument("--taint-older", type=float, default=1800.0, metavar="SECONDS",
                   help="flag a taint older than this")
    p.add_argument("--request-timeout", type=parse_duration, default=15.0, metavar="DURATION",
                   help="one API request in all, reply included (default 15s)")


def preflight_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verdict", choices=["status", "api"], default="status",
                   help="where the node's verdict comes from: the agent's status file "
                   "(default; mount the host's runtime dir read-only) or the Node, read "
                   "with the pod's own token (needs get on nodes)")
    p.add_argument("--runtime-dir", default="/run/nodeagent", type=Path,
                   help="the host agent's runtime dir as mounted in this container")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name, for --verdict api (default: $NODE_NAME, from "
                   "the downward API's spec.nodeName)")
    p.add_argument("--resource", default="rdma/rdma_shared_device_a",
                   help="the RDMA resource named in the fix for a missing device")
    p.add_argument("--lustre", action="append", default=None, metavar="PATH",
                   help="a Lustre mount the job needs (repeat; default: the agent's own "
                   "lustre list from its status file)")
    p.add_argument("--statfs-timeout", type=parse_duration, default=5.0, metavar="DURATION")
    p.add_argument("--peers", default=os.environ.get("NODEAGENT_PEERS", ""),
                   help="the gang's pods in rank order, comma-separated stable names "
                   "(e.g. train-0.train,train-1.train) or a pattern with {index} and "
                   "--size (default: $NODEAGENT_PEERS)")
    p.add_argument("--size", type=int, default=env_int("NODEAGENT_GANG_SIZE", 0),
                   help="the gang's size, with a --peers pattern")
    p.add_argument("--index", type=int, default=env_int("JOB_COMPLETION_INDEX", -1),
                   help="this pod's rank (default: $JOB_COMPLETION_INDEX)")
    p.add_argument("--gang-port", type=port, default=18601, help="the barrier's TCP port")
    p.add_argument("--gang-bind", type=ipv4, default=os.environ.get("POD_IP") or "0.0.0.0",
                   metavar="ADDRESS", help="where this pod serves its card and fetches the "
                   "others' from (default: $POD_IP, from the downward API's status.podIP; "
                   "else every address of the pod)")
    p.add_argument("--probe-port", type=port, default=18602,
                   help="this pod's responder for its neighbour's RoCE probe")
    p.add_argument("--barrier-timeout", type=parse_duration, default=60.0,
                   metavar="DURATION", help="how long to wait for the whole gang")
    p.add_argument("--probe-timeout", type=parse_duration, default=2.0, metavar="DURATION")
    p.add_argument("--allow-partial-rails", action="store_true",
                   help="pass a job whose NCCL settings use only some of the rails (by "
                   "default that is refused: it trains at a fraction of the bandwidth)")
    p.add_argument("--claims", action="store_true",
                   help="DRA: read this pod's ResourceClaims with its own token ($POD_NAME, "
                   "$POD_NAMESPACE from the downward API; the nodeagent-preflight "
                   "ClusterRole): each allocated NIC in the container with RDMA and used "
                   "by NCCL, each GPU on a NIC's PCIe root or NUMA node; the rails judged "
                   "are the allocated NICs'")
    p.add_argument("--nic-driver", default="dra.net",
                   help="with --claims: the DRA driver whose devices are the NICs")
    p.add_argument("--allow-unaligned", action="store_true",
                   help="with --claims: pass a GPU with no allocated NIC on its PCIe root "
                   "or NUMA node")
    p.add_argument("--termination-log", default="/dev/termination-log", type=Path,
                   help="where the kubelet reads the termination message")
    p.add_argument("--dev", default="/dev", type=Path, help="root of the device nodes")
    p.add_argument("--sysfs", default="/sys", type=Path)
    p.add_argument("--procfs", default="/proc", type=Path)


def port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise ValueError(text)  # argparse names the function: "invalid port value: '70000'"
    return value


def ipv4(text: str) -> str:
    return str(ipaddress.IPv4Address(text))


ipv4.__name__ = "IPv4 address"


def env_int(name: str, default: int) -> int:
    """An integer from the environment; a value that is not one is left to argparse's
    own check of the flag (it says which)."""
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default
