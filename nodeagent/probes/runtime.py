"""What the node's own container runtime knows about the plugin's pod. Read-only, files only.

The registry says what an image offers; the runtime says what this node actually pulled and
ran, with no network in between:
- the image's platform, from containerd's content store (`blobs/sha256/<hex>`): the pod's
  `imageID` is the image config's digest (`sha256:...`) for an image without a repo digest,
  or `repo@sha256:<manifest or index digest>` for one pulled from a registry;
- the newest lines the containers wrote, from the kubelet's pod logs
  (`<pods dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`, CRI format
  `<RFC 3339 time> <stream> <F|P> <text>`). A binary of another architecture writes
  nothing in the pod's status: `exec /app: exec format error` is only in these logs
  (measured on kubelet v1.34 with containerd 1.6 and runc 1.1; see tests/kubelet).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nodeagent.io.files import describe_error, read_bytes_bounded, read_tail
from nodeagent.model.kube import ImagePlatforms, Platform, PodFacts
from nodeagent.probes.registry import platform_of

BLOB_MAX = 1 << 20  # a manifest, index or config is a few KiB
LOG_TAIL = 16 << 10  # the newest lines of a log are all the check reads
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_LOG_LINE = re.compile(r"^\S+ (?:stdout|stderr) [FP] (.*)$")


def image_digest(image_id: str) -> str | None:
    """The sha256 digest in a container status' imageID, if it names one."""
    digest = image_id.rsplit("@", 1)[-1]
    return digest if _DIGEST.match(digest) else None


def _blob(content_root: Path, digest: str) -> dict[str, Any]:
    data = read_bytes_bounded(content_root / "blobs" / "sha256" / digest.split(":", 1)[1],
                              BLOB_MAX)
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"{digest} is not a JSON object")
    return body


def stored_image_platforms(content_root: Path, image: str, image_id: str) -> ImagePlatforms:
    """The platform(s) of an image in containerd's content store, from its status' imageID.
    An error (not stored here, unreadable, not JSON) leaves the fact Unknown."""
    digest = image_digest(image_id)
    if digest is None:
        return ImagePlatforms(image=image, error=f"imageID {image_id!r} names no sha256 digest")
    try:
        body = _blob(content_root, digest)
        if isinstance(body.get("manifests"), list):  # an index: what it offers
            found = [platform_of(m.get("platform")) for m in body["manifests"]
                     if isinstance(m, dict)]
            return ImagePlatforms(image=image, digest=digest,
                                  platforms=tuple(dict.fromkeys(p for p in found if p)))
        config = body.get("config")
        if isinstance(config, dict) and isinstance(config.get("digest"), str) \
                and _DIGEST.match(config["digest"]):
            body = _blob(content_root, config["digest"])  # a manifest: its config says
        platform = platform_of(body)
        if platform is None:
            return ImagePlatforms(image=image, digest=digest,
                                  error="the stored image config declares no os/architecture")
        return ImagePlatforms(image=image, digest=digest, platforms=(platform,))
    except (OSError, ValueError) as exc:
        return ImagePlatforms(image=image, digest=digest,
                              error=f"not readable from the runtime's content store: "
                                    f"{describe_error(exc)}")


def _restart(path: Path) -> int:
    try:
        return int(path.stem)
    except ValueError:
        return -1


def container_log_lines(pods_dir: Path, pod: PodFacts, container: str,
                        keep: int = 2) -> list[str]:
    """The text of the last lines of the container's newest `keep` log files (the current
    attempt and the previous one: a crash-looping container's error is in the previous one
    while the next attempt starts). Nothing when there is no log (yet)."""
    directory = pods_dir / f"{pod.namespace}_{pod.name}_{pod.uid}" / container
    try:
        files = sorted((p for p in directory.glob("*.log") if _restart(p) >= 0), key=_restart)
    except OSError:
        return []
    lines: list[str] = []
    for path in files[-keep:]:
        try:
            tail = read_tail(path, LOG_TAIL).decode("utf-8", errors="replace")
        except OSError:
            continue
        for raw in tail.splitlines()[1 if len(tail) >= LOG_TAIL else 0:]:
            match = _LOG_LINE.match(raw)
            if match:
                lines.append(match.group(1))
    return lines


def platform_hint(platforms: tuple[Platform, ...]) -> str:
    return ", ".join(str(p) for p in platforms) or "no platform"
