"""The fabric lab: a Debian bookworm guest with soft-RoCE (rdma_rxe), systemd, NetworkManager
and systemd-networkd, booted with qemu, driven over ssh, with true carrier loss through the
QEMU monitor (`set_link`).

The image is built from Debian packages only (debootstrap) into
`<build cache>/lab/<recipe hash>/` (tests.kit.helpers.build_cache)
and rebuilt only when the recipe below changes. Each boot runs on a throwaway qcow2 overlay.
KVM is used when a guest really boots with it; on machines where it hangs early the boot
times out quickly and TCG takes over.

NICs: ens3 is management (user-mode network, ssh forwarded to a loopback port); ens4 and
ens5 are the rails, wired to each other with a qemu socket pair (`rail0`/`rail1` for
set_link); ens6 (`fab0`) is a wire to a second guest, the peer node, whose only rail ens4
(`fab0` there too) connects to it: two kernels, two soft-RoCE stacks, one wire between.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.kit.helpers import build_cache, cached_build
from tools import imagebuild

ROOT = Path(__file__).resolve().parents[2]
CACHE = build_cache("lab")
MIRROR = "http://deb.debian.org/debian"
PACKAGES = [
    "linux-image-amd64", "systemd-sysv", "udev", "kmod", "iproute2", "rdma-core",
    "ibverbs-providers", "ibverbs-utils", "python3", "python3-venv", "python3-pyverbs",
    "python3-systemd", "python3-apt", "network-manager", "dbus", "libpam-systemd", "openssh-server",
    "python3-pip",  # what the role's first play installs (nodeagent_os_packages), baked in
    "nftables",  # the peer scenarios drop RoCE (UDP 4791) while TCP passes
    # A real communication library in place of NCCL (no GPU here): Open MPI over UCX, an
    # all-reduce from mpi4py; perftest's ib_write_bw as an oracle no one here wrote.
    "openmpi-bin", "python3-mpi4py", "ucx-utils", "perftest",
    "lldpd",  # plays the leaf switch at the peer node's end of the wire (started by a test)
]
MGMT_MAC = "52:54:00:00:00:01"
RAIL_MACS = {"rail0": "52:54:00:00:01:01", "rail1": "52:54:00:00:01:02",
             "fab0": "52:54:00:00:01:03"}
PEER_MAC = "52:54:00:00:02:01"  # the peer node's end of fab0
FAB1_MACS = ("52:54:00:00:01:04", "52:54:00:00:02:02")  # a second wire's ends (lab, peer)
# Run in the guest root at build time (chroot): the whole configuration of the image.
CONFIGURE = f"""
set -e
echo lab > /etc/hostname
printf '127.0.0.1 localhost\\n127.0.1.1 lab\\n' > /etc/hosts
echo '/dev/vda / ext4 defaults 0 1' > /etc/fstab
passwd -d root >/dev/null
mkdir -p /etc/systemd/network /etc/NetworkManager/conf.d
# Management is static (qemu's user network always gives 10.0.2.15) and kept across
# networkd restarts: with DHCP, a restart drops the lease's address (KeepConfiguration=no)
# and, on a loaded host, the guest was seen never to answer ssh again after scenario 2c.
printf '%s\\n' '[Match]' 'MACAddress={MGMT_MAC}' '' '[Network]' 'Address=10.0.2.15/24' \\
    'Gateway=10.0.2.2' 'DNS=10.0.2.3' 'KeepConfiguration=static' \\
    > /etc/systemd/network/10-mgmt.network
# NetworkManager leaves management alone and makes no profile by itself: a scenario that
# wants NM on a rail writes its own.
printf '[main]\\nno-auto-default=*\\n\\n[keyfile]\\nunmanaged-devices=mac:{MGMT_MAC}\\n' \\
    > /etc/NetworkManager/conf.d/10-lab.conf
systemctl enable systemd-networkd ssh >/dev/null 2>&1
systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer \\
    lldpd.service >/dev/null 2>&1
