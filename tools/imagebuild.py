"""nodeagent's container image, built from Debian packages and this checkout's wheel with no
base image pulled from anywhere: an OCI image layout (and a tar of it that `ctr images
import` and `podman load` read).

Layers, bottom up, each the same bytes when built again from the same inputs:
1. debian: a root filesystem made by mmdebstrap from Debian packages only (python3, the
   distro's pyverbs and RDMA providers, CA certificates; no apt, no docs but copyrights),
   with an empty venv at /opt/nodeagent that sees the distro's pyverbs
   (--system-site-packages: the PyPI pyverbs does not match the distro's rdma-core).
   mmdebstrap honours SOURCE_DATE_EPOCH, so two builds from the same mirror state are the
   same tar (measured: README, Install).
2. deps: the agent's PyPI dependencies, installed into the venv by pypa/installer.
3. app: the agent's own wheel.
Python files are compiled with unchecked-hash pycs (no timestamps; the root filesystem is
read-only in the DaemonSet). Layers 1 and 2 are cached by their inputs' hash under the build
cache; the app layer is rebuilt each time (seconds).

    tools/build-image [--out DIR]      (as root: mmdebstrap runs dpkg in a chroot)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ["python3", "python3-pyverbs", "ibverbs-providers", "ca-certificates"]
VENV = "/opt/nodeagent"
PYTHON = "python3.11"  # bookworm's: the deps' wheels and the pycs are built for it
SITE = f"{VENV}/lib/{PYTHON}/site-packages"
# mmdebstrap's options, all of the Debian layer's recipe (its cache key hashes them).
MMDEBSTRAP = [
    "--variant=essential",
    # merged /usr without the usrmerge package (and the perl it pulls in)
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    f"--include={','.join(PACKAGES)}",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    f'--customize-hook=chroot "$1" python3 -m venv --without-pip --system-site-packages {VENV}',
]
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
# dpkg's architecture names -> OCI's (they differ only where a variant is needed)
PLATFORMS = {"amd64": ("amd64", ""), "arm64": ("arm64", "v8")}


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Layer:
    blob: Path  # the gzipped tar
    digest: str  # of the blob
    diff_id: str  # of the uncompressed tar
    size: int
    created_by: str


@dataclass(frozen=True)
class Image:
    layout: Path  # an OCI image layout directory
    manifest_digest: str
    index_digest: str
    config_digest: str
    reference: str  # the name it is imported as
    platform: str  # os/arch[/variant]
    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        """Bytes a registry stores and a node pulls: the compressed layers."""
        return sum(layer.size for layer in self.layers)


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise BuildError(f"{' '.join(args[:4])} ... exited {res.returncode}:\n"
                         f"{(res.stdout + res.stderr)[-3000:]}")
    return res.stdout


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _commit_time(*paths: str) -> int:
    """SOURCE_DATE_EPOCH if set (the reproducible-builds convention), else the time of the
    last commit touching `paths` (so a layer's timestamps move only with its recipe)."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", *paths], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip()
    return int(out) if out else 315532800  # not a git checkout: 1980, as zip's epoch


def dpkg_arch() -> str:
    return _run("dpkg", "--print-architecture").strip()


def platform() -> tuple[str, str]:
    arch = dpkg_arch()
    if arch not in PLATFORMS:
        raise BuildError(f"no OCI platform known for dpkg architecture {arch!r}")
    return PLATFORMS[arch]


# ---------------------------------------------------------------------------- layers


def pack(root: Path, epoch: int) -> bytes:
    """`root`'s tree as a tar whose bytes depend only on the files: sorted names, one owner
    (root), every mtime `epoch`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).parts):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = epoch
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _store(cache: Path, tar: bytes, created_by: str) -> Layer:
    """Gzip `tar` (no name, no time: the same bytes each time) into the cache as a blob."""
    blob_data = gzip.compress(tar, compresslevel=6, mtime=0)
    digest = _sha256(blob_data)
    blob = cache / "blobs" / digest.split(":", 1)[1]
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        tmp = blob.with_suffix(".tmp")
        tmp.write_bytes(blob_data)
        tmp.rename(blob)
    return Layer(blob, digest, _sha256(tar), len(blob_data), created_by)


def _cached_layer(cache: Path, key: str) -> Layer | None:
    meta = cache / f"{key}.json"
    if not meta.exists():
        return None
    data = json.loads(meta.read_text())
    layer = Layer(Path(data["blob"]), data["digest"], data["diff_id"], data["size"],
                  data["created_by"])
    return layer if layer.blob.exists() else None


def _remember(cache: Path, key: str, layer: Layer) -> Layer:
    (cache / f"{key}.json").write_text(json.dumps({**layer.__dict__, "blob": str(layer.blob)}))
    return layer


def _prune(cache: Path) -> None:
    """Remove cached blobs no remembered layer names (app layers, interrupted builds)."""
    kept = {json.loads(meta.read_text())["digest"].split(":", 1)[1]
            for meta in cache.glob("*.json")}
    for blob in (cache / "blobs").iterdir():
        if blob.name not in kept:
            blob.unlink()


def debian_recipe() -> tuple[str, int]:
    epoch = _commit_time("tools/imagebuild.py")
    h = hashlib.sha256("\n".join([SUITE, MIRROR, str(epoch), dpkg_arch(), *MMDEBSTRAP])
                       .encode())
    return h.hexdigest()[:16], epoch


def debian_layer(cache: Path) -> Layer:
    """The Debian root filesystem, from the cache or made by mmdebstrap (~40 s)."""
    key, epoch = debian_recipe()
    cached = _cached_layer(cache, f"debian-{key}")
    if cached:
        return cached
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap missing: tools/bootstrap installs it (Debian package "
                         "mmdebstrap)")
    if os.geteuid() != 0:
        raise BuildError("building the Debian layer needs root (mmdebstrap runs dpkg in a "
                         "chroot)")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        out = Path(tmp) / "rootfs.tar"
        _run("mmdebstrap", "--quiet", "--format=tar", *MMDEBSTRAP, SUITE, str(out), MIRROR,
             env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)})
        layer = _store(cache, out.read_bytes(),
                       f"mmdebstrap {SUITE} {' '.join(MMDEBSTRAP)}")
    return _remember(cache, f"debian-{key}", layer)


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One build in `cache` at a time: a second build (or wheelhouse) in another process
    waits, so no layer is made twice and no prune removes another build's blob."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def wheelhouse(cache: Path) -> tuple[Path, list[Path]]:
    """The agent's wheel built from this checkout (python -m build; fresh each time) and its
    dependencies' wheels for this machine's Python (cached by pyproject.toml's hash)."""
    with _locked(cache):
        return _wheelhouse(cache)


def _wheelhouse(cache: Path) -> tuple[Path, list[Path]]:
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    deps_dir = cache / ("wheels-" + hashlib.sha256(pyproject).hexdigest()[:16])
    app_dir = cache / f"app-{os.getpid()}"
    shutil.rmtree(app_dir, ignore_errors=True)
    python = sys.executable
    _run(python, "-m", "build", "--wheel", "--outdir", str(app_dir),
         str(ROOT), env={**os.environ,
                         "SOURCE_DATE_EPOCH": str(_commit_time())})
    (app,) = app_dir.glob("nodeagent-*.whl")
    if not deps_dir.exists():
        tmp = deps_dir.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _run(python, "-m", "pip", "download", "-q", "--disable-pip-version-check",
             "--only-binary=:all:", "-d", str(tmp), str(app))
        for own in tmp.glob("nodeagent-*"):
            own.unlink()
        tmp.rename(deps_dir)
    return app, sorted(w for w in deps_dir.glob("*.whl") if not w.name.startswith("nodeagent-"))


def _install(wheels: list[Path], stage: Path) -> None:
    """Install `wheels` into the venv's paths under `stage`, as pip would in the image
    (pypa/installer: scripts get the venv's interpreter), then compile them."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    scheme = {"purelib": SITE, "platlib": SITE, "scripts": f"{VENV}/bin", "data": VENV,
              "headers": f"{VENV}/include/site/{PYTHON}"}
    dest = SchemeDictionaryDestination(scheme, interpreter=f"{VENV}/bin/python",
                                       script_kind="posix", destdir=str(stage))
    for wheel in wheels:
        with WheelFile.open(wheel) as source:
            install(source, dest, {"INSTALLER": b"nodeagent-imagebuild\n"})
    site = stage / SITE.lstrip("/")
    if site.exists():
        # In a child with a fixed hash seed: a set literal's frozenset is marshalled in hash
        # order, so pycs differ between runs otherwise.
        _run(sys.executable, "-m", "compileall", "-q", "-j1", "-d", SITE,
             "--invalidation-mode", "unchecked-hash", str(site),
             env={**os.environ, "PYTHONHASHSEED": "0"})


def python_layer(cache: Path, wheels: list[Path], epoch: int, what: str) -> Layer:
    if sys.version_info[:2] != (3, 11):
        raise BuildError(f"the image's Python is {PYTHON}; build it with a 3.11 interpreter "
                         f"(this is {sys.version.split()[0]}): its wheels and pycs must match")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        stage = Path(tmp)
        _install(wheels, stage)
        return _store(cache, pack(stage, epoch),
                      f"{what}: {' '.join(w.name for w in wheels)}")


def deps_layer(cache: Path, wheels: list[Path]) -> Layer:
    h = hashlib.sha256(Path(__file__).read_bytes())  # how they are installed is an input too
    for w in wheels:
        h.update(w.name.encode() + b"\0" + hashlib.sha256(w.read_bytes()).digest())
    epoch = _commit_time("pyproject.toml")
    h.update(str(epoch).encode())
    key = f"deps-{h.hexdigest()[:16]}"
    return _cached_layer(cache, key) or _remember(
        cache, key, python_layer(cache, wheels, epoch, "dependencies"))


# ---------------------------------------------------------------------------- image


def _write_blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = _sha256(data)
    (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def build(out: Path, cache: Path, name: str = "nodeagent") -> Image:
    """Build the image into the OCI layout directory `out` (replaced), tagged with the
    agent's version; `name` is the repository it is imported as."""
    with _locked(cache):
        return _build(out, cache, name)


def _build(out: Path, cache: Path, name: str) -> Image:
    arch, variant = platform()
    debian = debian_layer(cache)
    app_wheel, dep_wheels = _wheelhouse(cache)
    try:
        deps = deps_layer(cache, dep_wheels)
        epoch = _commit_time()
        app = python_layer(cache, [app_wheel], epoch, "nodeagent")
    finally:
        shutil.rmtree(app_wheel.parent, ignore_errors=True)
    version = app_wheel.name.split("-")[1]
    layers = (debian, deps, app)

    shutil.rmtree(out, ignore_errors=True)
    (out / "blobs" / "sha256").mkdir(parents=True)
    for layer in layers:
        shutil.copyfile(layer.blob, out / "blobs" / "sha256" / layer.digest.split(":", 1)[1])
    _prune(cache)  # the app layer is rebuilt each time: only remembered layers stay
    created = datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config: dict[str, Any] = {
        "created": created, "architecture": arch, "os": "linux",
        "config": {
            "Entrypoint": [f"{VENV}/bin/nodeagent"],
            "Cmd": ["run", "--config", "/etc/nodeagent/config.yaml"],
            "Env": [f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                    "/sbin:/bin"],
            "Labels": {"org.opencontainers.image.title": "nodeagent",
                       "org.opencontainers.image.version": version,
                       "org.opencontainers.image.licenses": "Apache-2.0"},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": created, "created_by": layer.created_by} for layer in layers],
    }
    if variant:
        config["variant"] = variant
    config_desc = {"mediaType": OCI_CONFIG,
                   **_write_blob(out, json.dumps(config, sort_keys=True).encode())}
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc,
                "layers": [{"mediaType": LAYER_GZIP, "digest": layer.digest,
                            "size": layer.size} for layer in layers]}
    manifest_desc = {"mediaType": OCI_MANIFEST,
                     **_write_blob(out, json.dumps(manifest, sort_keys=True).encode()),
                     "platform": {"os": "linux", "architecture": arch,
                                  **({"variant": variant} if variant else {})}}
    # What a registry serves under the tag: an index naming the one platform it has.
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [manifest_desc]}
    index_desc = {"mediaType": OCI_INDEX,
                  **_write_blob(out, json.dumps(index, sort_keys=True).encode())}
    reference = f"{name}:{version}"
    layout_index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
        **index_desc,
        "annotations": {"org.opencontainers.image.ref.name": version,
                        "io.containerd.image.name": reference}}]}
    (out / "index.json").write_text(json.dumps(layout_index, sort_keys=True))
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return Image(out, str(manifest_desc["digest"]), str(index_desc["digest"]),
                 str(config_desc["digest"]), reference,
                 "/".join(p for p in ("linux", arch, variant) if p), layers)


