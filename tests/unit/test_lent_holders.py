"""A lent rail's holder: the pod and claim that hold its device, from this node's pods and
their ResourceClaims; the bound for a netdev that does not come back after its pod ended;
and the rails set aside on the agent's Lease, as `fleet -o wide` shows them.

Pod and claim shapes are the API's (k8s.io/api v0.34 core/v1 PodSpec.resourceClaims,
PodStatus.resourceClaimStatuses; resource/v1 ResourceClaimStatus.allocation.devices
.results); the kube tier writes the same objects to a real API server."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.cli.fleet import fleet_rows, render_table
from nodeagent.kube.claims import allocated, node_pods
from nodeagent.kube.peercard import ASIDE, lease_metadata, read_aside
from nodeagent.model.kube import ClaimsObservation, DeviceRef, Lending, RailsAside
from nodeagent.model.status import RailStatus
from nodeagent.run.dra import ClaimReader
from nodeagent.run.store import LentRails

NIC = DeviceRef("dra.net", "gpu-01", "pci-0000-3b-00-0")


def pod(name: str, claims: list[str] = (), generated: list[str] = (),  # type: ignore[assignment]
        phase: str = "Running", ns: str = "ml", uid: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "uid": uid or f"uid-{name}"},
            "spec": {"nodeName": "gpu-01",
                     "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims]
                     + [{"name": g, "resourceClaimTemplateName": "t"} for g in generated]},
            "status": {"phase": phase, "resourceClaimStatuses": [
                {"name": g, "resourceClaimName": f"{name}-{g}-x7k2p"} for g in generated]}}


def claim(*devices: DeviceRef) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "nic", "driver": d.driver, "pool": d.pool, "device": d.device}
        for d in devices]}}}}


def test_a_pods_claims_named_outright_and_made_from_templates_are_both_read() -> None:
    live, held = node_pods([pod("train-0", claims=["shared-nic"], generated=["gpus"]),
                            pod("done", claims=["old"], phase="Succeeded"),
                            pod("plain"), {"metadata": {"name": "no-namespace"}}])
    assert live == {"ml/train-0", "ml/plain"}  # ended pods hold nothing
    assert [(h.pod, h.claims) for h in held] == [
        ("ml/train-0", ("ml/shared-nic", "ml/train-0-gpus-x7k2p"))]
    assert allocated(claim(NIC)) == (NIC,)
    assert allocated({"status": {}}) == ()  # not allocated yet
    assert allocated({"status": {"allocation": {"devices": {"results": [
        {"driver": "dra.net", "pool": "", "device": "x"}, "junk"]}}}}) == ()


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(
                        st.sampled_from(["metadata", "spec", "status", "name", "namespace",
                                         "resourceClaims", "resourceClaimName", "phase",
                                         "allocation", "devices", "results", "driver"]), c,
                        max_size=4), max_leaves=24))
@settings(max_examples=300, deadline=None)
def test_any_shape_of_pod_or_claim_reads_as_nothing_never_an_error(doc: Any) -> None:
    live, held = node_pods([doc, doc])
    assert isinstance(live, frozenset) and isinstance(held, list)
    assert isinstance(allocated(doc), tuple)


class FakeApi:
    """The two GETs the reader makes, answered from dicts (the kube tier asks a real API
    server the same)."""

    def __init__(self, pods: list[dict[str, Any]], claims: dict[str, dict[str, Any]]):
        self.pods, self.claims, self.asked = pods, claims, []  # type: list[str]

    def __call__(self, path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        self.asked.append(path)
        if path == "/api/v1/pods":
            assert ("fieldSelector", "spec.nodeName=gpu-01") in query
            return {"items": self.pods}
        name = path.rsplit("/", 1)[1]
        if name not in self.claims:
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=404, reason="Not Found")
        return self.claims[name]


def test_the_reader_names_each_devices_holder_and_reads_a_claim_once() -> None:
    api = FakeApi([pod("train-0", claims=["nic", "later"])],
                  {"nic": claim(NIC), "later": {"status": {}}})
    reader = ClaimReader(api)
    got = reader.read("gpu-01")
    assert got.error is None and got.pods == {"ml/train-0"}
    assert got.holder(NIC) == Lending(NIC, "ml/train-0", "ml/nic")
    assert str(got.holder(NIC)) == "pod ml/train-0 (claim ml/nic)"
    reader.read("gpu-01")
    # The allocated claim is read once; the one not allocated yet is asked again.
    assert api.asked.count("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/nic") == 1
    assert api.asked.count("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/later") == 2
    api.pods = [pod("other", claims=["gone"])]  # a claim named but not made yet: no holder
    assert reader.read("gpu-01").lendings == ()


def test_a_claim_made_again_under_its_name_for_a_new_pod_is_read_again() -> None:
    """A Job's pod made again (the same name, a new uid) whose claim, named outright, was
    deleted and made again between two reads: allocated to another NIC now. Kept by name,
    the first allocation named the wrong rail's holder for as long as the pod ran."""
    other = DeviceRef("dra.net", "gpu-01", "pci-0000-86-00-0")
    api = FakeApi([pod("train-0", claims=["nic"], uid="a")], {"nic": claim(NIC)})
    reader = ClaimReader(api)
    assert reader.read("gpu-01").holder(NIC) is not None
    api.pods, api.claims = [pod("train-0", claims=["nic"], uid="b")], {"nic": claim(other)}
    got = reader.read("gpu-01")
    assert got.holder(NIC) is None and got.holder(other) == Lending(other, "ml/train-0",
                                                                    "ml/nic")


