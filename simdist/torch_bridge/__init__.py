"""The torch bridge: unmodified ``torch.distributed`` programs on simdist's backends.

A program written against ``torch.distributed`` reaches simdist through the process groups torch
creates: every group becomes a Python ``torch.distributed.ProcessGroup`` (:mod:`.group`) that
forwards each op to a simdist group, so the op is scheduled, checked and traced like a call of
simdist's own API. Its parts:

- :mod:`.ranks`: on simulated ranks, each rank thread gets a torch world of its own, and torch's
  rendezvous and group factory create simdist groups (installed while a simulation runs);
- :mod:`.processes`: in a real process launched by ``simdist run`` on one of simdist's own
  backends (``socket``), torch's group factory creates groups of that backend;
- :mod:`.cuda`: simulated GPUs backed by the CPU, so GPU programs run on simulated ranks;
- :mod:`.gpu_memory`: what a simulated GPU says of itself (device properties) and of its memory;
- :mod:`.spawn`: ``torch.multiprocessing.spawn`` while ranks are simulated in this process;
- :mod:`.profiler`: torch's profiler, shared by the rank threads of one process;
- :mod:`.versions`: the torch releases the bridge supports, and what differs between them.

Every internal of torch that simdist touches is in this package; :mod:`.factory` is the one
place that turns a group torch creates into a simdist group, on simulated ranks and in processes.
Importing the package installs nothing.
"""

from . import cuda, factory, gpu_memory, group, processes, profiler, ranks, spawn, versions

__all__ = ["cuda", "factory", "gpu_memory", "group", "processes", "profiler", "ranks", "spawn", "versions"]

ranks.carry(cuda.carried)  # a thread a rank starts sees the rank's simulated GPUs (once the bridge is installed)
