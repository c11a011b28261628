"""`nodeagent preflight`: run as an init container of each training pod, it refuses to let
the pod start when the job's traffic would not use the fabric. Exit 0 fit, 1 not fit, 2
usage; one line per problem on stderr and the same lines in the container's termination
message (what `kubectl describe pod` shows), each saying what to change.

Checks (checks/preflight.py): the rails' RDMA devices are in the container (their uverbs
nodes open); the node's agent says FabricReady=True (its status file, mounted read-only
from the host: the default, no API request per pod; or the Node through the API with the
pod's own token); the Lustre mounts the job needs answer a bounded statfs (in a child
process: a hung mount never hangs the init container); NCCL, given this environment and
this container's view of the RDMA ports, would use every rail at its IPv4 RoCE v2 GID
(checks/nccl.py); with `--claims` (DRA), the NICs this pod's ResourceClaims hold are in
the container with RDMA and used by NCCL, and each allocated GPU shares a NIC's PCIe root
or NUMA node (the slices' attributes); and with `--peers`, the gang (cli/gang.py): all pods
at a barrier, then each rail's RoCE probe of the next pod. Fit, the termination message
says what NCCL will use (devices, GIDs, traffic class).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodeagent.checks.preflight import PreflightFacts, class_notes, judge_preflight
from nodeagent.io.files import NotARegularFile, printable, write_regular
from nodeagent.kube.nodeview import read_node
from nodeagent.model.conditions import FABRIC_READY
from nodeagent.model.jobs import AllocatedDevice, NodeRail, NodeVerdict, PodAllocation, Unfit

TERMINATION_MAX = 4096  # the kubelet keeps this much of a termination message
EXIT_FIT, EXIT_UNFIT, EXIT_USAGE = 0, 1, 2


def peer_names(spec: str, size: int) -> list[str]:
    """`a,b,c`, or a pattern with {index} expanded `size` times; ValueError when neither."""
    from nodeagent.cli.gang import MAX_GANG

    if not 0 <= size <= MAX_GANG:
        raise ValueError(f"--size {size} is not a gang size (1 to {MAX_GANG})")
    if "{index}" in spec:
        if size < 1:
            raise ValueError("--peers is a pattern: give --size (or $NODEAGENT_GANG_SIZE)")
        return [spec.replace("{index}", str(i)) for i in range(size)]
    names = [n.strip() for n in spec[:MAX_GANG * 254].split(",") if n.strip()]
    if len(names) > MAX_GANG:
        raise ValueError(f"--peers names more than {MAX_GANG} pods")
    if size and size != len(names):
        raise ValueError(f"--size {size}, but --peers names {len(names)} pods")
    return names


def verdict_from_status(runtime_dir: Path) -> NodeVerdict:
    """The agent's own word, from its status file; its problems fail the preflight."""
    from nodeagent.publish.status import read_status, stale_after, status_path

    path = status_path(runtime_dir)
    try:
        view = read_status(runtime_dir, math.inf)
    except FileNotFoundError:
        return NodeVerdict(problem=f"no agent status at {path}: mount the host's "
                           f"{runtime_dir} read-only, or use --verdict api")
    except (OSError, ValueError) as exc:
        return NodeVerdict(problem=f"{path}: {printable(str(exc))[:300]}")
    doc = view.doc
    # Stale as `nodeagent status` judges it, by the interval the file says.
    view = replace(view, stale=view.age > stale_after(doc.resync_interval))
    rails = tuple(NodeRail(r.name, r.address, r.rdma_device, r.rdma_port, r.gid_index_pinned,
                           r.classes) for r in doc.rails)
    fabric = doc.condition(FABRIC_READY)
    if view.problem is not None:
        return NodeVerdict(doc.node, rails=rails, lustre=doc.lustre,
                           problem=f"the node's agent: {view.problem}")
    if fabric is None:
        return NodeVerdict(doc.node, rails=rails, lustre=doc.lustre,
                           problem="the agent's status has no FabricReady")
    return NodeVerdict(doc.node, fabric.status == "True", fabric.reason, fabric.message[:500],
                       rails, doc.lustre)


