"""What NCCL will do with this fabric, predicted from NCCL's own source: the ports its
IB/RoCE transport opens and, on each, the GID index it picks. Pure and table-driven: an
environment and the GID tables a process sees in, a plan out; `nccl_problems` compares the
plan with the rails the node's agent pins.

The rules, from NVIDIA/nccl 2.30.7 (commit 5067397c); the file and function are named at
each rule so a new NCCL can be read against them:
- Integer variables (`ncclLoadParam`, src/misc/param.cc): unset or empty is the default;
  otherwise `strtoll(value, NULL, 0)`: leading blanks and a sign, then the longest number
  in C's base 0 (`0x` hex, leading `0` octal), the rest ignored (`010` is 8, `1abc` 1,
  `true` 0); only an errno (ERANGE: out of range) brings the default back.
- `/etc/nccl.conf`, `~/.nccl.conf` or `$NCCL_CONF_FILE` fill in variables the
  environment does not set (`setEnvFile`: `NAME=value` lines, `#` comments, setenv without
  overwrite).
- `NCCL_NET` (src/plugin/net.cc `ncclNetInit`): compared with `strcasecmp` to each
  network's name; the built-in ones are `IB` and `Socket`. Set, it never falls back; set
  to anything no network is called (even empty), NCCL fails.
- `NCCL_IB_DISABLE` (src/transport/net_ib/init.cc): non-zero turns the transport off.
- `NCCL_IB_HCA` (init.cc, src/misc/utils.cc `parseStringList`/`matchIfList`): a leading
  `^` excludes, then a leading `=` matches exactly; entries split on `,` (empty ones
  dropped), each `prefix[:port[:rail[:plane]]]` with `atoi` ports (absent or empty: any
  port); without `=` an entry is a prefix (`mlx5_1` selects `mlx5_10`). An empty list
  selects every port, so `^` alone selects none. Only ACTIVE ports of an Ethernet or
  InfiniBand link layer are ever considered.
- The GID (src/transport/net_ib/connect.cc `ncclIbGetGidIndex`): `NCCL_IB_GID_INDEX`
  (default -1) >= 0 is used as is. Otherwise start at 0 and walk 1..gid_tbl_len-1: a
  candidate of the wanted family (`NCCL_IB_ADDR_FAMILY`: exactly `AF_INET6`, else IPv4)
  in `NCCL_IB_ADDR_RANGE` replaces one of another family outright, without looking at
  its RoCE version or validity; within the family, a valid (configured, not link-local)
  candidate replaces the current one when their versions differ or the current is not
  valid, and the candidate's version is `NCCL_IB_ROCE_VERSION_NUM` (default 2). Versions
  come from gid_attrs/types/N; EINVAL leaves the candidate's at -1 (never chosen) and the
  current's undefined (taken here as different); a types file that does not open fails.
- `NCCL_IB_ADDR_RANGE` (`envIbAddrRange`): ignored without a `/`, with an address
  `inet_pton` refuses, or a mask above the family's width; a mask of 0 matches everything,
  a negative one nothing.
- `NCCL_SOCKET_IFNAME` (src/misc/socket.cc `ncclFindInterfaces`): longer than one
  character, it must match an UP-and-RUNNING interface with an address (same list rules,
  no ports), or NET/IB and the bootstrap find none and NCCL fails.
- `NCCL_IB_TC`/`NCCL_IB_SL` (connect.cc): -1 (the default) means 0 unless a plugin sets
  a traffic class.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nodeagent.model.jobs import GidSlot, NodeRail, PortView, Unfit
from nodeagent.model.peers import Class

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
C_SPACE = " \t\n\v\f\r"
_BASE0 = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def strtoll0(text: str) -> tuple[int, bool]:
    """glibc's `strtoll(text, NULL, 0)`: the value and whether it was out of range (ERANGE;
    the value is then clamped, as glibc does). No number at all is 0, without an error."""
    m = _BASE0.match(text.lstrip(C_SPACE))
    if m is None:
        return 0, False
    sign, digits = m.groups()
    value = int(digits, 0) if not digits.startswith("0") or len(digits) == 1 else (
        int(digits, 16) if digits[1:2] in ("x", "X") else int(digits, 8))
    value = -value if sign == "-" else value
    if value > INT64_MAX:
        return INT64_MAX, True
    if value < INT64_MIN:
        return INT64_MIN, True
    return value, False


# A value strtoll(…, 0) reads as non-zero, as an RE2 pattern (the admission policy's CEL
# `matches`, rendered from this; a test holds it to strtoll0): blanks, a sign, then hex
# with a non-zero digit, octal with a non-zero digit, or decimal 1-9. (One difference: a
# number out of range, which NCCL reads as its default 0, matches.)
NONZERO_INT_RE = r"^[ \t\n\v\f\r]*[+-]?(0[xX]0*[1-9a-fA-F]|0[0-7]*[1-7]|[1-9])"


def nccl_int(env: Mapping[str, str], name: str, default: int) -> int:
    """An integer variable as `ncclLoadParam` reads it."""
    text = env.get(name)
    if not text:
        return default
    value, out_of_range = strtoll0(text)
    return default if out_of_range else value


def c_atoi(text: str) -> int:
    """C's atoi for a port number: decimal, leading blanks and a sign, the rest ignored."""
    m = re.match(r"[+-]?[0-9]+", text.lstrip(C_SPACE))
    return int(m.group(0)) if m else 0


