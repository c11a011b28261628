"""The publisher against a real kube-apiserver: conditions, taint, cordon, Events, Lease,
conflicts, races, restarts, and what the admission policy lets an agent do."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.checks.conditions import CONDITION_TYPES
from nodeagent.config import Kubernetes
from nodeagent.model.conditions import FABRIC_READY, ROCE_NETWORK_READY, Finding
from nodeagent.model.status import Report, Status
from nodeagent.publish.kube import NodeWriter
from nodeagent.publish.publisher import Publisher
from tests.kit.apiserver import ApiServer, node_json
from tests.kit.helpers import wait_for

KEY = "nodeagent.io/fabric-unready"
MERGE = "application/merge-patch+json"


def report(node: str, failing: str | None = None,
           labels: dict[str, str] | None = None) -> Status:
    """A pass's snapshot as the daemon hands it to the publisher."""
    findings = []
    for ctype in CONDITION_TYPES:
        if ctype == FABRIC_READY:
            continue
        if failing and ctype == ROCE_NETWORK_READY:
            findings.append(Finding(ctype, "False", failing, f"rail0 ens1f0: {failing}"))
        else:
            findings.append(Finding(ctype, "True", "Fine", "all good"))
    fabric = (Finding(FABRIC_READY, "False", failing, f"RoCENetworkReady=False ({failing})")
              if failing else Finding(FABRIC_READY, "True", "AllConditionsPassed", "ok"))
    return Status(Report(node=node, findings=[*findings, fabric], labels=dict(labels or {})))


def kcfg(**patch: Any) -> Kubernetes:
    base: dict[str, Any] = {"clear_after": 0.5, "lease_period": 1.0, "event_burst": 100,
                            "event_rate": 100.0}
    return Kubernetes(**{**base, **patch})


@pytest.fixture
def publisher(apiserver: ApiServer) -> Iterator[Callable[..., Publisher]]:
    started: list[Publisher] = []

    def make(node: str = "node-a", identity: str | None = None, **cfg: Any) -> Publisher:
        conf = kcfg(**cfg)
        ident = identity or f"agent-{node}"
        pub = Publisher(conf, lambda: NodeWriter(apiserver.client(ident), node, conf))
        pub.start()
        started.append(pub)
        return pub

    yield make
    for pub in started:
        pub.stop()


def taints(core: k8s.CoreV1Api, node: str) -> list[dict[str, Any]]:
    """The Node's taints, less the ones the API server's own admission adds (not-ready)."""
    found = node_json(core, node).get("spec", {}).get("taints") or []
    return [t for t in found if not t["key"].startswith("node.kubernetes.io/")]


def conditions(core: k8s.CoreV1Api, node: str) -> dict[str, dict[str, Any]]:
    conds = node_json(core, node).get("status", {}).get("conditions") or []
    return {c["type"]: c for c in conds}


def our_taint(core: k8s.CoreV1Api, node: str) -> dict[str, Any] | None:
    return next((t for t in taints(core, node) if t["key"] == KEY), None)


def events(core: k8s.CoreV1Api, node: str) -> list[Any]:
    items = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}").items
    return [e for e in items if e.source and e.source.component == "nodeagent"]


