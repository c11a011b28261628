"""The job gate (deploy/job-policy.yaml, as `nodeagent deploy` renders it) on the real API
server: in an opted-in namespace a GPU pod without the RDMA resource, or with an NCCL
variable that turns RDMA off, is refused with a message that names the field and the fix;
the same pods are admitted in a namespace that did not opt in; the preflight binding asks
for the init container; a Job whose pods are refused shows why in its FailedCreate events
(the real job controller); and deploy/examples pass a server-side dry run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.kit.apiserver import ApiServer
from tests.kit.control_plane import Component
from tests.kit.helpers import wait_for
from tests.kit.kueue import docs, module_dir

ROOT = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
RDMA = "rdma/rdma_shared_device_a"


def pod(name: str, limits: dict[str, str] | None = None,
        env: dict[str, str] | None = None, init: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{
        "name": "train", "image": "registry.example/train:1",
        "resources": {"limits": limits or {}},
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]}
    if init:
        spec["initContainers"] = [{"name": "nodeagent-preflight",
                                   "image": "registry.example/nodeagent:1",
                                   "args": ["preflight"]}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def namespace(core: k8s.CoreV1Api, name: str, labels: dict[str, str]) -> str:
    try:
        core.create_namespace({"metadata": {"name": name,  # type: ignore[arg-type]
                                            "labels": labels}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    # The ServiceAccount admission plugin wants the pods' default account to exist (no
    # serviceaccount controller runs here).
    try:
        core.create_namespaced_service_account(name, {"metadata": {  # type: ignore[arg-type]
            "name": "default"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return name


def create(core: k8s.CoreV1Api, ns: str, body: dict[str, Any]) -> str | None:
    """None when admitted (a server-side dry run: nothing is kept), else the refusal."""
    try:
        core.create_namespaced_pod(ns, body, dry_run="All")  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status not in (400, 403, 422):
            raise
        return str(exc.body)
    return None


@pytest.fixture(scope="module")
def spaces(apiserver: ApiServer) -> Iterator[dict[str, str]]:
    core = k8s.CoreV1Api(apiserver.client("admin"))
    got = {"gated": namespace(core, "jobs-gated", {"nodeagent.io/fabric": "required"}),
           "preflight": namespace(core, "jobs-preflight", {"nodeagent.io/fabric": "required",
                                                           "nodeagent.io/preflight": "required"}),
           "open": namespace(core, "jobs-open", {})}
    # A policy takes effect a moment after its creation: until a known-bad pod is refused.
    wait_for(lambda: create(core, got["preflight"], pod("probe", {GPU: "1"})), 60,
             "the job policies enforced")
    wait_for(lambda: "nodeagent-preflight init container" in (
        create(core, got["preflight"], pod("probe", {GPU: "1", RDMA: "1"})) or ""), 60,
        "the preflight policy enforced")
    yield got


def test_the_policies_type_check_clean(apiserver: ApiServer, spaces: dict[str, str]) -> None:
    api = k8s.AdmissionregistrationV1Api(apiserver.client("admin"))
    for name in ("nodeagent-job-fabric", "nodeagent-job-preflight", "nodeagent-job-claims"):
        got = wait_for(lambda n=name: api.read_validating_admission_policy(n).status, 30,
                       f"{name}'s status")
        warnings = got.type_checking.expression_warnings if got.type_checking else None
        assert not warnings, warnings


def test_a_gpu_pod_without_the_rdma_resource_is_refused_naming_the_fix(
        apiserver: ApiServer, spaces: dict[str, str]) -> None:
    core = k8s.CoreV1Api(apiserver.client("admin"))
    refused = create(core, spaces["gated"], pod("no-rdma", {GPU: "8"}))
    assert refused is not None
    assert ("container train requests a GPU but the pod does not request "
            "rdma/rdma_shared_device_a: add rdma/rdma_shared_device_a: 1 to "
            "spec.containers[].resources.limits") in refused
    assert create(core, spaces["gated"], pod("fit", {GPU: "8", RDMA: "1"})) is None
    assert create(core, spaces["gated"], pod("cpu-only", {"cpu": "1"})) is None


@pytest.mark.parametrize("env,words", [
    ({"NCCL_IB_DISABLE": "1"}, "container train sets NCCL_IB_DISABLE=1 in "
     "spec.containers[].env: remove it"),
    ({"NCCL_NET": "Socket"}, "container train sets NCCL_NET=Socket"),
])
def test_an_nccl_variable_that_turns_rdma_off_is_refused(
        apiserver: ApiServer, spaces: dict[str, str], env: dict[str, str], words: str) -> None:
    core = k8s.CoreV1Api(apiserver.client("admin"))
    refused = create(core, spaces["gated"], pod("env", {GPU: "8", RDMA: "1"}, env))
    assert refused is not None and words in refused
    fine = {"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB", "NCCL_IB_HCA": "mlx5"}
    assert create(core, spaces["gated"], pod("env-ok", {GPU: "8", RDMA: "1"}, fine)) is None


# NCCL_IB_DISABLE as NCCL reads it (strtoll base 0, tests/unit/test_nccl_prediction): each
# value is refused exactly when NCCL would turn NET/IB off, and the preflight agrees.
DISABLE_VALUES = ["1", "010", "1abc", "1e3", "-1", "0x1", " 1", "0", "00", "0x0", "true",
                  "08", "", "no"]


def test_nccl_ib_disable_is_refused_exactly_when_nccl_reads_it_as_nonzero(
        apiserver: ApiServer, spaces: dict[str, str]) -> None:
    from nodeagent.checks.nccl import nccl_int

    core = k8s.CoreV1Api(apiserver.client("admin"))
    got, want = {}, {}
    for n, value in enumerate(DISABLE_VALUES):
        refused = create(core, spaces["gated"], pod(f"disable-{n}", {GPU: "8", RDMA: "1"},
                                                    {"NCCL_IB_DISABLE": value}))
        got[value] = refused is not None
        want[value] = nccl_int({"NCCL_IB_DISABLE": value}, "NCCL_IB_DISABLE", 0) != 0
    assert got == want
    assert sum(want.values()) == 7  # the table has both kinds


def test_a_namespace_that_did_not_opt_in_is_untouched(apiserver: ApiServer,
                                                     spaces: dict[str, str]) -> None:
    core = k8s.CoreV1Api(apiserver.client("admin"))
    assert create(core, spaces["open"], pod("bad", {GPU: "8"}, {"NCCL_IB_DISABLE": "1"})) \
        is None


def test_the_preflight_binding_asks_for_the_init_container(apiserver: ApiServer,
                                                          spaces: dict[str, str]) -> None:
    core = k8s.CoreV1Api(apiserver.client("admin"))
    refused = create(core, spaces["preflight"], pod("no-init", {GPU: "8", RDMA: "1"}))
    assert refused is not None and "add it to spec.initContainers" in refused
    assert create(core, spaces["preflight"], pod("init", {GPU: "8", RDMA: "1"}, init=True)) \
        is None
    assert create(core, spaces["gated"], pod("no-init", {GPU: "8", RDMA: "1"})) is None


def test_with_preflight_images_set_only_those_images_pass_as_the_preflight(
        apiserver: ApiServer, spaces: dict[str, str]) -> None:
    """The name alone let any image called nodeagent-preflight pass. The policy rendered
    with `jobs.preflight_images`, applied beside the default one under other names (both
    bound to the same namespaces: the default's pods use an allowed image), refuses an
    init container of that name running another image, naming the allowed ones."""
    import yaml

    from nodeagent.cli.deploy import render
    from nodeagent.config import parse_config

    text = render(parse_config({"jobs": {"preflight_images": [
        "registry.example/nodeagent:"]}}))["job-policy.yaml"]
    docs_ = [d for d in yaml.safe_load_all(text.replace(
        "nodeagent-job-preflight", "nodeagent-job-preflight-images")) if d]
    policy = next(d for d in docs_ if d["kind"] == "ValidatingAdmissionPolicy"
                  and d["metadata"]["name"] == "nodeagent-job-preflight-images")
    binding = next(d for d in docs_ if d["kind"] == "ValidatingAdmissionPolicyBinding"
                   and d["spec"]["policyName"] == "nodeagent-job-preflight-images")
    admin = apiserver.client("admin")
    api = k8s.AdmissionregistrationV1Api(admin)
    api.create_validating_admission_policy(policy)  # type: ignore[arg-type]
    api.create_validating_admission_policy_binding(binding)  # type: ignore[arg-type]
    core = k8s.CoreV1Api(admin)
    try:
        other = pod("other-image", {GPU: "8", RDMA: "1"}, init=True)
        other["spec"]["initContainers"][0]["image"] = "evil.example/anything:1"
        refused = wait_for(lambda: create(core, spaces["preflight"], other), 60,
                           "the image policy enforced")
        assert ("the nodeagent-preflight init container runs an image that is not "
                "nodeagent's (registry.example/nodeagent:*)") in refused, refused
        assert create(core, spaces["preflight"], pod("ours", {GPU: "8", RDMA: "1"},
                                                     init=True)) is None
        status = wait_for(lambda: api.read_validating_admission_policy(
            "nodeagent-job-preflight-images").status, 30, "its type check")
        assert not (status.type_checking and status.type_checking.expression_warnings)
    finally:
        api.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        api.delete_validating_admission_policy("nodeagent-job-preflight-images")


def claim_template(name: str, *classes: str) -> dict[str, Any]:
    """A ResourceClaimTemplate in the shape of dranet's aligned examples
    (examples/aws_eks_examples/gpu-efa/resource-claim-template.yaml, demo_nvidia_dranet):
    one request per device class, the GPU and NIC constrained to one PCIe root."""
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": c, "count": 1}}
                for i, c in enumerate(classes)]
    devices: dict[str, Any] = {"requests": requests}
    if len(classes) > 1:
        devices["constraints"] = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": {"devices": devices}}}


def create_claim(admin: Any, ns: str, body: dict[str, Any]) -> str | None:
    """None when admitted (a server-side dry run), else the refusal."""
    api = k8s.ResourceV1Api(admin)
    try:
        if body["kind"] == "ResourceClaimTemplate":
            api.create_namespaced_resource_claim_template(ns, body, dry_run="All")
        else:
            api.create_namespaced_resource_claim(ns, body, dry_run="All")
    except ApiException as exc:
        if exc.status not in (400, 403, 422):
            raise
        return str(exc.body)
    return None


def test_a_gpu_claim_without_a_nic_is_refused_in_an_opted_in_namespace(
        apiserver: ApiServer, spaces: dict[str, str]) -> None:
    """Dynamic Resource Allocation: a pod that gets its GPUs through a claim names no
    extended resource, so the pod rule cannot see it; the claim itself is judged."""
    admin = apiserver.client("admin")
    gpu_only = claim_template("gpu-only", "gpu.nvidia.com")
    refused = wait_for(lambda: create_claim(admin, spaces["gated"], gpu_only), 60,
                       "the claim policy enforced")
    assert ("this claim requests a GPU (gpu.nvidia.com, mig.nvidia.com) but no NIC with "
            "RDMA (rdma)") in refused, refused
    assert create_claim(admin, spaces["gated"], claim_template(
        "gpu-nic", "gpu.nvidia.com", "rdma")) is None
    # A prioritized list (firstAvailable) counts its alternatives; a claim of a NIC alone
    # or of another class is not this rule's business; a namespace not opted in is open.
    either = claim_template("mig-or-gpu", "rdma")
    either["spec"]["spec"]["devices"]["requests"].append(
        {"name": "accel", "firstAvailable": [{"name": "mig", "deviceClassName": "mig.nvidia.com"},
                                             {"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]})
    either["spec"]["spec"]["devices"].pop("constraints", None)
    assert create_claim(admin, spaces["gated"], either) is None
    assert create_claim(admin, spaces["gated"], claim_template("nic", "rdma")) is None
    assert create_claim(admin, spaces["open"], gpu_only) is None
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "one-gpu"},
             "spec": gpu_only["spec"]["spec"]}
    assert "but no NIC with RDMA" in (create_claim(admin, spaces["gated"], claim) or "")
    status = k8s.AdmissionregistrationV1Api(admin).read_validating_admission_policy(
        "nodeagent-job-claims").status
    assert not (status and status.type_checking
                and status.type_checking.expression_warnings), status


def test_a_job_whose_pods_are_refused_shows_why_in_its_events(
        apiserver: ApiServer, spaces: dict[str, str], tmp_path: Path) -> None:
    """The real job controller creates the Job's pods; the policy refuses them; the
    controller records the API server's message as a FailedCreate Event on the Job."""
    admin = apiserver.client("admin")
    manager = Component("kube-controller-manager", "controller-manager",
                        ["--controllers=job-controller",
                         "--use-service-account-credentials=true",
                         f"--root-ca-file={apiserver.workdir / 'ca.crt'}"], tmp_path)
    manager.start(apiserver)
    try:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "no-rdma"},
               "spec": {"backoffLimit": 0, "template": {"spec": {
                   "restartPolicy": "Never", **pod("x", {GPU: "8"})["spec"]}}}}
        k8s.BatchV1Api(admin).create_namespaced_job(spaces["gated"], job)  # type: ignore[arg-type]
        core = k8s.CoreV1Api(admin)

        def failed_create() -> str:
            manager.alive()
            events = core.list_namespaced_event(
                spaces["gated"], field_selector="involvedObject.name=no-rdma").items
            return next((e.message for e in events if e.reason == "FailedCreate"), "")

        message = wait_for(failed_create, 90, "a FailedCreate event on the Job")
        assert "requests a GPU but the pod does not request rdma/rdma_shared_device_a" \
            in message
        assert core.list_namespaced_pod(spaces["gated"]).items == []
    finally:
        manager.stop()


