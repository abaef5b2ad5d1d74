"""Lesson 2: deadlocks, and how the simulator finds, explains and replays them.

A deadlock is a state in which every unfinished rank waits for something that no other
rank will ever do. On real processes the program just hangs, and you are left to guess
which rank waits for what. On the simulator no rank runs unless the scheduler hands it
the baton, so the moment no rank can run, the simulator knows: it raises
``simdist.DeadlockError`` with a report that names every blocked rank, the call it is
blocked in (op, peer, tag, group) with its file:line, the messages that found no partner,
and a *replay token* that reproduces the run exactly.

Topics:
  1. head-to-head blocking sends; how buffering (eager_limit) hides the bug; two fixes
  2. a rank that skips a collective (and the mismatch error when it calls another one)
  3. a tag mismatch
  4. a deadlock that only some schedules reach: found by trying seeds, then replayed
     from its token; found again by trying every schedule (enumerate_schedules)

Reports contain file:line call sites; this lesson prints them with the directory cut
off, so that its output is the same on every machine (CI compares it with
``02_deadlocks.out``).

Run it:  python tutorials/02_deadlocks.py
"""

import re

import torch

import simdist
import simdist as dist


def show(err):
    """Print a report with each call site as file:line, without the directory."""
    print(f"{type(err).__name__}:")
    print(re.sub(r"(?:[^\s:]*[/\\])?([^\s/\\:]+\.py):(\d+)", r"\1:\2", str(err)))


def title(text):
    print()
    print(f"=== {text} ===")


# --- 1. Head-to-head blocking sends --------------------------------------------------------
# Both ranks send first and receive second. dist.send is synchronous on the simulator: it
# returns once the matching receive has been posted. Both ranks sit in send, neither
# reaches its recv: a wait-for cycle 0 -> 1 -> 0.


def head_to_head(rank, world_size, n):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    other = 1 - rank
    mine, theirs = torch.full((n,), float(rank)), torch.zeros(n)
    dist.send(mine, dst=other)
    dist.recv(theirs, src=other)
    dist.destroy_process_group()
    return theirs[0].item()


# Fix 1: post both operations without blocking (isend/irecv), then wait for both.
def head_to_head_nonblocking(rank, world_size, n):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    other = 1 - rank
    mine, theirs = torch.full((n,), float(rank)), torch.zeros(n)
    works = [dist.isend(mine, dst=other), dist.irecv(theirs, src=other)]
    for work in works:
        work.wait()
    dist.destroy_process_group()
    return theirs[0].item()


# Fix 2: order by rank: even ranks send first, odd ranks receive first.
def head_to_head_ordered(rank, world_size, n):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    other = 1 - rank
    mine, theirs = torch.full((n,), float(rank)), torch.zeros(n)
    if rank % 2 == 0:
        dist.send(mine, dst=other)
        dist.recv(theirs, src=other)
    else:
        dist.recv(theirs, src=other)
        dist.send(mine, dst=other)
    dist.destroy_process_group()
    return theirs[0].item()


def lesson_head_to_head():
    title("1. head-to-head blocking sends")
    try:
        simdist.simulate(head_to_head, 2, args=(2, 4))
    except simdist.DeadlockError as err:
        show(err)
        # The report is also data: a networkx wait-for graph, the cycle, the blocked calls.
        print("wait-for edges:", sorted(err.graph.edges))
        print("cycle:", err.cycle)
        print("blocked:", [(b["rank"], b["op"], b["peer"]) for b in err.blocked])

    # Real transports buffer small messages ("eager" protocol): a send of at most
    # eager_limit bytes returns at once. 4 float32 = 16 bytes fit, so the run finishes...
    title("1b. eager_limit=1024 hides it for small messages")
    res = simdist.simulate(head_to_head, 2, args=(2, 4), eager_limit=1024)
    print("16-byte messages, values:", res.values)
    # ...until the messages grow past the limit: the bug was there all along.
    title("1c. ...but not for large ones")
    try:
        simdist.simulate(head_to_head, 2, args=(2, 1024), eager_limit=1024)
    except simdist.DeadlockError as err:
        show(err)

    title("1d. the fixes")
    res = simdist.simulate(head_to_head_nonblocking, 2, args=(2, 1024))
    print("isend/irecv, then wait:", res.values)
    res = simdist.simulate(head_to_head_ordered, 2, args=(2, 1024))
    print("ordered by rank:       ", res.values)
    # For a program this small, every schedule can be tried: enumerate_schedules runs each
    # distinct choice sequence once (up to max_runs) and raises the first error it meets.
    runs = list(simdist.enumerate_schedules(head_to_head_ordered, 2, args=(2, 1024), max_runs=5000))
    complete = "all" if len(runs) < 5000 else "the first"
    print(f"ordered by rank: {complete} {len(runs)} schedules finish, values {sorted({tuple(r.values) for r in runs})}")


# --- 2. A rank that skips a collective -----------------------------------------------------
# A collective completes only when every rank of the group calls it. Here rank 2 thinks it
# has nothing to contribute and leaves early; ranks 0 and 1 wait for it forever.