def layout_tar(layout: Path, tar_path: Path) -> Path:
    """The layout as one tar (`ctr images import`, `podman load`), reproducibly packed."""
    tar_path.write_bytes(pack(layout, 0))
    return tar_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/build-image", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "image",
                   help="the OCI layout directory to write (default: build/image); a tar "
                        "of it is written beside it")
    p.add_argument("--name", default="nodeagent", help="the repository name it imports as")
    p.add_argument("--cache", type=Path, default=None,
                   help="where layers are cached (default: the build cache)")
    args = p.parse_args(argv)
    # The tests' build cache (tests/kit/helpers.py: build_cache), so both share layers.
    cache = args.cache or Path(
        os.environ.get("NODEAGENT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                  Path.home() / ".cache") / "nodeagent"
    ) / "image"
    start = time.monotonic()
    try:
        image = build(args.out, cache, args.name)
    except BuildError as exc:
        print(f"tools/build-image: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # an unwritable cache or output directory, a full disk
        print(f"tools/build-image: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 1
    tar = layout_tar(image.layout, args.out.with_suffix(".tar"))
    print(f"{image.reference} ({image.platform}) in {time.monotonic() - start:.1f} s")
    print(f"  layout {image.layout}  tar {tar}")
    print(f"  index {image.index_digest}\n  manifest {image.manifest_digest}")
    for layer in image.layers:
        print(f"  layer {layer.digest[:19]} {layer.size / 1e6:6.1f} MB  "
              f"{layer.created_by.split(':')[0].split(' ')[0]}")
    print(f"  compressed size {image.size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