def with_conf_files(env: Mapping[str, str], texts: Iterable[str]) -> dict[str, str]:
    """The environment NCCL sees after `setEnvFile` on each file, in NCCL's order (the user
    file, then /etc/nccl.conf): a variable already set is kept."""
    out = dict(env)
    for text in texts:
        for line in text.split("\n"):
            line = line.removesuffix("\r")
            if not line or line.startswith("#") or "=" not in line:
                continue
            name, value = line.split("=", 1)
            if name and "\0" not in name:
                out.setdefault(name[:1023], value[:1023])
    return out


@dataclass(frozen=True)
class IfEntry:
    prefix: str
    port: int  # -1: any port


@dataclass(frozen=True)
class IfList:
    """`NCCL_IB_HCA` or `NCCL_SOCKET_IFNAME` as NCCL parses it."""

    entries: tuple[IfEntry, ...] = ()
    exclude: bool = False
    exact: bool = False

    @classmethod
    def parse(cls, spec: str | None) -> IfList:
        if spec is None:
            return cls()
        exclude = spec.startswith("^")
        spec = spec[1:] if exclude else spec
        exact = spec.startswith("=")
        spec = spec[1:] if exact else spec
        entries = []
        for item in (i for i in spec.split(",") if i):
            parts = item.split(":")
            if not parts[0]:
                continue  # NCCL skips an entry with no name
            port = c_atoi(parts[1]) if len(parts) > 1 and parts[1] else -1
            entries.append(IfEntry(parts[0][:63], port))
        return cls(tuple(entries[:32]), exclude, exact)

    def selects(self, name: str, port: int = -1) -> bool:
        """`matchIfList(...) ^ searchNot`."""
        hit = not self.entries or any(
            (name == e.prefix if self.exact else name.startswith(e.prefix))
            and (port == -1 or e.port == -1 or port == e.port) for e in self.entries)
        return hit != self.exclude


@dataclass(frozen=True)
class AddrRange:
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None  # None: every address
    never: bool = False  # a negative mask: NCCL's match never succeeds

    def holds(self, gid: ipaddress.IPv6Address, family: int) -> bool:
        if self.never:
            return False
        if self.network is None:
            return True
        if family == 4:
            word = ipaddress.IPv4Address(gid.packed[12:])
            return word in self.network
        return gid in self.network


