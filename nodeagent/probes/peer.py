"""The peer probe, prober's side: one RC QP from this rail's pinned GID to a peer node's
responder, over the switch, then RDMA reads of its buffer.

Setup the NCCL way: a TCP connection from the rail's address to the peer's responder
carries the Hello and the Reply (probes/peerwire.py), then the QP is moved to RTS against
the peer's QP with an explicit source GID index, the pinned one, so the probe tests what
jobs use. The reads need nothing from the responder's CPU (one-sided): `reads` small ones
timed one by one (the RTT), then one of the path MTU, whose reply fills a frame; a path
that drops full-size RoCE frames (a switch port at 1500 behind hosts at 4200) fails there
alone. Now and then (`peers.bandwidth_every`) a bandwidth sample follows: 32 reads of the
whole buffer, 4 in flight. The TCP connection lives while the QP does, so its success is
the proof that "TCP reaches them" when RDMA does not.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Any

from nodeagent.io.files import one_line
from nodeagent.model.peers import Class, PeerOutcome, PeerProbe, RailEndpoint
from nodeagent.model.rdma import RDMAVolume
from nodeagent.probes.peerwire import (
    MTUS,
    REPLY_SIZE,
    Accept,
    Hello,
    Refuse,
    WireError,
    ipv4_gid,
    pack_hello,
    parse_reply,
)
from nodeagent.probes.transport import (
    CompletionWait,
    ProbeFailed,
    completion_status,
    connect_rc,
    open_device,
)
from nodeagent.probes.verbs import load as load_pyverbs
from nodeagent.probes.volume import RC_ATTEMPTS, rdma_read

CLASS_0 = Class()  # NCCL's default traffic class and service level
SMALL = 64  # bytes per RTT read
BUFFER = 4096  # what a responder lends for reads: the largest IB MTU
# The bandwidth sample: this many reads of the whole buffer, DEPTH in flight (128 KiB a
# sample). A sanity figure (a path whose full-size transfers crawl: PFC pauses, a
# renegotiated link), not the link's capacity, which only a longer transfer measures.
SAMPLE_READS = 32
DEPTH = 4


def mtu_bytes(ibv_mtu: int) -> int:
    """IBV_MTU_256 (1) .. IBV_MTU_4096 (5) in bytes."""
    return 128 << ibv_mtu


def ibv_mtu(size: int) -> int:
    return MTUS.index(size) + 1


def probe_volume(reads: int, mtu: int, length: int = BUFFER,
                 bandwidth: bool = False) -> RDMAVolume:
    """The most one probe moves once its QP is up (probes/volume.py): the small reads,
    the read of one path MTU, and the bandwidth sample when taken, each as often as the
    QP may send it (a slow answer is asked again, even when the probe passes)."""
    moved = rdma_read(SMALL, mtu, RC_ATTEMPTS) * reads + rdma_read(min(mtu, length), mtu,
                                                                   RC_ATTEMPTS)
    if bandwidth:
        moved += rdma_read(length, mtu, RC_ATTEMPTS) * SAMPLE_READS
    return moved


def gid_text(raw: bytes) -> str:
    """16 bytes as pyverbs' GID() takes them: eight 4-digit groups."""
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def gid_raw(gid: Any) -> bytes:
    return bytes.fromhex(str(gid).replace(":", ""))


@dataclass
class RailEnd:
    """One rail's RDMA resources for probing, at its endpoint: device context, PD, CQ, a
    buffer."""

    at: RailEndpoint
    ctx: Any = None
    gid: Any = None
    mtu: int = 0  # the port's active MTU, IBV_MTU_*
    pd: Any = None
    cq: Any = None
    mr: Any = None
    qps: list[Any] = field(default_factory=list)

    def open(self, remote_read: bool) -> None:
        """Raises ProbeFailed naming the step."""
        load_pyverbs()
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.pd import PD

        from nodeagent.model.peers import TransportStep as Step

        at = self.at
        self.ctx, self.gid, self.mtu = open_device(at.device, at.port, at.gid_index, at.address)
        access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_READ if remote_read else 0)
        try:
            self.pd = PD(self.ctx)
            self.cq = CQ(self.ctx, 16)
            self.mr = MR(self.pd, BUFFER, access)
        except Exception as exc:
            self.close()
            raise ProbeFailed(Step.RESOURCES, one_line(exc)) from exc

    def new_qp(self) -> Any:
        import pyverbs.enums as e
        from pyverbs.qp import QP, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.qps.append(qp)
        return qp

    def drop_qp(self, qp: Any) -> None:
        with contextlib.suppress(Exception):
            qp.close()
        with contextlib.suppress(ValueError):
            self.qps.remove(qp)

    def close(self) -> None:
        for obj in (*self.qps, self.mr, self.cq, self.pd, self.ctx):
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()
        self.qps.clear()
        self.ctx = self.pd = self.cq = self.mr = None


