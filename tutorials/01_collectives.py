"""Lesson 1: the communication primitives of torch.distributed, run on the simulator.

Every program below is written the way a torch.distributed lesson writes it; the only
change is the import:

    import torch.distributed as dist   ->   import simdist as dist

Each function is an SPMD program: the *same* function runs once per rank (process), and
``rank`` is the only thing that differs. ``simdist.spawn(fn, args=(world_size,),
nprocs=world_size, backend="sim")`` plays the part of ``torch.multiprocessing.spawn``:
it calls ``fn(rank, world_size)`` for every rank, here as simulated ranks in one Python
process. Exactly one rank runs at a time, and a seeded scheduler decides which, so the
output below is the same on every run and every machine (CI compares it with
``01_collectives.out``).

Lines from different ranks appear in the order in which the scheduler ran the ranks. On
real processes that order changes from run to run; what each rank prints does not.

Run it:  python tutorials/01_collectives.py
"""

import os

import torch

import simdist
import simdist as dist  # in place of: import torch.distributed as dist


def setup(rank, world_size):
    # Real backends meet at MASTER_ADDR:MASTER_PORT. The simulator needs no network,
    # but the lines are kept so that the program is the one a torch user would write.
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    # Initialize the process group. Inside a simulated rank, any backend name ("gloo",
    # "nccl", ...) binds to the simulator, so code written for gloo runs unchanged.
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


# --- Broadcast -----------------------------------------------------------------------------
# One rank (src) holds the data; after broadcast every rank holds a copy. Used to give every
# process the same initial model parameters.


def run_broadcast(rank, world_size):
    setup(rank, world_size)
    tensor = torch.zeros(1)
    if rank == 0:
        # Source process creates the data
        tensor += 1
    # Rank 0 broadcasts 'tensor' to all other processes
    dist.broadcast(tensor=tensor, src=0)
    print(f"Rank {rank} has data: {tensor[0]}")
    dist.destroy_process_group()
    # Expected: every rank has data 1.0 (ranks 1, 2 and 3 were updated from 0 to 1).


# --- All-reduce ----------------------------------------------------------------------------
# Every rank contributes a tensor; they are combined element-wise (SUM by default; also AVG,
# PRODUCT, MIN, MAX, ...) and every rank ends with the result, in place. This is how data
# parallel training averages gradients.


def run_all_reduce(rank, world_size):
    setup(rank, world_size)
    # Each rank creates data based on its rank
    tensor = torch.tensor([rank + 1], dtype=torch.float32)
    print(f"Rank {rank} initial tensor: {tensor[0]}")
    # Perform all-reduce with SUM operation
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    # Result (sum of 1+2+3+4 = 10) is available on all ranks
    print(f"Rank {rank} final tensor: {tensor[0]}")
    dist.destroy_process_group()
    # Expected: initial 1, 2, 3, 4; final 10 on every rank.


# --- Reduce --------------------------------------------------------------------------------
# Like all_reduce, but only the destination rank (dst) receives the result. Do not rely on
# what the other ranks' tensors hold afterwards.


def run_reduce(rank, world_size):
    setup(rank, world_size)
    tensor = torch.tensor([rank + 1.0])
    # Every rank contributes; only rank 0 gets the sum
    dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM)
    if rank == 0:
        print(f"Rank 0 reduced tensor: {tensor[0]}")
    else:
        print(f"Rank {rank} contributed its tensor")
    dist.destroy_process_group()
    # Expected: rank 0 reduced tensor 10.0.


# --- Scatter -------------------------------------------------------------------------------
# The source rank holds a list with one tensor per rank; the i-th tensor goes to rank i
# (the source keeps its own). Used to hand out batches of data.


def run_scatter(rank, world_size):
    setup(rank, world_size)
    my_tensor = torch.zeros(1)
    scatter_list = None
    if rank == 0:
        # Source rank prepares the list of tensors to scatter
        scatter_list = [torch.tensor([i + 1.0]) for i in range(world_size)]
        print(f"Rank 0 scatter list: {[t.item() for t in scatter_list]}")
    # Rank 0 scatters the list. Each rank receives one tensor into my_tensor.
    dist.scatter(tensor=my_tensor, scatter_list=scatter_list, src=0)
    print(f"Rank {rank} received tensor: {my_tensor.item()}")
    dist.destroy_process_group()
    # Expected: rank r received r + 1.0.


# --- Gather --------------------------------------------------------------------------------
# The inverse of scatter: every rank sends its tensor to the destination rank, which stores
# them in gather_list in rank order.


def run_gather(rank, world_size):
    setup(rank, world_size)
    # Each rank creates its own tensor
    my_tensor = torch.tensor([rank + 1.0])
    gather_list = None
    if rank == 0:
        # Destination rank prepares a list to store gathered tensors
        gather_list = [torch.zeros(1) for _ in range(world_size)]
    # All ranks send their tensor to rank 0
    dist.gather(tensor=my_tensor, gather_list=gather_list, dst=0)
    if rank == 0:
        print(f"Rank 0 gathered list: {[t.item() for t in gather_list]}")
    else:
        print(f"Rank {rank} sent tensor: {my_tensor.item()}")
    dist.destroy_process_group()
    # Expected: rank 0 gathered [1.0, 2.0, 3.0, 4.0]; rank r sent r + 1.0.


