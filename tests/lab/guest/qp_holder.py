"""Runs in the lab guest: a pair of RC QPs on one soft-RoCE device, connected to each other
through the given GID index and held in RTS until killed. A live QP pins its GID entry:
while it lives, the kernel cannot reuse the GID's slot."""

import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

device, gid_index = sys.argv[1], int(sys.argv[2])
ctx = Context(name=device)
pd = PD(ctx)
cq = CQ(ctx, 16)
cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)) for _ in range(2)]
gid = ctx.query_gid(1, gid_index)
for me, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
    attr.port_num = 1
    attr.pkey_index = 0
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    me.to_init(attr)
    attr = QPAttr()
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num = peer.qp_num
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=gid_index), is_global=1,
                          port_num=1)
    me.to_rtr(attr)
    attr.sq_psn = 0
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.max_rd_atomic = 1
    me.to_rts(attr)
print("ready", gid, flush=True)
while True:
    time.sleep(1)
