"""nodeagent: RoCE/RDMA fabric health as part of a GPU node's correctness."""

__version__ = "0.1.0"