echo rdma_rxe > /etc/modules-load.d/rxe.conf
"""


def recipe_hash() -> str:
    h = hashlib.sha256()
    h.update("\n".join(PACKAGES).encode())
    h.update(CONFIGURE.encode())
    return h.hexdigest()[:16]


@dataclass
class Image:
    dir: Path

    @property
    def disk(self) -> Path:
        return self.dir / "base.img"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"


def _run(*args: str, timeout: float = 1800, **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout,  # type: ignore[call-overload]
                         stdin=subprocess.DEVNULL, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} ... failed ({res.returncode}):\n"
                           f"{(res.stdout + res.stderr)[-3000:]}")
    return res  # type: ignore[no-any-return]


def build_image() -> Image:
    """The cached image for the current recipe, built if missing (about 2 min cold)."""
    image = Image(CACHE / recipe_hash())
    cached_build(image.disk, "lab image (debootstrap)", lambda: _build_image(image))
    return image


def _build_image(image: Image) -> None:
    for tool in ("debootstrap", "mke2fs", "qemu-img", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} missing: tools/bootstrap installs the lab's packages")
    tmp = CACHE / f"build-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    root = tmp / "root"
    root.mkdir(parents=True)
    try:
        _run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
             "bookworm", str(root), MIRROR)
        _run("chroot", str(root), "/bin/sh", "-c", CONFIGURE)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "id_ed25519"))
        ssh_dir = root / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text((tmp / "id_ed25519.pub").read_text())
        (ssh_dir / "authorized_keys").chmod(0o600)
        boot = root / "boot"
        shutil.copy(next(boot.glob("vmlinuz-*")), tmp / "vmlinuz")
        shutil.copy(next(boot.glob("initrd.img-*")), tmp / "initrd.img")
        _run("mke2fs", "-q", "-t", "ext4", "-d", str(root), "-L", "labroot",
             str(tmp / "base.img"), "3G")
        shutil.rmtree(root)
        shutil.rmtree(image.dir, ignore_errors=True)  # a build interrupted before its disk
        tmp.rename(image.dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def wheelhouse(dest: Path) -> Path:
    """The agent as a wheel from this checkout beside its dependencies' wheels (the image's
    builder makes both) in `dest`, a directory pip installs from with --no-index. Each
    caller has its own: the lab and the package tests run at the same time."""
    app, deps = imagebuild.wheelhouse(CACHE)
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in deps:
        shutil.copyfile(wheel, dest / wheel.name)
    shutil.move(app, dest / app.name)
    shutil.rmtree(app.parent, ignore_errors=True)
    return dest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VM:
    image: Image
    workdir: Path
    accel: str = "tcg"
    proc: subprocess.Popen[bytes] | None = None
    ssh_port: int = 0
    log: list[str] = field(default_factory=list)
    booted: bool = False
    # The wire to the peer node: this guest listens on it (the lab guest), or with
    # `peer_of` set, connects to it as the peer node's only rail.
    fab_port: int = 0
    peer_of: int = 0
    # A second wire between the two (bench/peers_cpu.py: two rails a node): the lab
    # guest's ens7 listens on `fab1_port`, the peer node's ens5 connects to it.
    fab1_port: int = 0
    second_wire: bool = False

    @property
    def monitor_path(self) -> Path:
        return self.workdir / "monitor.sock"

    def start(self, timeout: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        overlay = self.workdir / "overlay.qcow2"
        overlay.unlink(missing_ok=True)
        _run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image.disk), "-F",
             "raw", str(overlay))
        self.ssh_port, wire = _free_port(), _free_port()
        accel = ["-accel", "kvm"] if self.accel == "kvm" else ["-accel", "tcg,tb-size=128"]
        if self.peer_of:
            rails = ["-netdev", f"socket,id=fab0,connect=127.0.0.1:{self.peer_of}",
                     "-device", f"virtio-net-pci,netdev=fab0,mac={PEER_MAC}"]
            if self.fab1_port:
                rails += ["-netdev", f"socket,id=fab1,connect=127.0.0.1:{self.fab1_port}",
                          "-device", f"virtio-net-pci,netdev=fab1,mac={FAB1_MACS[1]}"]
        else:
            self.fab_port = self.fab_port or _free_port()
            rails = [
                "-netdev", f"socket,id=rail0,listen=127.0.0.1:{wire}",
                "-device", f"virtio-net-pci,netdev=rail0,mac={RAIL_MACS['rail0']}",
                "-netdev", f"socket,id=rail1,connect=127.0.0.1:{wire}",
                "-device", f"virtio-net-pci,netdev=rail1,mac={RAIL_MACS['rail1']}",
                "-netdev", f"socket,id=fab0,listen=127.0.0.1:{self.fab_port}",
                "-device", f"virtio-net-pci,netdev=fab0,mac={RAIL_MACS['fab0']}"]
            if self.second_wire:
                self.fab1_port = self.fab1_port or _free_port()
                rails += ["-netdev", f"socket,id=fab1,listen=127.0.0.1:{self.fab1_port}",
                          "-device", f"virtio-net-pci,netdev=fab1,mac={FAB1_MACS[0]}"]
        args = [
            "qemu-system-x86_64", *accel, "-m", "1024", "-smp", "2", "-display", "none",
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
            "-append", "root=/dev/vda rw console=ttyS0",
            "-drive", f"file={overlay},if=virtio,format=qcow2",
            "-netdev", f"user,id=mgmt,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22",
            "-device", f"virtio-net-pci,netdev=mgmt,mac={MGMT_MAC}",
            *rails,
            "-monitor", f"unix:{self.monitor_path},server,nowait",
            "-serial", f"file:{self.workdir / 'console.log'}",
        ]
        with open(self.workdir / "qemu.log", "wb") as out:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"qemu exited {self.proc.returncode}: "
                                   + (self.workdir / "qemu.log").read_text()[-2000:])
            if self.ssh("systemctl is-system-running --wait", check=False,
                        timeout=15).returncode in (0, 1):  # running or degraded: booted
                self.booted = True
                self.start_master()
                return
            time.sleep(1)
        self.kill()
        raise TimeoutError(f"guest ({self.accel}) not reachable over ssh within {timeout:.0f}s;"
                           f" console:\n{self.console()[-1500:]}")

    def console(self) -> str:
        try:
            return (self.workdir / "console.log").read_text(errors="replace")
        except OSError:
            return ""

    @property
    def control_path(self) -> Path:
        return self.workdir / "ssh-master.sock"

    def _ssh_options(self, direct: bool = False) -> list[str]:
        # Through one master connection when it is up (ControlMaster=no: without it, each
        # command connects on its own). A new connection costs the emulated guest a key
        # exchange and a logind session: 2.2 s a command, 0.2 s through the master.
        # `direct`: a connection of its own whatever the master's state.
        path = "none" if direct else str(self.control_path)
        return ["-i", str(self.image.key), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
                "-o", "BatchMode=yes", "-o", f"ControlPath={path}", "-o", "ControlMaster=no"]

    def _drop_master(self) -> None:
        """A master that failed a command (its link lost, or refusing sessions: sshd's
        MaxSessions once sessions were left open) is ended; the next start_master makes a
        new one."""
        subprocess.run(["ssh", "-q", "-o", f"ControlPath={self.control_path}", "-O", "exit",
                        "-p", str(self.ssh_port), "root@127.0.0.1"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)

    def start_master(self) -> None:
        """The shared connection, in the background (its stdio not the caller's pipes: a
        master holding them would keep every captured command waiting). Keep-alives end it
        within 15 s of a dead link; commands then connect on their own until the next
        start_master."""
        subprocess.run(
            ["ssh", "-q", *self._ssh_options(), "-p", str(self.ssh_port), "-o",
             "ControlMaster=yes", "-o", "ControlPersist=yes", "-o", "ServerAliveInterval=5",
             "-o", "ServerAliveCountMax=3", "-N", "-f", "root@127.0.0.1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=60, check=False)

    def ssh(self, command: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        dropped = False
        # A guest that cannot be reached is tried again until the command's own timeout
        # has passed, not a number of times: six tries (about 40 s) ran out on a guest
        # starved by two others and the Go builds on a fresh machine, while networkd
        # restarted its management link.
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            # A retry connects on its own: the master may be what failed.
            args = ["ssh", "-q", *self._ssh_options(direct=attempt > 0), "-p",
                    str(self.ssh_port), "root@127.0.0.1", command]
            try:
                # stdin a /dev/null of its own: ssh makes its stdin non-blocking, and a
                # stdin shared with the process (the peer node's boot runs beside the
                # role's test) made ansible-playbook refuse to start in CI.
                res = subprocess.run(args, capture_output=True, text=True,
                                     timeout=max(10.0, deadline - time.monotonic()),
                                     stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as exc:
                if self.booted:
                    self._drop_master()  # a session may be stuck in it
                    self.start_master()
                if check:
                    raise RuntimeError(f"guest command timed out after {timeout}s: "
                                       f"{command}") from exc
                return subprocess.CompletedProcess(args, 255, "", "timeout")
            # 255 with no output: ssh could not connect (e.g. networkd restarting the
            # management link): the command did not run, so it is safe to try again.
            if res.returncode != 255 or res.stdout or time.monotonic() >= deadline - 2:
                break
            if self.booted and not dropped:
                self._drop_master()
                dropped = True
            attempt += 1
            time.sleep(2)
        if dropped and res.returncode != 255:
            self.start_master()  # the guest answers again: commands share one connection
        if check and res.returncode != 0:
            raise RuntimeError(f"guest command failed ({res.returncode}): {command}\n"
                               f"{res.stdout[-2000:]}{res.stderr[-2000:]}")
        return res

    def put(self, local: Path, remote: str) -> None:
        _run("scp", "-q", "-r", *self._ssh_options(direct=True), "-P", str(self.ssh_port),
             str(local), f"root@127.0.0.1:{remote}")

    def write(self, remote: str, text: str) -> None:
        self.ssh(f"mkdir -p {shlex.quote(str(Path(remote).parent))} && "
                 f"cat > {shlex.quote(remote)} <<'LAB_EOF'\n{text}\nLAB_EOF")

    def monitor_session(self) -> MonitorSession:
        """One monitor connection for many commands (QEMU serves one client at a time)."""
        return MonitorSession(self.monitor_path)

    def set_link(self, rail: str, up: bool) -> None:
        """True carrier loss (or return) on the guest NIC of `rail` (rail0: ens4, rail1: ens5)."""
        with self.monitor_session() as monitor:
            monitor.set_link(rail, up)

    def kill(self) -> None:
        if self.booted:
            subprocess.run(["ssh", "-q", "-o", f"ControlPath={self.control_path}", "-O",
                            "exit", "-p", str(self.ssh_port), "root@127.0.0.1"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                           check=False)
            self.booted = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class MonitorSession:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self._until_prompt()

    def _until_prompt(self) -> str:
        data = b""
        while not data.endswith(b"(qemu) "):
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"QEMU monitor closed: {data[-200:]!r}")
            data += chunk
        return data.decode(errors="replace")

    def command(self, command: str) -> str:
        self.sock.sendall(command.encode() + b"\n")
        return self._until_prompt()

    def set_link(self, rail: str, up: bool) -> None:
        self.command(f"set_link {rail} {'on' if up else 'off'}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> MonitorSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def accelerator(image: Image, workdir: Path) -> str:
    """kvm if a guest really boots with it on this host, else tcg. Probed once per host
    kernel and qemu build, the verdict kept in the cache (a hanging probe costs 45 s)."""
    qemu = _run("qemu-system-x86_64", "--version").stdout.splitlines()[0]
    key = hashlib.sha256(f"{os.uname().release} {qemu}".encode()).hexdigest()[:16]
    cached = CACHE / f"accel-{key}"
    if cached.exists():
        return cached.read_text().strip()
    verdict = "tcg"
    if os.path.exists("/dev/kvm"):
        probe = VM(image, workdir / "kvm-probe", accel="kvm")
        try:
            probe.start(timeout=45)
            verdict = "kvm"
        except (TimeoutError, RuntimeError):
            pass
        finally:
            probe.kill()
    cached.write_text(verdict + "\n")
    return verdict


def boot(image: Image, workdir: Path, peer_of: int = 0, second_wire: bool = False,
         fab1_port: int = 0) -> VM:
    """A running guest, with KVM when it works here, else TCG; with `peer_of`, the peer
    node on the lab guest's fab0 wire (that guest's `fab_port`); `second_wire` gives the
    lab guest a second wire (ens7), which a peer node joins with `fab1_port` (its ens5)."""
    vm = VM(image, workdir / "vm", accel=accelerator(image, workdir), peer_of=peer_of,
            second_wire=second_wire, fab1_port=fab1_port)
    try:
        vm.start(timeout=300)
    except BaseException:
        vm.kill()
        raise
    return vm