def _addr_range(text: str | None, family: int) -> AddrRange:
    if not text or "/" not in text:
        return AddrRange(None)
    addr, mask_text = text[:127].split("/", 1)
    try:
        base = (ipaddress.IPv4Address(addr) if family == 4 else ipaddress.IPv6Address(addr))
    except ValueError:
        return AddrRange(None)
    m = re.match(r"[+-]?[0-9]+", mask_text.lstrip(C_SPACE))
    mask = int(m.group(0)) if m else 0
    if mask > (32 if family == 4 else 128):
        return AddrRange(None)
    if mask < 0:
        return AddrRange(None, never=True)
    cls = ipaddress.IPv4Network if family == 4 else ipaddress.IPv6Network
    return AddrRange(cls((base, mask), strict=False))


@dataclass(frozen=True)
class NcclEnv:
    """The variables that decide NCCL's network, as NCCL reads them."""

    net: str | None
    ib_disable: int
    hca: IfList
    hca_text: str | None
    gid_index: int
    family: int  # 4 or 6
    addr_range: AddrRange
    roce_version: int
    socket_ifname: str | None
    tc: int
    sl: int
    given: tuple[tuple[str, str], ...] = ()  # the NCCL_ variables as set, for messages

    def text(self, name: str) -> str:
        return dict(self.given).get(name, "")

    @property
    def traffic(self) -> Class:
        """The class NCCL's QPs run in: its connection metadata holds the class in a
        uint8_t (src/transport/net_ib/common.h), the IB service level has 4 bits."""
        return Class(self.tc & 0xFF, self.sl & 0xF)

    @classmethod
    def read(cls, env: Mapping[str, str]) -> NcclEnv:
        family = 6 if env.get("NCCL_IB_ADDR_FAMILY") == "AF_INET6" else 4
        ifname = env.get("NCCL_SOCKET_IFNAME")
        return cls(
            net=env.get("NCCL_NET"),
            ib_disable=nccl_int(env, "NCCL_IB_DISABLE", 0),
            hca=IfList.parse(env.get("NCCL_IB_HCA")),
            hca_text=env.get("NCCL_IB_HCA"),
            gid_index=nccl_int(env, "NCCL_IB_GID_INDEX", -1),
            family=family,
            addr_range=_addr_range(env.get("NCCL_IB_ADDR_RANGE"), family),
            roce_version=nccl_int(env, "NCCL_IB_ROCE_VERSION_NUM", 2),
            socket_ifname=ifname if ifname is not None and len(ifname) > 1 else None,
            tc=max(nccl_int(env, "NCCL_IB_TC", -1), 0),
            sl=max(nccl_int(env, "NCCL_IB_SL", -1), 0),
            given=tuple(sorted((k, v) for k, v in env.items() if k.startswith("NCCL_"))),
        )


DEFAULTS = NcclEnv.read({})


def gid_family(gid: ipaddress.IPv6Address) -> int:
    """`getGidAddrFamily`: IPv4-mapped (or its ff0e:: multicast form) is IPv4."""
    raw = gid.packed
    if raw[:10] == bytes(10) and raw[10:12] == b"\xff\xff":
        return 4
    if raw[:4] == b"\xff\x0e\x00\x00" and raw[4:10] == bytes(6) and raw[10:12] == b"\xff\xff":
        return 4
    return 6


def gid_valid(gid: ipaddress.IPv6Address) -> bool:
    """`validGid`: configured (not :: and not fe80:: with nothing after) and not
    link-local (fe80:0000:...)."""
    raw = gid.packed
    trailer = raw[4:] != bytes(12)
    if raw[:4] in (bytes(4), b"\xfe\x80\x00\x00") and not trailer:
        return False
    return not (raw[:4] == b"\xfe\x80\x00\x00" and raw[4:8] == bytes(4))


