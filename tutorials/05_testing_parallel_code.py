"""Lesson 5: testing parallel code with simdist.testing: schedules, exploration, Hypothesis, replay.

A parallel program can pass a thousand times and fail on the thousand-and-first: the
bug hides in one interleaving of the ranks, or at one world size. Running it more often
is not a test strategy. ``simdist.testing`` turns the simulator's control over the
schedule into tests:

- ``run(fn, n, schedule=...)`` runs one chosen (or generated) interleaving;
- ``explore(fn, n, strategy="pct")`` tries many schedules and, on a failure, *shrinks*
  its schedule to a minimal one, a handful of scheduler choices;
- every failure carries a *replay token*: ``replay(fn, n, token)``, or
  ``pytest --simdist-replay TOKEN``, reruns exactly that interleaving;
- Hypothesis strategies (``world_sizes``, ``schedules``, ``collective_inputs``) generate
  world sizes, schedules and inputs, and shrink a failing example to the smallest one;
- ``@spmd(nprocs=...)`` turns ``fn(rank)`` into a pytest test that explores it.

A schedule is a list of scheduler choices: at each point where several ranks could run,
choice 0 keeps the running rank (or takes the lowest runnable one), choice k takes the
k-th other option. Choices past the end of the list are 0, so ``[]`` is the calm
schedule "lowest rank first, no preemption" and short lists of small numbers are simple
schedules.

Topics:
  1. a race on recv(src=None): found by explore (PCT), shrunk, replayed
  2. a deadlock only some schedules reach: pct, random and exhaustive exploration
  3. a bug only at world sizes that are not a power of two: Hypothesis shrinks it to 3
  4. a ring all_reduce with an off-by-one chunk index, checked against dist.all_reduce
  5. @spmd tests and the pytest options --simdist-replay and --simdist-max-schedules

Everything here is seeded, so the output is the same on every run (CI compares it with
``05_testing_parallel_code.out``).

Run it:  python tutorials/05_testing_parallel_code.py
"""

import re

import torch
from hypothesis import HealthCheck, Verbosity, find, given, settings

import simdist
import simdist as dist
import simdist.testing as sdt
from simdist.testing import Schedule

# Hypothesis normally draws at random and remembers failures in a database; for a lesson
# with a fixed output it draws deterministically and forgets.
LESSON = settings(derandomize=True, database=None, deadline=None, verbosity=Verbosity.quiet,
                  suppress_health_check=list(HealthCheck))


def title(text):
    print()
    print(f"=== {text} ===")


def show(err):
    """Print an error's report with each call site as file:line, without the directory."""
    print(f"{type(err).__name__}:")
    print(re.sub(r"(?:[^\s:]*[/\\])?([^\s/\\:]+\.py):(\d+)", r"\1:\2", str(err)))


def choices(token):
    """The scheduler choices of a ``choices:`` token, without the implied trailing zeros.

    ``Schedule.from_token`` reads a replay token back; ``.choices`` is its plain list.
    """
    return Schedule.from_token(token).choices


# --- 1. A race on an any-source receive ----------------------------------------------------
# Rank 0 collects one message from each worker with recv(src=None), and its author assumed
# rank 1's message always arrives first ("rank 1 is the fastest"). Under the calm schedule
# it does. Which sender an any-source receive matches depends on the interleaving.


