"""Image references, docker-config credentials and the platform verdict: pure parts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from nodeagent.checks.deviceplugin import (
    device_plugin_finding,
    image_facts,
    node_platform,
    plugin_images,
)
from nodeagent.config import parse_config
from nodeagent.kube.objects import parse_node, plugin_observation
from nodeagent.model.kube import DevicePluginObservation, ImagePlatforms, Platform
from nodeagent.probes.registry import ImageRef, RegistryError, load_credentials, parse_image

HUB = "registry-1.docker.io"
D = "sha256:" + "a" * 64


@pytest.mark.parametrize("text, ref", [
    ("busybox", ImageRef(HUB, "library/busybox")),
    ("docker.io/mellanox/k8s-rdma-shared-dev-plugin:v1.5.2",
     ImageRef(HUB, "mellanox/k8s-rdma-shared-dev-plugin", "v1.5.2")),
    (f"ghcr.io/mellanox/dp@{D}", ImageRef("ghcr.io", "mellanox/dp", "", D)),
    (f"docker-pullable://mirror.local:5000/a/b/c:1@{D}", ImageRef("mirror.local:5000", "a/b/c",
                                                                  "1", D)),
    ("localhost/dp:2", ImageRef("localhost", "dp", "2")),
    ("127.0.0.1:5000/dp", ImageRef("127.0.0.1:5000", "dp")),
])
def test_parse_image(text: str, ref: ImageRef) -> None:
    assert parse_image(text) == ref


def test_reference_prefers_the_digest() -> None:
    assert parse_image(f"r.io/a:1@{D}").reference == D
    assert parse_image("r.io/a").reference == "latest"
    assert str(parse_image("busybox")) == f"{HUB}/library/busybox:latest"


@pytest.mark.parametrize("text, error", [
    ("", "not an image reference: ''"),
    ("r.io/a@md5:abc", "unsupported digest in 'r.io/a@md5:abc' (want sha256:<64 hex>)"),
    ("R.io/Upper/Case:1", "not an image reference: 'R.io/Upper/Case:1'"),
    ("a b", "not an image reference: 'a b'"),
])
def test_parse_image_refuses(text: str, error: str) -> None:
    with pytest.raises(RegistryError) as exc:
        parse_image(text)
    assert str(exc.value) == error


def test_docker_config_forms(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"auths": {
        "https://index.docker.io/v1/": {"auth": base64.b64encode(b"hub:pw:with:colons").decode()},
        "mirror.local:5000": {"username": "m", "password": "p"},
        "https://ghcr.io/v2/": {"auth": base64.b64encode(b"g:t").decode()},
        "empty.io": {},
    }}))
    assert load_credentials(path) == {HUB: ("hub", "pw:with:colons"),
                                      "mirror.local:5000": ("m", "p"), "ghcr.io": ("g", "t")}
    path.write_text(json.dumps({"old.io": {"auth": base64.b64encode(b"o:p").decode()}}))
    assert load_credentials(path) == {"old.io": ("o", "p")}, "the older bare-map form"


@pytest.mark.parametrize("text, error", [
    ("{", "cannot read docker config"),
    ("[]", "no auths map"),
    ('{"auths": {"r.io": {"auth": "!!!"}}}', "bad auth for r.io"),
])
def test_bad_docker_config(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(RegistryError) as exc:
        load_credentials(path)
    assert error in str(exc.value)


@pytest.mark.parametrize("node, image, runs", [
    (Platform("linux", "amd64"), Platform("linux", "amd64"), True),
    (Platform("linux", "amd64"), Platform("linux", "arm64"), False),
    (Platform("linux", "arm64", "v8"), Platform("linux", "arm64"), True),
    (Platform("linux", "arm64", "v8"), Platform("linux", "arm64", "v8"), True),
    (Platform("linux", "arm", "v7"), Platform("linux", "arm", "v6"), False),
    (Platform("linux", "amd64"), Platform("windows", "amd64"), False),
])
def test_platform_runs(node: Platform, image: Platform, runs: bool) -> None:
    assert node.runs(image) is runs


def test_node_platform_from_node_info_and_machine() -> None:
    node = {"status": {"nodeInfo": {"operatingSystem": "linux", "architecture": "arm64"}}}
    assert node_platform(parse_node(node), "aarch64") == Platform("linux", "arm64", "v8")
    assert node_platform(parse_node(node), "x86_64") == Platform("linux", "arm64"), \
        "the kubelet's word wins; the variant only when the machine agrees"
    assert node_platform(None, "x86_64") == Platform("linux", "amd64")


def pod(name: str, created: str, containers: dict[str, tuple[str, str]]) -> dict[str, object]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"containers": [{"name": n, "image": img}
                                    for n, (img, _) in containers.items()]},
            "status": {"containerStatuses": [{"name": n, "image": img, "imageID": iid}
                                             for n, (img, iid) in containers.items()]}}


def test_plugin_images_prefer_the_digest_that_ran() -> None:
    obs = plugin_observation(pods=[
        pod("old", "2026-01-01T00:00:00Z", {"dp": ("r.io/dp:1", f"r.io/dp@{D}")}),
        pod("new", "2026-02-01T00:00:00Z", {"dp": ("r.io/dp:2", f"docker-pullable://r.io/dp@{D}"),
                                            "side": ("r.io/side:1", "sha256:" + "b" * 64)}),
    ])
    assert plugin_images(obs) == [f"docker-pullable://r.io/dp@{D}", "r.io/side:1"]


def test_plugin_images_without_a_pod_come_from_the_daemonset() -> None:
    ds = {"spec": {"template": {"spec": {"containers": [{"name": "dp", "image": "r.io/dp:3"}]}}}}
    assert plugin_images(plugin_observation(daemonset=ds)) == ["r.io/dp:3"]
    assert plugin_images(DevicePluginObservation()) == []


def test_image_facts() -> None:
    node = Platform("linux", "amd64")
    images = [
        ImagePlatforms("r.io/a:1", D, (Platform("linux", "arm64"),)),
        ImagePlatforms("r.io/b:1", D, (Platform("linux", "amd64"), Platform("linux", "arm64"))),
        ImagePlatforms("r.io/c:1", error="r.io: refused"),
        ImagePlatforms("r.io/d:1", D, ()),
    ]
    problems, notes = image_facts(images, node)
    assert problems == [("ImageArchMismatch",
                         f"image r.io/a:1 ({D}) is built for linux/arm64; this node is "
                         "linux/amd64: it cannot run here")]
    assert notes == [f"image linux/amd64 verified ({D[:19]})",
                     "image platform not verified (r.io/c:1): r.io: refused",
                     "image platform not verified (r.io/d:1): the registry lists no platform"]


def ready_plugin(images: tuple[ImagePlatforms, ...]) -> DevicePluginObservation:
    return plugin_observation(
        node={"status": {"nodeInfo": {"operatingSystem": "linux", "architecture": "amd64"},
                         "allocatable": {"rdma/hca": "4"}, "capacity": {"rdma/hca": "4"}}},
        daemonset={"metadata": {"namespace": "kube-system", "name": "dp"},
                   "spec": {"template": {"spec": {"tolerations": [
                       {"key": "nodeagent.io/fabric-unready", "operator": "Exists"}]}}}},
        pods=[{"metadata": {"uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"},
               "status": {"conditions": [{"type": "Ready", "status": "True"}]}}],
        images=images, machine="x86_64")


def test_registry_trouble_never_fails_the_condition() -> None:
    cfg = parse_config({"kubernetes": {}, "device_plugin": {"daemonset": "dp",
                                                            "resource": "rdma/hca"}})
    unknown = device_plugin_finding(cfg, ready_plugin((ImagePlatforms("r.io/dp:1",
                                                                      error="timed out"),)))
    assert (unknown.status, unknown.reason) == ("True", "PluginReady")
    assert "image platform not verified (r.io/dp:1): timed out" in unknown.message
    wrong = device_plugin_finding(cfg, ready_plugin((ImagePlatforms(
        "r.io/dp:1", D, (Platform("linux", "arm64"),)),)))
    assert (wrong.status, wrong.reason) == ("False", "ImageArchMismatch")
    assert "linux/arm64" in wrong.message and "linux/amd64" in wrong.message and D in wrong.message
