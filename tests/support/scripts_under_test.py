"""torchrun scripts with a schedule-dependent bug and without it, for the tests of a script under test."""

# Rank 0 receives from any source and assumes the messages come in rank order: a schedule-dependent bug.
RACE = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
if r == 0:
    got = []
    for _ in range(w - 1):
        t = torch.zeros(1); dist.recv(t); got.append(int(t.item()))
    assert got == sorted(got), f"arrival order {got}"
    print("order ok", got)
else:
    dist.send(torch.tensor([float(r)]), dst=0)
dist.destroy_process_group()
"""

# The fix: rank 0 receives from each rank in turn.
FIXED = RACE.replace("for _ in range(w - 1):", "for src in range(1, w):").replace(
    "dist.recv(t)", "dist.recv(t, src=src)"
)
