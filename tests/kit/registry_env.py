"""A real OCI registry for the tests: Debian's docker-registry (distribution 2.8) on loopback,
with TLS from a test CA and the standard bearer-token auth, its tokens issued by a small
token service here (JWTs signed by a key the registry trusts, as a real token server does).

Users of the token service: `pusher` (push and pull anywhere), `puller` (pull anywhere),
anonymous (pull of `public/*` only). Images are pushed through the registry's own API.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import ssl
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
import yaml
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

from tests.kit.helpers import free_port
from tests.kit.pki import make_ca, pem_cert, pem_key, self_signed, serving_cert

REGISTRY_BIN = "/usr/bin/docker-registry"
SERVICE, ISSUER = "nodeagent-test-registry", "nodeagent-test-token-service"
USERS = {"pusher": "push-secret", "puller": "pull-secret"}
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class TLSServer(http.server.ThreadingHTTPServer):
    """An https server on 127.0.0.1 in a thread; `handler` answers every GET."""

    daemon_threads = True

    def __init__(self, cert: Path, key: Path,
                 handler: Callable[[http.server.BaseHTTPRequestHandler], None]) -> None:
        outer = handler

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer(self)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.socket = ctx.wrap_socket(self.socket, server_side=True)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def reply(req: http.server.BaseHTTPRequestHandler, status: int, body: bytes = b"",
          headers: dict[str, str] | None = None) -> None:
    req.send_response(status)
    for k, v in (headers or {}).items():
        req.send_header(k, v)
    if "Content-Length" not in (headers or {}):
        req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


@dataclass
class Registry:
    """docker-registry with TLS and token auth, plus its token service."""

    root: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    tokens: TLSServer | None = None
    token_requests: list[dict[str, Any]] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)  # name -> manifest digest

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.root / "ca.crt"

    def start(self, timeout: float = 30.0) -> None:
        if not Path(REGISTRY_BIN).exists():
            raise RuntimeError(f"{REGISTRY_BIN} missing: tools/bootstrap installs Debian's "
                               "docker-registry")
        ca = make_ca()
        cert, key = serving_cert(ca, "registry")
        self.signer = self_signed("token-signer")
        for name, data in (("ca.crt", pem_cert(ca[0])), ("server.crt", pem_cert(cert)),
                           ("server.key", pem_key(key)),
                           ("signer.crt", pem_cert(self.signer[0]))):
            (self.root / name).write_bytes(data)
        self.tokens = TLSServer(self.root / "server.crt", self.root / "server.key",
                                self._token)
        self.port = free_port()
        config = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "data")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.host, "secret": os.urandom(8).hex(),
                     "tls": {"certificate": str(self.root / "server.crt"),
                             "key": str(self.root / "server.key")}},
            "auth": {"token": {"realm": f"https://127.0.0.1:{self.tokens.port}/token",
                               "service": SERVICE, "issuer": ISSUER,
                               "rootcertbundle": str(self.root / "signer.crt")}},
        }
        (self.root / "config.yml").write_text(yaml.safe_dump(config))
        log = (self.root / "registry.log").open("wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(self.root / "config.yml")],
                                     stdout=log, stderr=subprocess.STDOUT)
        http = self.client()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}:\n"
                                   + (self.root / "registry.log").read_text()[-3000:])
            try:
                if http.request("GET", f"https://{self.host}/v2/", retries=False).status == 401:
                    return  # up, and asking for a token
            except urllib3.exceptions.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("docker-registry did not answer:\n"
                                   + (self.root / "registry.log").read_text()[-3000:])
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.tokens:
            self.tokens.stop()

    def client(self) -> urllib3.PoolManager:
        return urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(self.ca))

    def docker_config(self, path: Path, user: str = "puller",
                      password: str | None = None) -> Path:
        secret = f"{user}:{USERS.get(user, '') if password is None else password}"
        path.write_text(json.dumps({"auths": {f"https://{self.host}": {
            "auth": base64.b64encode(secret.encode()).decode()}}}))
        return path

    # ------------------------------------------------------------------ token service

    def _token(self, req: http.server.BaseHTTPRequestHandler) -> None:
        query = parse_qs(urlsplit(req.path).query)
        user = None
        auth = req.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            if USERS.get(user) != password:
                self.token_requests.append({"user": user, "refused": True})
                reply(req, 401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
                return
        self.token_requests.append({"user": user, "scope": query.get("scope")})
        access = []
        for scope in query.get("scope", []):
            kind, name, actions = scope.split(":", 2)
            wanted = actions.split(",")
            if user == "pusher":
                granted = wanted
            elif user == "puller" or name.startswith("public/"):
                granted = [a for a in wanted if a == "pull"]
            else:
                granted = []
            access.append({"type": kind, "name": name, "actions": granted})
        body = json.dumps({"token": self.sign(user or "", access), "expires_in": 300})
        reply(req, 200, body.encode(), {"Content-Type": "application/json"})

    def sign(self, subject: str, access: list[dict[str, Any]]) -> str:
        cert, key = self.signer
        header = {"typ": "JWT", "alg": "RS256",
                  "x5c": [base64.b64encode(cert.public_bytes(serialization.Encoding.DER))
                          .decode()]}
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "iat": now, "nbf": now - 10,
                  "exp": now + 300, "jti": os.urandom(8).hex(), "access": access}
        signing_input = (_b64url(json.dumps(header).encode()) + "."
                         + _b64url(json.dumps(claims).encode()))
        signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing_input + "." + _b64url(signature)

    # ------------------------------------------------------------------ pushing images

    def _push_headers(self, repo: str) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.sign("pusher", [
            {"type": "repository", "name": repo, "actions": ["pull", "push"]}])}

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = digest_of(data)
        http, headers = self.client(), self._push_headers(repo)
        resp = http.request("POST", f"https://{self.host}/v2/{repo}/blobs/uploads/",
                            headers=headers)
        if resp.status != 202:
            raise RuntimeError(f"blob upload start: HTTP {resp.status} {resp.data[:300]!r}")
        location = resp.headers["Location"]
        sep = "&" if "?" in location else "?"
        url = location if location.startswith("https") else f"https://{self.host}{location}"
        resp = http.request("PUT", f"{url}{sep}digest={digest}", body=data,
                            headers={**headers, "Content-Type": "application/octet-stream"})
        if resp.status != 201:
            raise RuntimeError(f"blob upload: HTTP {resp.status} {resp.data[:300]!r}")
        return digest

    def push_manifest(self, repo: str, reference: str, body: dict[str, Any] | bytes) -> str:
        """Push a manifest or index (a dict, or its exact bytes: a digest names bytes)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = self.client().request(
            "PUT", f"https://{self.host}/v2/{repo}/manifests/{reference}", body=data,
            headers={**self._push_headers(repo),
                     "Content-Type": json.loads(data)["mediaType"]})
        if resp.status != 201:
            raise RuntimeError(f"manifest push: HTTP {resp.status} {resp.data[:300]!r}")
        return digest_of(data)

    def push_layout(self, repo: str, tag: str, layout: Path) -> str:
        """Push the one image of an OCI image layout (its index under `tag`, each manifest
        and blob under its digest, children first, as `crane`/`skopeo` do); returns the
        digest the tag names."""
        blobs = layout / "blobs" / "sha256"

        def push(digest: str, reference: str) -> None:
            data = (blobs / digest.split(":", 1)[1]).read_bytes()
            body = json.loads(data)
            for child in body.get("manifests", []):
                push(child["digest"], child["digest"])
            for blob in [body["config"], *body["layers"]] if "config" in body else []:
                self.push_blob(repo, (blobs / blob["digest"].split(":", 1)[1]).read_bytes())
            self.push_manifest(repo, reference, data)

        (top,) = json.loads((layout / "index.json").read_text())["manifests"]
        push(top["digest"], tag)
        return str(top["digest"])

    def push_single(self, repo: str, tag: str, os_: str, arch: str, variant: str = "",
                    media_type: str = OCI_MANIFEST) -> str:
        """A one-platform image (config declares `arch`); returns the manifest digest."""
        layer_buf = io.BytesIO()
        with tarfile.open(fileobj=layer_buf, mode="w:gz") as tar:
            info = tarfile.TarInfo("plugin")
            payload = f"built for {os_}/{arch}\n".encode()
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        layer = layer_buf.getvalue()
        config: dict[str, Any] = {"architecture": arch, "os": os_, "rootfs": {
            "type": "layers", "diff_ids": [digest_of(layer)]}}
        if variant:
            config["variant"] = variant
        config_data = json.dumps(config).encode()
        config_type = ("application/vnd.oci.image.config.v1+json" if media_type == OCI_MANIFEST
                       else "application/vnd.docker.container.image.v1+json")
        layer_type = ("application/vnd.oci.image.layer.v1.tar+gzip"
                      if media_type == OCI_MANIFEST
                      else "application/vnd.docker.image.rootfs.diff.tar.gzip")
        manifest = {
            "schemaVersion": 2, "mediaType": media_type,
            "config": {"mediaType": config_type, "digest": self.push_blob(repo, config_data),
                       "size": len(config_data)},
            "layers": [{"mediaType": layer_type, "digest": self.push_blob(repo, layer),
                        "size": len(layer)}],
        }
        return self.push_manifest(repo, tag, manifest)

    def push_index(self, repo: str, tag: str, platforms: list[tuple[str, str, str]]) -> str:
        """A multi-platform index of one image per (os, arch, variant)."""
        entries = []
        for os_, arch, variant in platforms:
            digest = self.push_single(repo, digest_placeholder(os_, arch, variant),
                                      os_, arch, variant)
            body = self.manifest_bytes(repo, digest)
            platform = {"os": os_, "architecture": arch}
            if variant:
                platform["variant"] = variant
            entries.append({"mediaType": OCI_MANIFEST, "digest": digest,
                            "size": len(body), "platform": platform})
        return self.push_manifest(repo, tag, {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                              "manifests": entries})

    def manifest_bytes(self, repo: str, reference: str) -> bytes:
        resp = self.client().request(
            "GET", f"https://{self.host}/v2/{repo}/manifests/{reference}",
            headers={**self._push_headers(repo), "Accept": f"{OCI_MANIFEST}, {OCI_INDEX}"})
        if resp.status != 200:
            raise RuntimeError(f"manifest get: HTTP {resp.status}")
        return bytes(resp.data)


def digest_placeholder(os_: str, arch: str, variant: str) -> str:
    """A tag for an index's child image (distribution wants children pushed first)."""
    return "-".join(p for p in (os_, arch, variant) if p)


def start_registry(root: Path) -> Registry:
    reg = Registry(root)
    try:
        reg.start()
    except BaseException:
        reg.stop()
        raise
    return reg
