"""A real node for the kubelet tier: containerd (Debian's, with runc) and a kubelet built from
the same Go modules as the test apiserver, registered against it as `system:node:<name>`.

Facts of this machine kind the setup handles (each measured; see issue 14):
- root lacks CAP_SYS_RESOURCE: containerd's CRI needs `restrict_oom_score_adj`, or every
  sandbox fails with "can't get final child's PID from pipe: EOF";
- cgroup v1 hybrid: `failCgroupV1: false`, `cgroupDriver: cgroupfs`; swap may be on;
- no scheduler or controller-manager: pods are made with `nodeName`, no service-account
  token, in namespaces whose `default` ServiceAccount the kit creates;
- images are imported (`ctr images import`), never pulled, the sandbox image too;
- the kubelet changes host sysctls, and containers, shims, mounts, cgroups, the device-plugin
  directory and /var/log/containers outlive it: `Node.stop` undoes all of that, and
  `host_traces` is what a test compares before and after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.kit.apiserver import ApiServer, build_kube_binary
from tests.kit.helpers import free_port, terminate_group, wait_for
from tests.kit.images import build_program, ctr, oci_image

PAUSE_IMAGE = "nodeagent.test/pause:1"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # hard-coded in the kubelet
CONTAINER_LOGS = Path("/var/log/containers")  # hard-coded in the kubelet
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _mounts_under(prefix: Path) -> list[str]:
    """Mount points at or under `prefix`, deepest first (unmount order)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(prefix) or point.startswith(str(prefix) + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))


def _kubepods_cgroups() -> list[Path]:
    return sorted(CGROUP_ROOT.glob("*/kubepods*")) + sorted(CGROUP_ROOT.glob("kubepods*"))


def _remove_cgroup_tree(top: Path) -> None:
    """rmdir a cgroup tree leaf first (cgroupfs directories cannot be removed recursively)."""
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        d.rmdir()
    top.rmdir()


def host_traces(workdir: Path) -> dict[str, Any]:
    """What a node leaves on the host: processes of its binaries, mounts under its workdir,
    kubepods cgroups, the kubelet's sysctls, and the kubelet's hard-coded directories."""
    procs = []
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in cmd:
            procs.append(cmd[:200])
    return {
        "processes": sorted(procs),
        "mounts": _mounts_under(workdir),
        "cgroups": [str(p) for p in _kubepods_cgroups()],
        "sysctls": {n: _sysctl_path(n).read_text().strip() for n in KUBELET_SYSCTLS},
        "device_plugin_dir": sorted(str(p) for p in DEVICE_PLUGIN_DIR.glob("*"))
        if DEVICE_PLUGIN_DIR.exists() else None,
        "container_logs": sorted(str(p) for p in CONTAINER_LOGS.glob("*"))
        if CONTAINER_LOGS.exists() else None,
    }


