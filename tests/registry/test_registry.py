"""The registry probe against a real docker-registry (TLS, token auth) and against a hostile
https server that lies, stalls, floods and redirects."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.model.kube import Platform
from nodeagent.probes.registry import RegistryClient
from tests.kit.pki import make_ca, pem_cert, pem_key, serving_cert
from tests.kit.registry_env import OCI_INDEX, OCI_MANIFEST, Registry, TLSServer, reply

AMD64, ARM64V8 = Platform("linux", "amd64"), Platform("linux", "arm64", "v8")
Handler = http.server.BaseHTTPRequestHandler


def client(reg: Registry, tmp_path: Path, user: str | None = "puller",
           **kw: Any) -> RegistryClient:
    creds = reg.docker_config(tmp_path / "docker.json", user) if user else None
    return RegistryClient(ca_bundle=reg.ca, docker_config=creds, **kw)


# ---------------------------------------------------------------- the real registry


def test_index_lists_every_platform(registry: Registry, tmp_path: Path) -> None:
    found = client(registry, tmp_path).image_platforms(f"{registry.host}/rdma/dp:multi")
    assert found.error is None
    assert found.digest == registry.images["multi"]
    assert found.platforms == (AMD64, ARM64V8)


def test_single_manifest_platform_comes_from_its_config(registry: Registry,
                                                        tmp_path: Path) -> None:
    c = client(registry, tmp_path)
    arm = c.image_platforms(f"{registry.host}/rdma/dp:arm64")
    assert arm.error is None, arm.error  # (failed once in a clean CI run, not reproduced)
    assert (arm.digest, arm.platforms) == (registry.images["arm64"], (Platform("linux", "arm64"),))
    amd = c.image_platforms(f"{registry.host}/rdma/dp@{registry.images['amd64']}")
    assert amd.platforms == (AMD64,), "a Docker v2 manifest is read the same way"


def test_a_digest_is_looked_up_once(registry: Registry, tmp_path: Path) -> None:
    c = client(registry, tmp_path)
    ref = f"{registry.host}/rdma/dp@{registry.images['multi']}"
    first = c.image_platforms(ref)
    spent = c.requests
    assert spent >= 2  # challenge, then the manifest with a token
    for _ in range(5):
        assert c.image_platforms(ref) == first
    assert c.requests == spent, "a digest never changes: no request after the first"


def test_the_token_is_reused_within_its_lifetime(registry: Registry, tmp_path: Path) -> None:
    c = client(registry, tmp_path)
    before = len(registry.token_requests)
    c.image_platforms(f"{registry.host}/rdma/dp:multi")
    c.image_platforms(f"{registry.host}/rdma/dp:arm64")
    asked = registry.token_requests[before:]
    assert asked == [{"user": "puller", "scope": ["repository:rdma/dp:pull"]}]


def test_anonymous_pull_where_the_registry_allows_it(registry: Registry,
                                                     tmp_path: Path) -> None:
    c = client(registry, tmp_path, user=None)
    assert c.image_platforms(f"{registry.host}/public/dp:1").platforms == (AMD64,)
    private = c.image_platforms(f"{registry.host}/rdma/dp:multi")
    assert private.platforms == ()
    assert private.error == (f"{registry.host}/rdma/dp:multi: GET /v2/rdma/dp/manifests/multi "
                             "answered HTTP 401 (not authorized: credentials?)")


def test_wrong_credentials_are_an_error_not_a_verdict(registry: Registry,
                                                      tmp_path: Path) -> None:
    path = registry.docker_config(tmp_path / "bad.json", "puller", password="wrong")
    found = RegistryClient(ca_bundle=registry.ca, docker_config=path).image_platforms(
        f"{registry.host}/rdma/dp:multi")
    assert found.error == f"{registry.host}: token service answered HTTP 401 (credentials refused)"


def test_unknown_tag_and_unknown_repository(registry: Registry, tmp_path: Path) -> None:
    c = client(registry, tmp_path)
    assert "HTTP 404 (not found)" in str(c.image_platforms(f"{registry.host}/rdma/dp:nope").error)
    assert "HTTP 404" in str(c.image_platforms(f"{registry.host}/rdma/other:1").error)


def test_tls_is_verified_by_default(registry: Registry) -> None:
    found = RegistryClient().image_platforms(f"{registry.host}/public/dp:1")
    assert found.platforms == ()
    assert "CERTIFICATE_VERIFY_FAILED" in str(found.error)


def test_registry_down_is_an_error(tmp_path: Path) -> None:
    from tests.kit.helpers import free_port

    found = RegistryClient(timeout=2).image_platforms(f"127.0.0.1:{free_port()}/rdma/dp:1")
    assert found.error and "refused" in found.error.lower()


# ---------------------------------------------------------------- a hostile server


class Hostile:
    """An https server (trusted CA) whose replies the test scripts; it records requests."""

    def __init__(self, d: Path) -> None:
        ca = make_ca()
        cert, key = serving_cert(ca, "hostile")
        (d / "ca.crt").write_bytes(pem_cert(ca[0]))
        (d / "h.crt").write_bytes(pem_cert(cert))
        (d / "h.key").write_bytes(pem_key(key))
        self.ca = d / "ca.crt"
        self.seen: list[tuple[str, str | None]] = []  # (host header + path, Authorization)
        self.route: Callable[[Handler], None] = lambda req: reply(req, 404)
        self.server = TLSServer(d / "h.crt", d / "h.key", self._handle)

    def _handle(self, req: Handler) -> None:
        self.seen.append((f"{req.headers.get('Host')}{req.path}",
                          req.headers.get("Authorization")))
        self.route(req)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def client(self, **kw: Any) -> RegistryClient:
        return RegistryClient(ca_bundle=self.ca, **kw)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Hostile]:
    h = Hostile(tmp_path)
    try:
        yield h
    finally:
        h.server.stop()


def manifest_reply(req: Handler, body: Any, media_type: str = OCI_MANIFEST) -> None:
    reply(req, 200, json.dumps(body).encode(), {"Content-Type": media_type})


def test_a_server_error_is_an_error_not_a_verdict(hostile: Hostile) -> None:
    hostile.route = lambda req: reply(req, 500, b"internal error")
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert (found.platforms, found.error) == (
        (), f"{hostile.host}/a/b:1: GET /v2/a/b/manifests/1 answered HTTP 500")


def test_a_reply_larger_than_the_bound_is_refused(hostile: Hostile) -> None:
    hostile.route = lambda req: reply(req, 200, b"x" * 5000)
    found = hostile.client(max_bytes=4096).image_platforms(f"{hostile.host}/a/b:1")
    assert found.error == f"{hostile.host}: reply of 5000 bytes, over the 4096 allowed"


def test_an_endless_reply_without_length_is_cut_off(hostile: Hostile) -> None:
    def flood(req: Handler) -> None:
        req.send_response(200)
        req.send_header("Transfer-Encoding", "chunked")
        req.end_headers()
        chunk = b"{" * 65536
        try:
            for _ in range(1000):  # 64 MiB unless the client hangs up
                req.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass

    hostile.route = flood
    found = hostile.client(max_bytes=1 << 20).image_platforms(f"{hostile.host}/a/b:1")
    assert found.error == f"{hostile.host}: reply over the {1 << 20} bytes allowed"


def lookup_against(hostile: Hostile, route: Callable[[Handler], None],
                   release: threading.Event, timeout: float) -> tuple[str | None, float]:
    """One lookup against `route` with a `timeout` budget: its error and how long it took."""
    hostile.route = route
    try:
        started = time.monotonic()
        found = hostile.client(timeout=timeout).image_platforms(f"{hostile.host}/a/b:1")
        return found.error, time.monotonic() - started
    finally:
        release.set()


def test_a_trickling_server_is_abandoned_at_the_deadline(hostile: Hostile) -> None:
    release = threading.Event()

    def trickle(req: Handler) -> None:
        req.send_response(200)
        req.send_header("Content-Length", "100000")
        req.end_headers()
        try:
            while not release.wait(0.2):  # a byte every 200 ms: each read succeeds
                req.wfile.write(b" ")
                req.wfile.flush()
        except OSError:
            pass

    error, took = lookup_against(hostile, trickle, release, 1.5)
    assert error is not None and ("in time" in error or "timed out" in error.lower())
    assert took < 10, f"the lookup took {took:.1f} s with a 1.5 s budget"


def test_a_server_trickling_its_headers_is_abandoned_at_the_deadline(hostile: Hostile) -> None:
    """Headers one byte at a time: every recv succeeds, so only a total deadline ends it."""
    release = threading.Event()

    def trickle(req: Handler) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 500
        try:
            for byte in head:
                if release.wait(0.2):
                    return
                req.wfile.write(bytes([byte]))
                req.wfile.flush()
        except OSError:
            pass

    error, took = lookup_against(hostile, trickle, release, 1.5)
    assert error == "registry did not answer in time", error
    assert took < 10, f"the lookup took {took:.1f} s with a 1.5 s budget"


def test_redirect_to_plain_http_is_refused(hostile: Hostile) -> None:
    hostile.route = lambda req: reply(req, 307, headers={
        "Location": f"http://{hostile.host}/elsewhere"})
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert found.error == (f"{hostile.host}: refusing redirect to non-https "
                           f"http://{hostile.host}/elsewhere")


def test_redirect_loop_ends(hostile: Hostile) -> None:
    hostile.route = lambda req: reply(req, 302, headers={"Location": req.path})
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert found.error == f"more than 5 redirects from {hostile.host}"
    assert len(hostile.seen) == 6


def test_credentials_never_follow_a_redirect_to_another_host(hostile: Hostile,
                                                             tmp_path: Path) -> None:
    """Blob storage usually sits behind a redirect to another host (a CDN, S3): the
    registry's Authorization must not go there. localhost is the same server, other name."""
    config = {"architecture": "arm64", "os": "linux"}
    config_data = json.dumps(config).encode()
    config_digest = "sha256:" + hashlib.sha256(config_data).hexdigest()
    other = f"localhost:{hostile.server.port}"

    def route(req: Handler) -> None:
        if not req.headers.get("Authorization") and req.headers.get("Host") == hostile.host:
            reply(req, 401, headers={"WWW-Authenticate": 'Basic realm="hostile"'})
        elif "/manifests/" in req.path:
            manifest_reply(req, {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {
                "digest": config_digest, "size": len(config_data)}})
        elif req.headers.get("Host") == hostile.host:
            reply(req, 307, headers={"Location": f"https://{other}/storage/blob?sig=1"})
        else:
            reply(req, 200, config_data)

    hostile.route = route
    creds = tmp_path / "docker.json"
    creds.write_text(json.dumps({"auths": {hostile.host: {"username": "u", "password": "p"}}}))
    found = hostile.client(docker_config=creds).image_platforms(f"{hostile.host}/a/b:1")
    assert found.platforms == (Platform("linux", "arm64"),), found.error
    storage = [auth for where, auth in hostile.seen if where.startswith(other)]
    assert storage == [None], hostile.seen
    assert any(auth and auth.startswith("Basic ") for _, auth in hostile.seen)