def test_the_api_down_is_an_error_not_an_empty_node() -> None:
    def down(path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        raise ConnectionRefusedError(111, "Connection refused")

    got = ClaimReader(down).read("gpu-01")
    assert got.error and "refused" in got.error.lower(), got
    assert got.pods == frozenset()


def test_a_lent_rail_fails_only_when_its_pod_is_gone_past_the_bound() -> None:
    lent = LentRails()
    lent["rail1"] = 100.0
    devices = {"rail1": NIC}
    holding = ClaimsObservation((Lending(NIC, "ml/train-0", "ml/nic"),),
                                frozenset({"ml/train-0"}))
    lent.account(devices, holding, 110.0)
    assert str(lent.holders["rail1"]) == "pod ml/train-0 (claim ml/nic)"
    assert lent.overdue(500.0, 120.0) == {}  # the pod still runs: lent for as long as it does
    lent.account(devices, ClaimsObservation(error="API down"), 120.0)
    assert not lent.ended  # unreadable: its pod is not taken for gone
    lent.account(devices, ClaimsObservation((), frozenset()), 130.0)
    assert lent.ended == {"rail1": 130.0}
    assert lent.overdue(250.0, 120.0) == {}
    why = lent.overdue(251.0, 120.0)["rail1"]
    assert why.startswith("its netdev is not back 121 s after pod ml/train-0 (claim ml/nic) "
                          "ended (bound 120 s)"), why
    lent.account(devices, holding, 260.0)  # held again (a restarted pod of the same name)
    assert lent.ended == {}
    del lent["rail1"]  # back: its holder forgotten at the next account
    lent.account(devices, None, 270.0)
    assert lent.holders == {} and lent.ended == {}


def test_a_rail_lent_without_a_claim_has_no_holder_and_no_bound() -> None:
    """A CNI, or a driver whose device is not in the slices: lent, holder unknown, and
    never failed for not coming back (nothing says when it should)."""
    lent = LentRails()
    lent["rail1"] = 0.0
    lent.account({}, ClaimsObservation((), frozenset()), 10.0)
    assert lent.holders == {} and lent.overdue(1e6, 1.0) == {}


def test_the_lease_says_which_rails_are_aside_and_fleet_wide_shows_them() -> None:
    aside = RailsAside(lent={"rail1": "pod ml/train-0 (claim ml/nic)"},
                       tainted={"rail2": "PortDown"})
    labels, notes = lease_metadata(None, [RailStatus("rail0", "r0")], aside)
    assert labels == {} and json.loads(notes[ASIDE]) == {
        "lent": {"rail1": "pod ml/train-0 (claim ml/nic)"}, "tainted": {"rail2": "PortDown"}}
    assert lease_metadata(None, [], RailsAside()) == ({}, {})  # nothing aside: no annotation
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now))
    lease = {"metadata": {"name": "nodeagent-gpu-01", "annotations": notes},
             "spec": {"renewTime": stamp, "leaseDurationSeconds": 180}}
    assert read_aside(lease) == aside
    rows = fleet_rows([{"metadata": {"name": "gpu-01"}}], [lease], "rdma/x", "k", now,
                      None, 1800)
    assert rows[0].rails.lent == {"rail1": "pod ml/train-0 (claim ml/nic)"}
    assert "device-taint" in rows[0].flags
    table = render_table(rows, now, wide=True)
    head, row = table.splitlines()[:2]
    assert "LENT" in head and "DEVICE-TAINTS" in head
    assert "rail1=ml/train-0" in row and "rail2=PortDown" in row, table
    assert "LENT" not in render_table(rows, now)  # the narrow table keeps its columns


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(
                        st.text(max_size=6) | st.sampled_from(["lent", "tainted"]), c,
                        max_size=3), max_leaves=16))
