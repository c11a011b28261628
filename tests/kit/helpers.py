"""Test helpers: real network namespaces, the real CLI, fixture sysfs GID trees."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PYTHON = sys.executable


def build_cache(name: str) -> Path:
    """Where builds keyed by a source or recipe hash are kept: outside the checkout
    ($NODEAGENT_CACHE, default ~/.cache/nodeagent), so a fresh clone on the same machine
    reuses them; a changed source gets a new hash, never a stale build."""
    root = os.environ.get("NODEAGENT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nodeagent")
    return Path(root) / name


@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """One builder of `target` at a time across processes (tools/test's background prebuild,
    the two pytest processes, a bench): whoever comes second waits, then finds it built."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def record_build(what: str, seconds: float | None) -> None:
    """A line for tools/test's report of where the time went ($NODEAGENT_BUILD_LOG, set by
    tools/test): what was built and how long it took, or None when it was cached."""
    log = os.environ.get("NODEAGENT_BUILD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"what": what, "seconds": seconds, "pid": os.getpid()}) + "\n")


def cached_build(target: Path, what: str, build: Callable[[], object]) -> Path:
    """`target` as it is when it exists (its name carries the hash of what it is built
    from), else made by `build()` under the build lock, timed for the report."""
    if target.exists():
        return target
    with build_lock(target):
        if target.exists():  # built by another process while this one waited
            return target
        started = time.monotonic()
        build()
        record_build(what, time.monotonic() - started)
    return target


def require_root_netns() -> None:
    """Fail (never skip) when the real parts these tests need are missing."""
    if os.geteuid() != 0:
        raise RuntimeError("netns tests need root (they create network namespaces)")
    if shutil.which("ip") is None:
        raise RuntimeError("netns tests need iproute2's `ip` (apt-get install iproute2)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, text=True, capture_output=True)


@dataclass
class Netns:
    name: str
    daemons: list[subprocess.Popen[str]] = field(default_factory=list)

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.name, "ip", *args, check=check)

    def ipj(self, *args: str) -> Any:
        out = self.ip("-j", *args).stdout.strip()
        return json.loads(out) if out else []

    def exec(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.name, *args, check=check)

    def veth(self, rail: str, peer: str, up_peer: bool = True) -> None:
        self.ip("link", "add", "name", rail, "type", "veth", "peer", "name", peer)
        if up_peer:
            self.ip("link", "set", peer, "up")

    def addresses(self, ifname: str, family: str = "inet") -> list[str]:
        data = self.ipj("-f", family, "addr", "show", "dev", ifname)
        return [f"{a['local']}/{a['prefixlen']}" for d in data for a in d.get("addr_info", [])]

    def link(self, ifname: str) -> dict[str, Any]:
        data: list[dict[str, Any]] = self.ipj("link", "show", "dev", ifname)
        return data[0]

    def routes(self, table: int) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.ipj("route", "show", "table", str(table))
        return result

    def rules(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.ipj("rule", "show")
        return result

    def sysctl(self, ifname: str, key: str, family: str = "ipv4") -> str:
        return self.exec("cat", f"/proc/sys/net/{family}/conf/{ifname}/{key}").stdout.strip()

    def nodeagent(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.exec(PYTHON, "-m", "nodeagent", *args, check=check)

    def start_daemon(self, config: Path, *extra: str,
                     env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        # Log to a file, not a pipe: a pipe nobody drains would block the daemon.
        log_path = config.with_suffix(f".{len(self.daemons)}.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.name, PYTHON, "-m", "nodeagent", "run",
                 "--config", str(config), *extra],
                text=True, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        self.daemons.append(proc)
        return proc

    def delete(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sh("ip", "netns", "del", self.name, check=False)


def new_netns() -> Netns:
    require_root_netns()
    name = f"na-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    ns = Netns(name)
    ns.ip("link", "set", "lo", "up")
    return ns


CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def entered(ns: Netns) -> Iterator[None]:
    """This thread inside the namespace (setns(2)), back home at the end. Sockets made
    inside stay there, and threads started inside are born there (a thread takes its
    creator's namespaces), so a service under test listens only in the namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{ns.name}", os.O_RDONLY)
    try:
        if libc.setns(there, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns.name}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back home")
    finally:
        os.close(home)
        os.close(there)


def mounted(mountpoint: Path) -> bool:
    return any(line.split()[4] == str(mountpoint)
               for line in Path("/proc/self/mountinfo").read_text().splitlines())


@contextlib.contextmanager
def fuse_mount(argv: list[str], mountpoint: Path, log_path: Path,
               release: Callable[[], None] = lambda: None) -> Iterator[subprocess.Popen[bytes]]:
    """A test FUSE filesystem process (argv, foreground) mounted at `mountpoint`; on exit
    `release()` lets any blocked call return, then it is unmounted and stopped."""
    if not Path("/dev/fuse").exists():
        raise RuntimeError("this test needs /dev/fuse (a kernel with FUSE)")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while not mounted(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{Path(argv[1]).name} did not mount: "
                               + log_path.read_text()[-2000:])
        time.sleep(0.05)
    try:
        yield proc
    finally:
        release()
        time.sleep(0.2)
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def cpu_load(processes: int | None = None, seconds: float = 600) -> Iterator[None]:
    """CPU-bound processes beside the test (default: one per core), as on a GPU node whose
    CPUs are busy by design; each ends by itself after `seconds` and is killed on exit."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    burners = [subprocess.Popen([sys.executable, "-c", spin])
               for _ in range(processes or os.cpu_count() or 2)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
             interval: float = 0.02) -> Any:
    """Poll until predicate() is truthy, `interval` seconds apart; fail with `what` after a
    generous deadline.

    The deadline is a hang guard, not a performance assertion.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def terminate_group(proc: subprocess.Popen[Any] | None, timeout: float = 20) -> None:
    """Stop a process started with start_new_session=True and everything it started:
    SIGTERM to its group, SIGKILL after `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_daemon(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    proc.send_signal(sig)
    proc.wait(timeout=20)
    return proc.returncode, daemon_log(proc)


def daemon_log(proc: subprocess.Popen[str]) -> str:
    path: Path = proc.log_path  # type: ignore[attr-defined]
    return path.read_text()


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def read_status(runtime_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((runtime_dir / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def condition(data: dict[str, Any], ctype: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in data["conditions"] if c["type"] == ctype)
    return found


# ---------------------------------------------------------------- fixture GID trees


def gid_text(address: str) -> str:
    """Kernel sysfs spelling of a GID: eight groups of four hex digits."""
    import ipaddress

    packed = ipaddress.IPv6Address(address).packed
    return ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2))


def make_gid_tree(
    root: Path,
    device: str,
    entries: Iterable[tuple[int, str, str, str]],
    port: int = 1,
    slots: int = 16,
) -> Path:
    """Write <root>/class/infiniband/<device>/ports/<port>/{gids,gid_attrs} like the kernel.

    `entries` are (index, gid, type text, ndev); other slots are all-zero GIDs whose
    attribute files are directories (reading them fails like the kernel's EINVAL).
    """
    base = root / "class" / "infiniband" / device / "ports" / str(port)
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    filled = {i: (g, t, n) for i, g, t, n in entries}
    for i in range(max(slots, max(filled, default=-1) + 1)):
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            path = base / sub / str(i)
            if path.is_dir():
                path.rmdir()
            elif path.exists():
                path.unlink()
        if i in filled:
            gid, gtype, ndev = filled[i]
            (base / "gids" / str(i)).write_text(gid_text(gid) + "\n")
            (base / "gid_attrs" / "types" / str(i)).write_text(gtype + "\n")
            (base / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")
        else:
            (base / "gids" / str(i)).write_text(gid_text("::") + "\n")
            (base / "gid_attrs" / "types" / str(i)).mkdir()
            (base / "gid_attrs" / "ndevs" / str(i)).mkdir()
    return root


def roce_entries(
    ndev: str, ipv4: str | None, ipv4_index: int = 2
) -> list[tuple[int, str, str, str]]:
    """A mlx5-like port: default link-local v1/v2 at 0/1, the IPv4 pair at index, index+1.

    The returned IPv4 RoCE v2 GID sits at `ipv4_index + 1`.
    """
    out = [
        (0, "fe80::1", "IB/RoCE v1", ndev),
        (1, "fe80::1", "RoCE v2", ndev),
    ]
    if ipv4 is not None:
        out += [
            (ipv4_index, f"::ffff:{ipv4}", "IB/RoCE v1", ndev),
            (ipv4_index + 1, f"::ffff:{ipv4}", "RoCE v2", ndev),
        ]
    return out


def make_port_tree(
    root: Path,
    device: str,
    port: int = 1,
    *,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    link_layer: str = "Ethernet",
    rate: str = "200 Gb/sec (4X HDR)",
    counters: dict[str, int | str] | None = None,
    hw_counters: dict[str, int | str] | None = None,
    hca_type: str = "MT4123",
    fw_ver: str = "20.31.1014",
    pcie: tuple[str, str, str, str, str] | None = ("0000:3b:00.0", "16.0 GT/s PCIe", "16",
                                                  "16.0 GT/s PCIe", "16"),
) -> Path:
    """Write a ConnectX-6-like (mlx5) port under <root>/class/infiniband/<device>: the
    attributes' text as the kernel prints it (state "%d: %s", rate "%d%s Gb/sec (%dX%s)",
    PCIe speeds "16.0 GT/s PCIe"), counters/ and hw_counters/ (a str value is written as
    is: garbage), and `device` linking to a PCI function with its link attributes (None:
    no PCI function, as soft-RoCE). Existing GID files are kept."""
    base = root / "class" / "infiniband" / device
    ports = base / "ports" / str(port)
    for sub in ("counters", "hw_counters"):
        (ports / sub).mkdir(parents=True, exist_ok=True)
    for name, text in (("state", state), ("phys_state", phys_state),
                       ("link_layer", link_layer), ("rate", rate)):
        (ports / name).write_text(text + "\n")
    (base / "hca_type").write_text(hca_type + "\n")
    (base / "fw_ver").write_text(fw_ver + "\n")
    for sub, values in (("counters", counters), ("hw_counters", hw_counters)):
        for name, value in (values or {}).items():
            (ports / sub / name).write_text(f"{value}\n")
    link = base / "device"
    if link.is_symlink():
        link.unlink()
    if pcie is not None:
        address, speed, width, max_speed, max_width = pcie
        function = root / "devices" / "pci0000:00" / address
        function.mkdir(parents=True, exist_ok=True)
        for name, text in (("current_link_speed", speed), ("current_link_width", width),
                           ("max_link_speed", max_speed), ("max_link_width", max_width)):
            (function / name).write_text(text + "\n")
        link.symlink_to(function)
    return root


# ---------------------------------------------------------------- loopback bridge

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns failed")


class LoopbackBridge:
    """Make host 127.0.0.1:<port> reachable as 127.0.0.1:<port> inside a namespace.

    A daemon under test runs in its own network namespace (with its rails) but must reach
    the API server on the host's loopback. The listening socket is created inside the
    namespace by a thread that setns()es there and back (setns is per thread); upstream
    connections are made from the host namespace. Traffic stays on the two loopbacks.
    """

    def __init__(self, netns: str, port: int) -> None:
        import socket
        import threading

        self.port = port
        host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        ns_fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        made: list[socket.socket] = []

        def make_listener() -> None:
            _setns(ns_fd)
            try:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(64)
                made.append(s)
            finally:
                _setns(host_fd)

        t = threading.Thread(target=make_listener)
        t.start()
        t.join()
        os.close(ns_fd)
        os.close(host_fd)
        self.listener = made[0]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def close(self) -> None:
        self.listener.close()