# --- All-gather ----------------------------------------------------------------------------
# Like gather, but every rank ends with the whole list.


def run_all_gather(rank, world_size):
    setup(rank, world_size)
    my_tensor = torch.tensor([rank + 1.0])
    # Every rank prepares correctly sized output tensors, one per rank
    tensor_list = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(tensor_list, my_tensor)
    print(f"Rank {rank} gathered list: {[t.item() for t in tensor_list]}")
    dist.destroy_process_group()
    # Expected: every rank has [1.0, 2.0, 3.0, 4.0].


# --- Point-to-point: send and recv ---------------------------------------------------------
# send(tensor, dst) blocks until the data is handed over; recv(tensor, src) blocks until it
# arrives and fills the tensor in place. Every send needs a matching recv on the other side
# (same pair of ranks, same tag), or both sides wait forever: lesson 2 is about that.


def run_send_recv(rank, world_size):
    setup(rank, world_size)
    tensor = torch.zeros(1)
    if rank == 0:
        # Rank 0 sends a different value to every other rank
        for dst in range(1, world_size):
            tensor[0] = 10.0 * dst
            dist.send(tensor, dst=dst)
        print(f"Rank 0 sent {[10.0 * dst for dst in range(1, world_size)]}")
    else:
        dist.recv(tensor, src=0)
        print(f"Rank {rank} received: {tensor[0]}")
    dist.destroy_process_group()
    # Expected: rank r received 10.0 * r.


# A ring: each rank receives a running sum from its left neighbour, adds its own rank + 1 and
# passes it on. Rank 0 starts and is the last to receive, so the sends and receives always
# pair up; if every rank called send first, they would all wait for each other.


def run_ring(rank, world_size):
    setup(rank, world_size)
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    total = torch.zeros(1)
    if rank == 0:
        total += 1
        dist.send(total, dst=right)
        dist.recv(total, src=left)
        print(f"Rank 0 got the sum back: {total[0]}")
    else:
        dist.recv(total, src=left)
        total += rank + 1
        print(f"Rank {rank} passes on: {total[0]}")
        dist.send(total, dst=right)
    dist.destroy_process_group()
    # Expected: ranks 1, 2, 3 pass on 3.0, 6.0, 10.0; rank 0 gets 10.0 back.


# --- Non-blocking operations ---------------------------------------------------------------
# With async_op=True a collective returns a Work handle at once; isend/irecv do the same for
# point-to-point. The tensor may be read or reused only after work.wait(). In between, the
# rank can compute while the communication proceeds.


def run_async(rank, world_size):
    setup(rank, world_size)
    tensor = torch.ones(1) * rank
    # Initiate non-blocking all-reduce
    work_handle = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
    # Perform other computations while communication happens...
    local = torch.arange(3.0).sum()
    # Wait for the all_reduce operation to complete
    work_handle.wait()
    # Now 'tensor' contains the reduced result
    print(f"Rank {rank} async all_reduce result: {tensor[0]} (computed {local} meanwhile)")
    dist.destroy_process_group()
    # Expected: 0 + 1 + 2 + 3 = 6.0 on every rank.


def run_isend_irecv(rank, world_size):
    setup(rank, world_size)
    # Every rank sends its rank to the right and receives from the left, at the same time.
    # Both calls return at once, so nobody blocks before both are posted.
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    out, into = torch.tensor([float(rank)]), torch.zeros(1)
    works = [dist.isend(out, dst=right), dist.irecv(into, src=left)]
    for work in works:
        work.wait()
    print(f"Rank {rank} received {into[0]} from rank {left}; done: {all(w.is_completed() for w in works)}")
    dist.destroy_process_group()
    # Expected: rank r received float(r - 1) from its left neighbour.


# --- GPU code, unchanged -------------------------------------------------------------------
# The example of torch's reference puts the tensor on GPU number `rank`. On the simulator,
# cuda_as_cpu=True keeps tensors that code moves to a GPU on the CPU, so the program runs as
# written on any machine (without a GPU it is the default; it is passed here so that the
# output is the same on machines with one).


def demo_basic(rank, world_size):
    setup(rank, world_size)
    # Create a tensor
    tensor = torch.ones(2, 2).to(rank)
    # All-reduce operation
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    print(f'Rank {rank}: {tensor}')
    dist.destroy_process_group()
    # Expected: a 2x2 tensor of 2.0 on both ranks.


if __name__ == "__main__":
    world_size = 4
    for fn in (run_broadcast, run_all_reduce, run_reduce, run_scatter, run_gather, run_all_gather,
               run_send_recv, run_ring, run_async, run_isend_irecv):
        print(f"--- {fn.__name__} (world_size={world_size}) ---")
        simdist.spawn(fn, args=(world_size,), nprocs=world_size, backend="sim")
        print()

    # spawn returns what each rank's function returned, in rank order:
    def rank_times_ten(rank, world_size):
        return 10 * rank

    print("--- return values ---")
    print(simdist.spawn(rank_times_ten, args=(world_size,), nprocs=world_size, backend="sim"))
    print()

    print("--- demo_basic (world_size=2) ---")
    simdist.spawn(demo_basic, args=(2,), nprocs=2, backend="sim", cuda_as_cpu=True)