@settings(max_examples=200, deadline=None)
def test_any_aside_annotation_reads_as_rails_or_nothing(doc: Any) -> None:
    lease = {"metadata": {"name": "nodeagent-gpu-01", "annotations": {ASIDE: json.dumps(doc)}}}
    got = read_aside(lease)
    assert all(isinstance(v, str) for v in (*got.lent.values(), *got.tainted.values()))


def test_a_restart_keeps_the_holder_and_its_pods_end_so_the_bound_still_fires(
        tmp_path: Path) -> None:
    """The daemon restarted after the job ended with the netdev still away: the new one
    read only the rails from lent.json, found no claim naming the device (the pod is gone)
    and kept the rail lent forever. The holder and the end are kept with it now, this boot
    only, and anything of the wrong shape is dropped."""
    from nodeagent.config import parse_config
    from nodeagent.state import LENT_FILE, load_lent_record

    cfg = parse_config({"state_dir": str(tmp_path), "dra": {}, "kubernetes": {}, "rails": [
        {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"},
        {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24"}]})
    clock = [1000.0]
    lent = LentRails()
    lent["rail1"] = 900.0
    lent.account({"rail1": NIC}, ClaimsObservation((Lending(NIC, "ml/train-0", "ml/nic"),),
                                                   frozenset({"ml/train-0"})), 950.0)
    lent.account({"rail1": NIC}, ClaimsObservation((), frozenset()), 990.0)  # pod gone
    lent.keep(cfg, lambda: clock[0])
    saved = json.loads((tmp_path / LENT_FILE).read_text())
    assert saved["holders"]["rail1"]["pod"] == "ml/train-0" and "rail1" in saved["ended"]

    again = LentRails()  # the next daemon, 200 s of monotonic time later
    clock[0] = 1200.0
    again.load(cfg, lambda: clock[0])
    assert again.holders == {"rail1": Lending(NIC, "ml/train-0", "ml/nic")}
    assert "rail1" in again.overdue(clock[0] + 200, 120.0)  # ended at ~990 s: long past
    again.keep(cfg, lambda: clock[0])  # nothing changed: nothing written
    assert json.loads((tmp_path / LENT_FILE).read_text()) == saved

    saved["holders"]["rail1"]["pod"] = 7  # of the wrong shape: no holder, and so no end
    saved["holders"]["rail0"] = saved["holders"]["rail1"]  # a rail not lent: dropped
    (tmp_path / LENT_FILE).write_text(json.dumps(saved))
    record = load_lent_record(cfg)
    assert set(record.rails) == {"rail1"} and record.holders == {} and record.ended == {}