class _Failed(Exception):
    def __init__(self, outcome: PeerOutcome, error: str, late: bool = False) -> None:
        super().__init__(error)
        self.outcome, self.error = outcome, error
        self.late = late  # the probe's deadline ran out: nothing said of what was read


def _handshake(end: RailEnd, qp: Any, address: str, port: int, deadline: float,
               psn: int, klass: Class) -> tuple[socket.socket, Accept]:
    """TCP from the rail's address to the responder, Hello out, Reply in."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((end.at.address, 0))
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock.connect((address, port))
        except OSError as exc:
            raise _Failed(PeerOutcome.NO_RESPONDER,
                          f"TCP to {address}:{port}: {_os_words(exc)}") from exc
        hello = Hello(qp.qp_num, psn, gid_raw(end.gid), mtu_bytes(end.mtu),
                      klass.traffic_class, klass.service_level)
        try:
            sock.sendall(pack_hello(hello))
            data = _recv_exactly(sock, REPLY_SIZE, deadline)
        except OSError as exc:
            raise _Failed(PeerOutcome.NO_RESPONDER,
                          f"responder {address}:{port}: {_os_words(exc)}") from exc
        try:
            reply = parse_reply(data)
        except WireError as exc:
            raise _Failed(PeerOutcome.NO_RESPONDER, f"responder {address}:{port}: {exc}") from exc
        if isinstance(reply, Refuse):
            raise _Failed(PeerOutcome.REFUSED, f"its responder refused: {reply.code.words}")
        if reply.gid != ipv4_gid(address) or reply.mtu > mtu_bytes(end.mtu):
            # A reply may not point this QP at another host, nor ask for frames this rail
            # does not carry.
            raise _Failed(PeerOutcome.REFUSED, f"its responder replied GID "
                          f"{gid_text(reply.gid)} MTU {reply.mtu}, not the peer's "
                          f"::ffff:{address} at most {mtu_bytes(end.mtu)}")
        return sock, reply
    except BaseException:
        sock.close()
        raise


def _recv_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = b""
    while len(data) < size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def _os_words(exc: OSError) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return exc.strerror.lower() if exc.strerror else str(exc)


def _read(end: RailEnd, qp: Any, accept: Accept, size: int, wr_id: int,
          deadline: float) -> float:
    """One RDMA read of `size` bytes of the responder's buffer: its round trip, us."""
    import pyverbs.enums as e
    from pyverbs.wr import SGE, SendWR

    wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                sg=[SGE(end.mr.buf, size, end.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(accept.rkey, accept.addr)
    t0 = time.perf_counter()
    qp.post_send(wr)
    wait = CompletionWait()
    while True:
        n, wcs = end.cq.poll(4)
        wait.polled(n)
        for wc in wcs[:n]:
            if wc.wr_id != wr_id or wc.qp_num != qp.qp_num:
                continue  # an earlier read's or an earlier probe's late completion
            if wc.status != 0:
                raise _Failed(PeerOutcome.ROCE_FAILED, completion_status(wc.status))
            return (time.perf_counter() - t0) * 1e6
        if time.monotonic() > deadline:
            raise _Failed(PeerOutcome.ROCE_FAILED, "no completion by the deadline", late=True)


def _bandwidth(end: RailEnd, qp: Any, accept: Accept, first_id: int, deadline: float
               ) -> float | None:
    """SAMPLE_READS reads of the responder's whole buffer, DEPTH at a time: Gbit/s; None
    when they do not all complete by the probe's deadline (a slow path is no figure, not a
    failed probe; a completion in error is a RoCE failure)."""
    import pyverbs.enums as e
    from pyverbs.wr import SGE, SendWR

    size = accept.length
    posted = done = 0
    t0 = time.perf_counter()
    wait = CompletionWait()
    while done < SAMPLE_READS:
        while posted < SAMPLE_READS and posted - done < DEPTH:
            wr = SendWR(wr_id=first_id + posted, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                        sg=[SGE(end.mr.buf, size, end.mr.lkey)],
                        send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(accept.rkey, accept.addr)
            qp.post_send(wr)
            posted += 1
        n, wcs = end.cq.poll(DEPTH)
        wait.polled(n)
        for wc in wcs[:n]:
            if wc.qp_num != qp.qp_num or not first_id <= wc.wr_id < first_id + posted:
                continue
            if wc.status != 0:
                raise _Failed(PeerOutcome.ROCE_FAILED, completion_status(wc.status))
            done += 1
        if n == 0 and time.monotonic() > deadline:
            return None
    return SAMPLE_READS * size * 8 / (time.perf_counter() - t0) / 1e9


def probe_peer(end: RailEnd, rail: str, address: str, node: str | None, port: int,
               reads: int, timeout: float, bandwidth: bool = False,
               klass: Class = CLASS_0) -> PeerProbe:
    """One probe of one peer through an opened RailEnd, in traffic class `klass` both ways
    (the responder sets it on its QP too), with the bandwidth sample when asked; never
    raises."""
    started = time.monotonic()
    deadline = started + timeout
    sock: socket.socket | None = None
    qp = None
    rtts: list[float] = []
    mtu: int | None = None
    gbps: float | None = None
    moved = RDMAVolume()
    try:
        try:
            qp = end.new_qp()
        except Exception as exc:
            raise _Failed(PeerOutcome.LOCAL, f"QP: {one_line(exc)}") from exc
        psn = random.randrange(1 << 24)
        sock, accept = _handshake(end, qp, address, port, deadline, psn, klass)
        # Never more than our own buffer holds, whatever the responder offers.
        accept = replace(accept, length=max(1, min(accept.length, BUFFER)))
        mtu = accept.mtu
        load_pyverbs()
        from pyverbs.addr import GID

        try:
            connect_rc(qp, end.at.port, end.at.gid_index, accept.qpn, GID(gid_text(accept.gid)),
                       remote_psn=accept.psn, local_psn=psn, mtu=ibv_mtu(accept.mtu),
                       traffic_class=klass.traffic_class, service_level=klass.service_level)
        except ProbeFailed as failed:
            raise _Failed(PeerOutcome.LOCAL, str(failed)) from failed
        # Charged as planned, every retry included (a bound, not a count).
        moved = probe_volume(reads, accept.mtu, accept.length, bandwidth)
        for i in range(reads):
            rtts.append(_read(end, qp, accept, SMALL, i, deadline))
        try:
            _read(end, qp, accept, min(accept.mtu, accept.length), reads, deadline)
        except _Failed as failed:
            if failed.late:  # a slow path ran out of time: not refused at this size
                raise
            raise _Failed(PeerOutcome.MTU_FAILED,
                          f"reads of {SMALL} bytes pass, a read of {accept.mtu} bytes (the "
                          f"path MTU) fails: {failed.error}") from failed
        if bandwidth:
            gbps = _bandwidth(end, qp, accept, reads + 1, deadline)
        outcome, error = PeerOutcome.OK, ""
    except _Failed as failed:
        outcome, error = failed.outcome, failed.error
    except Exception as exc:  # pyverbs raises its own errors from any call
        outcome, error = PeerOutcome.LOCAL, one_line(exc)
    finally:
        if qp is not None:
            end.drop_qp(qp)
        if sock is not None:
            sock.close()
    return PeerProbe(rail, address, node, outcome, error, tuple(rtts), mtu,
                     at=time.monotonic(), bandwidth_gbps=gbps, moved=moved,
                     traffic_class=klass.traffic_class)
