"""Seven small distributed programs, each with a real bug of a kind people write (tests and benchmarks).

Every program runs on ``WORLD`` ranks and fails under some schedule: the any-source
ones only when messages are matched in an order the author did not expect, the others
(uneven all_reduces, ring, subgroups, ragged all_gather) on every schedule.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

import simdist as dist

__all__ = ["BUGS", "WORLD"]

WORLD = 3


def parameter_server(rank):
    """Workers push a gradient; the server assumes the i-th receive came from worker i."""
    dist.init_process_group("gloo")
    if rank == 0:
        params = {}
        for worker in range(1, WORLD):
            grad = torch.zeros(1)
            dist.recv(grad)  # any source
            params[worker] = grad * 10  # bug: should be keyed by the sender recv returned
        for worker in range(1, WORLD):
            dist.send(params[worker], dst=worker)
    else:
        dist.send(torch.tensor([float(rank)]), dst=0)
        back = torch.zeros(1)
        dist.recv(back, src=0)
        assert back.item() == 10 * rank, f"worker {rank} got the parameters of worker {back.item() / 10:g}"
    dist.destroy_process_group()


def pipeline_reuses_send_buffer(rank):
    """Stage 0 refills its activation buffer before the isend of the previous micro-batch completed."""
    dist.init_process_group("gloo")
    if rank == 0:
        act = torch.zeros(1)
        works = []
        for micro in range(2):
            act.fill_(float(micro))  # bug: overwrites the buffer an earlier isend may still read
            works.append(dist.isend(act, dst=1))
        for w in works:
            w.wait()
    elif rank == 1:
        for micro in range(2):
            got = torch.zeros(1)
            dist.recv(got, src=0)
            assert got.item() == micro, f"micro-batch {micro} arrived as {got.item():g}"
    dist.destroy_process_group()


def uneven_accumulation(rank):
    """Each rank all_reduces once per local micro-batch, but rank 0 holds one more batch."""
    dist.init_process_group("gloo")
    grad = torch.ones(2)
    for _ in range(2 + (rank == 0)):  # bug: the number of batches differs between ranks
        dist.all_reduce(grad)
    dist.destroy_process_group()


def hand_written_ring(rank):
    """A ring shift where every rank sends before it receives: with synchronous sends, nobody receives."""
    dist.init_process_group("gloo")
    right, left = (rank + 1) % WORLD, (rank - 1) % WORLD
    out, got = torch.tensor([float(rank)]), torch.zeros(1)
    dist.send(out, dst=right)  # bug: even ranks should send first and odd ranks receive first
    dist.recv(got, src=left)
    dist.destroy_process_group()


def subgroups_in_different_orders(rank):
    """Ranks create the same two subgroups, but rank 1 creates them in the other order."""
    dist.init_process_group("gloo")
    pairs = [[0, 1], [1, 2]]
    if rank == 1:
        pairs.reverse()  # bug: new_group must be called in the same order on every rank
    groups = [dist.new_group(p) for p in pairs]
    dist.all_reduce(torch.ones(1), group=groups[0] if rank != 2 else groups[1])
    dist.destroy_process_group()


def ragged_all_gather(rank):
    """Each rank gathers its own number of tokens, as if all_gather accepted ragged tensors."""
    dist.init_process_group("gloo")
    mine = torch.full((rank + 1,), float(rank))  # bug: sizes differ; pad or all_gather the sizes first
    out = [torch.zeros(rank + 1) for _ in range(WORLD)]
    dist.all_gather(out, mine)
    dist.destroy_process_group()


def torch_task_server(rank):
    """torch.distributed code: a server hands out tasks and takes results from whoever answers first."""
    tdist.init_process_group("gloo")
    if rank == 0:
        for worker in range(1, WORLD):
            tdist.send(torch.tensor([float(worker * 100)]), dst=worker)
        results = []
        for _ in range(1, WORLD):
            res = torch.zeros(1)
            tdist.recv(res)  # any source
            results.append(res.item())
        assert results == sorted(results), f"results came back as {results}, not in the order tasks went out"
    else:
        task = torch.zeros(1)
        tdist.recv(task, src=0)
        tdist.send(task + 1, dst=0)
    tdist.destroy_process_group()


BUGS = {
    "parameter server": parameter_server,
    "pipeline isend buffer": pipeline_reuses_send_buffer,
    "uneven accumulation": uneven_accumulation,
    "hand-written ring": hand_written_ring,
    "subgroup order": subgroups_in_different_orders,
    "ragged all_gather": ragged_all_gather,
    "torch task server": torch_task_server,
}
