"""What the agent's own RDMA probes may move through a port: an upper bound, in packets and
bytes, as the port's tx + rx counters count them (a packet one end sends, the other
receives: a probe between two nodes moves the same amount on both ends' sums).

FabricTrafficOnRDMA compares kernel-stack bytes with RDMA traffic; without this the agent's
own probes would be the RDMA traffic that proves a job on the fabric while the job runs over
TCP (found in the lab with Open MPI over soft-RoCE: docs/testing.md). Pure arithmetic from
the probes' shapes (probes/peer.py, probes/transport.py); over-counting errs towards naming
a job off the fabric, which only a job moving less RDMA than the probes do could suffer.
"""

from __future__ import annotations

from nodeagent.model.rdma import RDMAVolume

# Bytes a packet may carry besides its payload, rounded up: Ethernet 14 + IPv4 20 + UDP 8
# + BTH 12 + RETH 16 + ICRC 4 + FCS 4 (the IB counters count fewer of them).
HEADER = 128
# A request not answered within the QP's timeout (17 ms: probes/transport.py) is sent again,
# up to retry_cnt (3) times, and a read's responder answers each copy: a busy host's probes
# that pass may still have sent everything four times (seen in the lab under a TCP job).
RC_ATTEMPTS = 4


def segments(size: int, mtu: int) -> int:
    """Packets a message of `size` bytes takes at path MTU `mtu` (a zero-byte one: one)."""
    return max(1, -(-size // mtu))


def rdma_read(size: int, mtu: int, attempts: int = 1) -> RDMAVolume:
    """RDMA READs of `size` bytes: the request and the responses carrying the data."""
    packets = 1 + segments(size, mtu)
    return RDMAVolume(packets * attempts, (packets * HEADER + size) * attempts)


def rdma_send(size: int, mtu: int, attempts: int = 1) -> RDMAVolume:
    """A SEND of `size` bytes: its packets and at most one ACK for each."""
    packets = 2 * segments(size, mtu)
    return RDMAVolume(packets * attempts, (packets * HEADER + size) * attempts)