def test_the_examples_pass_a_server_side_dry_run(apiserver: ApiServer,
                                                spaces: dict[str, str]) -> None:
    """Every object of deploy/examples/ in the preflight-gated namespace, dry-run: the API
    server validates it whole (fields it does not know refused: the JobSet's by its own
    CRD, the one Kueue's module pins), and admits each pod template through the job gate,
    as the pod the job controller would make of it."""
    from kubernetes.dynamic import DynamicClient

    admin = apiserver.client("admin")
    (crd,) = docs(module_dir("sigs.k8s.io/jobset") / "config" / "components" / "crd" /
                  "bases" / "jobset.x-k8s.io_jobsets.yaml")
    crds = k8s.ApiextensionsV1Api(admin)
    crds.create_custom_resource_definition(crd)  # type: ignore[arg-type]
    try:
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             crds.read_custom_resource_definition(
                                 crd["metadata"]["name"]).status.conditions or []),
                 60, "the JobSet CRD established")
        dyn = DynamicClient(admin)  # discovery again: it now serves JobSets
        examples = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
        assert {p.name for p in examples} >= {"indexed-job.yaml", "jobset.yaml"}
        checked = []
        for path in examples:
            for doc in docs(path):
                api = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                api.create(body=doc, namespace=spaces["preflight"], query_params=[
                    ("dryRun", "All"), ("fieldValidation", "Strict")])
                for i, template in enumerate(pod_templates(doc)):
                    pods = dyn.resources.get(api_version="v1", kind="Pod")
                    pods.create(body={"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {"name": f"{doc['metadata']['name']}-{i}"},
                                      "spec": template["spec"]},
                                namespace=spaces["preflight"],
                                query_params=[("dryRun", "All")])
                    checked.append(f"{path.name}: {doc['kind']} {doc['metadata']['name']}")
        assert checked == ["indexed-job.yaml: Job train", "jobset.yaml: JobSet train-js"]
    finally:
        crds.delete_custom_resource_definition(crd["metadata"]["name"])


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a Job, or of each replicated Job of a JobSet."""
    spec = doc.get("spec") or {}
    if doc["kind"] == "Job":
        return [spec["template"]]
    if doc["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    return []