def test_a_manifest_that_does_not_match_its_digest_is_refused(hostile: Hostile) -> None:
    hostile.route = lambda req: manifest_reply(req, {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                     "manifests": []})
    wanted = "sha256:" + "ab" * 32
    found = hostile.client().image_platforms(f"{hostile.host}/a/b@{wanted}")
    assert found.error is not None and "does not match its digest" in found.error


def test_an_image_config_that_does_not_match_its_digest_is_refused(hostile: Hostile) -> None:
    def route(req: Handler) -> None:
        if "/manifests/" in req.path:
            manifest_reply(req, {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                 "config": {"digest": "sha256:" + "cd" * 32}})
        else:
            reply(req, 200, b'{"architecture": "amd64", "os": "linux"}')

    hostile.route = route
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert found.error == f"{hostile.host}/a/b:1: image config does not match its digest"


@pytest.mark.parametrize("body, error", [
    (b"<html>proxy login</html>", "manifest is not JSON"),
    (b"[1, 2]", "manifest is not a JSON object"),
    (json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": "x"}).encode(),
     "index without a manifests list"),
    (json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {}}).encode(),
     "has no sha256 config digest"),
])
def test_garbage_manifests_are_errors(hostile: Hostile, body: bytes, error: str) -> None:
    hostile.route = lambda req: reply(req, 200, body, {"Content-Type": OCI_MANIFEST})
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert found.error is not None and error in found.error
    assert found.platforms == ()