def skip_collective(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    grads = torch.full((4,), float(rank))
    if rank != 2:
        dist.all_reduce(grads)
    dist.destroy_process_group()


# If rank 2 calls a different collective instead, the ranks disagree about the same
# (first) collective on the group: that is reported at once as a CollectiveMismatchError.
def skip_then_barrier(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    grads = torch.full((4,), float(rank))
    if rank != 2:
        dist.all_reduce(grads)
    dist.barrier()
    dist.destroy_process_group()


def lesson_skip():
    title("2. a rank skips a collective")
    try:
        simdist.simulate(skip_collective, 3, args=(3,))
    except simdist.DeadlockError as err:
        show(err)
    title("2b. a rank calls a different collective")
    try:
        simdist.simulate(skip_then_barrier, 3, args=(3,))
    except simdist.CollectiveMismatchError as err:
        show(err)
        print("fields that differ:", sorted(err.fields))


# --- 3. A tag mismatch ---------------------------------------------------------------------
# A receive matches only a send with the same tag. Rank 0 sends with tag 1, rank 1 waits for
# tag 0: both messages stay unmatched.


def tag_mismatch(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.zeros(2)
    if rank == 0:
        dist.send(t, dst=1, tag=1)
    else:
        dist.recv(t, src=0, tag=0)
    dist.destroy_process_group()


def lesson_tags():
    title("3. a tag mismatch")
    try:
        simdist.simulate(tag_mismatch, 2, args=(2,))
    except simdist.DeadlockError as err:
        show(err)


# --- 4. A deadlock that only some schedules reach ------------------------------------------
# Rank 0 takes one message from whichever worker is ready (recv with src=None), then waits
# for rank 2's message. The author assumed rank 1 is always first. When rank 1's message
# wins the race, all is well; when rank 2's wins, rank 0 waits for a second message from
# rank 2 that never comes, and rank 1's message is never received. Which sender an
# any-source receive matches is a choice of the scheduler, so different seeds explore
# different outcomes.


def racing_receives(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)          # any source: returns the sender's rank
        dist.recv(t, src=2)           # BUG: assumes the first message came from rank 1
        result = first
    else:
        t += rank
        dist.send(t, dst=0)
        result = None
    dist.destroy_process_group()
    return result


# The fix: use the rank that recv returned, and receive from the other worker.
def racing_receives_fixed(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)
        dist.recv(t, src=3 - first)
        result = first
    else:
        t += rank
        dist.send(t, dst=0)
        result = None
    dist.destroy_process_group()
    return result


def lesson_race():
    title("4. a deadlock that only some schedules reach")
    outcomes = {}
    first_error = None
    seed = 0
    while seed < 10 or (first_error is None and seed < 1000):  # at least 10 seeds, more until one fails
        try:
            res = simdist.simulate(racing_receives, 3, args=(3,), seed=seed)
            outcomes[seed] = f"ok, rank 0 heard first from rank {res.values[0]}"
        except simdist.DeadlockError as err:
            outcomes[seed] = f"DEADLOCK (token {err.schedule})"
            first_error = first_error or err
        seed += 1
    for seed, outcome in outcomes.items():
        print(f"seed {seed}: {outcome}")
    if first_error is None:
        print("no seed deadlocked: the race was never lost")
        return

    title("4b. the first deadlocking schedule's report")
    show(first_error)

    # The token reproduces that exact run: the same choices, the same deadlock, the same
    # report, as often as you like. Paste it into a test or a bug report.
    title("4c. replayed from its token")
    try:
        simdist.simulate(racing_receives, 3, args=(3,), schedule=first_error.schedule)
        print("no deadlock?!")
    except simdist.DeadlockError as err:
        print(f"replaying {err.schedule!r}: same report: {str(err) == str(first_error)}")

    # Seeds sample schedules at random. A program this small can also be checked on every
    # schedule: enumerate_schedules runs each distinct sequence of scheduler choices once
    # (depth first, up to max_runs) and raises the first error it meets, with a token that
    # lists the choices.
    title("4d. or try every schedule")
    runs, token = 0, None
    try:
        for _ in simdist.enumerate_schedules(racing_receives, 3, args=(3,), max_runs=5000):
            runs += 1
    except simdist.DeadlockError as err:
        print(f"schedule {runs + 1} deadlocks; its token is {err.schedule!r}")
        token, report = err.schedule, str(err)
    if token is None:
        print(f"{runs} schedules, no deadlock")
        return
    try:
        simdist.simulate(racing_receives, 3, args=(3,), schedule=token)
    except simdist.DeadlockError as err:
        print(f"replaying {token!r}: same report: {str(err) == report}")

    title("4e. the fix")
    firsts = [simdist.simulate(racing_receives_fixed, 3, args=(3,), seed=s).values[0] for s in range(10)]
    print("seeds 0-9: rank 0 heard first from:", firsts)
    runs = list(simdist.enumerate_schedules(racing_receives_fixed, 3, args=(3,), max_runs=5000))
    complete = "all" if len(runs) < 5000 else "the first"
    heard = sorted({r.values[0] for r in runs})
    print(f"{complete} {len(runs)} schedules finish; rank 0 heard first from ranks {heard}")


if __name__ == "__main__":
    print("Lesson 2: deadlocks")
    lesson_head_to_head()
    lesson_skip()
    lesson_tags()
    lesson_race()
