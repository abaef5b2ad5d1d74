"""Lesson 8: searching for bugs you can trust: bounded exhaustive search, minimal schedules, checks, buffer races.

Lesson 5 explored schedules at random (PCT). This lesson asks for guarantees:

- ``explore(fn, n, strategy="exhaustive", preemption_bound=k)`` runs *every* schedule with
  at most k preemptions (a preemption: a scheduler choice other than 0), fewest first,
  skipping schedules that only reorder independent steps of one already run. Most
  concurrency bugs need one or two preemptions, so a small bound finds them in few runs,
  and a search that ends says so: ``.complete`` is True only when the bound was covered;
- a failure comes back with a *minimal* schedule: no single choice can be deleted or
  lowered and still fail the same way (same exception, same line of your code);
- ``sdt.explain`` says which decisions made it fail, at your code's lines;
- ``check=fn`` judges every run's return values, so wrong results are failures too;
- a buffer handed to ``isend``/``irecv`` and written before the operation completed is a
  ``BufferRaceError`` under every schedule (``simdist.testing`` turns the check on).

Topics:
  1. a parameter server that assumes which worker answers first: found at one preemption
  2. the minimal schedule, explained, and read back from its token
  3. the fixed server: the search covers every schedule within the bound
  4. wrong results under some schedules: check=
  5. a send buffer reused too early: BufferRaceError on every schedule

Everything here is deterministic, so the output is the same on every run (CI compares it
with ``08_searching_for_bugs.out``).

Run it:  python tutorials/08_searching_for_bugs.py
"""

import re
import warnings

import torch

import simdist
import simdist as dist
import simdist.testing as sdt

WORKERS = 2


def title(text):
    print()
    print(f"=== {text} ===")


def short(text):
    """``text`` with each call site as file:line, without the directory."""
    return re.sub(r"(?:[^\s:]*[/\\])?([^\s/\\:]+\.py):(\d+)", r"\1:\2", str(text))


# --- 1. A parameter server ----------------------------------------------------------------
# Each worker sends its gradient to rank 0; rank 0 sends back each worker's update. The
# author stored the i-th gradient received as worker i's, forgetting that recv(src=None)
# returns whoever sent first.


def parameter_server(rank, fixed=False):
    dist.init_process_group("gloo")
    if rank == 0:
        updates = {}
        for i in range(1, WORKERS + 1):
            grad = torch.zeros(1)
            sender = dist.recv(grad)                       # any source
            updates[sender if fixed else i] = grad * 10    # BUG unless fixed: i is not the sender
        for worker, update in updates.items():
            dist.send(update, dst=worker)
    else:
        grad = torch.tensor([float(rank)])
        dist.send(grad, dst=0)
        dist.recv(grad, src=0)                             # the update replaces the gradient
        assert grad.item() == 10 * rank, f"worker {rank} got worker {grad.item() / 10:g}'s update"
    dist.destroy_process_group()


def lesson_search():
    title("1. a parameter server, searched up to one preemption")
    print(f"the schedule with no preemption passes: {sdt.run(parameter_server, WORKERS + 1, schedule=[]).values}")
    try:
        sdt.explore(parameter_server, WORKERS + 1, strategy="exhaustive", preemption_bound=1)
    except simdist.RankError as err:
        print(f"found: {short(err.__cause__)}")
        print(f"token: {err.schedule}")
        return err.schedule


# --- 2. The minimal schedule, explained ---------------------------------------------------


def lesson_explain(token):
    title("2. the minimal schedule, explained")
    schedule = sdt.Schedule.from_token(token)
    print(f"choices {schedule.choices}: {sum(1 for c in schedule.choices if c)} preemption")
    print(f"repr: {schedule!r}")
    for line in sdt.explain(parameter_server, WORKERS + 1, token):
        print("  " + short(line))


# --- 3. The fixed server --------------------------------------------------------------------


def lesson_fixed():
    title("3. the fixed server: every schedule within the bound")
    for bound in (1, 2):
        summary = sdt.explore(parameter_server, WORKERS + 1, args=(True,), strategy="exhaustive",
                              preemption_bound=bound)
        print(f"bound {bound}: complete={summary.complete}, {summary.runs} runs, {summary.distinct} distinct")
    # max_runs too small to cover the bound: the summary says incomplete, and a warning says so
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = sdt.explore(parameter_server, WORKERS + 1, args=(True,), strategy="exhaustive",
                              preemption_bound=2, max_runs=3)
    print(f"max_runs=3: complete={summary.complete}; warned: {bool(caught)}")


# --- 4. Wrong results: check= ---------------------------------------------------------------
# A task server hands out tasks to whichever worker asks first and returns the results in
# the order they came back, but the caller expects them in task order.


def task_server(rank):
    dist.init_process_group("gloo")
    results = None
    if rank == 0:
        results = []
        for _ in range(WORKERS):
            result = torch.zeros(1)
            dist.recv(result)                 # any source: arrival order
            results.append(int(result.item()))
    else:
        dist.send(torch.tensor([float(rank * rank)]), dst=0)
    dist.destroy_process_group()
    return results


def in_task_order(values):
    assert values[0] == [r * r for r in range(1, WORKERS + 1)], f"results out of order: {values[0]}"


def lesson_check():
    title("4. wrong results under some schedules: check=")
    print(f"calm schedule: {sdt.run(task_server, WORKERS + 1, schedule=[]).values[0]}")
    try:
        sdt.explore(task_server, WORKERS + 1, strategy="exhaustive", preemption_bound=1, check=in_task_order)
    except sdt.CheckError as err:
        print(f"{type(err).__name__}: {err.__cause__}")
        print(f"minimal schedule: {sdt.Schedule.from_token(err.schedule).choices}")


# --- 5. A send buffer reused too early -------------------------------------------------------
# Stage 0 of a pipeline refills its activation buffer for the next micro-batch while the
# isend of the previous one may still be reading it. Without the check, what stage 1
# receives depends on the schedule; with it, every schedule raises.


def pipeline(rank):
    dist.init_process_group("gloo")
    got = []
    if rank == 0:
        act, works = torch.zeros(1), []
        for micro in range(2):
            act.fill_(float(micro))           # BUG: the previous isend may still read act
            works.append(dist.isend(act, dst=1))
        for w in works:
            w.wait()
    else:
        for _ in range(2):
            t = torch.zeros(1)
            dist.recv(t, src=0)
            got.append(t.item())
    dist.destroy_process_group()
    return got


def lesson_buffers():
    title("5. a send buffer reused too early")
    seen = {tuple(simdist.simulate(pipeline, 2, seed=s).values[1]) for s in range(20)}
    print(f"unchecked, 20 seeds: stage 1 received {sorted(seen)}")
    raised = 0
    for s in range(20):
        try:
            sdt.run(pipeline, 2, seed=s)
        except simdist.BufferRaceError as err:
            raised += 1
            first = err
    print(f"checked (simdist.testing), 20 seeds: BufferRaceError on {raised}")
    print(short(str(first).splitlines()[0]))


if __name__ == "__main__":
    print("Lesson 8: searching for bugs you can trust")
    lesson_explain(lesson_search())
    lesson_fixed()
    lesson_check()
    lesson_buffers()
