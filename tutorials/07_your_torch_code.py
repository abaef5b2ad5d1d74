"""Lesson 7: test your existing torch.distributed code on simulated ranks, with Hypothesis schedules.

You already have a script written for torch.distributed: ``import torch.distributed as dist``,
``init_process_group("nccl")``, torch's own DistributedDataParallel. You want to know whether
it is correct under every interleaving of its ranks, without a cluster. simdist runs it on
simulated ranks with no edit: each rank is a thread with its own torch world, and every
torch.distributed call goes through the simulator, which chooses the order in which ranks run,
checks each call, and records a replay token.

Topics:
  1. an unchanged torch.distributed training function, with torch's DDP, on 3 simulated ranks
  2. the same function under Hypothesis-generated schedules: the result never depends on them
  3. a parameter server whose code assumes an arrival order: Hypothesis finds a schedule that
     breaks it, shrinks it to a few choices, and the token replays it exactly
  4. the same bug found without Hypothesis, by explore(), with its minimal schedule

Run it:  python tutorials/07_your_torch_code.py
"""

import torch
import torch.distributed as dist  # torch's own: nothing below imports simdist's API for the ranks
from hypothesis import find, given, settings
from torch import nn

import simdist
import simdist.testing as sdt

WORLD = 3


# --- the user's existing code: plain torch.distributed -----------------------------------------------


def train_main(rank, world_size):
    """One rank of a data-parallel training loop, as written for torchrun (unchanged)."""
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)  # each rank its own shard of data
    for _ in range(3):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    checksum = sum(float(p.detach().sum()) for p in model.parameters())
    dist.destroy_process_group()
    return round(checksum, 5)


def parameter_server(rank, world_size):
    """Rank 0 collects one update from each worker; it assumes rank 1's update arrives first."""
    dist.init_process_group("gloo")
    if rank == 0:
        first = torch.zeros(1)
        sender = dist.recv(first)  # from any worker: whoever is first
        rest = [torch.zeros(1) for _ in range(world_size - 2)]
        for t in rest:
            dist.recv(t)
        # the bug: treat the first message as rank 1's (a learning-rate warm-up, say)
        assert sender == 1, f"expected rank 1's update first, got rank {sender}'s"
        result = first.item()
    else:
        dist.send(torch.tensor([10.0 * rank]), dst=0)
        result = None
    dist.destroy_process_group()
    return result


def title(text):
    print(f"\n=== {text} ===")


def main():
    title("1. an unchanged torch.distributed script on simulated ranks")
    res = simdist.testing.run(train_main, WORLD, args=(WORLD,), seed=3)
    print(f"replicas after 3 steps of torch DDP on {WORLD} ranks: checksums {res.values}")
    print(f"all equal: {len(set(res.values)) == 1}; replay token: {res.schedule}")

    title("2. the same under Hypothesis schedules")
    seen = set()

    @settings(max_examples=15, derandomize=True, database=None, deadline=None)
    @given(schedule=sdt.schedules())
    def test_training_does_not_depend_on_the_schedule(schedule):
        values = sdt.run(train_main, WORLD, args=(WORLD,), schedule=schedule).values
        assert len(set(values)) == 1
        seen.add(values[0])

    test_training_does_not_depend_on_the_schedule()
    print(f"15 schedules, one result: {len(seen) == 1} ({seen.pop()})")

    title("3. a parameter server that assumes an arrival order")

    def fails(schedule):
        try:
            sdt.run(parameter_server, WORLD, args=(WORLD,), schedule=schedule)
        except simdist.RankError:
            return True
        return False

    patient = settings(max_examples=300, derandomize=True, database=None, deadline=None)  # runs may be slow here
    minimal = find(sdt.schedules(), fails, settings=patient)
    print(f"Hypothesis found a failing schedule and shrank it to {list(minimal)}: token {minimal.token}")
    try:
        sdt.replay(parameter_server, WORLD, minimal.token, args=(WORLD,))
    except simdist.RankError as err:
        print(f"replaying the token fails the same way: {err.__cause__}")

    title("4. the same bug found by explore()")
    try:
        sdt.explore(parameter_server, WORLD, args=(WORLD,), strategy="pct", seed=0)
    except simdist.RankError as err:
        shrunk = sdt.Schedule.from_token(err.schedule).choices
        print(f"explore: {type(err).__name__} on rank {err.rank}; minimal schedule {shrunk}")
        print(f"the cause: {err.__cause__}")
    print("To rerun exactly this interleaving in a test: sdt.replay(parameter_server, 3, TOKEN, args=(3,))")


if __name__ == "__main__":
    main()