@dataclass(frozen=True)
class GidChoice:
    device: str
    port: int
    index: int | None  # None: NCCL fails (why says how)
    slot: GidSlot | None
    forced: bool  # NCCL_IB_GID_INDEX
    why: str = ""

    def describe(self) -> str:
        slot = self.slot
        if self.index is None or slot is None:
            return f"no GID ({self.why})"
        kind = ("empty" if slot.gid.packed == bytes(16) else
                f"IPv4 {slot.ipv4}" if slot.ipv4 is not None else
                f"link-local {slot.gid}" if not gid_valid(slot.gid) else f"IPv6 {slot.gid}")
        version = f"RoCE v{slot.version}" if slot.version else "type unreadable"
        return f"GID {self.index} ({kind}, {version})"

    @property
    def ipv4_v2(self) -> str | None:
        slot = self.slot
        return slot.ipv4 if slot is not None and slot.version == 2 else None


class _Fails(Exception):
    pass


def _version(slot: GidSlot) -> int | None:
    if slot.missing:
        raise _Fails(f"gid_attrs/types/{slot.index} does not open")
    return slot.version


def choose_gid(port: PortView, env: NcclEnv) -> GidChoice:
    """`ncclIbGetGidIndex` for a RoCE port."""
    slots = {s.index: s for s in port.slots}
    length = max(slots, default=-1) + 1
    if env.gid_index >= 0:
        slot = slots.get(env.gid_index)
        if slot is None:
            return GidChoice(port.device, port.port, None, None, True,
                             f"NCCL_IB_GID_INDEX={env.gid_index} is past the table's "
                             f"{length} slots")
        return GidChoice(port.device, port.port, env.gid_index, slot, True)
    zero = GidSlot(0, ipaddress.IPv6Address(0), None)
    current = slots.get(0, zero)
    try:
        for index in range(1, length):
            cand = slots.get(index, GidSlot(index, ipaddress.IPv6Address(0), None))
            fam, cand_fam = gid_family(current.gid), gid_family(cand.gid)
            in_range = env.addr_range.holds(cand.gid, env.family)
            if cand_fam != fam and cand_fam == env.family and in_range:
                current = cand
                continue
            if cand_fam != env.family or not gid_valid(cand.gid) or not in_range:
                continue
            have, want = _version(current), _version(cand)
            if (have is None or have != want or not gid_valid(current.gid)) \
                    and want == env.roce_version:
                current = cand
    except _Fails as exc:
        return GidChoice(port.device, port.port, None, None, False, str(exc))
    return GidChoice(port.device, port.port, current.index, current, False)


@dataclass(frozen=True)
class NcclPlan:
    """What NCCL would do: the network, the ports NET/IB opens, the GID on each."""

    network: str  # "IB", "Socket", "fails", or a plugin's name
    why: str  # why not IB, or why NCCL fails; "" when IB
    ports: tuple[GidChoice, ...]
    skipped: tuple[str, ...]  # ports NET/IB will not open, with why
    env: NcclEnv

    def summary(self) -> str:
        if self.network != "IB":
            return f"NCCL: {self.network} ({self.why})"
        used = ", ".join(f"{c.device}:{c.port} GID {c.index}" for c in self.ports)
        return f"NCCL: IB on {used}; TC {self.env.tc}, SL {self.env.sl}"


def selected_ports(ports: Sequence[PortView], env: NcclEnv) -> tuple[list[PortView], list[str]]:
    """The ports NET/IB opens (init.cc: ACTIVE, Ethernet or InfiniBand, in NCCL_IB_HCA)."""
    used: list[PortView] = []
    skipped: list[str] = []
    for p in ports:
        name = f"{p.device}:{p.port}"
        if not p.active:
            skipped.append(f"{name} is {p.state or 'not ACTIVE'}")
        elif not env.hca.selects(p.device, p.port):
            skipped.append(f"{name} is not in NCCL_IB_HCA={env.hca_text}")
        else:
            used.append(p)
    return used, skipped


