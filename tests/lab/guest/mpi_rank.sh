#!/bin/bash
# One rank of the lab's MPI job (allreduce.py) on this node, pointed at its fab0 rail the
# way a platform's launcher points UCX at a rail: the rail's RDMA device and netdev, and its
# IPv4 RoCE v2 GID index read from sysfs (the one the agent pins). UCX's UD transport
# checks the GRH destination GID on Ethernet and times out on soft-RoCE without this
# (docs/testing.md). Whether UCX is used at all is mpirun's choice (--mca pml ucx or not).
set -eu
netdev=$(ip -o -4 addr show to 10.20.0.0/24 | awk '{print $2; exit}')
address=$(ip -o -4 addr show dev "$netdev" | awk '{split($4, a, "/"); print a[1]; exit}')
device=$(rdma link show | awk -v n="$netdev" '$NF == n || $0 ~ " netdev " n " " {
    split($2, a, "/"); print a[1]; exit }')
want=$(python3 -c 'import ipaddress, sys; print(ipaddress.IPv6Address("::ffff:" + sys.argv[1]).exploded)' "$address")
port=/sys/class/infiniband/$device/ports/1
index=
for gid in "$port"/gids/*; do
    i=${gid##*/}
    if [ "$(cat "$gid")" = "$want" ] && \
        [ "$(cat "$port/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ]; then
        index=$i
        break
    fi
done
[ -n "$index" ] || { echo "mpi_rank: no RoCE v2 GID of $address on $device" >&2; exit 2; }
export UCX_NET_DEVICES=$device:1,$netdev UCX_IB_GID_INDEX=$index UCX_UD_VERBS_ETH_DGID_CHECK=n
exec python3 /root/guest/allreduce.py "$@" </dev/null
