"""An active RDMA probe of one rail (pyverbs, the distro's): a pair of RC QPs on the rail's
device, connected to each other through the rail's pinned IPv4 RoCE v2 GID, so every
message goes through the RoCE stack, the rail's netdev and UDP port 4791; then N small
sends timed one by one (latency) and a short burst of large ones (bandwidth).

Each step that can fail says so: the device open, the port ACTIVE, the GID at the pin, the
resources, the QP moves to INIT, RTR and RTS, a completion's status (pyverbs' own words for
it), or the deadline. The probe's QPs live only while it runs; the re-pin logic counts the
agent's own QPs out (run/evaluate.py) and the loop never probes a rail whose GID is shifted.
"""

from __future__ import annotations

import contextlib
import ipaddress
import statistics
import time
from dataclasses import dataclass
from typing import Any

from nodeagent.io.files import one_line
from nodeagent.model.peers import TransportResult
from nodeagent.model.peers import TransportStep as Step
from nodeagent.model.rdma import RDMAVolume
from nodeagent.probes.verbs import load as load_pyverbs
from nodeagent.probes.volume import RC_ATTEMPTS, rdma_send

SIZE = 64  # bytes per latency message
BURST = 16  # messages in flight in the bandwidth sample
CHUNK = 64 << 10  # bytes per bandwidth message


class ProbeFailed(Exception):
    def __init__(self, step: Step, error: str) -> None:
        super().__init__(f"{step}: {error}")
        self.step, self.error = step, error


class CompletionWait:
    """Paces polling a CQ for completions: polled back to back for SPIN seconds, then
    between naps that double up to NAP_MAX. A healthy round trip (microseconds on a NIC,
    tens on soft-RoCE on a host) completes while spinning, so its RTT stays exact; a slow
    one (a congested path, an emulated guest's 50 ms) no longer costs a core for its whole
    wait, and is read at most NAP_MAX late, far below the 10 ms PeerLatencyHigh bound."""

    SPIN = 200e-6
    NAP_FIRST = 20e-6
    NAP_MAX = 500e-6

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.nap = self.NAP_FIRST

    def polled(self, found: int) -> None:
        """After each poll, with the number of completions it found: none, and the wait
        goes on (spun, then napped); some, and the next is expected soon (spun for again)."""
        if found:
            self.started = time.perf_counter()
            self.nap = self.NAP_FIRST
        elif time.perf_counter() - self.started >= self.SPIN:
            time.sleep(self.nap)
            self.nap = min(2 * self.nap, self.NAP_MAX)


def completion_status(status: int) -> str:
    """A work completion's status as libibverbs names it ("retry exceeded error")."""
    try:
        from pyverbs.cq import cqe_status_to_str
    except ImportError:  # only for the message: the probe itself needs pyverbs
        return f"status {status}"
    text = str(cqe_status_to_str(status))
    return text if not text.startswith("Unknown") else f"status {status}"


def port_state(state: int) -> str:
    try:
        from pyverbs.device import port_state_to_str
    except ImportError:
        return f"state {state}"
    return str(port_state_to_str(state))


def gid_matches(gid: str, address: str) -> bool:
    """Whether a GID (pyverbs' text) is the IPv4-mapped form of `address`."""
    try:
        return ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(f"::ffff:{address}")
    except ValueError:
        return False


@dataclass
class _Pair:
    ctx: Any
    pd: Any
    cq: Any
    mrs: list[Any]
    qps: list[Any]

    def close(self) -> None:
        for obj in (*self.qps, *self.mrs, self.cq, self.pd, self.ctx):
            if obj is not None:
                with contextlib.suppress(Exception):  # what failed to open: nothing to keep
                    obj.close()


# The GRH hop limit NCCL sets on RoCE (src/transport/net_ib/connect.cc); pyverbs' default
# of 1 is an IP TTL of 1, which a routed fabric drops at its first router.
HOP_LIMIT = 255


def address_vector(port: int, gid_index: int, remote_gid: Any, traffic_class: int = 0,
                   service_level: int = 0) -> Any:
    """The QP's path to the remote GID as NCCL's ncclIbRtrQp sets it on RoCE: from the
    pinned source index, hop limit 255, its class and service level."""
    from pyverbs.addr import AHAttr, GlobalRoute

    route = GlobalRoute(dgid=remote_gid, sgid_index=gid_index, hop_limit=HOP_LIMIT,
                        traffic_class=traffic_class)
    return AHAttr(gr=route, is_global=1, sl=service_level, port_num=port)


