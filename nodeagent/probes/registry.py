"""Which platforms a container image offers, from its registry (OCI distribution API). Read-only.

A small client that follows the distribution spec rather than a library: the agent must bound
every reply (size and time), follow redirects only to https (or the same host), never send
credentials to another host, and verify every digest it is given. What is read by digest is
cached for good: a digest never changes.

Redirects: only to https (relative ones stay on the registry's https origin); a Location
with another scheme is refused. Auth: anonymous, Basic, and the standard bearer-token flow (401 with
`WWW-Authenticate: Bearer realm=...,service=...,scope=...`), with credentials from a
docker-config JSON file (the form of a kubelet image pull secret).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import urllib3

from nodeagent.io.files import one_line, parse_json_state
from nodeagent.io.http import TRACKED_POOLS, BodyTooLarge, DeadlineExceeded, read_body
from nodeagent.io.http import deadline as http_deadline
from nodeagent.model.kube import ImagePlatforms, Platform

DOCKER_HUB = "registry-1.docker.io"
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
SCHEMA1_TYPES = (
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
)
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES + SCHEMA1_TYPES)
MAX_REDIRECTS = 5
CACHE_SIZE = 256
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(Exception):
    """The registry could not answer the question; the message is one line."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port]
    repository: str
    tag: str = ""
    digest: str = ""

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        ref = f"{self.registry}/{self.repository}"
        return f"{ref}@{self.digest}" if self.digest else f"{ref}:{self.reference}"


