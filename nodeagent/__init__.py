"""nodeagent: RoCE/RDMA fabric health as part of a GPU node's correctness."""

from nodeagent.io.lean_imports import pyroute2_on_demand

__version__ = "0.1.0"

pyroute2_on_demand()