def connect_rc(qp: Any, port: int, gid_index: int, remote_qpn: int, remote_gid: Any,
               remote_psn: int = 0, local_psn: int = 0, mtu: int | None = None,
               access: int | None = None, traffic_class: int = 0,
               service_level: int = 0) -> None:
    """One RC QP through INIT, RTR and RTS to a remote QP, addressed by the remote GID
    from the local pinned `gid_index` (as NCCL does with NCCL_IB_GID_INDEX). `mtu` is an
    IBV_MTU_* (default 1024); `access` the remote access it grants (default none);
    `traffic_class` and `service_level` as NCCL_IB_TC and NCCL_IB_SL set them (the GRH's
    class becomes the IP header's DSCP and ECN bits on RoCE v2, on mlx5 and rxe alike)."""
    import pyverbs.enums as e
    from pyverbs.qp import QPAttr

    step = Step.QP_INIT
    try:
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.port_num = port
        attr.pkey_index = 0
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE if access is None else access
        qp.to_init(attr)
        step = Step.QP_RTR
        attr = QPAttr()
        attr.path_mtu = e.IBV_MTU_1024 if mtu is None else mtu
        attr.dest_qp_num = remote_qpn
        attr.rq_psn = remote_psn
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 1
        attr.ah_attr = address_vector(port, gid_index, remote_gid, traffic_class,
                                      service_level)
        qp.to_rtr(attr)
        step = Step.QP_RTS
        attr.sq_psn = local_psn
        attr.timeout = 12  # 4.096 us * 2^12 = 17 ms per try
        attr.retry_cnt = 3
        attr.rnr_retry = 3
        attr.max_rd_atomic = 1
        qp.to_rts(attr)
    except Exception as exc:
        raise ProbeFailed(step, one_line(exc)) from exc


def _connect(pair: _Pair, port: int, gid: Any, gid_index: int) -> None:
    first, second = pair.qps
    connect_rc(first, port, gid_index, second.qp_num, gid)
    connect_rc(second, port, gid_index, first.qp_num, gid)


def _complete(cq: Any, want: set[int], deadline: float) -> None:
    """Poll until every wr_id in `want` completed (successfully), or fail."""
    wait = CompletionWait()
    while want:
        n, wcs = cq.poll(len(want) + 4)
        wait.polled(n)
        for wc in wcs[:n]:
            if wc.status != 0:
                raise ProbeFailed(Step.COMPLETION, f"{completion_status(wc.status)} "
                                  f"(wr {wc.wr_id}, vendor error {wc.vendor_err})")
            want.discard(wc.wr_id)
        if want and time.monotonic() > deadline:
            raise ProbeFailed(Step.TIMEOUT, f"{len(want)} completion(s) missing at the deadline")


def open_device(device: str, port: int, gid_index: int, address: str) -> tuple[Any, Any, int]:
    """The device opened, its port ACTIVE, the rail's GID at the pin: (context, GID, the
    port's active MTU as an IBV_MTU_*). The context is closed again if a step fails."""
    load_pyverbs()
    import pyverbs.enums as e
    from pyverbs.device import Context

    try:
        ctx = Context(name=device)
    except Exception as exc:
        raise ProbeFailed(Step.DEVICE_OPEN, one_line(exc)) from exc
    try:
        try:
            attr = ctx.query_port(port)
        except Exception as exc:
            raise ProbeFailed(Step.PORT, one_line(exc)) from exc
        if attr.state != e.IBV_PORT_ACTIVE:
            # Two QPs of one port may still talk inside the HCA (soft-RoCE does, measured
            # in the lab): a port that is not ACTIVE carries nothing to the wire.
            raise ProbeFailed(Step.PORT, f"port {port} is {port_state(attr.state)}, not ACTIVE")
        try:
            gid = ctx.query_gid(port, gid_index)
        except Exception as exc:
            raise ProbeFailed(Step.GID, f"index {gid_index}: {exc}") from exc
        if not gid_matches(str(gid), address):
            raise ProbeFailed(Step.GID, f"index {gid_index} holds {gid}, not the rail's "
                              f"::ffff:{address}")
    except BaseException:
        with contextlib.suppress(Exception):
            ctx.close()
        raise
    return ctx, gid, int(attr.active_mtu)


