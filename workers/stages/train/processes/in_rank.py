"""One process of our loop's training across nodes, as torchrun starts it on each node:

    torchrun --nnodes N --node-rank R ... -m workers.stages.train.processes.in_rank SOCKET

It dies with torchrun (torch's elastic agent starts each process in a session of its own, so a stop of
the agent's process group would not reach it), starts the process group (gloo on the CPU, NCCL on CUDA:
workers.stages.train.processes.ddp), then reaches its node's worker at SOCKET, a Unix socket the worker listens on
(workers.stages.train.processes.nodes), and runs the training as workers.stages.train.processes.in_child does: arguments in,
callbacks, log records and the result back. Only the writer's worker hands it callbacks.
"""
from __future__ import annotations

import ctypes
import datetime
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection

# A writer's validation or checkpoint keeps the other ranks waiting at their next collective; a rank
# that died is found by the workers (workers.stages.train.processes.nodes), not by this timeout.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


def main(address: str) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: go with torchrun
    if os.getppid() == 1:  # torchrun died before the line above
        return 1
    import torch
    import torch.distributed as dist

    from workers.stages.train.processes.ddp import Ranks
    from workers.stages.train.processes.in_child import serve_training

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    try:
        return serve_training(Connection(sock.detach()), ranks=Ranks.from_env())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
