"""Lesson 3: the same program on the simulator and on real processes.

Lessons 1 and 2 ran every rank as a simulated thread. The socket backend runs each rank as
its own operating-system process; the ranks meet at a rendezvous address and exchange data
over TCP on this machine (or across machines). The program does not change: only the
``backend=`` argument of ``simdist.spawn`` does.

Topics:
  1. one data-parallel training step, run with backend="sim" and backend="socket":
     the results are equal, bit for bit
  2. what differs: one process or four; the torchrun-style environment each rank sees
  3. a rank that raises on real processes: ``simdist.RankError`` names it
  4. processes you start yourself: ``init_process_group("socket",
     init_method="tcp://127.0.0.1:PORT", rank=r, world_size=n)``

Real processes are started with ``forkserver`` (or ``spawn``), which pickle a rank's
function *by reference*: the functions below live at module level, and the lesson itself
runs under ``if __name__ == "__main__":`` so that a started process can import this file
without running the lesson again.

On real processes, lines that ranks print come out in an order that changes from run to
run. So every rank here *returns* its results and only the parent prints, and nothing
printed depends on timing, process ids or port numbers: the output is the same on every
run (CI compares it with ``03_real_processes.out``).

Run it:  python tutorials/03_real_processes.py
"""

import multiprocessing as mp
import os
import secrets
import socket

import torch

import simdist
import simdist as dist

WORLD_SIZE = 4

# --- 1. One data-parallel step ---------------------------------------------------------------
# A tiny linear model y = x @ w with 3 weights, trained on 8 samples split into 4 shards of 2.
# All values are small integers, and the only divisions are by powers of two, so every float
# below is exact and the two backends can be compared with ==.

X = torch.tensor([[1., 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 1., 1.],
                  [3., 0., 1.], [0., 2., 1.], [1., 2., 3.], [2., 0., 2.]])
Y = torch.tensor([5., 3., 4., 6., 7., 5., 14., 8.])


