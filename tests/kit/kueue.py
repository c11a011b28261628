"""Kueue (sigs.k8s.io/kueue, pinned by tools/kueue/go.mod) on a test API server: its CRDs,
its manager's ClusterRole and binding, and the webhooks of its own kinds and of batch/v1
Jobs, all from the module's config/ (what its release manifests are built from), with the
manager run as a process as the identity its binding names.

Changed from config/, for this machine only: the webhooks are called at 127.0.0.1 by URL
with the test CA (no Service can be reached here: no kube-proxy), only the ones of the
frameworks enabled (a webhook whose framework is off is not served, and would refuse every
write it matches); certificates from the test PKI instead of Kueue's internal ones (those
need the webhook Service); Kueue's metrics certificate, which it reads from
/etc/kueue/metrics/certs as its Deployment mounts it, is mounted there in a mount namespace
of the manager's own (the host's /etc is not touched)."""

from __future__ import annotations

import base64
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.kit.apiserver import ROOT, ApiServer, go_binary, go_build, module_hash
from tests.kit.helpers import build_cache, free_port, terminate_group, wait_for
from tests.kit.pki import write_serving_pki

SRC = ROOT / "tools" / "kueue"
CACHE = build_cache("kueue")
NS = "kueue-system"
FRAMEWORKS = ["batch/job"]
# The webhook paths served with FRAMEWORKS on: Kueue's own kinds and batch/v1 Jobs.
SERVED = ("-kueue-x-k8s-io-", "-batch-v1-job")
# The manager's own roles: cluster-wide, and its namespace's Secrets (which it watches).
RBAC = ["role.yaml", "role_binding.yaml", "manager_secrets_role.yaml",
        "manager_secrets_role_binding.yaml"]


def version() -> str:
    for line in (SRC / "go.mod").read_text().splitlines():
        if line.startswith("require sigs.k8s.io/kueue "):
            return line.split()[-1]
    raise RuntimeError("tools/kueue/go.mod does not require sigs.k8s.io/kueue")


def build_kueue() -> Path:
    """Kueue's manager, stamped with its version, cached by tools/kueue's requirements."""
    stamp = f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={version()}"
    return go_build(CACHE / f"kueue-{module_hash(SRC)}",
                    [f"-ldflags={stamp}", "sigs.k8s.io/kueue/cmd/kueue"], SRC, "kueue")


def module_dir(module: str = "sigs.k8s.io/kueue") -> Path:
    """Where the Go module cache holds `module` at the version tools/kueue pins (Kueue's
    config/ directory; JobSet's CRD)."""
    res = subprocess.run([go_binary(), "list", "-m", "-f", "{{.Dir}}", module],
                         cwd=SRC, capture_output=True, text=True, timeout=600)
    if res.returncode != 0 or not res.stdout.strip():
        raise RuntimeError(f"go list {module} failed:\n{res.stderr[-2000:]}")
    return Path(res.stdout.strip())


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomized(obj: dict[str, Any]) -> dict[str, Any]:
    """What config/default's kustomization makes of an object of config/components: names
    prefixed `kueue-`, the `system` namespace named kueue-system."""
    meta = obj["metadata"]
    meta["name"] = "kueue-" + meta["name"]
    if "namespace" in meta:
        meta["namespace"] = NS
    if "roleRef" in obj:
        obj["roleRef"]["name"] = "kueue-" + obj["roleRef"]["name"]
    for subject in obj.get("subjects", []):
        subject.update(name="kueue-" + subject["name"], namespace=NS)
    return obj


@dataclass
class Kueue:
    server: ApiServer
    workdir: Path
    wait_for_pods_ready: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    webhooks: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) created

    @property
    def log(self) -> Path:
        return self.workdir / "kueue.log"

    def install(self, port: int) -> None:
        """CRDs (established before the manager starts), the manager's RBAC, and the
        webhooks of the enabled frameworks at 127.0.0.1:`port`."""
        admin = self.server.client("admin")
        config = module_dir() / "config" / "components"
        crds = k8s.ApiextensionsV1Api(admin)
        names = []
        for path in sorted((config / "crd" / "bases").glob("*.yaml")):
            for crd in docs(path):
                k8s_utils.create_from_dict(admin, crd)
                names.append(crd["metadata"]["name"])

        def established() -> bool:
            return all(any(c.type == "Established" and c.status == "True"
                           for c in crds.read_custom_resource_definition(n).status.conditions
                           or []) for n in names)
        wait_for(established, 60, "Kueue's CRDs established")
        k8s.CoreV1Api(admin).create_namespace({"metadata": {"name": NS}})  # type: ignore[arg-type]
        for name in RBAC:
            for obj in docs(config / "rbac" / name):
                k8s_utils.create_from_dict(admin, kustomized(obj))
        ca = base64.b64encode((self.workdir / "certs" / "ca.crt").read_bytes()).decode()
        for conf in docs(config / "webhook" / "manifests.yaml"):
            kustomized(conf)
            kept = [w for w in conf["webhooks"]
                    if any(s in w["clientConfig"]["service"]["path"] for s in SERVED)]
            for hook in kept:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                        "caBundle": ca}
            conf["webhooks"] = kept
            k8s_utils.create_from_dict(admin, conf)
            self.webhooks.append((conf["kind"], conf["metadata"]["name"]))

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        certs = self.workdir / "certs"
        certs.mkdir()
        write_serving_pki(certs, "kueue-webhook")
        for name in ("crt", "key"):  # the names controller-runtime's servers read
            (certs / f"tls.{name}").write_bytes((certs / f"server.{name}").read_bytes())
        # /etc as it is, with Kueue's metrics certificate directory laid over it.
        extra = self.workdir / "etc-extra" / "kueue" / "metrics" / "certs"
        extra.mkdir(parents=True)
        for name in ("tls.crt", "tls.key"):
            (extra / name).write_bytes((certs / name).read_bytes())
        webhook_port, health_port = free_port(), free_port()
        self.install(webhook_port)
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NS,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "waitForPodsReady": self.wait_for_pods_ready,
            "integrations": {"frameworks": FRAMEWORKS}}))
        # As the ServiceAccount its ClusterRoleBinding names (a static token of the API
        # server's, tests/kit/apiserver: RBAC matches the subject by that user name).
        kubeconfig = self.server.kubeconfig("kueue", self.workdir / "kubeconfig")
        overlay = f"lowerdir={self.workdir / 'etc-extra'}:/etc"
        script = ('mount --make-rprivate / && mount -t overlay overlay -o "$1" /etc && '
                  'shift && exec "$@"')
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--", "sh", "-c", script, "sh", overlay,
                 str(build_kueue()), f"--config={config}", f"--kubeconfig={kubeconfig}",
                 # its aggregated API needs an APIService and a Service: not this test's
                 "--feature-gates=VisibilityOnDemand=false"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

        def ready() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"kueue exited:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz",
                                            timeout=2) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False
        try:
            wait_for(ready, 120, "Kueue's manager ready")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """The manager stopped and its webhooks deleted (they would refuse every Job and
        Kueue object written after it)."""
        terminate_group(self.proc)
        self.proc = None
        admin = k8s.AdmissionregistrationV1Api(self.server.client("admin"))
        for kind, name in self.webhooks:
            delete = (admin.delete_mutating_webhook_configuration
                      if kind == "MutatingWebhookConfiguration"
                      else admin.delete_validating_webhook_configuration)
            delete(name)
        self.webhooks.clear()
