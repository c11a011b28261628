"""deploy/ is `nodeagent deploy` rendered for the default config; other configs render the
policies for their taint key, conditions-only mode and Lease namespace."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nodeagent.cli.deploy import MANIFESTS, render
from nodeagent.cli.main import main
from nodeagent.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_committed_manifests_are_the_rendered_defaults() -> None:
    for name, text in render(parse_config({})).items():
        assert (ROOT / "deploy" / name).read_text() == text, (
            f"deploy/{name} is stale: regenerate it with `nodeagent deploy --output-dir deploy`")


def variables(text: str) -> dict[str, str]:
    doc = next(d for d in yaml.safe_load_all(text)
               if d and d["kind"] == "ValidatingAdmissionPolicy")
    return {v["name"]: v["expression"] for v in doc["spec"]["variables"]}


def test_conditions_only_and_other_keys_and_namespaces() -> None:
    only = render(parse_config({"kubernetes": {"taint": None}}))
    assert variables(only["admission-policy.yaml"])["taintKey"] == "''"
    assert variables(only["admission-policy.yaml"])["mayCordon"] == "false"
    other = render(parse_config({"kubernetes": {"taint": {"key": "example.com/fabric"},
                                                "lease_namespace": "fabric-agents"}}))
    assert variables(other["admission-policy.yaml"])["taintKey"] == "'example.com/fabric'"
    docs = [d for d in yaml.safe_load_all(other["rbac.yaml"]) if d]
    assert {d["metadata"].get("namespace") for d in docs} == {None, "fabric-agents"}
    assert yaml.safe_load(other["namespace.yaml"])["metadata"]["name"] == "fabric-agents"


def test_the_command_writes_every_manifest(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(MANIFESTS)
    assert capsys.readouterr().out.split() == [str(tmp_path / name) for name in MANIFESTS]
    assert main(["deploy"]) == 0
    # 18: the agent's policies and bindings (its Node, its Events and Lease, its device
    # taint rules), the job gate's three (pods, the preflight, DRA claims), and the
    # ClusterRole `preflight --claims` reads with
    assert len([d for d in yaml.safe_load_all(capsys.readouterr().out) if d]) == 18


@pytest.mark.parametrize("namespace", ["Nodeagent", "a_b", "x'y", ""])
def test_a_lease_namespace_must_be_a_namespace_name(namespace: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"kubernetes": {"lease_namespace": namespace}})
    assert info.value.problems[0].startswith("kubernetes.lease_namespace: ")


def test_cordon_needs_a_taint() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"kubernetes": {"taint": None, "cordon": True}})
    assert info.value.problems == [
        "kubernetes: cordon: true needs a taint (with taint: null the agent writes neither)"]


def test_the_job_gate_takes_the_configs_resource_names() -> None:
    got = render(parse_config({"jobs": {"gpu_resources": ["nvidia.com/gpu", "amd.com/gpu"]},
                               "device_plugin": {"resource": "rdma/hca_shared"}}))
    text = got["job-policy.yaml"]
    assert "\"['nvidia.com/gpu', 'amd.com/gpu']\"" in text and "'rdma/hca_shared'" in text
    assert "'rdma/rdma_shared_device_a'" in render(parse_config({}))["job-policy.yaml"]


@pytest.mark.parametrize("name", ["nvidia.com/gpu']", "gpu", "a/b c", "x/'y'"])
def test_a_resource_name_cannot_reach_the_policy_unchecked(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"jobs": {"gpu_resources": [name]}})
    assert "is not an extended resource name" in info.value.problems[0]