@dataclass
class Node:
    """containerd and a kubelet in `workdir`, for node `name` of `server`."""

    server: ApiServer
    workdir: Path
    name: str = "node-a"
    taint: dict[str, str] | None = None
    containerd: subprocess.Popen[bytes] | None = None
    kubelet: subprocess.Popen[bytes] | None = None
    _saved_sysctls: dict[str, str] = field(default_factory=dict)
    _made_dirs: list[Path] = field(default_factory=list)
    # registries containerd pulls from: host:port -> the CA its TLS certificate is from
    registries: dict[str, Path] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def content_root(self) -> Path:
        """containerd's content store: where an image's manifest and config are blobs."""
        return self.workdir / "containerd" / "root" / "io.containerd.content.v1.content"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    # containerd -----------------------------------------------------------------------

    def _containerd_config(self) -> Path:
        d = self.workdir / "containerd"
        cni = self.workdir / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        # Loopback only: the runtime reports NetworkReady and hostNetwork pods run; a pod of
        # its own network gets no address and never starts (no pod here needs one).
        (cni / "10-loopback.conflist").write_text(
            '{"cniVersion": "1.0.0", "name": "lo", "plugins": [{"type": "loopback"}]}\n')
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        text = f"""version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{d / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_cdi = false
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [{cri}.containerd.runtimes.runc.options]
    SystemdCgroup = false
  [{cri}.registry]
    config_path = "{d / 'certs.d'}"
"""
        for host, ca in self.registries.items():  # containerd's hosts.toml, one per registry
            hosts = d / "certs.d" / host / "hosts.toml"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(f'server = "https://{host}"\n[host."https://{host}"]\n'
                             f'  capabilities = ["pull", "resolve"]\n  ca = "{ca}"\n')
        path = d / "config.toml"
        path.write_text(text)
        return path

    def start_containerd(self) -> None:
        d = self.workdir / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        config = self._containerd_config()
        with open(self.workdir / "containerd.log", "ab") as log:
            self.containerd = subprocess.Popen(["containerd", "--config", str(config)],
                                               stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        wait_for(lambda: self.ctr("version", check=False).returncode == 0 or self._dead(
            self.containerd, "containerd"), 30, "containerd answering")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([ctr(), "--address", str(self.socket), "--namespace", "k8s.io",
                              *args], capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {res.stderr.strip()[-2000:]}")
        return res

    def import_image(self, name: str, package: str, goarch: str = "amd64",
                     entrypoint: list[str] | None = None, label_arch: str | None = None) -> str:
        """Import an image named `name` whose one file /app is tools/testenv/<package> built
        for `goarch` (its config says `label_arch`, by default the same). Returns the
        manifest digest."""
        binary = build_program(package, goarch)
        tar = self.workdir / "images" / (name.replace("/", "_").replace(":", "_") + ".tar")
        tar.parent.mkdir(parents=True, exist_ok=True)
        digest = oci_image(tar, name, {"/app": binary}, entrypoint or ["/app"],
                           label_arch or goarch)
        # --all-platforms: import what the image is, even if it is not this machine's
        # platform (that mismatch is what the tests are about).
        self.ctr("images", "import", "--all-platforms", str(tar))
        return digest

    # kubelet --------------------------------------------------------------------------

    def _kubelet_config(self) -> Path:
        conf = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # No kubelet client certificate exists here: anonymous, loopback only.
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                               "x509": {}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.pod_logs),
            "registerWithTaints": [self.taint] if self.taint else [],
            "resolvConf": "",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "localStorageCapacityIsolation": False,
        }
        path = self.workdir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(conf))
        return path

    def start_kubelet(self) -> None:
        if not self._saved_sysctls:
            self._saved_sysctls = {n: _sysctl_path(n).read_text().strip()
                                   for n in KUBELET_SYSCTLS}
        for d in (DEVICE_PLUGIN_DIR.parent, DEVICE_PLUGIN_DIR, CONTAINER_LOGS):
            if not d.exists():
                d.mkdir(parents=True)
                self._made_dirs.append(d)
        kubeconfig = self.server.kubeconfig(f"kubelet-{self.name}",
                                            self.workdir / "kubelet.kubeconfig")
        config = self._kubelet_config()
        binary = build_kube_binary("kubelet")
        with open(self.workdir / "kubelet.log", "ab") as log:
            self.kubelet = subprocess.Popen(
                [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
                 f"--root-dir={self.workdir / 'kubelet'}", f"--cert-dir={self.workdir / 'pki'}",
                 f"--hostname-override={self.name}", "--node-ip=127.0.0.1", "--v=1"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop_kubelet(self) -> None:
        terminate_group(self.kubelet)
        self.kubelet = None

    def _dead(self, proc: subprocess.Popen[bytes] | None, what: str) -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n"
                               f"{(self.workdir / (what + '.log')).read_text()[-4000:]}")
        return False

    def wait_registered(self, core: k8s.CoreV1Api, timeout: float = 60) -> None:
        def registered() -> bool:
            self._dead(self.kubelet, "kubelet")
            try:
                core.read_node(self.name)
                return True
            except k8s.ApiException:
                return False
        wait_for(registered, timeout, f"node {self.name} registered by the kubelet")

    # lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._forget_node()
        self.start_containerd()
        self.import_image(PAUSE_IMAGE, "pause")
        self.start_kubelet()

    def _forget_node(self) -> None:
        """Delete a Node of this name that an earlier test left (the tiers share one API
        server): the kubelet would reconcile it, and registerWithTaints applies only when
        it registers the Node itself."""
        core = k8s.CoreV1Api(self.server.client("admin"))
        try:
            core.delete_node(self.name)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
        wait_for(lambda: not any(n.metadata.name == self.name
                                 for n in core.list_node().items), 30,
                 f"node {self.name} deleted")

    def stop(self) -> None:
        """Stop the kubelet, every container and shim, containerd; unmount, remove the
        cgroups and files the node made, put the kubelet's sysctls back."""
        self.stop_kubelet()
        if self.containerd is not None and self.containerd.poll() is None:
            for _ in range(2):  # again: a delete can fail while its task is still dying
                tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
                for task in tasks:
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
                for task in tasks:
                    self.ctr("tasks", "delete", "-f", task, check=False)
                for c in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                    self.ctr("containers", "delete", c, check=False)
        terminate_group(self.containerd)
        self.containerd = None
        _kill_leftovers(self.workdir)
        for point in _mounts_under(self.workdir):
            subprocess.run(["umount", "-l", point], capture_output=True)
        for top in _kubepods_cgroups():
            _remove_cgroup_tree(top)
        for name, value in self._saved_sysctls.items():
            _sysctl_path(name).write_text(value + "\n")
        for d in (DEVICE_PLUGIN_DIR, CONTAINER_LOGS):
            if d.exists():
                for p in d.iterdir():
                    # Only what this node made: its sockets and its containers' log links.
                    if p.is_socket() or p.name == "DEPRECATION" or (
                            p.is_symlink() and str(self.workdir) in os.readlink(p)):
                        p.unlink()
        for d in reversed(self._made_dirs):
            shutil.rmtree(d, ignore_errors=True)
        self._made_dirs.clear()


def _kill_leftovers(workdir: Path) -> None:
    """Shims (and anything else) whose command line names the workdir: they are started in
    sessions of their own and outlive containerd."""
    for _ in range(50):
        pids = []
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (pid_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if str(workdir).encode() in cmd and int(pid_dir.name) != os.getpid():
                pids.append(int(pid_dir.name))
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"processes of {workdir} survive SIGKILL")
