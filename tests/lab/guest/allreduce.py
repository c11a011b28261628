"""An all-reduce across the MPI world (mpi4py over Open MPI's UCX PML): a training job's
collective without a GPU. Rank 0 prints one JSON line: whether the sum is right, the
seconds the rounds took and the bytes each rank reduced."""

import array
import json
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
count = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 18  # doubles: 2 MiB
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
mine = array.array("d", [comm.rank + 1.0]) * count
out = array.array("d", bytes(8 * count))
started = time.monotonic()
for _ in range(rounds):
    comm.Allreduce(mine, out, op=MPI.SUM)
took = time.monotonic() - started
want = comm.size * (comm.size + 1) / 2
if comm.rank == 0:
    print(json.dumps({"ok": out[0] == want and out[-1] == want, "seconds": round(took, 3),
                      "bytes": 8 * count * rounds, "ranks": comm.size}), flush=True)
