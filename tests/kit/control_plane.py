"""The rest of a control plane for tests that need objects to act on their own: the real
kube-controller-manager (only the controllers named) and kube-scheduler, built from
tools/testenv's k8s.io/kubernetes like the kubelet, each with its bootstrap-RBAC identity
(system:kube-controller-manager, system:kube-scheduler), no leader election, no serving
port."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s

from tests.kit.apiserver import ApiServer, build_kube_binary
from tests.kit.helpers import terminate_group, wait_for

# A DaemonSet's pods (the scheduler binds them), a Job's pods and its verdict, the
# namespaces' `default` service account, and their kube-root-ca.crt ConfigMap (what a
# projected service-account volume mounts).
CONTROLLERS = ["daemonset-controller", "job-controller", "serviceaccount-controller",
               "root-ca-certificate-publisher-controller"]


@dataclass
class Component:
    name: str  # kube-controller-manager, kube-scheduler
    identity: str  # an ApiServer identity
    args: list[str]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self, server: ApiServer) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = server.kubeconfig(self.identity, self.workdir / f"{self.name}.kubeconfig")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(build_kube_binary(self.name)), f"--kubeconfig={kubeconfig}",
                 "--leader-elect=false", "--secure-port=0", *self.args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-4000:]}")
        return True

    def stop(self) -> None:
        terminate_group(self.proc)
        self.proc = None


@dataclass
class ControlPlane:
    components: list[Component]

    def stop(self) -> None:
        for c in self.components:
            c.stop()


def start_control_plane(server: ApiServer, workdir: Path,
                        namespace: str = "default") -> ControlPlane:
    """Start both; return once the controllers have published the root CA into
    `namespace` (they are then watching)."""
    plane = ControlPlane([
        Component("kube-controller-manager", "controller-manager",
                  [f"--controllers={','.join(CONTROLLERS)}",
                   # each controller as its own service account, with its bootstrap role
                   # (the controller manager's own user may not write ConfigMaps or pods)
                   "--use-service-account-credentials=true",
                   f"--root-ca-file={server.workdir / 'ca.crt'}"], workdir),
        Component("kube-scheduler", "scheduler", [], workdir),
    ])
    try:
        for c in plane.components:
            c.start(server)
        core = k8s.CoreV1Api(server.client("admin"))

        def published() -> bool:
            for c in plane.components:
                c.alive()
            try:
                core.read_namespaced_config_map("kube-root-ca.crt", namespace)
                return True
            except k8s.ApiException:
                return False
        wait_for(published, 60, f"the controller manager publishing kube-root-ca.crt in "
                                f"{namespace}")
    except BaseException:
        plane.stop()
        raise
    return plane