def predict(env: NcclEnv, ports: Sequence[PortView],
            interfaces: Sequence[str] | None = None) -> NcclPlan:
    """NCCL's choice. `interfaces`: the names of this process's running interfaces with an
    address (None: not known, NCCL_SOCKET_IFNAME not checked)."""
    used, skipped = selected_ports(ports, env)
    net = env.net
    wants_ib = net is None or net.lower() == "ib"

    def plan(network: str, why: str, chosen: Sequence[GidChoice] = ()) -> NcclPlan:
        return NcclPlan(network, why, tuple(chosen), tuple(skipped), env)

    if net is not None and net.lower() not in ("ib", "socket"):
        if not net:
            return plan("fails", "NCCL_NET is set but empty: no network has that name")
        return plan(net, f"NCCL_NET={net} names a plugin, not the built-in IB: not "
                    "predicted")
    if interfaces is not None and env.socket_ifname is not None:
        wanted = IfList.parse(env.socket_ifname)
        if not any(wanted.selects(i) for i in interfaces):
            return plan("fails", f"NCCL_SOCKET_IFNAME={env.socket_ifname} matches no running "
                        "interface with an address here (NCCL's bootstrap and NET/IB need one)")
    if not wants_ib:
        return plan("Socket", f"NCCL_NET={net} forces TCP sockets: remove it, or set "
                    "NCCL_NET=IB")
    if env.ib_disable != 0:
        off, fix = (f"NCCL_IB_DISABLE={env.text('NCCL_IB_DISABLE')} turns NET/IB off (NCCL "
                    f"reads it as {env.ib_disable})", "remove it")
    elif not ports:
        off, fix = ("no ACTIVE RDMA port here", "request the RDMA resource")
    elif not used:
        off, fix = (f"NET/IB opens no port ({'; '.join(skipped)})",
                    "select the rails' devices in NCCL_IB_HCA")
    else:
        off = fix = ""
    if off:
        return plan("fails" if net is not None else "Socket", off + (
            f": NCCL_NET=IB then fails; {fix}" if net is not None else
            f": NCCL falls back to TCP sockets without an error; {fix}"))
    chosen = [choose_gid(p, env) if p.ethernet else
              GidChoice(p.device, p.port, 0, None, False, "InfiniBand") for p in used]
    failed = [c for c in chosen if c.index is None]
    if failed:
        return plan("fails", "; ".join(f"{c.device}:{c.port}: {c.why}" for c in failed),
                    chosen)
    return plan("IB", "", chosen)


# ---------------------------------------------------------------- against the rails


@dataclass(frozen=True)
class Expected:
    """The GID a rail's traffic must leave from, and whose view says so."""

    rail: NodeRail
    index: int | None
    address: str | None
    view: str  # "host" (the agent's pin) or "pod" (the pod's own address on the device)


def expected_gid(rail: NodeRail, port: PortView | None, pod_addresses: Iterable[str]) -> Expected:
    """The host's pin, unless this process has an IPv4 address of its own (not the rail's)
    that is a RoCE v2 GID of the rail's port: a macvlan or SR-IOV child moved into the pod,
    whose GID sits at an index of its own (NVIDIA/nccl#718, multus-cni#1100)."""
    own = set(pod_addresses) - {(rail.address or "").split("/")[0]}
    if port is not None and own:
        for slot in sorted(port.slots, key=lambda s: s.index):
            if slot.version == 2 and slot.ipv4 in own:
                return Expected(rail, slot.index, slot.ipv4, "pod")
    return Expected(rail, rail.gid_index, rail.address, "host")