def test_an_index_of_attestations_only_offers_no_platform(hostile: Hostile) -> None:
    hostile.route = lambda req: manifest_reply(req, {
        "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"digest": "sha256:" + "00" * 32, "platform": {"os": "unknown",
                                                           "architecture": "unknown"}}]},
        OCI_INDEX)
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert (found.error, found.platforms) == (None, ())


@pytest.mark.parametrize("challenge, token_reply, error", [
    ('Bearer realm="http://{host}/token",service="s"', None, "is not https"),
    ('Bearer realm="https://{host}/token",service="s"', b"not json", "token reply is not JSON"),
    ('Bearer realm="https://{host}/token",service="s"', b'{"token": ""}',
     "token reply without a token"),
    ('Negotiate', None, "unsupported auth challenge 'Negotiate'"),
    ('Basic realm="r"', None, "wants credentials and none are configured"),
])
def test_hostile_auth_challenges(hostile: Hostile, challenge: str, token_reply: bytes | None,
                                 error: str) -> None:
    def route(req: Handler) -> None:
        if req.path.startswith("/token"):
            reply(req, 200, token_reply or b"")
        else:
            reply(req, 401, headers={"WWW-Authenticate": challenge.format(host=hostile.host)})

    hostile.route = route
    found = hostile.client().image_platforms(f"{hostile.host}/a/b:1")
    assert found.error is not None and error in found.error, found.error
