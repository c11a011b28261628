"""A real kube-apiserver (with embedded etcd) for the tests: built from Go modules by
tools/testenv, started on loopback with RBAC, the Node authorizer, NodeRestriction and
this project's deploy/ policies, and one client per identity."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils
from kubernetes.client.exceptions import ApiException

from tests.kit.helpers import build_cache, cached_build, free_port, terminate_group
from tests.kit.pki import new_key, pem_key, write_serving_pki

ROOT = Path(__file__).resolve().parents[2]
TESTENV_SRC = ROOT / "tools" / "testenv"
CACHE = build_cache("testenv")
KUBECTL_SRC = ROOT / "tools" / "kubectl"
AGENT_GROUP = "nodeagent:agents"
KUBE_VERSION = "v1.34.4"  # tools/testenv/go.mod's k8s.io/kubernetes


def source_hash(package: str | None = ".") -> str:
    """A hash of the module's go.mod and go.sum and of the Go files of `package` (a directory
    of the module, "." the testenv command; None for a binary of a dependency, built from
    the module's requirements alone): what each build is cached by, so a change to one
    test program rebuilds that program, not the API server and the kubelet."""
    h = hashlib.sha256()
    files = [TESTENV_SRC / "go.mod", TESTENV_SRC / "go.sum"]
    if package is not None:
        files += sorted((TESTENV_SRC / package).glob("*.go"))
    for path in files:
        h.update(str(path.relative_to(TESTENV_SRC)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def module_hash(src: Path) -> str:
    """A hash of a Go module's go.mod and go.sum: what a binary built from its requirements
    alone (helm, kustomize, Kueue) is cached by."""
    return hashlib.sha256((src / "go.mod").read_bytes() +
                          (src / "go.sum").read_bytes()).hexdigest()[:16]


def go_binary() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise RuntimeError("kube tests need Go to build tools/testenv (no `go` on PATH)")
    return go


def go_build(binary: Path, args: list[str], cwd: Path, what: str,
             env: dict[str, str] | None = None) -> Path:
    """`binary` (its name carries the hash of what it is built from) as it is, else built
    by `go build -o <binary> <args>` in `cwd`, under the build lock. Every Go build of the
    tests goes through here; a failed one fails loudly with the compiler's words. No DWARF
    or symbol table (-s -w): nothing here debugs them, and linking a Kubernetes binary
    without them is faster and smaller. The flags are part of the name: other flags, another
    build."""
    binary = binary.with_name(binary.name + "-" + hashlib.sha256(
        "\0".join(args).encode()).hexdigest()[:8])

    def build() -> None:
        tmp = binary.with_suffix(".tmp")
        res = subprocess.run([go_binary(), "build", "-trimpath", "-o", str(tmp), *args],
                             cwd=cwd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"building {what} failed:\n{res.stderr[-4000:]}")
        tmp.rename(binary)

    return cached_build(binary, what, build)


def build_testenv() -> Path:
    """The testenv binary, built when missing or when its source changed."""
    return go_build(CACHE / f"testenv-{source_hash()}", [f"-ldflags={version_stamp()}", "."],
                    TESTENV_SRC, "tools/testenv (kube-apiserver and etcd)")


def version_stamp() -> str:
    """The linker flags that stamp a Kubernetes binary with its version (else it reports
    v0.0.0-master, which clients that parse the server's version refuse: Kueue exits)."""
    major, minor = KUBE_VERSION.lstrip("v").split(".")[:2]
    return " ".join(["-s", "-w"] + [f"-X k8s.io/component-base/version.{k}={v}" for k, v in (
        ("gitVersion", KUBE_VERSION), ("gitMajor", major), ("gitMinor", minor))])


def build_kube_binary(name: str) -> Path:
    """k8s.io/kubernetes/cmd/<name> of tools/testenv's module (the kubelet, the scheduler,
    the controller manager), stamped with its version, cached by the module's
    requirements."""
    return go_build(CACHE / f"{name}-{source_hash(None)}",
                    [f"-ldflags={version_stamp()}", f"k8s.io/kubernetes/cmd/{name}"],
                    TESTENV_SRC, name)


def build_kubectl() -> Path:
    """The real kubectl of the test API server's version (tools/kubectl: the main of
    k8s.io/kubernetes/cmd/kubectl over the published k8s.io/kubectl module), what an
    operator reads the Node with; cached by that module's requirements and its main."""
    digest = hashlib.sha256((KUBECTL_SRC / "main.go").read_bytes()).hexdigest()[:8]
    return go_build(CACHE / f"kubectl-{module_hash(KUBECTL_SRC)}-{digest}",
                    [f"-ldflags={version_stamp()}", "."], KUBECTL_SRC, "kubectl")


def make_pki(d: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1, and service-account keys."""
    write_serving_pki(d, "kube-apiserver")
    (d / "sa.key").write_bytes(pem_key(new_key()))


@dataclass
class Identity:
    user: str
    groups: list[str]
    token: str = field(default_factory=lambda: os.urandom(16).hex())


@dataclass
class ApiServer:
    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    identities: dict[str, Identity] = field(default_factory=dict)
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def add_identity(self, name: str, user: str, groups: list[str]) -> Identity:
        ident = Identity(user, groups)
        self.identities[name] = ident
        return ident

    def start(self, binary: Path, timeout: float = 120.0) -> None:
        d = self.workdir
        if not (d / "ca.crt").exists():
            make_pki(d)
        rows = [f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"'
                for i in self.identities.values()]
        (d / "tokens.csv").write_text("\n".join(rows) + "\n")
        self.port = self.port or free_port()
        etcd_dir = d / "etcd"
        self.log_path = d / "apiserver.log"
        args = [
            str(binary), "-etcd-dir", str(etcd_dir), "-etcd-port", str(free_port()),
            "-etcd-peer-port", str(free_port()), "--",
            f"--secure-port={self.port}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={d / 'server.crt'}", f"--tls-private-key-file={d / 'server.key'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.key'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24",
            f"--cert-dir={d / 'certs'}",
            "--profiling=false",
            # DRA device taints (alpha in 1.34): DeviceTaintRule in resource.k8s.io/v1alpha3,
            # what dra.device_taints writes.
            "--feature-gates=DRADeviceTaints=true",
            "--runtime-config=resource.k8s.io/v1alpha3=true",
            "--v=0",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        admin = self.client("admin")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kube-apiserver exited ({self.proc.returncode}):\n"
                                   f"{self.log_path.read_text()[-4000:]}")
            try:
                resp = admin.call_api("GET", f"{self.url}/readyz", header_params={},
                                      _request_timeout=2)
                resp.read()
                if resp.status == 200:
                    return
            except Exception:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"kube-apiserver not ready after {timeout}s:\n"
                           f"{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        terminate_group(self.proc)
        self.proc = None

    def configuration(self, name: str) -> k8s.Configuration:
        conf = k8s.Configuration()
        conf.host = self.url
        conf.ssl_ca_cert = str(self.workdir / "ca.crt")
        conf.api_key = {"authorization": self.identities[name].token}
        conf.api_key_prefix = {"authorization": "Bearer"}
        conf.retries = False
        return conf

    def client(self, name: str) -> k8s.ApiClient:
        return k8s.ApiClient(self.configuration(name))

    def kubeconfig(self, name: str, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url, "certificate-authority": str(self.workdir / "ca.crt")}}],
            "users": [{"name": name, "user": {"token": self.identities[name].token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
        }))
        return path

    def apply_deploy(self) -> None:
        """Create the project's deploy/ manifests as the admin."""
        admin = self.client("admin")
        for manifest in sorted((ROOT / "deploy").glob("*.yaml")):
            docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
            for doc in docs:
                k8s_utils.create_from_dict(admin, doc)


NODES = ["node-a", "node-b", "node-c"]


def add_identities(server: ApiServer) -> None:
    server.add_identity("admin", "admin", ["system:masters"])
    for node in NODES:
        server.add_identity(f"agent-{node}", f"nodeagent:node:{node}", [AGENT_GROUP])
        server.add_identity(f"kubelet-{node}", f"system:node:{node}", ["system:nodes"])
    server.add_identity("stranger", "someone", ["developers"])
    # the control plane's own identities (bootstrap RBAC gives them their roles)
    server.add_identity("controller-manager", "system:kube-controller-manager", [])
    server.add_identity("scheduler", "system:kube-scheduler", [])
    # Kueue's manager, as the ServiceAccount its ClusterRoleBinding names (tests/kit/kueue)
    server.add_identity("kueue", "system:serviceaccount:kueue-system:kueue-controller-manager",
                        ["system:serviceaccounts", "system:serviceaccounts:kueue-system"])


def start_apiserver(workdir: Path) -> ApiServer:
    """An API server in `workdir` with the standard identities and deploy/ applied."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = ApiServer(workdir)
    add_identities(server)
    server.start(build_testenv())
    try:
        server.apply_deploy()
    except BaseException:
        server.stop()
        raise
    return server


def wait_policy_enforced(server: ApiServer, timeout: float = 60.0) -> None:
    """ValidatingAdmissionPolicies take effect a moment after creation: wait until a write
    the policy forbids (agent of node-a tainting node-b) is refused."""
    admin = k8s.CoreV1Api(server.client("admin"))
    try:
        admin.create_node({"metadata": {"name": "policy-probe"}})  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status != 409:
            raise
    agent = k8s.CoreV1Api(server.client("agent-node-a"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            agent.patch_node("policy-probe", {"metadata": {"labels": {"x": "y"}}},
                             _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status in (403, 422) and "own Node" in str(exc.body):
                return
        time.sleep(0.5)
    raise RuntimeError("the nodeagent admission policy was not enforced within 60s")


def node_json(core: k8s.CoreV1Api, name: str) -> dict[str, Any]:
    resp = core.read_node(name, _preload_content=False)
    data: dict[str, Any] = json.loads(resp.data)
    return data