def verdict_from_api(node: str) -> NodeVerdict:
    """FabricReady from the Node, with the pod's own service-account token."""
    from nodeagent.kube.api import Counters, api_error_text, call, incluster_client

    if not node:
        return NodeVerdict(problem="--verdict api needs the node's name: --node or $NODE_NAME "
                           "(env from fieldRef spec.nodeName)")
    try:
        got = call(incluster_client(10.0), Counters(), "GET", f"/api/v1/nodes/{node}")
    except Exception as exc:  # not in a pod, 403, API down: one line, fail closed
        return NodeVerdict(node, problem=f"reading Node {node}: {api_error_text(exc)}")
    fabric = read_node(got).condition(FABRIC_READY)
    if fabric is None:
        return NodeVerdict(node, problem=f"Node {node} has no FabricReady condition (no "
                           "nodeagent on it?)")
    return NodeVerdict(node, fabric.status == "True", fabric.reason, fabric.message[:500])


def allocation_from_api(namespace: str, pod: str, node: str, api: Any = None) -> PodAllocation:
    """The devices this pod's ResourceClaims hold, each with its attributes from this
    node's ResourceSlices; read with the pod's own token (the nodeagent-preflight
    ClusterRole: get on pods and resourceclaims, list on resourceslices)."""
    from nodeagent.kube.api import Counters, api_error_text, call, incluster_client
    from nodeagent.kube.claims import allocated, node_pods
    from nodeagent.kube.fields import obj, text
    from nodeagent.kube.slices import node_devices

    if not namespace or not pod:
        return PodAllocation(problem="--claims needs this pod's name and namespace: "
                             "$POD_NAME and $POD_NAMESPACE (env from fieldRef metadata.name "
                             "and metadata.namespace)")
    counters = Counters()
    try:
        api = api or incluster_client(10.0)
        got = call(api, counters, "GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
        node = node or text(obj(got.get("spec")).get("nodeName"))
        _, held = node_pods([got])
        refs = []
        for claim in held[0].claims if held else ():
            ns, name = claim.split("/", 1)
            body = call(api, counters, "GET",
                        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
            refs += [(claim, d) for d in allocated(body)]
        if not refs:
            return PodAllocation()
        listed = call(api, counters, "GET", "/apis/resource.k8s.io/v1/resourceslices",
                      query=[("fieldSelector", f"spec.nodeName={node}")]).get("items")
        slices = listed if isinstance(listed, list) else []
    except Exception as exc:  # not in a pod, 403, API down: one line, fail closed
        return PodAllocation(problem=printable(api_error_text(exc))[:300])
    attributes = {(driver, d.pool, d.name): d.attributes
                  for driver in {ref.driver for _, ref in refs}
                  for d in node_devices(slices, node, driver).devices}
    return PodAllocation(tuple(
        AllocatedDevice(claim, ref, attributes.get((ref.driver, ref.pool, ref.device), {}))
        for claim, ref in refs))


def statfs_all(paths: list[str], procfs: Path, timeout: float) -> dict[str, str | None]:
    """Each path mounted in this container and answering a statfs within `timeout`
    (the agent's hang-safe child-process probe)."""
    from nodeagent.io.commands import BoundedRunner
    from nodeagent.probes.lustre import read_mountinfo, statfs_argv

    entries, _ = read_mountinfo(procfs)
    mounted = {e.mountpoint for e in entries}
    runner = BoundedRunner()
    out: dict[str, str | None] = {}
    for path in paths:
        if path not in mounted:
            out[path] = "not mounted in this container: add it to the pod's volumes"
            continue
        got = runner.run(f"statfs:{path}", statfs_argv(path), timeout)
        out[path] = None if got.done and got.ok else (
            f"statfs did not answer within {timeout:g}s (hung mount)" if not got.done
            else f"statfs failed: {got.output.strip()[:200]}")
    return out


def nccl_environment(env: dict[str, str], root: Path = Path("/")) -> dict[str, str]:
    """The environment NCCL will see: this one, with its conf files filling what is unset
    ($NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf, under `root`; src/misc/param.cc
    `initEnvFunc`). A file that cannot be read is skipped, as NCCL skips it."""
    from nodeagent.checks.nccl import with_conf_files
    from nodeagent.io.files import read_text_bounded

    user = env.get("NCCL_CONF_FILE") or (f"{env['HOME']}/.nccl.conf" if env.get("HOME")
                                         else "")
    texts = []
    for path in (user, "/etc/nccl.conf"):
        if not path:
            continue
        try:
            texts.append(read_text_bounded(root / path.lstrip("/"), 1 << 16,
                                           errors="replace"))
        except OSError:
            continue
    return with_conf_files(env, texts)


def container_network() -> tuple[list[str] | None, list[str]]:
    """This container's running interfaces and IPv4 addresses; (None, []) when netlink
    cannot say (then NCCL_SOCKET_IFNAME is not judged)."""
    from nodeagent.probes.container import read_interfaces

    try:
        return read_interfaces()
    except Exception:  # no netlink in a locked-down container: judge the rest
        return None, []


def report(problems: list[Unfit], termination_log: Path, fit: str = "") -> None:
    lines = [f"preflight: {printable(u.line())}" for u in problems]
    for line in lines:
        print(line, file=sys.stderr)
    text = ("\n".join(lines) + "\n" if lines else
            f"preflight: fit{f' ({printable(fit)})' if fit else ''}\n")
    if termination_log.parent.is_dir():
        try:
            write_regular(termination_log, text.encode()[:TERMINATION_MAX])
        except OSError as exc:
            why = "not a regular file" if isinstance(exc, NotARegularFile) else {
                errno.ELOOP: "it is a symbolic link",
                errno.ENXIO: "not a regular file"}.get(exc.errno or 0, exc.strerror)
            print(f"preflight: cannot write {termination_log}: {why}", file=sys.stderr)



def run(args: argparse.Namespace) -> int:
    try:
        peers = peer_names(args.peers, args.size) if args.peers else []
        if peers and not 0 <= args.index < len(peers):
            raise ValueError(f"--index {args.index} is not a rank of the {len(peers)} pods "
                             "(default: $JOB_COMPLETION_INDEX)")
    except ValueError as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from nodeagent.probes.container import read_port_views, read_verbs_devices

    started = time.monotonic()
    verdict = verdict_from_status(args.runtime_dir)
    if args.verdict == "api":
        local = verdict
        verdict = verdict_from_api(args.node)
        # The rails and mounts still come from the status file when it is mounted.
        verdict = NodeVerdict(verdict.node, verdict.ready, verdict.reason, verdict.message,
                              local.rails, local.lustre, verdict.problem)
    mounts = args.lustre if args.lustre is not None else list(verdict.lustre)
    interfaces, addresses = container_network()
    facts = PreflightFacts(verdict, read_verbs_devices(args.dev, args.sysfs),
                           nccl_environment(dict(os.environ)),
                           statfs_all(mounts, args.procfs, args.statfs_timeout),
                           args.resource, read_port_views(args.sysfs), interfaces, addresses,
                           args.allow_partial_rails,
                           allocation_from_api(os.environ.get("POD_NAMESPACE", ""),
                                               os.environ.get("POD_NAME", ""), verdict.node
                                               or args.node) if args.claims else None,
                           args.nic_driver, args.allow_unaligned)
    problems = judge_preflight(facts)
    if len(peers) > 1:
        from nodeagent.cli.gang import GangCard, run_gang

        card = GangCard(args.index, verdict.node or os.uname().nodename, facts.rails())
        # The ring is probed in the class the job's NCCL will use.
        _, gang = run_gang(card, peers, args.gang_port, args.probe_port,
                           started + args.barrier_timeout, args.probe_timeout,
                           bind=args.gang_bind, klass=facts.plan().env.traffic)
        problems += gang
    report(problems, args.termination_log, "; ".join([facts.plan().summary(),
                                                      *class_notes(facts)]))
    return EXIT_UNFIT if problems else EXIT_FIT
