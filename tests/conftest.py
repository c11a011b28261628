from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.apiserver import ApiServer, start_apiserver, wait_policy_enforced
from tests.kit.helpers import Netns, build_cache, make_gid_tree, new_netns, roce_entries
from tests.kit.registry_env import DOCKER_MANIFEST, Registry, start_registry
from tools import imagebuild


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = new_netns()
    try:
        yield ns
    finally:
        ns.delete()


RAILS = [
    {"name": "rail0", "interface": "r0", "address": "10.10.0.5/24", "mtu": 4200,
     "table": 100, "rule_priority": 1000, "gateway": "10.10.0.1"},
    {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24", "mtu": 4200,
     "table": 101, "rule_priority": 1001},
]


@pytest.fixture
def rails_ns(netns: Netns) -> Netns:
    """A namespace with two veth rails (r0, r1) whose peers are up: carrier present."""
    netns.veth("r0", "p0")
    netns.veth("r1", "p1")
    return netns


@pytest.fixture
def agent_config(tmp_path: Path) -> dict[str, Any]:
    """A two-rail config whose GID table is a fixture tree matching the rails."""
    sysfs = tmp_path / "sys"
    make_gid_tree(sysfs, "mlx5_0", roce_entries("r0", "10.10.0.5"))
    make_gid_tree(sysfs, "mlx5_1", roce_entries("r1", "10.11.0.5"))
    return {
        "node_name": "node-a",
        "paths": {"sysfs": str(sysfs), "procfs": "/proc"},
        "state_dir": str(tmp_path / "state"),
        "runtime_dir": str(tmp_path / "run"),
        "rails": [dict(r) for r in RAILS],
    }


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """The real kube-apiserver (tests/kit/apiserver.py) for the session, deploy/ applied and
    the admission policy in force."""
    server = start_apiserver(tmp_path_factory.mktemp("apiserver"))
    try:
        wait_policy_enforced(server)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The real docker-registry (TLS, token auth) with the plugin's test images:
    `rdma/dp:multi` (linux/amd64 + linux/arm64/v8), `rdma/dp:arm64` (one arm64 manifest),
    `rdma/dp:no-amd64` (an index of linux/arm64/v8 + linux/ppc64le),
    `rdma/dp:amd64` (one amd64 Docker v2 manifest), `public/dp:1` (anonymous pull)."""
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        reg.images = {
            "multi": reg.push_index("rdma/dp", "multi", [("linux", "amd64", ""),
                                                        ("linux", "arm64", "v8")]),
            "arm64": reg.push_single("rdma/dp", "arm64", "linux", "arm64"),
            "no-amd64": reg.push_index("rdma/dp", "no-amd64", [("linux", "arm64", "v8"),
                                                               ("linux", "ppc64le", "")]),
            "amd64": reg.push_single("rdma/dp", "amd64", "linux", "amd64",
                                     media_type=DOCKER_MANIFEST),
            "public": reg.push_single("public/dp", "1", "linux", "amd64"),
        }
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def agent_image(tmp_path_factory: pytest.TempPathFactory) -> imagebuild.Image:
    """The agent's container image (tools/imagebuild.py) built from this checkout; its
    Debian and dependency layers come from the build cache while their recipes hold."""
    return imagebuild.build(tmp_path_factory.mktemp("image") / "layout", build_cache("image"))


@pytest.fixture(scope="session")
def pushed_image(registry: Registry, agent_image: imagebuild.Image) -> str:
    """The agent's image pushed to the test registry where anyone may pull it; returns the
    reference a DaemonSet would name."""
    tag = agent_image.reference.split(":", 1)[1]
    assert registry.push_layout("public/nodeagent", tag, agent_image.layout) == \
        agent_image.index_digest
    return f"{registry.host}/public/nodeagent:{tag}"


# Property-based tests: a fixed, derandomized campaign in CI; HYPOTHESIS_PROFILE=campaign
# for a longer, random one (README: "What the agent survives").
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", derandomize=True, max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("campaign", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(__import__("os").environ.get("HYPOTHESIS_PROFILE", "ci"))
