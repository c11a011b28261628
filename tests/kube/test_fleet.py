"""`nodeagent fleet` / `kubectl fabric` against the real API server, many Node objects."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.checks.conditions import CONDITIONS, FABRIC
from nodeagent.cli.fleet import fleet_rows, render_table, run
from nodeagent.cli.main import main
from nodeagent.cli.options import fleet_arguments
from nodeagent.kube.api import Counters, call
from tests.kit.apiserver import ApiServer
from tests.kit.helpers import wait_for

KEY = "nodeagent.io/fabric-unready"
RESOURCE = "rdma/rdma_shared_device_a"
LEASES = "nodeagent-system"
MERGE = "application/merge-patch+json"
N = 40


def stamp(offset: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset))


def micro(offset: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() + offset))


@pytest.fixture(scope="module")
def fleet(apiserver: ApiServer) -> Iterator[dict[str, Any]]:
    """N fabric nodes: healthy, except fleet-1 (tainted an hour ago, RuleMissing), fleet-2
    (agent silent for 10 min), fleet-3 (no RDMA devices advertised), fleet-4 (no agent at
    all); and one CPU node without the fabric label."""
    admin = apiserver.client("admin")
    core = k8s.CoreV1Api(admin)
    coord = k8s.CoordinationV1Api(admin)
    names = [f"fleet-{i}" for i in range(N)]
    for name in [*names, "cpu-0"]:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for name in names:
        bad = name == "fleet-1"
        core.create_node({  # type: ignore[arg-type]
            "metadata": {"name": name, "labels": {"fabric": "true"}},
            "spec": {"taints": [{"key": KEY, "value": "RuleMissing", "effect": "NoSchedule"}]
                     if bad else []}})
        count = "0" if name == "fleet-3" else "8"
        conditions = [{"type": t, "status": "True", "reason": "Fine", "message": "ok",
                       "lastTransitionTime": stamp(-86400), "lastHeartbeatTime": stamp()}
                      for t in ("RoCENetworkReady", "RoCEGIDStable", "RDMADevicePluginReady",
                                "LustreReady")]
        conditions.append({"type": "FabricReady", "status": "False" if bad else "True",
                           "reason": "RuleMissing" if bad else "AllConditionsPassed",
                           "message": "m", "lastTransitionTime": stamp(-3600 if bad else -86400),
                           "lastHeartbeatTime": stamp()})
        if bad:
            conditions[0].update(status="False", reason="RuleMissing")
        core.patch_node_status(name, {"status": {
            "capacity": {RESOURCE: count}, "allocatable": {RESOURCE: count},
            "conditions": conditions}}, _content_type=MERGE)
        if name == "fleet-4":
            continue
        lease_name = f"nodeagent-{name}"
        try:
            coord.delete_namespaced_lease(lease_name, LEASES)
        except ApiException as exc:
            if exc.status != 404:
                raise
        # Plain JSON: the typed client re-serializes MicroTime without its microseconds.
        call(admin, Counters(), "POST",
             f"/apis/coordination.k8s.io/v1/namespaces/{LEASES}/leases",
             {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": lease_name, "annotations": {
                  # fleet-10's agent has lent rail1 to a pod (the shape lease_metadata writes)
                  "nodeagent.io/rails-aside": json.dumps({"lent": {
                      "rail1": "pod ml/train-0 (claim ml/train-0-nic)"}, "tainted": {}})}
                  if name == "fleet-10" else {}},
              "spec": {"holderIdentity": name, "leaseDurationSeconds": 60,
                       "renewTime": micro(-600 if name == "fleet-2" else -5)}})
    core.create_node({"metadata": {"name": "cpu-0"}})  # type: ignore[arg-type]
    yield {"core": core, "coord": coord}


def kubeconfig(apiserver: ApiServer, tmp_path: Path, who: str = "admin") -> str:
    return str(apiserver.kubeconfig(who, tmp_path / f"{who}.kubeconfig"))


def test_json_rows_flag_what_needs_attention(apiserver: ApiServer, fleet: dict[str, Any],
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--kubeconfig", kubeconfig(apiserver, tmp_path), "-l", "fabric=true",
                 "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    rows = {r["node"]: r for r in listed["items"]}
    assert len(rows) == N and "cpu-0" not in rows
    assert rows["fleet-1"]["tainted"] and rows["fleet-1"]["taint_reason"] == "RuleMissing"
    assert rows["fleet-1"]["flags"] == ["taint-old"]
    assert rows["fleet-1"]["conditions"]["RoCENetworkReady"]["reason"] == "RuleMissing"
    assert rows["fleet-2"]["flags"] == ["agent-stale"] and rows["fleet-2"]["heartbeat_age"] > 500
    assert rows["fleet-3"]["flags"] == ["no-rdma"] and rows["fleet-3"]["capacity"] == 0
    assert rows["fleet-4"]["flags"] == ["no-agent"] and rows["fleet-4"]["heartbeat_age"] is None
    healthy = rows["fleet-10"]
    assert (healthy["fabric"], healthy["flags"], healthy["allocatable"]) == ("True", [], 8)
    assert healthy["heartbeat_age"] < 120


def test_table_puts_trouble_first(apiserver: ApiServer, fleet: dict[str, Any], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--kubeconfig", kubeconfig(apiserver, tmp_path), "-l",
                 "fabric=true", "-o", "wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # A column per registered condition, in the registry's order (FabricReady has its own).
    columns = [c.column for c in CONDITIONS if c is not FABRIC]
    assert lines[0].split() == ["NODE", "FABRIC", "REASON", *columns, "TAINT", "SINCE",
                                "HEARTBEAT", "RDMA", "PEERS", "SWITCHES", "LENT",
                                "DEVICE-TAINTS", "FLAGS"]
    lent = next(line.split() for line in lines if line.startswith("fleet-10 "))
    assert lent[-3:] == ["rail1=ml/train-0", "-", "-"], lent  # lent is no flag
    # the newest conditions, derived like the rest
    assert {"NCCL", "DRA", "CONGESTION", "CABLING"} <= set(columns)
    flagged = [line.split()[0] for line in lines[1:5]]
    assert sorted(flagged) == ["fleet-1", "fleet-2", "fleet-3", "fleet-4"]
    row1 = next(line for line in lines if line.startswith("fleet-1 "))
    assert "False RuleMissing" in row1 and " 60m " in row1 and "8/8" in row1


def test_kubectl_output_modes_context_and_kubeconfig_from_the_environment(
        apiserver: ApiServer, fleet: dict[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As kubectl: the kubeconfig from $KUBECONFIG when no flag says otherwise (a missing
    first entry skipped), --context picks a context, -o yaml/name, --no-headers."""
    path = Path(kubeconfig(apiserver, tmp_path))
    doc = yaml.safe_load(path.read_text())
    doc["contexts"].append({"name": "elsewhere", "context": {"cluster": "nowhere",
                                                            "user": doc["users"][0]["name"]}})
    doc["clusters"].append({"name": "nowhere", "cluster": {
        "server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}})
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config to fall back on

    assert main(["fleet", "-l", "fabric=true", "-o", "name"]) == 0
    names = capsys.readouterr().out.split()
    assert len(names) == N and all(n.startswith("node/fleet-") for n in names)
    assert main(["fleet", "-l", "fabric=true", "-o", "yaml"]) == 0
    listed = yaml.safe_load(capsys.readouterr().out)
    assert listed["kind"] == "List" and len(listed["items"]) == N
    assert main(["fleet", "-l", "fabric=true", "--no-headers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == N and not lines[0].startswith("NODE")
    assert main(["fleet", "--context", "elsewhere"]) == 1  # that context's server is not there
    assert capsys.readouterr().err.startswith("fleet: cannot list nodes and leases:")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["fleet", "--context", "elsewhere"]) == 1  # nothing found: one line
    assert "no kubeconfig" in capsys.readouterr().err


def test_watch_redraws_on_change(apiserver: ApiServer, fleet: dict[str, Any],
                                 tmp_path: Path) -> None:
    import argparse

    p = argparse.ArgumentParser()
    fleet_arguments(p)
    args = p.parse_args(["--kubeconfig", kubeconfig(apiserver, tmp_path), "-l", "fabric=true",
                         "-w"])
    out, stop = io.StringIO(), threading.Event()
    thread = threading.Thread(target=run, args=(args, out, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: "fleet-39" in out.getvalue(), what="the first draw")
        fleet["core"].patch_node_status("fleet-7", {"status": {"allocatable": {RESOURCE: "0"}}},
                                        _content_type=MERGE)
        wait_for(lambda: any(line.startswith("fleet-7 ") and "no-rdma" in line
                             for line in out.getvalue().splitlines()), what="a redraw")
    finally:
        stop.set()
        thread.join(10)
        fleet["core"].patch_node_status("fleet-7", {"status": {"allocatable": {RESOURCE: "8"}}},
                                        _content_type=MERGE)
    assert not thread.is_alive()


def test_without_rights_one_line_and_exit_1(apiserver: ApiServer, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--kubeconfig", kubeconfig(apiserver, tmp_path, "stranger")]) == 1
    err = capsys.readouterr().err
    # The API's own reason, so the missing right is named.
    assert err.startswith("fleet: cannot list nodes and leases: HTTP 403: ")
    assert err.count("\n") == 1
    assert 'cannot list resource "nodes"' in err, err


def test_api_server_unreachable_is_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from tests.kit.helpers import free_port

    path = tmp_path / "kc"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    assert main(["fleet", "--kubeconfig", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("fleet: cannot list nodes and leases:")


def test_rows_are_pure_and_ages_are_short() -> None:
    now = time.time()
    node = {"metadata": {"name": "n"}, "status": {"conditions": []}}
    rows = fleet_rows([node], [], RESOURCE, KEY, now, 120, 1800)
    assert rows[0].fabric == "-" and rows[0].flags == ["no-agent", "no-rdma"]
    assert render_table(rows, now).splitlines()[1].split() == [
        "n", "-", "-", "-", "-", "-", "0/0", "-", "no-agent,no-rdma"]


def test_firmware_that_differs_from_the_majority_of_its_hca_type_is_flagged() -> None:
    """From the agents' hardware labels: three ConnectX-6 nodes on one firmware, one on
    another; a lone ConnectX-7 and a node whose rails mix firmware are not flagged."""
    def node(name: str, hca: str, fw: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {
            "nodeagent.io/rdma-hca-type": hca, "nodeagent.io/rdma-fw-version": fw}}}
    nodes = [node("a", "MT4123", "20.31.1014"), node("b", "MT4123", "20.31.1014"),
             node("c", "MT4123", "20.31.1014"), node("d", "MT4123", "20.28.1002"),
             node("e", "MT4129", "28.39.1002"), node("f", "MT4123", "mixed")]
    rows = {r.node: r for r in fleet_rows(nodes, [], RESOURCE, KEY, time.time(), 120, 1800)}
    assert [n for n, r in sorted(rows.items()) if "fw-minority" in r.flags] == ["d"]
    tie = [node("a", "MT4123", "1"), node("b", "MT4123", "2")]
    assert not any("fw-minority" in r.flags
                   for r in fleet_rows(tie, [], RESOURCE, KEY, time.time(), 120, 1800))