def train_step(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    # Rank 0 initializes the model; a broadcast gives every rank the same weights.
    w = torch.tensor([1., 1., 1.]) if rank == 0 else torch.zeros(3)
    dist.broadcast(w, src=0)

    # Each rank takes its own shard of the data (what DistributedSampler does).
    n = len(X) // world_size
    x, y = X[rank * n:(rank + 1) * n], Y[rank * n:(rank + 1) * n]

    # Forward and backward on the local shard: loss = sum of squared errors / 2.
    w.requires_grad_(True)
    loss = ((x @ w - y) ** 2).sum() / 2
    loss.backward()
    grad = w.grad.clone()
    local_grad = grad.tolist()

    # All-reduce the gradients and average them: every rank now holds the same gradient.
    dist.all_reduce(grad, op=dist.ReduceOp.SUM)
    grad /= world_size

    # The same update on every rank keeps the replicas identical.
    with torch.no_grad():
        w_new = w - 0.25 * grad

    # Gather every rank's loss, for logging.
    losses = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(losses, loss.detach().reshape(1))

    dist.destroy_process_group()
    return {
        "local_grad": local_grad,
        "avg_grad": grad.tolist(),
        "new_weights": w_new.tolist(),
        "losses": [t.item() for t in losses],
    }


def lesson_same_program():
    title("1. one data-parallel step, on the simulator and on real processes")
    simulated = simdist.spawn(train_step, args=(WORLD_SIZE,), nprocs=WORLD_SIZE, backend="sim")
    real = simdist.spawn(train_step, args=(WORLD_SIZE,), nprocs=WORLD_SIZE, backend="socket")
    for name, results in (("sim", simulated), ("socket", real)):
        print(f"backend={name!r}:")
        for rank, r in enumerate(results):
            print(f"  rank {rank}: local grad {r['local_grad']}  averaged {r['avg_grad']}  "
                  f"new weights {r['new_weights']}")
        print(f"  losses gathered on every rank: {results[0]['losses']}")
    print("replicas agree after the step:", all(r["new_weights"] == real[0]["new_weights"] for r in real))
    print("socket results == sim results:", real == simulated)


# --- 2. What differs -------------------------------------------------------------------------
# The program is the same; where it runs is not. A simulated rank is a thread of the calling
# process. A socket rank is a process of its own, started with the environment torchrun
# would give it, so init_process_group() finds the rendezvous without arguments.

TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SIMDIST_SECRET")


def where_am_i(rank, world_size):
    dist.init_process_group("gloo")  # rank and world size come from the backend or from RANK/WORLD_SIZE
    seen = {
        "pid": os.getpid(),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "env": [v for v in TORCHRUN_VARIABLES if v in os.environ],
    }
    dist.destroy_process_group()
    return seen


def lesson_what_differs():
    title("2. what differs: threads of one process, or processes")
    saved = {v: os.environ.pop(v) for v in TORCHRUN_VARIABLES if v in os.environ}
    try:
        for backend in ("sim", "socket"):
            seen = simdist.spawn(where_am_i, args=(WORLD_SIZE,), nprocs=WORLD_SIZE, backend=backend)
            print(f"backend={backend!r}:")
            print(f"  ranks {[s['rank'] for s in seen]}, world sizes {[s['world_size'] for s in seen]}")
            print(f"  distinct processes: {len({s['pid'] for s in seen})}; "
                  f"the parent among them: {os.getpid() in {s['pid'] for s in seen}}")
            print(f"  environment of rank 0: {seen[0]['env'] or 'none'}")
    finally:
        os.environ.update(saved)


# --- 3. A rank that raises -------------------------------------------------------------------
# On real processes an exception cannot simply propagate into the parent. spawn sends it back:
# the first rank to fail stops the others and simdist.RankError names it, with the original
# exception as __cause__ (and, on Python >= 3.11, the rank's traceback as a note). The
# simulator raises the same error for the same program.


def raises_on_rank_1(rank, world_size):
    dist.init_process_group("gloo")
    if rank == 1:
        raise KeyError("rank 1 cannot find its data")
    dist.barrier()  # the other ranks wait here for rank 1; spawn stops them
    dist.destroy_process_group()


def lesson_rank_error():
    title("3. a rank that raises")
    for backend in ("sim", "socket"):
        options = {"timeout": 30} if backend == "socket" else {}
        try:
            simdist.spawn(raises_on_rank_1, args=(3,), nprocs=3, backend=backend, **options)
        except simdist.RankError as err:
            print(f"backend={backend!r}: {type(err).__name__}: {err}")
            print(f"  err.rank = {err.rank}; err.__cause__ is a {type(err.__cause__).__name__}")


# --- 4. Processes you start yourself ---------------------------------------------------------
# Without simdist.spawn, start the processes any way you like (multiprocessing here; by hand in
# several terminals, or on several machines, works the same) and give each the rendezvous
# address, its rank and the world size. Rank 0 serves the rendezvous at that address.
# Every connection is authenticated with the secret in SIMDIST_SECRET, which all processes
# must share. (On loopback, without SIMDIST_SECRET, each user's own secret is used, created on
# first use in ~/.config/simdist/secret, readable by that user only; any other address refuses
# to start without one.)


def by_hand(rank, world_size, port, secret, results):
    # Set here, in the process itself: a forkserver process inherits the environment of the
    # server (started earlier), not the parent's os.environ at the time of Process.start().
    os.environ["SIMDIST_SECRET"] = secret
    dist.init_process_group("socket", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    t = torch.tensor([10 * (rank + 1)])
    dist.all_reduce(t)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, f"rank {rank} of {world_size}")
    dist.destroy_process_group()
    results.put((rank, t.item(), gathered))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lesson_by_hand():
    title("4. init_process_group('socket', init_method='tcp://...') in processes started by hand")
    secret = secrets.token_hex(16)  # one per job, shared by its processes
    # forkserver, as simdist.spawn uses: it forks each process from a server that has already
    # imported torch, where "spawn" would import torch anew in every process (seconds each).
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    port, world_size = free_port(), 3
    results = ctx.Queue()
    procs = [ctx.Process(target=by_hand, args=(r, world_size, port, secret, results)) for r in range(world_size)]
    for p in procs:
        p.start()
    collected = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    for rank, total, gathered in collected:
        print(f"rank {rank}: all_reduce -> {total}; all_gather_object -> {gathered}")
    print("exit codes:", [p.exitcode for p in procs])


def title(text):
    print()
    print(f"=== {text} ===")


if __name__ == "__main__":
    print("Lesson 3: real processes")
    lesson_same_program()
    lesson_what_differs()
    lesson_rank_error()
    lesson_by_hand()
