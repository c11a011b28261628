"""Configuration: YAML -> validated, typed objects, or one line per problem.

Every problem is reported as `<key path>: <what is wrong>` (`rails[1].address: ...`), so an
operator can fix a bad inventory without reading a traceback. Nothing is applied from a config
that has any problem.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from nodeagent.io.files import CONFIG_MAX, describe_error, read_text_bounded
from nodeagent.io.safeyaml import safe_yaml, shown, yaml_problem

DEFAULT_CONFIG_PATH = "/etc/nodeagent/config.yaml"
CONFIG_ENV = "NODEAGENT_CONFIG"

# A plain number of seconds, or one or more number+unit parts as Go and Kubernetes write
# durations ("1h30m", "1m30s"), plus days ("1d"); at most one part per unit.
_NUMBER = r"\d{1,12}(?:\.\d{1,9})?"
# ASCII digits only: Python's \d and float() take Arabic-Indic and other digits too.
_PLAIN = re.compile(rf"^\s*({_NUMBER})\s*$", re.ASCII)
_PARTS = re.compile(rf"^\s*(?:{_NUMBER}(?:ms|s|m|h|d)){{1,5}}\s*$", re.ASCII)
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)", re.ASCII)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_HINT = "use e.g. 30s, 500ms, 2m, 1h30m, 1d"
MAX_DURATION = 7 * 24 * 3600.0  # no interval, timeout or window is longer than a week
# Kubernetes names: a DNS-1123 subdomain (Node names), a qualified name (taint keys).
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(?:\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_RAIL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Linux reserves these routing tables: 253 default, 254 main, 255 local (0 = unspecified).
_RESERVED_TABLES = {0, 253, 254, 255}


class ConfigError(Exception):
    """An invalid configuration: `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def parse_duration(value: Any) -> float:
    """'5s', '500ms', '2m', '1h', '1d', compound forms ('1h30m', '1m30s') or a plain number
    of seconds -> seconds (float), finite and at most a week."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration ({_DURATION_HINT})")
    if isinstance(value, int | float):
        seconds = float(value) if abs(value) < 1e300 or value != value else math.inf
    elif isinstance(value, str) and (m := _PLAIN.match(value)):
        seconds = float(m.group(1))
    elif isinstance(value, str) and _PARTS.match(value) and len(
            units := [u for _, u in _PART.findall(value)]) == len(set(units)):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value))
    else:
        raise ValueError(f"{shown(value)} is not a duration ({_DURATION_HINT})")
    if math.isnan(seconds):
        raise ValueError("NaN is not a duration")
    if seconds < 0:
        raise ValueError(f"{shown(value)} is negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"{shown(value)} is longer than a week ({MAX_DURATION:g}s)")
    return seconds


def _at_least(floor: float, shown: str) -> Callable[[float], float]:
    def check(seconds: float) -> float:
        if seconds < floor:
            raise ValueError(f"{seconds:g}s is too short (at least {shown})")
        return seconds
    return check


# A taint key (node or device): checked by check_taint_key, found when validating.
TaintKey = Annotated[str, AfterValidator(lambda v: check_taint_key(v))]
Duration = Annotated[float, BeforeValidator(parse_duration)]
# Anything a loop waits on between rounds: 0 would spin a thread.
Interval = Annotated[float, BeforeValidator(parse_duration),
                     AfterValidator(_at_least(0.1, "100ms"))]
Timeout = Annotated[float, BeforeValidator(parse_duration),
                    AfterValidator(_at_least(0.01, "10ms"))]


def _node_name(v: str | None) -> str | None:
    if v is not None and (len(v) > 253 or not _SUBDOMAIN.match(v)):
        raise ValueError(f"{shown(v)} is not a Node name (a lowercase DNS-1123 subdomain)")
    return v


def _not_empty(value: Any) -> Any:
    if value == "":
        raise ValueError("is empty (an absolute path is required)")
    return value


def _absolute_path(value: Path) -> Path:
    text = str(value)
    if "\0" in text:
        raise ValueError("contains a NUL byte")
    if not value.is_absolute():
        raise ValueError(f"{shown(text)} is not an absolute path")
    return value


def _command_name(value: str) -> str:
    """A program: a name looked up on PATH, or an absolute path."""
    if not value.strip() or "\0" in value or ("/" in value and not value.startswith("/")):
        raise ValueError(f"{shown(value)} is neither a command name nor an absolute path")
    if value.startswith("-"):
        raise ValueError(f"{shown(value)} starts with '-': an option, not a program")
    if "/" not in value and any(c.isspace() for c in value):
        raise ValueError(f"{shown(value)} is a command line: give the program alone")
    return value


def _argv(argv: list[str]) -> list[str]:
    """A command line: the program a name or an absolute path, no NUL byte anywhere."""
    if argv:
        _command_name(argv[0])
        if any("\0" in arg for arg in argv):
            raise ValueError("an argument contains a NUL byte")
    return argv


AbsPath = Annotated[Path, BeforeValidator(_not_empty), AfterValidator(_absolute_path)]

# Directories of the system: never the agent's own (it creates, locks and replaces files
# in its state and runtime directories).
_SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib64", "/opt",
                          "/root", "/run", "/sbin", "/srv", "/tmp", "/usr", "/var",
                          "/var/lib", "/var/run", "/var/tmp"})


def _own_directory(value: Path) -> Path:
    text = os.path.normpath(str(value))
    if text in _SYSTEM_DIRS or any(text == top or text.startswith(top + "/")
                                   for top in ("/proc", "/sys", "/dev")):
        raise ValueError(f"{shown(text)} is a system directory, not one of the agent's own "
                         "(e.g. /var/lib/nodeagent)")
    return value


OwnDir = Annotated[AbsPath, AfterValidator(_own_directory)]
Argv = Annotated[list[str], Field(min_length=1), AfterValidator(_argv)]
Command = Annotated[str, AfterValidator(_command_name)]


def _nonempty_text(value: str) -> str:
    if not value.strip() or not value.isprintable():
        raise ValueError(f"{shown(value)} must be non-empty printable text")
    return value


Text = Annotated[str, AfterValidator(_nonempty_text)]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo must never silently disable a check. Built when first
    # validated: Config's validator holds every section's, so a validator of each section
    # of its own, built at import, was work no command used.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Paths(_Strict):
    sysfs: AbsPath = Path("/sys")
    procfs: AbsPath = Path("/proc")
    lfs: Command = "lfs"  # the Lustre `lfs` tool (name on PATH or a path); skipped when absent
    rdma: Command = "rdma"  # iproute2's `rdma` tool: lists QPs before a GID is re-pinned


# Rail sysctls the agent knows how to enforce: name -> (procfs subtree, allowed values).
RAIL_SYSCTLS: dict[str, tuple[str, range]] = {
    "arp_ignore": ("net/ipv4/conf", range(0, 9)),
    "arp_announce": ("net/ipv4/conf", range(0, 3)),
    "rp_filter": ("net/ipv4/conf", range(0, 3)),
    "accept_ra": ("net/ipv6/conf", range(0, 3)),
    "addr_gen_mode": ("net/ipv6/conf", range(0, 4)),
    "disable_ipv6": ("net/ipv6/conf", range(0, 2)),
}
def sysctl_parts(ifname: str, key: str) -> list[str]:
    """The path of a rail sysctl below the procfs root, component by component: the only
    place the agent writes under it (net/ipv4|ipv6/conf/<rail>/<key>)."""
    return ["sys", *RAIL_SYSCTLS[key][0].split("/"), ifname, key]


# What multi-rail RoCE hosts want (design notes): answer ARP only for the rail's own
# address, announce with it, loose reverse-path filtering, no router advertisements.
DEFAULT_RAIL_SYSCTLS = {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2, "accept_ra": 0}


def _check_sysctls(value: dict[str, int]) -> dict[str, int]:
    for key, val in value.items():
        if key not in RAIL_SYSCTLS:
            known = ", ".join(sorted(RAIL_SYSCTLS))
            raise ValueError(f"unknown rail sysctl {key!r} (known: {known})")
        allowed = RAIL_SYSCTLS[key][1]
        if val not in allowed:
            raise ValueError(f"{key}={val} is out of range {allowed.start}..{allowed.stop - 1}")
    return value


def check_ifname(v: str) -> str:
    """The kernel's dev_valid_name(): 1-15 bytes, not '.' or '..', no '/', ':', NUL or
    whitespace."""
    why = None
    if not v:
        why = "empty"
    elif len(v.encode("utf-8", "surrogatepass")) > 15:
        why = "longer than 15 bytes"
    elif v in (".", ".."):
        why = "reserved by the kernel"
    elif any(c in "/:" or c.isspace() or not c.isprintable() for c in v):
        why = "'/', ':', whitespace or a control character"
    if why:
        raise ValueError(f"{shown(v)} is not a valid interface name ({why})")
    return v


class Rail(_Strict):
    name: str
    interface: str
    address: str  # validated below: IPv4 interface address with prefix
    mtu: int | None = Field(default=None, ge=68, le=65535)
    table: int | None = None
    rule_priority: int | None = Field(default=None, ge=0, le=2**32 - 1)
    gateway: str | None = None
    gid_index: int | None = Field(default=None, ge=0, le=65535)
    rdma_device: str | None = None  # found from gid_attrs/ndevs when not set
    rdma_port: int = Field(default=1, ge=1, le=255)
    exclusive: bool = False  # remove addresses on the interface that the config does not name
    sysctls: dict[str, int] | None = None  # overrides the top-level rail_sysctls
    # false: observe only (another tool owns the rail: checked and reported, never written);
    # unset: the top-level manage_rails
    manage: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _RAIL_NAME.match(v):
            raise ValueError(f"{shown(v)} is not a rail name (letters, digits, '_', '.', '-';"
                             " at most 63)")
        return v

    @field_validator("interface")
    @classmethod
    def _ifname(cls, v: str) -> str:
        if v in ("lo", "all", "default"):
            # all/default: the kernel's sysctl trees for every interface, not one
            raise ValueError(f"{shown(v)} cannot be a rail (the loopback, or the sysctl "
                             "tree of every interface)")
        return check_ifname(v)

    @field_validator("rdma_device")
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        # A directory name under class/infiniband (IB_DEVICE_NAME_MAX is 64).
        if v is not None and (not _RAIL_NAME.match(v) or v in (".", "..")):
            raise ValueError(f"{shown(v)} is not an RDMA device name")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if "/" not in v:
            raise ValueError(f"{shown(v)} has no prefix length (e.g. 10.10.0.5/24)")
        try:
            iface = ipaddress.IPv4Interface(v)
        except ValueError:
            raise ValueError(f"{shown(v)} is not an IPv4 interface address") from None
        ip, net = iface.ip, iface.network
        if net.prefixlen == 0:
            raise ValueError(f"{shown(v)}: a /0 prefix makes every address the rail's subnet")
        kind = ("unspecified" if ip.is_unspecified else "loopback" if ip.is_loopback
                else "multicast" if ip.is_multicast else "reserved" if ip.is_reserved
                else None)
        if kind is not None:
            article = "an" if kind[0] in "aeiou" else "a"
            raise ValueError(f"{shown(v)} is {article} {kind} address, not a host's")
        if net.prefixlen <= 30 and ip in (net.network_address, net.broadcast_address):
            which = "network" if ip == net.network_address else "broadcast"
            raise ValueError(f"{shown(v)} is the {which} address of {net}")
        return str(iface)

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(ipaddress.IPv4Address(v))
        except ValueError:
            raise ValueError(f"{shown(v)} is not an IPv4 address") from None

    @field_validator("table")
    @classmethod
    def _table(cls, v: int | None) -> int | None:
        if v is not None and (v in _RESERVED_TABLES or not 0 < v < 2**32):
            raise ValueError(f"{v} is reserved or out of range (use 1..252 or 256..4294967295)")
        return v

    @field_validator("sysctls")
    @classmethod
    def _sysctls(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        return None if v is None else _check_sysctls(v)

    @cached_property
    def interface_address(self) -> ipaddress.IPv4Interface:
        """The address parsed once (the pass reads it for every rail, every pass)."""
        return ipaddress.IPv4Interface(self.address)

    @cached_property
    def ip(self) -> str:
        return str(self.interface_address.ip)

    @cached_property
    def prefixlen(self) -> int:
        return self.interface_address.network.prefixlen

    @cached_property
    def network(self) -> str:
        return str(self.interface_address.network)

    @property
    def label(self) -> str:
        """How messages name the rail: 'rail0 ens1f0'."""
        return f"{self.name} {self.interface}"


class LinkFlap(_Strict):
    window: Duration = 60.0  # sliding window for counting carrier losses
    max_flaps: int = Field(default=3, ge=1, le=100_000)  # more than this in the window: flapping
    dwell: Duration = 30.0  # carrier stable this long before LinkFlapping clears


class RepairGuard(_Strict):
    max_repairs: int = Field(default=5, ge=1, le=100_000)  # same drift repaired more than this
    window: Duration = 60.0
    backoff: Duration = 300.0  # then stop fighting for this long: ManagedElsewhere


class Registry(_Strict):
    """How the plugin's image is looked up in its registry (OCI distribution API)."""

    verify_platform: bool = True  # off: the image-platform fact is not checked at all
    ca_bundle: AbsPath | None = None  # PEM roots for registry TLS; None: the system's roots
    docker_config: AbsPath | None = None  # docker-config JSON with credentials
    timeout: Timeout = 10.0  # per registry lookup, all requests and redirects included
    max_bytes: int = Field(default=4 << 20, ge=1024, le=1 << 30)  # larger replies are refused


class Runtime(_Strict):
    """What the node's container runtime knows of the plugin's pod: its pulled image's
    platform (containerd's content store) and its containers' newest log lines (the
    kubelet's pod logs, where `exec format error` is written). Files only, read as root."""

    enabled: bool = True
    content_store: AbsPath = Path("/var/lib/containerd/io.containerd.content.v1.content")
    pod_logs: AbsPath = Path("/var/log/pods")  # the kubelet's podLogsDir


class DevicePlugin(_Strict):
    namespace: Text = "kube-system"
    daemonset: Text = "rdma-shared-dp-ds"
    resource: Text = "rdma/rdma_shared_device_a"
    min_allocatable: int = Field(default=1, ge=0, le=1 << 20)
    interval: Interval = 30.0  # how often its objects are read (off the main loop)
    registry: Registry = Registry()
    runtime: Runtime = Runtime()


class FabricTraffic(_Strict):
    """FabricTrafficOnRDMA: kernel-stack bytes growing while RDMA counters stay flat."""

    expect: Literal["pods", "always", "never"] = "pods"  # pods: while pods here request
    #   the device plugin's resource or one of `pod_resources`
    pod_resources: list[Text] = Field(default_factory=lambda: ["nvidia.com/gpu"])
    window: Duration = 120.0
    min_kernel_bytes: int = Field(default=100 << 20, ge=0, le=2**63 - 1)  # more than this via
    #   the kernel ...
    flat_rdma_bytes: int = Field(default=0, ge=0, le=2**63 - 1)  # ... while RDMA moved at most
    flat_rdma_packets: int = Field(default=0, ge=0, le=2**63 - 1)  # the same, in packets
    gate: bool = False  # true: part of FabricReady (a failure taints the node)


DEFAULT_ERROR_LIMITS = {
    # counters/ (IB port counters; mlx5 fills them for RoCE too)
    "symbol_error": 10, "link_downed": 1, "link_error_recovery": 10, "port_rcv_errors": 10,
    "local_link_integrity_errors": 1, "excessive_buffer_overrun_errors": 1,
    "port_xmit_discards": 100, "port_rcv_remote_physical_errors": 10,
    # hw_counters/ (the driver's; mlx5 names)
    "out_of_sequence": 100, "packet_seq_err": 100, "local_ack_timeout_err": 10,
    "rnr_nak_retry_err": 10, "out_of_buffer": 100, "implied_nak_seq_err": 100,
    "req_cqe_error": 10, "resp_cqe_error": 10,
}


class Hardware(_Strict):
    """RDMAHardwareHealthy: each rail's RDMA port (state, physical state, link layer, rate),
    its HCA's PCIe link, error counters over a window, firmware. Read every `interval`, off
    the repair path."""

    interval: Interval = 30.0
    link_layer: Literal["Ethernet", "InfiniBand"] | None = "Ethernet"  # None: not checked
    expect_rate: float | None = Field(default=None, gt=0)  # Gb/s at least; None: not checked
    pcie: bool = True  # current PCIe speed and width must be the device's maximum ...
    min_pcie_speed: float | None = Field(default=None, gt=0)  # ... or at least these (GT/s,
    min_pcie_width: int | None = Field(default=None, ge=1, le=32)  # lanes)
    error_window: Duration = 300.0
    # counter -> the most it may grow within error_window; a counter not named is only
    # exported as a metric.
    error_limits: dict[Text, int] = Field(default_factory=lambda: dict(DEFAULT_ERROR_LIMITS))
    firmware: dict[Text, list[Text]] = Field(default_factory=dict)  # hca_type -> accepted
    #   fw_ver values (an HCA type not named is not checked)
    gate: bool = True  # part of FabricReady (a failure taints the node)

    @field_validator("error_limits")
    @classmethod
    def _limits(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [k for k, n in v.items() if n < 0]
        if bad:
            raise ValueError(f"negative limit for {', '.join(bad)}")
        return v


class Transport(_Strict):
    """RDMATransportVerified: an RC QP pair over each rail's pinned GID (pyverbs), at start
    and every `probe_interval`, off the main loop."""

    probe_interval: Interval = 300.0
    messages: int = Field(default=100, ge=1, le=100_000)
    timeout: Timeout = 10.0  # the whole probe of one rail
    gate: bool = False  # true: part of FabricReady (a failure taints the node)


class Nccl(_Strict):
    """NCCLDefaultGIDPinned: whether NCCL with its default settings would pick each rail's
    pinned GID (checks/nccl.py, NCCL's selection read from its source). Off FabricReady
    by default: a job may set NCCL_IB_GID_INDEX, and preflight judges the job's own."""

    gate: bool = False  # true: part of FabricReady (jobs run with NCCL's defaults here)


class DraAttributes(_Strict):
    """The attribute names a DRA driver publishes for a NIC (dranet's, by default: its
    pkg/driver and published ResourceSlices, e.g. examples/aws_eks_examples/gpu-efa)."""

    interface: str = "ifName"
    rdma: str = "rdma"
    rdma_device: str = "rdmaDevice"
    mtu: str = "mtu"


class DeviceTaints(_Strict):
    """The DeviceTaintRule a failing rail's device gets (resource.k8s.io: v1alpha3 from
    Kubernetes 1.33 behind the DRADeviceTaints feature gate, the newest served version is
    used). Lifted `kubernetes.clear_after` after the rail passes again."""

    key: TaintKey = "nodeagent.io/rail-unhealthy"
    # None (1.35+): shown to the scheduler's users, keeps no claim off (observe only).
    effect: Literal["NoSchedule", "NoExecute", "None"] = "NoSchedule"


class Dra(_Strict):
    """RDMAResourceSlicesReady: the DRA driver's ResourceSlices for this node (read every
    `interval`) list each rail's NIC, with RDMA, its interface or RDMA device, and its MTU.
    Needs the kubernetes section."""

    driver: str = Field(default="dra.net", min_length=1, max_length=63)
    attributes: DraAttributes = DraAttributes()
    interval: Interval = 60.0
    gate: bool = False  # true: part of FabricReady
    # A rail lent to a pod by a claim (its netdev in the pod's namespace) that is not back
    # this long after its pod ended: RoCENetworkReady False, LentRailNotReturned.
    return_within: Interval = 120.0
    # One bad rail gated alone: a failing rail's device gets a DeviceTaintRule (selector:
    # driver, pool, device from the slices) and the node keeps its taint only for what is
    # not one rail's (the GID table unreadable, every rail, a node-wide check, the API).
    device_taints: DeviceTaints | None = None

    @field_validator("device_taints", mode="before")
    @classmethod
    def _switch(cls, v: Any) -> Any:
        """`device_taints: true` is the defaults; false is off."""
        return {} if v is True else None if v is False else v


# counter -> the fastest it may grow, per second, over congestion.window. The names of a
# ConnectX port: hw_counters/ (the mlx5 driver's q counters and its cong_cnts, in
# drivers/infiniband/hw/mlx5/counters.c; the same layout as leptonai/gpud's captured H100
# node) and the netdev's ethtool statistics (mlx5e's per-priority PFC counters,
# "rx_prio%d_pause" in en_stats.c), for priority 3, where DSCP 26 (NCCL_IB_TC=106) lands.
DEFAULT_CONGESTION_RATES = {
    "rx_prio3_pause": 100.0,  # the switch pauses this port: a pause storm upstream
    "tx_prio3_pause": 100.0,  # this port pauses the switch: its receive buffer is full
    "np_cnp_sent": 1000.0,  # as a receiver, ECN-marked packets answered with CNPs
    "rp_cnp_handled": 1000.0,  # as a sender, CNPs that slowed this port down
    "np_ecn_marked_roce_packets": 1000.0,
    "out_of_sequence": 10.0,  # packets lost and resent (go-back-N)
    "local_ack_timeout_err": 1.0,  # an ACK never came: the retransmit timer fired
    "roce_slow_restart": 1.0,  # retransmits after a long idle, slowed down
}


class Congestion(_Strict):
    """FabricNotCongested: each ready rail's pause, congestion and retransmission counters
    (hw_counters/ of its RDMA port, else the netdev's ethtool statistics), read every
    `interval`, each against its rate over `window`. A counter the driver does not have is
    left out (soft-RoCE has none of these names); a rail with none of them is Unknown."""

    interval: Interval = 10.0
    window: Duration = 60.0
    rates: dict[Text, float] = Field(default_factory=lambda: dict(DEFAULT_CONGESTION_RATES))
    gate: bool = False  # true: part of FabricReady

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, n in v.items() if not 0 <= n < float("inf")]
        if bad:
            raise ValueError(f"a rate must be 0 or more per second: {', '.join(bad)}")
        paths = [k for k in v if "/" in k or k.startswith(".")]
        if paths:
            raise ValueError(f"a counter's name, not a path: {', '.join(paths)}")
        if not v:
            raise ValueError("name at least one counter")
        return v

    @model_validator(mode="after")
    def _window(self) -> Congestion:
        if self.window < 2 * self.interval:
            raise ValueError(f"window {self.window:g}s holds fewer than two samples taken "
                             f"every {self.interval:g}s: make it at least twice the interval")
        return self


class Lldp(_Strict):
    """RailCablingVerified: the switch port at each rail's far end, from the LLDP frames
    arriving on its netdev. No LLDP seen is Unknown, never a failure."""

    # fnmatch pattern each rail's switch (its LLDP system name, else its chassis ID) must
    # match; {n} is the rail's position in `rails` (0, 1, ...), {rail} its name. None: the
    # switches are reported, not checked.
    switch_name: Text | None = None
    gate: bool = False  # true: part of FabricReady (a miscabled rail taints the node)

    def expected(self, rail: str, n: int) -> str | None:
        if self.switch_name is None:
            return None
        return self.switch_name.replace("{n}", str(n)).replace("{rail}", rail)


class Peer(_Strict):
    """Another node's end of a rail: its rail address, and the node's name for messages."""

    address: str
    node: str | None = None

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            ip = ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"{shown(v)} is not an IPv4 address") from None
        if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_reserved:
            raise ValueError(f"{shown(v)} is not a host's address")
        return str(ip)

    @field_validator("node")
    @classmethod
    def _node(cls, v: str | None) -> str | None:
        return _node_name(v)

    @property
    def label(self) -> str:
        """How messages name the peer: 'gpu-07 10.10.1.7'."""
        return f"{self.node} {self.address}" if self.node else self.address


MAX_PEERS = 64  # per rail: the probe rate and the responder's allow-list stay bounded
MAX_CLASSES = 4  # traffic classes probed: each one is another probe of every peer a round
TrafficClass = Annotated[int, Field(ge=0, le=255)]


class Peers(_Strict):
    """RDMAPeersReachable: every rail probes its peers over RoCE (an RC QP to the peer's
    responder, set up over TCP, on the pinned GID index), and answers theirs."""

    port: int = Field(default=18600, ge=1, le=65535)  # the responder's TCP port, per rail
    interval: Interval = 1.0  # each peer probed this often (at most 10 probes/s per rail)
    timeout: Timeout = 1.0  # one probe of one peer: TCP setup and every RDMA read
    reads: int = Field(default=5, ge=1, le=1000)  # small reads per probe (the RTT sample)
    # every this many probes of a peer, a bandwidth sample (128 KiB of reads); 0: never
    bandwidth_every: int = Field(default=60, ge=0, le=1_000_000)
    window: int = Field(default=60, ge=2, le=10_000)  # probes kept per peer (RTT, loss)
    failures: int = Field(default=2, ge=1, le=100)  # failed probes in a row: a failing peer
    max_rtt: Duration = 0.01  # PeerLatencyHigh when a peer's RTT p99 is above this
    static: dict[str, list[Peer]] = Field(default_factory=dict)  # rail name -> its peers
    # With a kubernetes section: each agent publishes its rails on its own Lease and finds
    # `sample` peers per rail among the agents on the same rail network (run/discovery.py).
    discover: bool = False
    sample: int = Field(default=4, ge=1, le=MAX_PEERS)  # discovered peers per rail
    discover_interval: Interval = 600.0  # the agents' cards listed again this often
    gate: bool = False  # true: part of FabricReady (a failure taints the node)
    # The class the jobs' RoCE traffic runs in, as NCCL sets it on its QPs: NCCL_IB_TC (the
    # GRH traffic class: DSCP << 2 | ECN) and NCCL_IB_SL; NCCL's defaults are 0 for both
    # (src/transport/net_ib/connect.cc). A site whose PFC runs on DSCP 26 sets 104.
    traffic_class: int = Field(default=0, ge=0, le=255)
    service_level: int = Field(default=0, ge=0, le=15)
    # The traffic classes every peer is probed in, each every round (default: the jobs'
    # class alone). [0, 104] tells a dropped lossless class from a dead path.
    classes: list[TrafficClass] | None = None

    @property
    def probed_classes(self) -> tuple[int, ...]:
        return tuple(self.classes) if self.classes else (self.traffic_class,)

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not 1 <= len(v) <= MAX_CLASSES:
            raise ValueError(f"{len(v)} classes; 1 to {MAX_CLASSES}")
        dup = sorted({c for c in v if v.count(c) > 1})
        if dup:
            raise ValueError(f"class {', '.join(map(str, dup))} listed twice")
        return v

    @field_validator("static")
    @classmethod
    def _static(cls, v: dict[str, list[Peer]]) -> dict[str, list[Peer]]:
        for rail, peers in v.items():
            if len(peers) > MAX_PEERS:
                raise ValueError(f"{rail}: {len(peers)} peers, at most {MAX_PEERS} per rail")
            seen = [p.address for p in peers]
            dup = sorted({a for a in seen if seen.count(a) > 1})
            if dup:
                raise ValueError(f"{rail}: {', '.join(dup)} listed twice")
        return v


_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*"
                       r"[A-Za-z0-9])?")


def _resource_name(v: str) -> str:
    if len(v) > 253 or not _RESOURCE.fullmatch(v):
        raise ValueError(f"{shown(v)} is not an extended resource name (domain/name)")
    return v


ResourceName = Annotated[str, AfterValidator(_resource_name)]

_IMAGE_PREFIX = re.compile(r"[a-z0-9][a-z0-9._/:@-]{0,254}")


def _image_prefix(v: str) -> str:
    if not _IMAGE_PREFIX.fullmatch(v):
        raise ValueError(f"{shown(v)} is not an image reference prefix (registry/repo[:tag])")
    return v


# An image reference's start: letters a CEL string holds without escaping.
ImagePrefix = Annotated[str, AfterValidator(_image_prefix)]

_CLASS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _class_name(v: str) -> str:
    if len(v) > 253 or not _CLASS_NAME.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a DeviceClass name (a DNS subdomain)")
    return v


ClassName = Annotated[str, AfterValidator(_class_name)]


class Jobs(_Strict):
    """The job gate `nodeagent deploy` renders (deploy/job-policy.yaml): in an opted-in
    namespace a Pod that requests one of `gpu_resources` must request the RDMA resource."""

    gpu_resources: list[ResourceName] = Field(default_factory=lambda: ["nvidia.com/gpu"],
                                              min_length=1, max_length=16)
    rdma_resource: ResourceName | None = None  # default: device_plugin.resource
    # Images the nodeagent-preflight init container may run, as prefixes
    # ("registry.example/nodeagent:"); empty: any image of that name (the name alone let
    # any image called nodeagent-preflight pass).
    preflight_images: list[ImagePrefix] = Field(default_factory=list, max_length=16)
    # With DRA (resource.k8s.io/v1): a claim requesting one of these device classes must
    # request one of the NIC classes too. The GPU classes are NVIDIA's GPU DRA driver's
    # (its deployments/helm deviceclass-gpu.yaml, -mig.yaml); a NIC class is the site's own
    # (dranet's RDMA example names it `rdma`, examples/demo_gke_rdma).
    gpu_device_classes: list[ClassName] = Field(
        default_factory=lambda: ["gpu.nvidia.com", "mig.nvidia.com"], min_length=1,
        max_length=16)
    nic_device_classes: list[ClassName] = Field(default_factory=lambda: ["rdma"],
                                                min_length=1, max_length=16)


class CustomCheck(_Strict):
    """One executable in node-problem-detector's custom-plugin convention: exit 0 OK, 1 a
    problem, 2 (or anything else) unknown; the first line of its stdout is the message."""

    name: str
    command: Argv  # argv; the program by absolute path or on PATH
    timeout: Timeout = 10.0  # then killed with all it started (its scope); counts unknown
    interval: Interval = 60.0
    reason: str = "CustomCheckFailed"  # the condition's reason when this check fails

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(_DNS_LABEL, v):
            raise ValueError(f"{shown(v)} is not a check name (lowercase letters, digits, -)")
        return v


    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]{0,127}", v):
            raise ValueError(f"{shown(v)} is not a CamelCase reason")
        return v


class CustomChecks(_Strict):
    """CustomChecksPassed: the sites' own scripts, carried over as they are."""

    checks: list[CustomCheck] = Field(min_length=1)
    gate: bool = True  # part of FabricReady (a failing check taints the node)

    @field_validator("checks")
    @classmethod
    def _unique(cls, v: list[CustomCheck]) -> list[CustomCheck]:
        names = [c.name for c in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"check names must be unique: {', '.join(twice)}")
        return v


class Metrics(_Strict):
    listen: str = "127.0.0.1:9464"  # host:port of the Prometheus endpoint (loopback)
    expose: bool = False  # true: `listen` may be an address other hosts reach

    @field_validator("listen")
    @classmethod
    def _hostport(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"{shown(v)} is not host:port (e.g. 127.0.0.1:9464)")
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            if host != "localhost":
                raise ValueError(f"{shown(v)}: {shown(host)} is not an IP address or "
                                 "localhost") from None
        return v

    @model_validator(mode="after")
    def _loopback_unless_exposed(self) -> Metrics:
        host = self.listen.rpartition(":")[0].strip("[]")
        if not self.expose and host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"listen {self.listen} is reachable from other hosts: set "
                             "metrics.expose: true to mean it")
        return self


class LustreMount(_Strict):
    mountpoint: str
    source: Text  # as mountinfo shows it: MGS NIDs and fsname, e.g. 10.0.0.1@o2ib:/scratch
    timeout: Timeout = 5.0  # statfs (in a child process) must answer within this
    fstype: Text = "lustre"
    options: list[Text] = Field(default_factory=list)  # required mount options, e.g. [flock]
    remount_command: Argv | None = None  # optional repair
    #   (argv), off by default
    remount_timeout: Timeout = 60.0

    @field_validator("mountpoint")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or "\0" in v:
            raise ValueError(f"{shown(v)} is not an absolute path")
        if not v.isprintable():
            raise ValueError(f"{shown(v)} holds a control character (a newline?)")
        v = v.rstrip("/") or "/"
        if v == "/":
            raise ValueError("'/' is the root filesystem, not a Lustre mount")
        return v



def check_taint_key(v: str) -> str:
    """A Kubernetes qualified name: [prefix/]name, prefix a DNS subdomain, name <= 63."""
    prefix, sep, name = v.rpartition("/")
    if (sep and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix))) \
            or not _QUALIFIED_NAME.match(name):
        raise ValueError(f"{shown(v)} is not a qualified name (e.g. example.com/fabric)")
    return v


class Taint(_Strict):
    key: TaintKey = "nodeagent.io/fabric-unready"
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class Kubernetes(_Strict):
    kubeconfig: AbsPath | None = None  # None: in-cluster or $KUBECONFIG
    # null: conditions only (a node-readiness-controller rule owns the taint): the agent
    # publishes conditions and Events and never writes a taint or cordon
    taint: Taint | None = Taint()
    cordon: bool = False
    clear_after: Duration = 30.0  # all conditions True this long before the taint is lifted
    lease_namespace: str = "nodeagent-system"  # a DNS-1123 label
    lease_period: Interval = 60.0  # heartbeat: Lease renewed this often
    lease_duration: Interval | None = None  # how long a renewal holds; default 3x the period
    # lastHeartbeatTime of the agent's conditions refreshed at least this often (in the same
    # status patch as any change); with the Lease: 60 + 12 = 72 writes per node-hour
    heartbeat_interval: Interval = 300.0
    reconcile_interval: Interval = 600.0  # re-read the Node even when nothing changed
    request_timeout: Timeout = 15.0  # one API request in all, reply included (a server that
    #   trickles its reply cannot hold the publisher)
    # One API reply or watch event, in bytes: a larger one is refused, never buffered (the
    # agent reads its Node, its DaemonSet, its node's pods and a group of Leases: KiBs).
    max_reply: int = Field(default=64 << 20, ge=1 << 20, le=1 << 30)
    event_burst: int = Field(default=10, ge=1, le=10_000)  # Events: token bucket of this size
    event_rate: float = Field(default=0.2, gt=0, le=1000, allow_inf_nan=False)  # ... refilled
    #   at this many per second


    @field_validator("lease_namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not re.fullmatch(_DNS_LABEL, v):
            raise ValueError(f"{shown(v)} is not a namespace name (a DNS-1123 label)")
        return v

    @model_validator(mode="after")
    def _cordon_needs_taint(self) -> Kubernetes:
        if self.taint is None and self.cordon:
            raise ValueError("cordon: true needs a taint (with taint: null the agent writes "
                             "neither)")
        return self

    def lease_seconds(self) -> float:
        """How long one Lease renewal holds: staleness in `fleet` and the alerts."""
        return self.lease_duration if self.lease_duration is not None else 3 * self.lease_period


class Config(_Strict):
    node_name: str | None = None  # default: $NODE_NAME, else the hostname
    paths: Paths = Paths()
    state_dir: OwnDir = Path("/var/lib/nodeagent")
    runtime_dir: OwnDir = Path("/run/nodeagent")
    resync_interval: Annotated[float, BeforeValidator(parse_duration),
                               AfterValidator(_at_least(1.0, "1s"))] = 30.0
    # Receive buffer of the netlink event socket; on overflow the agent resyncs everything.
    netlink_rcvbuf: int = Field(default=1 << 20, ge=4096, le=1 << 30)
    rails: list[Rail] = Field(default_factory=list)
    rail_sysctls: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_RAIL_SYSCTLS))
    manage_rails: bool = True  # the default of each rail's `manage`
    gid_source: Literal["auto", "pyverbs", "sysfs"] = "auto"
    # A GID found off its pinned index is put back (the rail's address deleted and re-added)
    # once no QP uses the port any more: auto. never: only reported.
    gid_repin: Literal["auto", "never"] = "auto"
    gid_repin_poll: Interval = 5.0  # while a GID is shifted, QPs are looked at this often
    link_flap: LinkFlap = LinkFlap()
    repair_guard: RepairGuard = RepairGuard()
    device_plugin: DevicePlugin | None = None
    fabric_traffic: FabricTraffic | None = None
    hardware: Hardware | None = None
    custom_checks: CustomChecks | None = None
    transport: Transport | None = None
    peers: Peers | None = None
    nccl: Nccl | None = None
    dra: Dra | None = None
    congestion: Congestion | None = None
    lldp: Lldp | None = None
    jobs: Jobs = Jobs()  # the job gate's names, for nodeagent deploy
    metrics: Metrics | None = None  # the Prometheus endpoint; off without this section
    lustre: list[LustreMount] | None = None
    lustre_interval: Interval = 10.0  # how often the mounts are probed (off the main loop)
    kubernetes: Kubernetes | None = None

    @field_validator("rail_sysctls")
    @classmethod
    def _sysctls(cls, v: dict[str, int]) -> dict[str, int]:
        return _check_sysctls(v)

    @field_validator("node_name")
    @classmethod
    def _node(cls, v: str | None) -> str | None:
        return _node_name(v)

    def resolved_node_name(self) -> str:
        return self.node_name or os.environ.get("NODE_NAME") or socket.gethostname()

    def manages(self, rail: Rail) -> bool:
        """Whether the agent may write the rail's kernel state (repairs, re-pins)."""
        return self.manage_rails if rail.manage is None else rail.manage

    def sysctls_for(self, rail: Rail) -> dict[str, int]:
        return dict(self.rail_sysctls if rail.sysctls is None else rail.sysctls)


# ---------------------------------------------------------------- loading


def _path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _describe(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = str(error["msg"])
    msg = msg.removeprefix("Value error, ")
    if kind != "value_error" and "input" in error:
        msg += f" (got {shown(error['input'])})"
    return msg


def _overlapping_subnets(rails: list[tuple[int, Rail]]) -> list[str]:
    """Two rails whose subnets overlap: the kernel's connected routes, and so the path a
    rail's traffic takes, would be ambiguous. (The same address twice is a duplicate.)"""
    problems: list[str] = []
    for n, (i, rail) in enumerate(rails):
        net = rail.interface_address.network
        for j, other in rails[:n]:
            if other.ip != rail.ip and net.overlaps(other.interface_address.network):
                problems.append(f"rails[{i}].address: subnet {net} overlaps rails[{j}]'s "
                                f"{other.network}")
                break
    return problems


def _semantic_problems(rails: list[tuple[int, Rail]],
                       mounts: list[tuple[int, LustreMount]]) -> list[str]:
    """Cross-field rules pydantic cannot place on one key, over the rails and mounts that
    are valid on their own (so field and cross-field problems come out in one run)."""
    problems: list[str] = []
    seen: dict[str, dict[str, int]] = {"name": {}, "interface": {}, "ip": {}, "table": {}}
    for i, rail in rails:
        where = f"rails[{i}]"
        for key, value in (
            ("name", rail.name),
            ("interface", rail.interface),
            ("ip", rail.ip),
            ("table", rail.table),
        ):
            if value is None:
                continue
            first = seen[key].get(str(value))
            if first is not None:
                shown = "address" if key == "ip" else key
                problems.append(f"{where}.{shown}: {value!r} duplicates rails[{first}].{shown}")
            else:
                seen[key][str(value)] = i
        if rail.rule_priority is not None and rail.table is None:
            problems.append(f"{where}.rule_priority: set without {where}.table")
        if rail.gateway is not None:
            if rail.table is None:
                problems.append(f"{where}.gateway: set without {where}.table")
            elif ipaddress.IPv4Address(rail.gateway) not in ipaddress.IPv4Network(rail.network):
                problems.append(
                    f"{where}.gateway: {rail.gateway} is outside the rail subnet {rail.network}"
                )
            elif rail.gateway == rail.ip:
                problems.append(f"{where}.gateway: {rail.gateway} is the rail's own address")
            elif ipaddress.IPv4Address(rail.gateway) in (
                    rail.interface_address.network.network_address,
                    rail.interface_address.network.broadcast_address):
                problems.append(f"{where}.gateway: {rail.gateway} is the network or broadcast "
                                f"address of {rail.network}")
    problems += _overlapping_subnets(rails)
    points: dict[str, int] = {}
    for i, mount in mounts:
        if mount.mountpoint in points:
            problems.append(
                f"lustre[{i}].mountpoint: {mount.mountpoint!r} duplicates "
                f"lustre[{points[mount.mountpoint]}].mountpoint"
            )
        points.setdefault(mount.mountpoint, i)
    return problems


def _dra_problems(cfg: Config) -> list[str]:
    if cfg.dra is not None and cfg.dra.device_taints is not None and cfg.kubernetes is None:
        return ["dra.device_taints: needs a kubernetes section (the rules are written "
                "through the API)"]
    return []


def _peer_problems(cfg: Config) -> list[str]:
    """peers.static names configured rails, no peer is one of this node's own rails, and
    discovery has an API to discover from."""
    if cfg.peers is None:
        return []
    names = [r.name for r in cfg.rails]
    own = {r.ip for r in cfg.rails}
    problems = []
    if cfg.peers.discover and cfg.kubernetes is None:
        problems.append("peers.discover: needs a kubernetes section (the peers' cards are "
                        "read from their Leases)")
    for rail, peers in cfg.peers.static.items():
        if rail not in names:
            problems.append(f"peers.static.{rail}: no rail of that name (rails: "
                            f"{', '.join(names) or 'none'})")
        for i, peer in enumerate(peers):
            if peer.address in own:
                problems.append(f"peers.static.{rail}[{i}].address: {peer.address} is this "
                                "node's own rail address")
    return problems


def _valid_items(data: Any, model: type[BaseModel]) -> list[tuple[int, Any]]:
    """The items of a list that validate on their own, with their index."""
    out: list[tuple[int, Any]] = []
    if isinstance(data, list):
        for i, item in enumerate(data):
            try:
                out.append((i, model.model_validate(item)))
            except ValidationError:
                continue
    return out


def parse_config(data: Any) -> Config:
    """Validate already-parsed YAML data; raise ConfigError with every problem, field and
    cross-field alike."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"(top level): expected a mapping of keys, got {type(data).__name__}"])
    problems: list[str] = []
    cfg: Config | None = None
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        problems = [f"{_path(e['loc'])}: {_describe(e)}" for e in exc.errors()]
    if cfg is not None:
        rails, mounts = list(enumerate(cfg.rails)), list(enumerate(cfg.lustre or []))
    else:
        rails = _valid_items(data.get("rails"), Rail)
        mounts = _valid_items(data.get("lustre"), LustreMount)
    problems += _semantic_problems(rails, mounts)
    if cfg is not None:
        problems += _peer_problems(cfg)
        problems += _dra_problems(cfg)
    if problems or cfg is None:
        raise ConfigError(problems)
    return cfg


def default_config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML file; every problem line is prefixed with the file name."""
    name = str(path)
    try:
        text = read_text_bounded(path, CONFIG_MAX)
    except FileNotFoundError:
        raise ConfigError([f"{name}: config file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{name}: cannot read config: {describe_error(exc)}"]) from None
    try:
        data = safe_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{name}: {yaml_problem(exc)}"]) from None
    except (RecursionError, ValueError, OverflowError, MemoryError) as exc:
        # PyYAML's own recursion on what the limits let through, or a value it cannot
        # build: still one line, never a traceback.
        raise ConfigError([f"{name}: invalid YAML: {type(exc).__name__}: "
                           f"{str(exc)[:100]}"]) from None
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError([f"{name}: {p}" for p in exc.problems]) from None