def kubelet_ready(apiserver: ApiServer, node: str, message: str, as_node: str = "") -> None:
    kubelet = k8s.CoreV1Api(apiserver.client(f"kubelet-{as_node or node}"))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kubelet.patch_node_status(node, {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady", "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
        _content_type="application/strategic-merge-patch+json")


BOOT = {"key": KEY, "value": "AgentStarting", "effect": "NoSchedule"}
FOREIGN_1 = {"key": "example.com/first", "value": "a", "effect": "NoSchedule"}
FOREIGN_2 = {"key": "example.com/last", "effect": "NoExecute"}


def test_conditions_taint_and_events_follow_findings(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a", [FOREIGN_1, BOOT, FOREIGN_2])  # registered fail-closed
    kubelet_ready(apiserver, node, "kubelet is posting ready status")
    pub = publisher(node)
    pub.submit(report(node))
    wait_for(lambda: our_taint(core, node) is None, what="boot taint lifted after dwell")
    assert [t["key"] for t in taints(core, node)] == [FOREIGN_1["key"], FOREIGN_2["key"]]
    # The publisher lifts the taint first, then patches the conditions (publisher.py
    # _sync_node): a read between the two saw none of them (a CI rehearsal did).
    conds = wait_for(lambda: (c := conditions(core, node)) and all(
        t in c for t in CONDITION_TYPES) and c, what="the conditions patched after the taint")
    assert {t: conds[t]["status"] for t in CONDITION_TYPES} == dict.fromkeys(CONDITION_TYPES,
                                                                             "True")
    assert conds["Ready"]["message"] == "kubelet is posting ready status"
    gid_transition = conds["RoCEGIDStable"]["lastTransitionTime"]

    pub.submit(report(node, failing="AddressMissing"))
    wait_for(lambda: our_taint(core, node) is not None, what="taint on failure")
    assert our_taint(core, node) == {"key": KEY, "value": "AddressMissing",
                                     "effect": "NoSchedule"}
    assert [t["key"] for t in taints(core, node)] == [FOREIGN_1["key"], FOREIGN_2["key"], KEY]
    wait_for(lambda: conditions(core, node).get("FabricReady", {}).get("status") == "False",
             what="FabricReady False")
    conds = conditions(core, node)
    assert conds["RoCENetworkReady"]["reason"] == "AddressMissing"
    assert conds["RoCENetworkReady"]["message"] == "rail0 ens1f0: AddressMissing"
    assert conds["RoCEGIDStable"]["lastTransitionTime"] == gid_transition  # it stayed True
    # Events follow the writes they describe: wait for them rather than race them
    wanted = {"FabricReadyFailed", "RoCENetworkReadyFailed", "FabricTaint"}
    wait_for(lambda: wanted <= {e.reason for e in events(core, node)}, what=f"Events {wanted}")
    lease = k8s.CoordinationV1Api(apiserver.client("admin")).read_namespaced_lease(
        f"nodeagent-{node}", "nodeagent-system")
    assert lease.spec.holder_identity == node


def test_taint_is_lifted_only_after_clear_after(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a", [BOOT])
    pub = publisher(node, clear_after=3.0)
    pub.submit(report(node, failing="NoCarrier"))
    wait_for(lambda: (our_taint(core, node) or {}).get("value") == "NoCarrier", what="taint")
    healthy_at = time.monotonic()
    pub.submit(report(node))
    wait_for(lambda: conditions(core, node).get("FabricReady", {}).get("status") == "True",
             what="FabricReady True")
    assert our_taint(core, node) is not None, "lifted before clear_after"
    wait_for(lambda: our_taint(core, node) is None, timeout=15, what="taint lifted")
    assert time.monotonic() - healthy_at >= 3.0


def test_restart_keeps_transition_times_and_does_not_flap(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a", [BOOT])
    first = publisher(node)
    first.submit(report(node, failing="LinkFlapping"))
    wait_for(lambda: (our_taint(core, node) or {}).get("value") == "LinkFlapping", what="taint")
    wait_for(lambda: conditions(core, node).get("FabricReady", {}).get("status") == "False",
             what="cond")
    first.stop()  # joins its thread: every Event it meant to write is written
    before = conditions(core, node)
    n_events = len(events(core, node))

    second = publisher(node, clear_after=2.0)
    second.submit(report(node, failing="LinkFlapping"))
    time.sleep(1.0)
    after = conditions(core, node)
    for ctype in CONDITION_TYPES:
        assert after[ctype]["lastTransitionTime"] == before[ctype]["lastTransitionTime"]
    assert len(events(core, node)) == n_events  # a restart is not news
    assert our_taint(core, node) is not None
    second.submit(report(node))
    wait_for(lambda: our_taint(core, node) is None, what="lifted after healthy + dwell")


def test_concurrent_taint_writer_loses_nothing(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a", [BOOT])
    pub = publisher(node, clear_after=0.0)
    other = k8s.CoreV1Api(apiserver.client("admin"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def rmw(change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
        while True:
            n = node_json(other, node)
            body = {"metadata": {"resourceVersion": n["metadata"]["resourceVersion"]},
                    "spec": {"taints": change(list(n["spec"].get("taints") or []))}}
            try:
                other.patch_node(node, body, _content_type=MERGE)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def other_writer() -> None:
        try:
            for i in range(40):
                rmw(lambda ts, i=i: [*ts, {"key": f"other.io/k{i}", "effect": "NoSchedule"}])
                if i % 2 == 0:
                    rmw(lambda ts, i=i: [t for t in ts if t["key"] != f"other.io/k{i}"])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            stop.set()

    writer = threading.Thread(target=other_writer)
    writer.start()
    flips = 0
    while not stop.is_set():
        pub.submit(report(node, failing="RuleMissing" if flips % 2 == 0 else None))
        flips += 1
        time.sleep(0.02)
    writer.join()
    assert not errors, errors
    pub.submit(report(node, failing="RuleMissing"))
    wait_for(lambda: (our_taint(core, node) or {}).get("value") == "RuleMissing", what="ours")
    theirs = [t["key"] for t in taints(core, node) if t["key"].startswith("other.io/")]
    assert theirs == [f"other.io/k{i}" for i in range(1, 40, 2)]
    assert pub.writer is not None
    print(f"flips={flips} conflicts={pub.writer.counters.conflicts}")


def test_kubelet_status_writes_racing_ours_lose_no_condition(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a")
    pub = publisher(node)
    for i in range(40):
        kubelet_ready(apiserver, node, f"heartbeat {i}")
        pub.submit(report(node, failing="MTUMismatch" if i % 2 else None))
    pub.submit(report(node, failing="MTUMismatch"))
    wait_for(lambda: conditions(core, node).get("RoCENetworkReady", {}).get("reason")
             == "MTUMismatch", what="our last state")
    conds = conditions(core, node)
    assert conds["Ready"]["message"] == "heartbeat 39"
    assert set(CONDITION_TYPES) <= set(conds)


def test_admin_cordon_is_never_lifted(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a")
    core.patch_node(node, {"spec": {"unschedulable": True}})  # an admin's kubectl cordon
    pub = publisher(node, cordon=True)
    pub.submit(report(node, failing="NoCarrier"))
    wait_for(lambda: our_taint(core, node) is not None, what="taint")
    pub.submit(report(node))
    wait_for(lambda: our_taint(core, node) is None, what="taint lifted")
    n = node_json(core, node)
    assert n["spec"]["unschedulable"] is True
    assert "nodeagent.io/cordoned" not in (n["metadata"].get("annotations") or {})


def test_admin_cordon_during_a_fault_is_never_lifted(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a")
    pub = publisher(node)  # taint only: the cordon is the admin's business
    pub.submit(report(node, failing="RouteMissing"))
    wait_for(lambda: our_taint(core, node) is not None, what="taint")
    core.patch_node(node, {"spec": {"unschedulable": True}})  # admin drains during the fault
    pub.submit(report(node))
    wait_for(lambda: our_taint(core, node) is None, what="taint lifted")
    time.sleep(0.5)
    assert node_json(core, node)["spec"]["unschedulable"] is True


def test_agent_cordon_is_set_with_a_reason_and_lifted(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a")
    pub = publisher(node, cordon=True)
    pub.submit(report(node, failing="GIDIndexShifted"))
    wait_for(lambda: node_json(core, node)["spec"].get("unschedulable") is True, what="cordon")
    n = node_json(core, node)
    assert n["metadata"]["annotations"]["nodeagent.io/cordoned"] == "GIDIndexShifted"
    pub.submit(report(node))
    wait_for(lambda: not node_json(core, node)["spec"].get("unschedulable"), what="uncordon")
    assert "nodeagent.io/cordoned" not in (node_json(core, node)["metadata"].get("annotations")
                                          or {})


def forbidden(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status in (403, 422), info.value
    return str(info.value.body)


def test_identities_are_limited_to_their_own_node(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
) -> None:
    a, b = fresh_node("node-a", [FOREIGN_1]), fresh_node("node-b")
    agent_a = k8s.CoreV1Api(apiserver.client("agent-node-a"))
    body = {"spec": {"taints": [{"key": KEY, "value": "x", "effect": "NoSchedule"}]}}
    assert "may only change its own Node" in forbidden(
        lambda: agent_a.patch_node(b, body, _content_type=MERGE))
    assert "may only add, change or remove its taint nodeagent.io/fabric-unready" in forbidden(
        lambda: agent_a.patch_node(a, {"spec": {"taints": []}}, _content_type=MERGE))
    status = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "X",
                                         "message": "spoofed"}]}}
    assert "only write its own condition types" in forbidden(
        lambda: agent_a.patch_node_status(a, status,
                                          _content_type="application/strategic-merge-patch+json"))
    assert "labels under nodeagent.io/" in forbidden(
        lambda: agent_a.patch_node(a, {"metadata": {"labels": {"team": "x"}}},
                                   _content_type=MERGE))
    # What it may do: its own taint, its own label prefix.
    current = node_json(core, a)["spec"]["taints"]  # with the API server's not-ready taint
    agent_a.patch_node(a, {"spec": {"taints": [*current, body["spec"]["taints"][0]]}},
                       _content_type=MERGE)
    assert our_taint(core, a) == {"key": KEY, "value": "x", "effect": "NoSchedule"}
    agent_a.patch_node(a, {"metadata": {"labels": {"nodeagent.io/hca": "mt4129"}}},
                       _content_type=MERGE)
    # Events and Leases: only about itself.
    event = {"metadata": {"generateName": "x."}, "reason": "R", "message": "m",
             "involvedObject": {"kind": "Node", "name": b}}
    assert "Events about its own Node" in forbidden(
        lambda: agent_a.create_namespaced_event("default", event))  # type: ignore[arg-type]
    coord = k8s.CoordinationV1Api(apiserver.client("agent-node-a"))
    lease = {"metadata": {"name": f"nodeagent-{b}"}, "spec": {"holderIdentity": b}}
    assert "its own Lease" in forbidden(
        lambda: coord.create_namespaced_lease("nodeagent-system", lease))  # type: ignore[arg-type]
    # The kubelet keeps its own rights (Node authorizer), and only for its own node.
    kubelet_ready(apiserver, a, "still mine")
    forbidden(lambda: kubelet_ready(apiserver, b, "not mine", as_node=a))
    # Someone outside the agent group gets nothing.
    stranger = k8s.CoreV1Api(apiserver.client("stranger"))
    forbidden(lambda: stranger.patch_node(a, body, _content_type=MERGE))


def test_token_without_rights_is_a_clear_error_not_a_crash(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a", [BOOT])
    pub = publisher(node, identity="stranger")
    pub.submit(report(node))
    wait_for(lambda: pub.state.last_error is not None, what="an error recorded")
    assert "403" in pub.state.last_error or "Forbidden" in pub.state.last_error  # type: ignore[operator]
    assert pub.is_alive() and pub.state.synced is False
    assert our_taint(core, node) is not None  # nothing lifted by a failed writer


def test_event_storm_is_rate_limited(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
) -> None:
    node = fresh_node("node-c")
    conf = kcfg(event_burst=3, event_rate=0.01)
    writer = NodeWriter(apiserver.client("agent-node-c"), node, conf)
    sent = [writer.event(None, "Storm", f"event {i}", True) for i in range(20)]
    assert sent.count(True) == 3 and writer.counters.events_dropped == 17
    assert len([e for e in events(core, node) if e.reason == "Storm"]) == 3


def test_bound_service_account_token_is_limited_to_its_node(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
) -> None:
    """A token bound to a Node carries the node-name extra; the policy goes by it."""
    a, b = fresh_node("node-a"), fresh_node("node-b")
    try:
        core.create_namespaced_service_account(
            "nodeagent-system", {"metadata": {"name": "agent"}})  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status != 409:
            raise
    uid = node_json(core, a)["metadata"]["uid"]
    token = core.create_namespaced_service_account_token("agent", "nodeagent-system", {
        "spec": {"audiences": [], "expirationSeconds": 3600,
                 "boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": a, "uid": uid}},
    }).status.token  # type: ignore[arg-type]
    conf = apiserver.configuration("admin")
    conf.api_key = {"authorization": token}
    sa = k8s.CoreV1Api(k8s.ApiClient(conf))
    current = node_json(core, a)["spec"].get("taints") or []
    mine = {"key": KEY, "value": "x", "effect": "NoSchedule"}
    sa.patch_node(a, {"spec": {"taints": [*current, mine]}}, _content_type=MERGE)
    assert our_taint(core, a) == mine
    assert "may only change its own Node" in forbidden(
        lambda: sa.patch_node(b, {"spec": {"taints": [mine]}}, _content_type=MERGE))


def test_hardware_fingerprint_labels_follow_the_hardware(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    """Set when seen, changed when they change, removed when gone; labels of others (and
    other nodeagent.io/ labels) untouched; an unchanged fingerprint writes nothing."""
    node = fresh_node("node-a")
    core.patch_node(node, {"metadata": {"labels": {"team": "ml", "nodeagent.io/pool": "a"}}},
                    _content_type=MERGE)
    pub = publisher(node, lease_period=3600.0)  # no heartbeat writes in the way
    labels = {"nodeagent.io/rdma-hca-type": "MT4129", "nodeagent.io/rdma-fw-version":
              "28.39.1002", "nodeagent.io/rdma-driver": "mlx5_core"}

    def node_labels() -> dict[str, str]:
        found: dict[str, str] = node_json(core, node)["metadata"].get("labels") or {}
        return found

    pub.submit(report(node, labels=labels))
    wait_for(lambda: all(node_labels().get(k) == v for k, v in labels.items()), what="labels")
    wait_for(lambda: our_taint(core, node) is None, what="the boot taint lifted")
    time.sleep(0.5)
    writes = pub.status().writes
    for _ in range(3):
        pub.submit(report(node, labels=labels))
    time.sleep(1.0)
    assert pub.status().writes == writes, "an unchanged fingerprint writes nothing"
    upgraded = {**labels, "nodeagent.io/rdma-fw-version": "28.40.1000"}
    del upgraded["nodeagent.io/rdma-driver"]
    pub.submit(report(node, labels=upgraded))
    wait_for(lambda: node_labels().get("nodeagent.io/rdma-fw-version") == "28.40.1000",
             what="the firmware upgrade")
    got = node_labels()
    assert "nodeagent.io/rdma-driver" not in got
    assert got["team"] == "ml" and got["nodeagent.io/pool"] == "a"
    # the Event follows the label patch: wait for it rather than race it
    wait_for(lambda: any(e.reason == "HardwareFingerprint" and "28.40.1000" in e.message
                         for e in events(core, node)), what="the HardwareFingerprint Event")


def test_each_rails_switch_label_follows_lldp_and_a_gone_rail_loses_its_own(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    """nodeagent.io/switch-<rail>, through NodeRestriction and the admission policy: set,
    moved when the rail's switch changes, removed when its rail no longer reports one; an
    admin's other nodeagent.io/ label is left alone."""
    node = fresh_node("node-a")
    core.patch_node(node, {"metadata": {"labels": {"nodeagent.io/pool": "a"}}},
                    _content_type=MERGE)
    pub = publisher(node, lease_period=3600.0)

    def node_labels() -> dict[str, str]:
        found: dict[str, str] = node_json(core, node)["metadata"].get("labels") or {}
        return found

    both = {"nodeagent.io/switch-rail0": "leaf-07-r0", "nodeagent.io/switch-rail1": "leaf-07-r1"}
    pub.submit(report(node, labels=both))
    wait_for(lambda: all(node_labels().get(k) == v for k, v in both.items()), what="labels")
    pub.submit(report(node, labels={"nodeagent.io/switch-rail0": "leaf-09-r0"}))
    wait_for(lambda: node_labels().get("nodeagent.io/switch-rail0") == "leaf-09-r0",
             what="rail0 recabled")
    got = node_labels()
    assert "nodeagent.io/switch-rail1" not in got and got["nodeagent.io/pool"] == "a"


def plain_update(core: k8s.CoreV1Api, node: str,
                 change: Callable[[dict[str, Any]], None]) -> None:
    """What `kubectl taint` or an admin's script does without care: read, change, write back
    with no resourceVersion precondition (last writer wins)."""
    n = node_json(core, node)
    change(n)
    body = {"spec": {k: n["spec"].get(k) for k in ("taints", "unschedulable")},
            "metadata": {"annotations": n["metadata"].get("annotations")}}
    core.patch_node(node, body, _content_type=MERGE)


@pytest.mark.parametrize("cordon", [False, True], ids=["taint", "taint+cordon"])
def test_foreign_writes_to_our_taint_are_undone_in_both_directions(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher], cordon: bool,
) -> None:
    """The agent's own Node is watched: someone re-adding the agent's taint to a healthy
    node, or removing it from a failing one, is corrected at once (not at the next
    reconcile_interval, 10 min), while another writer toggles its own taint throughout and
    keeps every one of its changes."""
    node = fresh_node("node-a", [FOREIGN_1])
    pub = publisher(node, clear_after=0.0, cordon=cordon, reconcile_interval="1h")
    admin = k8s.CoreV1Api(apiserver.client("admin"))
    pub.submit(report(node))
    wait_for(lambda: pub.state.synced and our_taint(core, node) is None, what="healthy")

    stop = threading.Event()

    def toggler() -> None:  # an unrelated writer, with resourceVersion preconditions
        i = 0
        while not stop.is_set():
            i += 1
            n = node_json(admin, node)
            ts = [t for t in n["spec"].get("taints") or [] if t["key"] != "other.io/toggle"]
            if i % 2:
                ts.append({"key": "other.io/toggle", "effect": "NoSchedule"})
            with contextlib.suppress(ApiException):
                admin.patch_node(node, {"metadata": {"resourceVersion":
                                                     n["metadata"]["resourceVersion"]},
                                        "spec": {"taints": ts}}, _content_type=MERGE)
            time.sleep(0.05)

    thread = threading.Thread(target=toggler)
    thread.start()
    try:
        for _ in range(3):
            # Healthy node: an admin puts the agent's taint (and cordon) back.
            def add(n: dict[str, Any]) -> None:
                n["spec"]["taints"] = [*(n["spec"].get("taints") or []),
                                       {"key": KEY, "value": "Manual", "effect": "NoSchedule"}]
                if cordon:
                    n["spec"]["unschedulable"] = True
                    n["metadata"]["annotations"] = {
                        **(n["metadata"].get("annotations") or {}),
                        "nodeagent.io/cordoned": "Manual"}
            plain_update(admin, node, add)
            wait_for(lambda: our_taint(core, node) is None
                     and not node_json(core, node)["spec"].get("unschedulable"),
                     timeout=5, what="the foreign taint on a healthy node lifted")

        pub.submit(report(node, failing="RuleMissing"))
        wait_for(lambda: (our_taint(core, node) or {}).get("value") == "RuleMissing",
                 what="tainted for the fault")
        for _ in range(3):
            # Failing node: someone removes the agent's taint (and cordon).
            def remove(n: dict[str, Any]) -> None:
                n["spec"]["taints"] = [t for t in n["spec"].get("taints") or []
                                       if t["key"] != KEY]
                if cordon:
                    n["spec"]["unschedulable"] = False
            plain_update(admin, node, remove)
            wait_for(lambda: (our_taint(core, node) or {}).get("value") == "RuleMissing"
                     and (not cordon or node_json(core, node)["spec"].get("unschedulable")),
                     timeout=5, what="the agent's taint put back on a failing node")
    finally:
        stop.set()
        thread.join()
    assert FOREIGN_1["key"] in [t["key"] for t in taints(core, node)]
    assert pub.state.tainted is True


def test_a_foreign_condition_edit_is_put_back(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher],
) -> None:
    node = fresh_node("node-a")
    pub = publisher(node, clear_after=0.0, reconcile_interval="1h")
    pub.submit(report(node))
    wait_for(lambda: conditions(core, node).get("FabricReady", {}).get("status") == "True",
             what="published")
    admin = k8s.CoreV1Api(apiserver.client("admin"))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    admin.patch_node_status(node, {"status": {"conditions": [{
        "type": "FabricReady", "status": "False", "reason": "Forged", "message": "x",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
        _content_type="application/strategic-merge-patch+json")
    wait_for(lambda: conditions(core, node).get("FabricReady", {}).get("reason")
             == "AllConditionsPassed", timeout=5, what="the agent's condition put back")
    assert pub.writer is not None
    requests = pub.writer.counters.requests
    time.sleep(3.0)  # steady state: nothing but the watch (and Lease renewals)
    leases = 3 / 1.0 + 1
    assert pub.writer.counters.requests - requests <= leases, pub.writer.counters


def test_heartbeat_refreshes_every_condition_without_a_change(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    """lastHeartbeatTime moves every heartbeat_interval, in one status patch for all the
    agent's conditions, while status and lastTransitionTime stay as they were."""
    node = fresh_node("node-a", [])
    pub = publisher(node, heartbeat_interval=2.0, lease_period=3600.0)
    pub.submit(report(node))
    wait_for(lambda: conditions(core, node).get("FabricReady"), what="the agent's conditions")
    wait_for(lambda: our_taint(core, node) is None, what="the boot taint lifted")
    time.sleep(0.5)  # its Event written too: steady state from here
    first, writes = conditions(core, node), pub.status().writes
    later = wait_for(lambda: (c := conditions(core, node))["FabricReady"]["lastHeartbeatTime"]
                     != first["FabricReady"]["lastHeartbeatTime"] and c, timeout=10,
                     what="a heartbeat with nothing changed")
    for ctype in CONDITION_TYPES:
        assert later[ctype]["lastHeartbeatTime"] == later["FabricReady"]["lastHeartbeatTime"]
        assert later[ctype]["lastTransitionTime"] == first[ctype]["lastTransitionTime"]
        assert later[ctype]["status"] == first[ctype]["status"]
    time.sleep(0.5)
    assert pub.status().writes - writes <= 2, "one patch per heartbeat, nothing else"


def test_a_boot_taint_without_a_value_is_removed_in_one_write(
    core: k8s.CoreV1Api, fresh_node: Callable[..., str], publisher: Callable[..., Publisher],
) -> None:
    """An autoscaler's startup taint (no value): a healthy start lifts it with one write,
    it is never first rewritten to AgentStarting."""
    node = fresh_node("node-a", [{"key": KEY, "effect": "NoSchedule"}])
    seen: list[list[Any]] = []
    done = threading.Event()

    def follow() -> None:  # every version of the Node's taints, as a watching client sees
        from kubernetes import watch as k8s_watch

        w = k8s_watch.Watch()
        for event in w.stream(core.list_node, field_selector=f"metadata.name={node}",
                              timeout_seconds=15):
            taints = event["object"].spec.taints or []
            seen.append([(t.key, t.value) for t in taints])
            if done.is_set() and not taints:
                w.stop()

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    time.sleep(0.5)
    pub = publisher(node)
    pub.submit(report(node))
    wait_for(lambda: our_taint(core, node) is None, what="the boot taint lifted")
    done.set()
    watcher.join(timeout=20)
    values = [v for taints in seen for k, v in taints if k == KEY]
    assert values and set(values) == {None}, seen



def test_only_someone_elses_edit_is_logged_as_foreign(
    apiserver: ApiServer, core: k8s.CoreV1Api, fresh_node: Callable[..., str],
    publisher: Callable[..., Publisher], caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's first write finds the Node without its conditions: that is not another
    writer's doing (seen in the DaemonSet pod's log before this was fixed)."""
    foreign = "changed by another writer"
    node = fresh_node("node-a")
    caplog.set_level(logging.INFO, logger="nodeagent.publish.publisher")
    pub = publisher(node, clear_after=0.0, reconcile_interval="1h")
    wait_for(lambda: pub.node_watch is not None and pub.node_watch.synced.is_set(),
             what="the agent's watch of its Node")
    pub.submit(report(node))
    wait_for(lambda: conditions(core, node).get("FabricReady", {}).get("status") == "True",
             what="published")
    assert foreign not in caplog.text
    admin = k8s.CoreV1Api(apiserver.client("admin"))
    admin.patch_node(node, {"metadata": {"labels": {"unrelated": "edit"}}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    admin.patch_node_status(node, {"status": {"conditions": [{
        "type": "FabricReady", "status": "False", "reason": "Forged", "message": "x",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}},
        _content_type="application/strategic-merge-patch+json")
    wait_for(lambda: foreign in caplog.text, timeout=5, what="the forged condition noticed")
    assert caplog.text.count(foreign) == 1, "an unrelated label edit is nobody's drift"