def _fix(choice: GidChoice, want: Expected, env: NcclEnv) -> str:
    slot = choice.slot
    if want.index is None:
        return (f"{choice.device}:{choice.port} has no IPv4 RoCE v2 GID here: give the "
                "rail's port its IPv4 address")
    if choice.forced:
        return f"set NCCL_IB_GID_INDEX={want.index}, or unset it (NCCL then picks it itself)"
    if env.family == 6:
        return "remove NCCL_IB_ADDR_FAMILY=AF_INET6 (or set NCCL_IB_GID_INDEX=" \
               f"{want.index})"
    if env.roce_version != 2:
        return f"remove NCCL_IB_ROCE_VERSION_NUM (NCCL reads it as {env.roce_version})"
    if slot is not None and slot.ipv4 is not None and slot.version == 2:
        return (f"another IPv4 address ({slot.ipv4}) sits below it: set "
                f"NCCL_IB_ADDR_RANGE to the rail's subnet, or NCCL_IB_GID_INDEX={want.index}")
    return (f"no IPv4 RoCE v2 GID NCCL can pick on {choice.device}:{choice.port}: set "
            f"NCCL_IB_GID_INDEX={want.index}, or give the rail's port its IPv4 address")


def nccl_problems(plan: NcclPlan, rails: Sequence[NodeRail], ports: Sequence[PortView],
                  pod_addresses: Iterable[str] = (), *,
                  allow_partial: bool = False) -> list[Unfit]:
    """One line per way NCCL's plan misses the rails: not IB, a rail left out, a GID that
    is not the rail's IPv4 RoCE v2 one."""
    if plan.network == "fails":
        return [Unfit("nccl", f"NCCL would fail at init: {plan.why}")]
    if plan.network not in ("IB",):
        if plan.network == "Socket":
            return [Unfit("nccl", f"NCCL would use TCP sockets, not the rails: {plan.why}")]
        return []  # a plugin's network: not predicted
    addresses = list(pod_addresses)
    by_port = {(p.device, p.port): p for p in ports}
    out: list[Unfit] = []
    used = {(c.device, c.port): c for c in plan.ports}
    rails = [r for r in rails if r.device]
    left = [r for r in rails if (r.device, r.port or 1) not in used]
    if left and not allow_partial:
        names = ", ".join(f"{r.name} ({r.device}:{r.port or 1})" for r in left)
        why = "; ".join(s for s in plan.skipped
                        if any(s.startswith(f"{r.device}:{r.port or 1} ") for r in left))
        out.append(Unfit("nccl", f"NCCL would use {len(rails) - len(left)} of {len(rails)} "
                         f"rails, not {names}{f' ({why})' if why else ''}: the job trains "
                         "at a fraction of the bandwidth; select every rail, or pass "
                         "--allow-partial-rails"))
    railed = {(r.device, r.port or 1) for r in rails}
    extra = [f"{d}:{p}" for d, p in used if rails and (d, p) not in railed]
    if extra:
        names = ",".join(sorted({r.device or "" for r in rails}))
        out.append(Unfit("nccl", f"NCCL would also use {', '.join(extra)}, not a rail: its "
                         f"traffic leaves the fabric; set NCCL_IB_HCA=={names}"))
    for rail in rails:
        choice = used.get((rail.device or "", rail.port or 1))
        if choice is None or choice.slot is None:
            continue
        want = expected_gid(rail, by_port.get((rail.device or "", rail.port or 1)), addresses)
        if want.index is None:
            if choice.ipv4_v2 is None:
                out.append(Unfit("nccl", f"NCCL would use {choice.describe()} on "
                                 f"{choice.device}:{choice.port} ({rail.name}), not an IPv4 "
                                 f"RoCE v2 GID: {_fix(choice, want, DEFAULTS)}"))
            continue
        if choice.index != want.index:
            env_view = f", the pod's own address {want.address}" if want.view == "pod" else ""
            out.append(Unfit("nccl", f"NCCL would use {choice.describe()} on "
                             f"{choice.device}:{choice.port}, not {rail.name}'s IPv4 RoCE v2 "
                             f"GID {want.index} ({want.view} view{env_view}): "
                             f"{_fix(choice, want, plan.env)}"))
    return out