def _open(pair: _Pair, device: str, port: int, gid_index: int, address: str) -> Any:
    """The device opened into the pair; the GID."""
    pair.ctx, gid, _ = open_device(device, port, gid_index, address)
    return gid


def _allocate(pair: _Pair, qps: int) -> None:
    """A protection domain, one completion queue, and `qps` RC QPs with a buffer each."""
    import pyverbs.enums as e
    from pyverbs.cq import CQ
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPCap, QPInitAttr

    try:
        pair.pd = PD(pair.ctx)
        pair.cq = CQ(pair.ctx, 4 * BURST)
        cap = QPCap(max_send_wr=BURST, max_recv_wr=BURST, max_send_sge=1, max_recv_sge=1)
        for _ in range(qps):
            pair.qps.append(QP(pair.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=pair.cq,
                                                   rcq=pair.cq, cap=cap)))
            pair.mrs.append(MR(pair.pd, CHUNK, e.IBV_ACCESS_LOCAL_WRITE))
    except Exception as exc:
        raise ProbeFailed(Step.RESOURCES, one_line(exc)) from exc


@dataclass(frozen=True)
class _Figures:
    latencies_us: list[float]
    burst_seconds: float


def _measure(pair: _Pair, messages: int, deadline: float) -> _Figures:
    """`messages` small sends timed one by one, then a burst of large ones."""
    import pyverbs.enums as e
    from pyverbs.wr import SGE, RecvWR, SendWR

    sender, receiver = pair.qps
    smr, rmr = pair.mrs

    def post(wr_id: int, size: int) -> None:
        receiver.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(rmr.buf, size, rmr.lkey)]))
        sender.post_send(SendWR(wr_id=wr_id + 1, opcode=e.IBV_WR_SEND, num_sge=1,
                                sg=[SGE(smr.buf, size, smr.lkey)],
                                send_flags=e.IBV_SEND_SIGNALED))

    latencies = []
    for i in range(messages):
        t0 = time.perf_counter()
        post(2 * i, SIZE)
        _complete(pair.cq, {2 * i, 2 * i + 1}, deadline)
        latencies.append((time.perf_counter() - t0) * 1e6)
    t0 = time.perf_counter()
    want: set[int] = set()
    base = 2 * messages
    for i in range(BURST // 2):  # each post is one recv and one send WR
        post(base + 2 * i, CHUNK)
        want |= {base + 2 * i, base + 2 * i + 1}
    _complete(pair.cq, want, deadline)
    return _Figures(latencies, time.perf_counter() - t0)


def probe_volume(messages: int) -> RDMAVolume:
    """The most one probe moves through its port once its QPs are connected (at the
    default path MTU, 1024, every packet as often as the QP may send it): both QPs are on
    the one port, so each packet counts twice, sent and received."""
    sends = (rdma_send(SIZE, 1024, RC_ATTEMPTS) * messages
             + rdma_send(CHUNK, 1024, RC_ATTEMPTS) * (BURST // 2))
    return sends * 2


def probe_rail(rail: str, device: str, port: int, gid_index: int, address: str,
               messages: int = 100, timeout: float = 10.0) -> TransportResult:
    started = time.monotonic()
    moved = RDMAVolume()
    try:
        load_pyverbs()  # every step below needs the distro's pyverbs
    except ImportError as exc:
        return TransportResult(rail, False, Step.PYVERBS, f"not importable: {exc}")
    pair = _Pair(None, None, None, [], [])
    try:
        gid = _open(pair, device, port, gid_index, address)
        _allocate(pair, 2)
        _connect(pair, port, gid, gid_index)
        moved = probe_volume(messages)
        got = _measure(pair, messages, started + timeout)
    except ProbeFailed as failed:
        return TransportResult(rail, False, failed.step, failed.error,
                               seconds=time.monotonic() - started, gid_index=gid_index,
                               moved=moved)
    except Exception as exc:  # pyverbs raises its own errors from any call
        return TransportResult(rail, False, Step.VERBS, one_line(exc),
                               seconds=time.monotonic() - started, gid_index=gid_index,
                               moved=moved)
    finally:
        pair.close()
    lat = got.latencies_us
    cuts = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
    return TransportResult(
        rail, True, messages=messages, latency_p50_us=statistics.median(lat),
        latency_p99_us=cuts[98], bandwidth_gbps=(BURST // 2) * CHUNK * 8 / got.burst_seconds / 1e9,
        seconds=time.monotonic() - started, gid_index=gid_index, moved=moved)
