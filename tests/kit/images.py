"""Container images for the kubelet tier, made here rather than pulled (the tests reach no
registry but their own): the Go programs under tools/testenv built static for a chosen
architecture, each put alone in a one-layer OCI image, written as an OCI image-layout tar
that `ctr images import` reads.

The binaries are cached by source hash beside the testenv binary.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

from tests.kit.apiserver import CACHE, TESTENV_SRC, go_build, source_hash

# containerd's import reads the image name from this annotation of the layout's index.
NAME_ANNOTATION = "io.containerd.image.name"


def build_program(package: str, goarch: str = "amd64") -> Path:
    """tools/testenv/<package> built static for linux/<goarch>, cached by source hash."""
    env = {**os.environ, "CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": goarch}
    return go_build(CACHE / f"{package}-{goarch}-{source_hash(package)}",
                    ["-ldflags=-s -w", f"./{package}"], TESTENV_SRC,
                    f"tools/testenv/{package} for {goarch}", env)


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def layer_tar(files: dict[str, Path]) -> bytes:
    """An uncompressed layer holding each file (executable) at its path."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, src in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            data = src.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def oci_image(out: Path, name: str, files: dict[str, Path], entrypoint: list[str],
              arch: str = "amd64") -> str:
    """Write an OCI image-layout tar of a one-layer image named `name` whose config says
    linux/`arch`; return the manifest digest (what the runtime reports as the image's
    repo digest)."""
    blobs: dict[str, bytes] = {}
    layer = layer_tar(files)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    config = {"architecture": arch, "os": "linux",
              "config": {"Entrypoint": entrypoint},
              "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}
    config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json",
                   **_blob(blobs, json.dumps(config).encode())}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                     **_blob(blobs, json.dumps(manifest).encode()),
                     "annotations": {NAME_ANNOTATION: name}}
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    with tarfile.open(out, "w") as tar:
        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    return str(manifest_desc["digest"])


def ctr() -> str:
    found = shutil.which("ctr")
    if not found:
        raise RuntimeError("the kubelet tests need containerd's ctr (tools/bootstrap installs "
                           "the containerd package)")
    return found
