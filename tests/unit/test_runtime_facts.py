"""The runtime's facts about the plugin pod: fixture trees in the shapes a real kubelet
v1.34 and containerd 1.6 wrote in tests/kubelet (pod log paths and CRI log lines, content
store blobs addressed by the imageID a container status carries), for the edge cases the
real tier does not reach. The real tier is tests/kubelet."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodeagent.checks.deviceplugin import device_plugin_finding, runtime_facts
from nodeagent.config import parse_config
from nodeagent.kube.objects import parse_daemonset, parse_pod, plugin_observation
from nodeagent.model.kube import DevicePluginObservation, Platform
from nodeagent.probes.runtime import (
    LOG_TAIL,
    container_log_lines,
    image_digest,
    stored_image_platforms,
)
from nodeagent.run.deviceplugin import with_runtime_facts

AMD64 = Platform("linux", "amd64")
POD = {"metadata": {"namespace": "kube-system", "name": "rdma-dp-x7k2p",
                    "uid": "f8d47397-5ade-4eab-aab6-fa00af6b77a9",
                    "creationTimestamp": "2026-12-01T14:05:04Z",
                    "ownerReferences": [{"kind": "DaemonSet", "name": "rdma-dp"}]}}


def store_blob(root: Path, body: dict[str, Any] | bytes) -> str:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    digest = hashlib.sha256(data).hexdigest()
    path = root / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return "sha256:" + digest


def write_log(pods: Path, restart: int, *lines: str) -> Path:
    meta = POD["metadata"]
    d = pods / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "dp"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{restart}.log"
    # The kubelet's CRI log format, as written in tests/kubelet.
    path.write_text("".join(f"2026-12-01T14:05:18.168215102Z stderr F {line}\n"
                            for line in lines))
    return path


def test_image_digest_from_either_form_of_image_id() -> None:
    hexd = "ab" * 32
    assert image_digest(f"sha256:{hexd}") == f"sha256:{hexd}"
    assert image_digest(f"registry.example/rdma/dp@sha256:{hexd}") == f"sha256:{hexd}"
    assert image_digest("docker-pullable://x:1") is None
    assert image_digest("sha256:short") is None


def test_config_manifest_and_index_in_the_content_store(tmp_path: Path) -> None:
    config = store_blob(tmp_path, {"architecture": "arm64", "os": "linux"})
    manifest = store_blob(tmp_path, {"schemaVersion": 2, "config": {"digest": config}})
    index = store_blob(tmp_path, {"manifests": [
        {"digest": manifest, "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": manifest, "platform": {"os": "unknown", "architecture": "unknown"}}]})
    for image_id in (config, f"reg/dp@{manifest}", f"reg/dp@{index}"):
        found = stored_image_platforms(tmp_path, "reg/dp:1", image_id)
        assert found.platforms == (Platform("linux", "arm64"),), image_id
        assert found.error is None


def test_unusable_store_entries_are_errors_not_platforms(tmp_path: Path) -> None:
    missing = "sha256:" + "cd" * 32
    assert "content store" in (stored_image_platforms(tmp_path, "i", missing).error or "")
    garbage = store_blob(tmp_path, b"\xff\xfe not json")
    assert stored_image_platforms(tmp_path, "i", garbage).error
    listed = store_blob(tmp_path, b"[1, 2]")
    assert stored_image_platforms(tmp_path, "i", listed).error
    no_arch = store_blob(tmp_path, {"os": "linux"})
    assert "no os/architecture" in (stored_image_platforms(tmp_path, "i", no_arch).error or "")
    big = tmp_path / "blobs" / "sha256" / ("ef" * 32)
    big.write_bytes(b" " * (2 << 20))
    assert stored_image_platforms(tmp_path, "i", "sha256:" + "ef" * 32).error
    fifo = tmp_path / "blobs" / "sha256" / ("01" * 32)
    os.mkfifo(fifo)  # never blocks the reader
    assert stored_image_platforms(tmp_path, "i", "sha256:" + "01" * 32).error
    assert stored_image_platforms(tmp_path, "i", "nonsense").error


def test_log_lines_from_the_newest_two_attempts(tmp_path: Path) -> None:
    write_log(tmp_path, 0, "started")
    write_log(tmp_path, 1, "exec /app: exec format error")
    write_log(tmp_path, 2, "partial")
    (tmp_path / "kube-system_rdma-dp-x7k2p_f8d47397-5ade-4eab-aab6-fa00af6b77a9" / "dp"
     / "notes.log").write_text("2026-12-01T14:05:18Z stderr F ignored\n")
    assert container_log_lines(tmp_path, parse_pod(POD), "dp") == ["exec /app: exec format error",
                                                         "partial"]
    assert container_log_lines(tmp_path, parse_pod(POD), "other") == []
    assert container_log_lines(tmp_path / "absent", parse_pod(POD), "dp") == []


def test_a_long_log_is_read_from_its_end(tmp_path: Path) -> None:
    path = write_log(tmp_path, 0, *(["x" * 200] * 1000), "exec /app: exec format error")
    assert path.stat().st_size > LOG_TAIL
    lines = container_log_lines(tmp_path, parse_pod(POD), "dp")
    assert lines[-1] == "exec /app: exec format error"
    assert all(line == "x" * 200 for line in lines[:-1])  # no torn first line


def plugin_obs(tmp_path: Path, image_id: str, state: dict[str, Any]) -> DevicePluginObservation:
    pod = {**POD, "status": {"containerStatuses": [{
        "name": "dp", "image": "reg/dp:1", "imageID": image_id, "ready": False,
        "restartCount": 2, **state}]}}
    obs = plugin_observation(node={"status": {"nodeInfo": {
        "operatingSystem": "linux", "architecture": "amd64"}}}, pods=[pod], machine="x86_64")
    cfg = parse_config({"device_plugin": {"runtime": {
        "content_store": str(tmp_path / "store"), "pod_logs": str(tmp_path / "pods")}}})
    assert cfg.device_plugin is not None
    return with_runtime_facts(obs, cfg.device_plugin.runtime)


# The real container status of an arm64 binary run on amd64 (tests/kubelet): no message.
CRASHED = {"state": {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": "back-off 20s restarting failed container=dp"}},
           "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}


def test_log_line_names_the_mismatch_even_when_the_config_claims_amd64(tmp_path: Path) -> None:
    config = store_blob(tmp_path / "store", {"architecture": "amd64", "os": "linux"})
    write_log(tmp_path / "pods", 1, "exec /app: exec format error")
    obs = plugin_obs(tmp_path, config, CRASHED)
    problems, _ = runtime_facts(obs, AMD64)
    assert [p[0] for p in problems] == ["ImageArchMismatch"]
    assert "exec format error" in problems[0][1] and "linux/amd64" in problems[0][1]


def test_stored_config_of_another_platform_is_a_mismatch_before_any_log(tmp_path: Path) -> None:
    config = store_blob(tmp_path / "store", {"architecture": "arm64", "os": "linux"})
    obs = plugin_obs(tmp_path, config, {"state": {"waiting": {"reason": "ContainerCreating"}}})
    problems, _ = runtime_facts(obs, AMD64)
    assert problems and "built for linux/arm64" in problems[0][1]


def test_matching_image_and_clean_log_is_a_note(tmp_path: Path) -> None:
    config = store_blob(tmp_path / "store", {"architecture": "amd64", "os": "linux"})
    write_log(tmp_path / "pods", 0, "deviceplugin: registered rdma/hca x4")
    problems, notes = runtime_facts(plugin_obs(tmp_path, config, {}), AMD64)
    assert problems == [] and any("verified by the runtime" in n for n in notes)


def test_mismatch_is_the_reason_over_crash_looping(tmp_path: Path) -> None:
    config = store_blob(tmp_path / "store", {"architecture": "amd64", "os": "linux"})
    write_log(tmp_path / "pods", 1, "exec /app: exec format error")
    ds = {"spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}}
    obs = replace(plugin_obs(tmp_path, config, CRASHED), daemonset=parse_daemonset(ds))
    cfg = parse_config({"kubernetes": {}, "device_plugin": {"min_allocatable": 0}})
    f = device_plugin_finding(cfg, obs)
    assert (f.status, f.reason) == ("False", "ImageArchMismatch")
    assert "never been Ready" in f.message  # the pod's state is still said
