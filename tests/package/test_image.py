"""The container image (tools/imagebuild.py): its layout says what it is, honestly; the
agent runs from the image's own root filesystem with the distro's pyverbs; a rebuild gives
the same bytes; pushed to the real registry, the agent's own image-platform check accepts
it. (Running it as the DaemonSet's pod on a real kubelet: tests/kubelet/test_agent_pod.py.)"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nodeagent import __version__
from nodeagent.checks.deviceplugin import image_facts, node_platform
from nodeagent.kube.objects import parse_node
from nodeagent.model.kube import Platform
from nodeagent.probes.registry import RegistryClient
from tests.kit.helpers import build_cache
from tests.kit.registry_env import Registry
from tools import imagebuild
from tools.imagebuild import Image


def blob(image: Image, digest: str) -> bytes:
    return (image.layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()


def doc(image: Image, digest: str) -> dict[str, Any]:
    data = blob(image, digest)
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    parsed: dict[str, Any] = json.loads(data)
    return parsed


@pytest.fixture(scope="module")
def rootfs(agent_image: Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's layers unpacked in order, as a runtime's snapshotter stacks them."""
    root = tmp_path_factory.mktemp("rootfs")
    manifest = doc(agent_image, agent_image.manifest_digest)
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(blob(agent_image, layer["digest"])),
                          mode="r:gz") as tar:
            names = tar.getnames()
            assert not any(Path(n).name.startswith(".wh.") for n in names), \
                "no layer deletes what a lower one made"
        # GNU tar, as root, keeps owners, modes and device nodes as a snapshotter does.
        subprocess.run(["tar", "-xz", "--numeric-owner", "-C", str(root)],
                       input=blob(agent_image, layer["digest"]), check=True, timeout=300)
    return root


def test_the_layout_says_what_the_image_is(agent_image: Image) -> None:
    layout_index = json.loads((agent_image.layout / "index.json").read_text())
    (top,) = layout_index["manifests"]
    assert top["digest"] == agent_image.index_digest
    assert top["annotations"]["io.containerd.image.name"] == f"nodeagent:{__version__}"
    index = doc(agent_image, agent_image.index_digest)
    (entry,) = index["manifests"]
    assert entry["platform"] == {"os": "linux", "architecture": "amd64"}
    manifest = doc(agent_image, entry["digest"])
    config = doc(agent_image, manifest["config"]["digest"])
    # The index's platform is the config's: what the image is, not what someone typed.
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert platform.machine() == "x86_64"
    assert config["config"]["Entrypoint"] == ["/opt/nodeagent/bin/nodeagent"]
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == __version__
    diff_ids = [
        "sha256:" + hashlib.sha256(gzip.decompress(blob(agent_image, layer["digest"])))
        .hexdigest() for layer in manifest["layers"]]
    assert config["rootfs"]["diff_ids"] == diff_ids
    assert [h["created_by"].split(" ")[0] for h in config["history"]] == \
        ["mmdebstrap", "dependencies:", "nodeagent:"]


def test_the_agent_runs_from_the_images_root(rootfs: Path, tmp_path: Path) -> None:
    def chroot(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/usr/sbin/chroot", str(rootfs), *argv], capture_output=True,
                              text=True, timeout=120,
                              env={"PATH": "/opt/nodeagent/bin:/usr/bin:/bin"})

    assert chroot("nodeagent", "--version").stdout.strip() == f"nodeagent {__version__}"
    # The distro's pyverbs, through the venv's --system-site-packages (the PyPI one does
    # not match Debian's rdma-core), and every dependency from the image's own venv.
    probe = chroot("python", "-c", "import pyverbs.device, nodeagent, kubernetes, pyroute2; "
                   "print(pyverbs.__file__, nodeagent.__file__)")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == [
        "/usr/lib/python3/dist-packages/pyverbs/__init__.py",
        "/opt/nodeagent/lib/python3.11/site-packages/nodeagent/__init__.py"]
    config = rootfs / "etc" / "nodeagent" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("rails: []\nstate_dir: /var/lib/nodeagent\n")
    res = chroot("nodeagent", "check", "--config-only", "--config", "/etc/nodeagent/config.yaml")
    assert res.returncode == 0, res.stdout + res.stderr
    config.write_text("rails: [{name: 1bad}]\n")
    bad = chroot("nodeagent", "check", "--config-only", "--config", "/etc/nodeagent/config.yaml")
    assert bad.returncode != 0 and "rails" in bad.stderr + bad.stdout
    # Compiled ahead (the DaemonSet's root filesystem is read-only): no source left uncompiled.
    site = rootfs / "opt/nodeagent/lib/python3.11/site-packages/nodeagent"
    sources = {p.stem for p in site.glob("*.py")}
    compiled = {p.name.split(".")[0] for p in (site / "__pycache__").glob("*.pyc")}
    assert sources <= compiled


def test_a_rebuild_gives_the_same_bytes(agent_image: Image, tmp_path: Path) -> None:
    """The app layer is rebuilt from a fresh wheel each time; the Debian and dependency
    layers come from the cache, and were measured reproducible by building them twice
    (docs/testing.md)."""
    again = imagebuild.build(tmp_path / "again", build_cache("image"))
    assert again.index_digest == agent_image.index_digest
    assert [layer.digest for layer in again.layers] == \
        [layer.digest for layer in agent_image.layers]


def test_the_pushed_image_passes_the_agents_own_platform_check(
        registry: Registry, pushed_image: str, agent_image: Image, tmp_path: Path) -> None:
    found = RegistryClient(ca_bundle=registry.ca).image_platforms(pushed_image)
    assert found.error is None, found.error
    assert found.digest == agent_image.index_digest
    assert found.platforms == (Platform("linux", "amd64"),)
    problems, notes = image_facts([found], node_platform(None, "x86_64"))
    assert problems == []
    assert notes == [f"image linux/amd64 verified ({agent_image.index_digest[:19]})"]
    arm_node = node_platform(parse_node({"status": {"nodeInfo": {"architecture": "arm64"}}}),
                             "aarch64")
    problems, _ = image_facts([found], arm_node)
    assert [reason for reason, _ in problems] == ["ImageArchMismatch"]
    assert "built for linux/amd64" in problems[0][1]