def first_message_race(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = dist.recv(t)                 # any source: returns the sender's rank
        assert first == 1, f"expected rank 1's message first, got rank {first}'s"
        for _ in range(dist.get_world_size() - 2):
            dist.recv(t)
    else:
        t += rank
        dist.send(t, dst=0)
    dist.destroy_process_group()


def lesson_race():
    title("1. a race on recv(src=None)")
    res = sdt.run(first_message_race, 4, schedule=[])
    print(f"the calm schedule [] passes ({res.points} scheduling points, token {res.schedule})")
    # explore runs the program under up to max_runs schedules. 'pct' (probabilistic
    # concurrency testing) gives the ranks random priorities and preempts the running rank
    # at depth - 1 random points: it finds bugs that need few ill-timed preemptions, fast.
    try:
        print(sdt.explore(first_message_race, 4, strategy="pct", max_runs=100, seed=0))
    except simdist.RankError as err:
        print(f"explore found: rank {err.rank} raised: {str(err).splitlines()[0].split(': ', 1)[1]}")
        for note in getattr(err, "__notes__", []):
            print("note:", note)
        print(f"minimal schedule: {choices(err.schedule)} (token {err.schedule!r})")
        # The token replays that interleaving exactly: paste it into a test or a bug report.
        try:
            sdt.replay(first_message_race, 4, err.schedule)
        except simdist.RankError as again:
            print(f"replay({err.schedule!r}): rank {again.rank} raised {type(again.__cause__).__name__}: "
                  f"{again.__cause__}")


# --- 2. A deadlock that only some schedules reach ------------------------------------------
# The same mistake with a blocking consequence (lesson 2, part 4): rank 0 takes any message,
# then waits for rank 2's. If rank 2's message came first, rank 0 waits for a second one
# that never comes.


def racing_receives(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    first = None
    if rank == 0:
        first = dist.recv(t)
        dist.recv(t, src=2)   # BUG: assumes the first message came from rank 1
    else:
        t += rank
        dist.send(t, dst=0)
    dist.destroy_process_group()
    return first


def lesson_deadlock():
    title("2. a deadlock only some schedules reach")
    res = sdt.run(racing_receives, 3, seed=0)
    print(f"run(seed=0) passes: rank 0 heard first from rank {res.values[0]}")
    for strategy in ("pct", "random", "exhaustive"):
        try:
            print(strategy, sdt.explore(racing_receives, 3, strategy=strategy, max_runs=100, seed=0))
        except simdist.DeadlockError as err:
            print(f"{strategy}: DeadlockError, minimal schedule {choices(err.schedule)} (token {err.schedule!r})")
            last = err
    # "Minimal" means a local minimum: the shrinker deletes, zeroes, lowers and moves the
    # failing run's choices until no single deletion or lowering still deadlocks the same
    # way. Each strategy ends with one non-zero choice (one reordering), not always the same.
    title("2b. the report of the minimal deadlocking schedule")
    show(last)


# --- 3. A bug only at some world sizes -----------------------------------------------------
# Recursive doubling: in round k every rank exchanges its partial sum with rank ^ 2**k.
# After log2(world) rounds every rank has the total, if world is a power of two. At other
# world sizes some partners do not exist, and the code below silently skips them: no
# error, no deadlock, just wrong sums on some ranks.


def doubling_all_reduce(rank, world):
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    mask = 1
    while mask < world:
        partner = rank ^ mask
        if partner < world:   # BUG: at other world sizes some ranks miss a partial sum
            other = torch.zeros(1)
            for work in [dist.isend(t, dst=partner), dist.irecv(other, src=partner)]:
                work.wait()
            t += other
        mask <<= 1
    dist.destroy_process_group()
    return t.item()


def doubling_is_wrong(world):
    res = sdt.run(doubling_all_reduce, world, args=(world,))
    return any(v != world * (world + 1) / 2 for v in res.values)


def lesson_world_sizes():
    title("3. a bug only at world sizes that are not a power of two")
    print("worlds 1, 2, 4, 8 correct:", not any(doubling_is_wrong(w) for w in (1, 2, 4, 8)))
    # find() searches for an example that satisfies the condition and shrinks it:
    # world_sizes(1, 8) shrinks towards 1, so the answer is the smallest failing world.
    world = find(sdt.world_sizes(1, 8), doubling_is_wrong, settings=LESSON)
    print("Hypothesis: smallest failing world size:", world)
    print(f"sums at world {world}:", sdt.run(doubling_all_reduce, world, args=(world,)).values,
          f"(expected {world * (world + 1) / 2} everywhere)")


# --- 4. A ring all_reduce with an off-by-one chunk index -----------------------------------
# The ring all_reduce of lesson 1, hand-written: split the tensor into world chunks;
# reduce-scatter (world - 1 steps of "send one chunk right, add the one from the left"),
# after which rank r holds the sum of chunk (r + 1) % world; then all-gather (world - 1
# steps passing the sums on). ``off`` is the all-gather's starting chunk: 1 is right; 0
# passes on a chunk that is not summed yet. The property: the result equals
# dist.all_reduce of the same input, for every world size, input and schedule.


def ring_all_reduce(rank, inputs, off):
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    x = inputs.input(rank)
    expected = x.clone()
    dist.all_reduce(expected)
    chunks = list(torch.tensor_split(x.reshape(-1), world))
    right, left = (rank + 1) % world, (rank - 1) % world

    def shift(send, recv, add):
        buf = torch.empty_like(chunks[recv])
        for work in [dist.isend(chunks[send], dst=right), dist.irecv(buf, src=left)]:
            work.wait()
        chunks[recv].add_(buf) if add else chunks[recv].copy_(buf)

    for step in range(world - 1):
        shift((rank - step) % world, (rank - step - 1) % world, add=True)
    for step in range(world - 1):
        shift((rank + off - step) % world, (rank + off - step - 1) % world, add=False)
    dist.destroy_process_group()
    return torch.equal(x, expected)


def ring_property(off):
    @settings(LESSON, max_examples=40)
    @given(inputs=sdt.collective_inputs(op="all_reduce"), schedule=sdt.schedules())
    def test_ring(inputs, schedule):
        res = sdt.run(ring_all_reduce, inputs.world, args=(inputs, off), schedule=schedule)
        if not all(res.values):
            failing.append((inputs, schedule, res.values))
            raise AssertionError("the ring disagrees with dist.all_reduce")

    failing = []
    try:
        test_ring()
    except AssertionError:
        return failing[-1]  # the last failing example Hypothesis tried is the shrunk one
    return None


def lesson_ring():
    title("4. a ring all_reduce with an off-by-one chunk index")
    print("off=1 (correct): 40 examples pass:", ring_property(1) is None)
    inputs, schedule, agree = ring_property(0)
    print("off=0 (the bug): Hypothesis's shrunk example:")
    print(f"  world {inputs.world}, shape {inputs.shape}, {inputs.dtype}, schedule {list(schedule)}")
    print(f"  inputs {[inputs.input(r).tolist() for r in range(inputs.world)]}; "
          f"ranks agreeing with dist.all_reduce: {agree}")


# --- 5. @spmd tests and the pytest plugin --------------------------------------------------
# In a test file, @spmd turns fn(rank) into a test function that explores it:
#
#     import simdist.testing
#
#     @simdist.testing.spmd(nprocs=[3, 4])        # each world size in turn
#     def test_first_message(rank):
#         ...                                     # the body of first_message_race
#
# pytest runs it like any test. A failure shows the minimal schedule's replay token:
#
#     E   simdist.core._errors.RankError: rank 0 raised AssertionError: ...
#     E   replay token: choices:...
#
# and these options (from simdist's pytest plugin, installed with simdist) control runs:
#
#     pytest test_x.py --simdist-replay TOKEN       # every simulated run replays TOKEN
#     pytest test_x.py --simdist-max-schedules 500  # explore/@spmd try 500 schedules
#
# Below, the decorated function is simply called, as pytest would.


@sdt.spmd(nprocs=[3, 4])
def test_first_message(rank):
    first_message_race(rank)


def lesson_spmd():
    title("5. @spmd")
    print("test_first_message is a zero-argument test:", test_first_message.__name__)
    try:
        test_first_message()
        print("passed")
    except simdist.RankError as err:
        print(f"it fails: rank {err.rank}, token {err.schedule!r}")
        print(f"to rerun it: pytest test_x.py -k test_first_message --simdist-replay {err.schedule}")


if __name__ == "__main__":
    print("Lesson 5: testing parallel code")
    lesson_race()
    lesson_deadlock()
    lesson_world_sizes()
    lesson_ring()
    lesson_spmd()
