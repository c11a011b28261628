"""FabricNotCongested from the daemon: its source reads each ready rail's counters every
interval (the RDMA port's from sysfs, the rest from the netdev's ethtool statistics with
the real ETHTOOL_GSTATS ioctl on a real veth) and the pass judges their rates."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.kit.helpers import Netns, make_port_tree, wait_for
from tests.netns.test_daemon import cond, start, stop_cleanly


def test_a_rail_whose_port_sends_cnps_too_fast_is_named_and_the_netdevs_counters_are_read(
        rails_ns: Netns, agent_config: dict[str, Any], tmp_path: Path) -> None:
    sysfs = Path(agent_config["paths"]["sysfs"])
    make_port_tree(sysfs, "mlx5_0", hw_counters={"np_cnp_sent": 0}, pcie=None)
    make_port_tree(sysfs, "mlx5_1", hw_counters={}, pcie=None)  # none: the netdev's read
    # peer_ifindex is one of veth's own ethtool statistics (drivers/net/veth.c): a value
    # only the real ioctl on r1 gives.
    agent_config["congestion"] = {"interval": "0.5s", "window": "3s",
                                  "rates": {"np_cnp_sent": 100, "peer_ifindex": 1}}
    stop = threading.Event()

    def cnps() -> None:  # 1,000 CNPs a second, as a receiver behind a congested path would
        sent = 0
        while not stop.wait(0.1):
            sent += 100
            (sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent").write_text(
                f"{sent}\n")

    proc = start(rails_ns, agent_config, tmp_path / "c.yaml")
    writer = threading.Thread(target=cnps, daemon=True)
    writer.start()
    try:
        wait_for(lambda: (cond(agent_config, "FabricNotCongested") or ("",))[0] == "False",
                 15, "FabricNotCongested False")
        _, reason, message = cond(agent_config, "FabricNotCongested") or ("", "", "")
        assert reason == "CongestionNotified", message
        assert "rail0 r0 (mlx5_0/1): np_cnp_sent" in message and "(rate 100/s)" in message
        assert "rail1" not in message  # a False message names the rails at fault only
        stop.set()
        writer.join()
        wait_for(lambda: (cond(agent_config, "FabricNotCongested") or ("",))[0] == "True",
                 15, "FabricNotCongested True once the CNPs stop (after the window)")
        # True once under the rate, which falls to 0 only when the window holds no sample
        # from before the stop (it read 39.9/s at the turn in one run in two).
        wait_for(lambda: "np_cnp_sent 0.0/s" in (cond(agent_config, "FabricNotCongested")
                                                 or ("", "", ""))[2], 10, "the rate at 0")
        _, reason, message = cond(agent_config, "FabricNotCongested") or ("", "", "")
        assert reason == "NotCongested", message
        # rail1's port has neither name: its netdev's ethtool statistics were read, and
        # peer_ifindex does not grow.
        assert "rail1 r1 (mlx5_1/1): peer_ifindex 0.0/s" in message, message
        # Informational without congestion.gate: the node stayed ready throughout.
        assert (cond(agent_config, "FabricReady") or ("",))[0] == "True"
    finally:
        stop.set()
        stop_cleanly(proc)