def parse_image(text: str) -> ImageRef:
    """A pod's image or imageID as a registry reference.

    Accepts `registry/repo:tag`, `repo@sha256:...`, `docker-pullable://...` (dockershim), and
    Docker Hub short names (`busybox` is `registry-1.docker.io/library/busybox:latest`).
    """
    ref = text.strip()
    for prefix in ("docker-pullable://", "docker://"):
        ref = ref.removeprefix(prefix)
    if not ref or " " in ref:
        raise RegistryError(f"not an image reference: {text!r}")
    name, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        raise RegistryError(f"unsupported digest in {text!r} (want sha256:<64 hex>)")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry in ("docker.io", "index.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not repository or repository != repository.lower():
        raise RegistryError(f"not an image reference: {text!r}")
    return ImageRef(registry, repository, tag, digest)


def load_credentials(path: Path | None) -> dict[str, tuple[str, str]]:
    """Registry host -> (user, password) from a docker-config JSON file (`{"auths": {...}}`,
    or the older bare map). Keys may be URLs (`https://host/v1/`): the host is what counts."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RegistryError(f"cannot read docker config {path}: {exc}") from exc
    auths = data.get("auths", data) if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        raise RegistryError(f"docker config {path}: no auths map")
    creds: dict[str, tuple[str, str]] = {}
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            continue
        user, password = entry.get("username"), entry.get("password")
        if entry.get("auth"):
            try:
                user, _, password = (base64.b64decode(entry["auth"], validate=True)
                                      .decode().partition(":"))
            except ValueError as exc:
                raise RegistryError(f"docker config {path}: bad auth for {key}") from exc
        if not user:
            continue
        host = urlsplit(key if "://" in key else f"//{key}").netloc
        if host in ("index.docker.io", "docker.io"):
            host = DOCKER_HUB
        creds[host] = (str(user), str(password or ""))
    return creds


def platform_of(entry: Any) -> Platform | None:
    if not isinstance(entry, dict):
        return None
    os_, arch = entry.get("os"), entry.get("architecture")
    if not isinstance(os_, str) or not isinstance(arch, str) or "unknown" in (os_, arch):
        return None  # e.g. the attestation manifests buildkit adds to an index
    variant = entry.get("variant")
    return Platform(os_, arch, variant if isinstance(variant, str) else "")


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise RegistryError("registry did not answer in time")
        return left


class RegistryClient:
    """Thread-safe; one per agent (its cache and tokens are shared by every lookup)."""

    def __init__(
        self,
        ca_bundle: Path | None = None,
        docker_config: Path | None = None,
        timeout: float = 10.0,
        max_bytes: int = 4 << 20,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.credentials = load_credentials(docker_config)
        self.http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED", ca_certs=str(ca_bundle) if ca_bundle else None,
            retries=False, maxsize=2)
        self.http.pool_classes_by_scheme = dict(TRACKED_POOLS)  # headers held to the deadline
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}  # (host, scope) -> token
        self._cache: OrderedDict[str, tuple[Platform, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0  # HTTP requests made, for benchmarks and tests

    # ------------------------------------------------------------------ public

    def image_platforms(self, image: str) -> ImagePlatforms:
        """What `image` offers; registry trouble becomes an `error`, never an exception."""
        try:
            ref = parse_image(image)
            digest, platforms = self.resolve(ref)
        except RegistryError as exc:
            return ImagePlatforms(image=image, error=str(exc))
        return ImagePlatforms(image=image, digest=digest, platforms=platforms)

    def resolve(self, ref: ImageRef) -> tuple[str, tuple[Platform, ...]]:
        if ref.digest:
            with self._lock:
                if ref.digest in self._cache:
                    self._cache.move_to_end(ref.digest)
                    return ref.digest, self._cache[ref.digest]
        deadline = _Deadline(self.timeout)
        body, media_type, digest = self._manifest(ref, ref.reference, deadline)
        platforms = self._platforms(ref, body, media_type, deadline)
        with self._lock:
            self._cache[digest] = platforms
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return digest, platforms

    # ------------------------------------------------------------------ distribution API

    def _manifest(self, ref: ImageRef, reference: str,
                  deadline: _Deadline) -> tuple[Any, str, str]:
        data, headers = self._get(ref, f"/v2/{ref.repository}/manifests/{reference}",
                                  {"Accept": ACCEPT}, deadline)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if _DIGEST.match(reference) and digest != reference:
            raise RegistryError(f"{ref}: manifest does not match its digest (got {digest})")
        body = self._json(data, f"{ref} manifest")
        media_type = body.get("mediaType") or headers.get("Content-Type", "").split(";")[0]
        return body, media_type, digest

    def _platforms(self, ref: ImageRef, body: dict[str, Any], media_type: str,
                   deadline: _Deadline) -> tuple[Platform, ...]:
        if media_type in INDEX_TYPES or (not media_type and "manifests" in body):
            manifests = body.get("manifests")
            if not isinstance(manifests, list):
                raise RegistryError(f"{ref}: index without a manifests list")
            found = [p for p in (platform_of(m.get("platform") if isinstance(m, dict) else None)
                                 for m in manifests) if p]
            return tuple(dict.fromkeys(found))
        if media_type in SCHEMA1_TYPES or body.get("schemaVersion") == 1:
            arch = body.get("architecture")
            if not isinstance(arch, str):
                raise RegistryError(f"{ref}: schema1 manifest without architecture")
            return (Platform("linux", arch),)
        config = body.get("config")
        config_digest = config.get("digest") if isinstance(config, dict) else None
        if not isinstance(config_digest, str) or not _DIGEST.match(config_digest):
            raise RegistryError(f"{ref}: manifest ({media_type or 'no media type'}) "
                                "has no sha256 config digest")
        data, _ = self._get(ref, f"/v2/{ref.repository}/blobs/{config_digest}", {}, deadline)
        if "sha256:" + hashlib.sha256(data).hexdigest() != config_digest:
            raise RegistryError(f"{ref}: image config does not match its digest")
        platform = platform_of(self._json(data, f"{ref} image config"))
        if platform is None:
            raise RegistryError(f"{ref}: image config declares no os/architecture")
        return (platform,)

    @staticmethod
    def _json(data: bytes, what: str) -> dict[str, Any]:
        try:  # strict: nesting that exhausts the parser is "not JSON" too
            body = parse_json_state(data.decode("utf-8"))
        except ValueError as exc:
            raise RegistryError(f"{what} is not JSON") from exc
        if not isinstance(body, dict):
            raise RegistryError(f"{what} is not a JSON object")
        return body

    # ------------------------------------------------------------------ HTTP

    def _get(self, ref: ImageRef, path: str, headers: dict[str, str],
             deadline: _Deadline) -> tuple[bytes, Mapping[str, str]]:
        """GET with auth: once as is (or with a cached token), once more after a challenge."""
        scope = f"repository:{ref.repository}:pull"
        token = self._token(ref.registry, scope)
        status, data, resp_headers = self._fetch(
            f"https://{ref.registry}{path}", ref.registry, headers, token, deadline)
        if status == 401:
            token = self._authenticate(ref.registry, scope,
                                       resp_headers.get("WWW-Authenticate", ""), deadline)
            status, data, resp_headers = self._fetch(
                f"https://{ref.registry}{path}", ref.registry, headers, token, deadline)
        if status != 200:
            hint = {401: " (not authorized: credentials?)", 403: " (forbidden)",
                    404: " (not found)"}.get(status, "")
            raise RegistryError(f"{ref}: GET {path} answered HTTP {status}{hint}")
        return data, resp_headers

    def _token(self, host: str, scope: str) -> str | None:
        with self._lock:
            token, expires = self._tokens.get((host, scope), ("", 0.0))
        return token if token and time.monotonic() < expires else None

    def _authenticate(self, host: str, scope: str, challenge: str,
                      deadline: _Deadline) -> str:
        """The Authorization value that answers a 401 challenge."""
        scheme = challenge.split(" ", 1)[0].lower()
        params = dict(_CHALLENGE.findall(challenge))
        creds = self.credentials.get(host)
        basic = ("Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
                 if creds else None)
        if scheme == "basic":
            if basic is None:
                raise RegistryError(f"{host} wants credentials and none are configured")
            with self._lock:
                self._tokens[(host, scope)] = (basic, time.monotonic() + 3600)
            return basic
        if scheme != "bearer" or not params.get("realm"):
            raise RegistryError(f"{host}: unsupported auth challenge {challenge[:80]!r}")
        realm = params["realm"]
        query = {"scope": params.get("scope") or scope}
        if params.get("service"):
            query["service"] = params["service"]
        realm_host = urlsplit(realm).netloc
        if urlsplit(realm).scheme != "https":
            raise RegistryError(f"{host}: token realm {realm[:80]} is not https")
        # Credentials go to the token realm the registry names (that is the protocol) only
        # over https; a Basic header is sent to no other host than the realm.
        status, data, _ = self._fetch(
            f"{realm}{'&' if '?' in realm else '?'}{urlencode(query)}", realm_host, {},
            basic, deadline)
        if status != 200:
            raise RegistryError(f"{host}: token service answered HTTP {status}"
                                + (" (credentials refused)" if status == 401 else ""))
        body = self._json(data, f"{host} token reply")
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str) or not token or len(token) > 64 << 10:
            raise RegistryError(f"{host}: token reply without a token")
        expires = body.get("expires_in")
        lifetime = float(expires) if isinstance(expires, (int, float)) and expires > 0 else 60.0
        value = f"Bearer {token}"
        with self._lock:
            # Renew a little early; 60 s is the spec's default lifetime.
            self._tokens[(host, scope)] = (value, time.monotonic() + max(lifetime - 10, 1))
        return value

    def _fetch(self, url: str, auth_host: str, headers: dict[str, str],
               authorization: str | None,
               deadline: _Deadline) -> tuple[int, bytes, Mapping[str, str]]:
        """One GET, redirects followed by hand (only to https), the Authorization header only
        ever sent to `auth_host`. Headers come back case-insensitive."""
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers)
            if authorization and urlsplit(url).netloc == auth_host:
                sent["Authorization"] = authorization
            left = deadline.left()
            self.requests += 1
            try:
                with http_deadline(left):  # a server trickling its headers cannot hold it
                    resp = self.http.request(
                        "GET", url, headers=sent, redirect=False, preload_content=False,
                        timeout=urllib3.Timeout(connect=min(left, 5.0), read=left))
            except DeadlineExceeded:
                raise RegistryError("registry did not answer in time") from None
            except urllib3.exceptions.HTTPError as exc:
                raise RegistryError(f"{urlsplit(url).netloc}: {_reason(exc)}") from exc
            complete = False
            try:
                data = self._read(resp, url, deadline)
                complete = True
                if resp.status in (301, 302, 303, 307, 308):
                    target = urljoin(url, resp.headers.get("Location", ""))
                    if urlsplit(target).scheme != "https":  # relative ones stay https
                        raise RegistryError(f"{urlsplit(url).netloc}: refusing redirect to "
                                            f"non-https {target[:100]}")
                    url = target
                    continue
                return resp.status, data, resp.headers
            finally:
                if not complete:
                    resp.close()  # a half-read connection must not go back to the pool
                resp.release_conn()
        raise RegistryError(f"more than {MAX_REDIRECTS} redirects from {urlsplit(url).netloc}")

    def _read(self, resp: urllib3.BaseHTTPResponse, url: str, deadline: _Deadline) -> bytes:
        host = urlsplit(url).netloc
        try:  # a trickling server must not hold the probe: the deadline before each read
            return read_body(resp, self.max_bytes, host, before_read=deadline.left)
        except BodyTooLarge as exc:
            raise RegistryError(str(exc)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise RegistryError(f"{host}: {_reason(exc)}") from exc


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)  # urllib3: the error that gave up, when there is one
    return one_line(reason if isinstance(reason, BaseException) else exc)
