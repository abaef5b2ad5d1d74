"""Exercises (simdist.exercises): the shipped six, their grading against model and wrong solutions, the file format.

Each wrong solution is a mistake students make; its verdict must name the right kind of failure
and explain it in the student's terms. Three exercises have a wrong solution that passes the plain
schedule and fails only under some schedules (``RARE``): grading finds it.
"""

from __future__ import annotations

import pytest

import simdist
import simdist.testing as sdt
from simdist.exercises import EXERCISES_ENV, ExerciseError, Verdict, grade, load, load_all
from simdist.exercises._grade import _program

pytestmark = pytest.mark.timeout(300)

SHIPPED = {e.name: e for e in load_all()}


def edited(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


def test_six_exercises_ship_each_with_a_task_a_starter_and_hints():
    assert sorted(SHIPPED) == [
        "01_ring_all_reduce",
        "02_fix_a_deadlock",
        "03_binomial_broadcast",
        "04_halo_exchange",
        "05_parameter_server",
        "06_gradient_bucket",
    ]
    for e in SHIPPED.values():
        assert e.title and e.task and e.hints
        assert f"def {e.function}(" in e.starter and f"def {e.function}(" in e.solution
        assert e.solution.strip() not in e.task and e.solution.strip() != e.starter.strip()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_model_solution_passes_every_schedule_within_the_bound(name):
    e = SHIPPED[name]
    verdict = grade(e, e.solution)
    assert verdict.passed, verdict
    assert verdict.complete, verdict  # the exhaustive search covered its bound at every world size
    assert verdict.runs > 20 * len(e.worlds)
    assert f"up to {e.preemptions} preemptions" in verdict.summary


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_starter_does_not_pass(name):
    e = SHIPPED[name]
    assert not grade(e, e.starter).passed


def _wrong(name: str) -> dict[str, tuple[str, str, str]]:
    """Typical wrong solutions of exercise ``name``: description -> (source, kind, words of the explanation)."""
    e = SHIPPED[name]
    s = e.solution
    return {
        "01_ring_all_reduce": lambda: {
            "every rank sends first": (
                edited(
                    s,
                    "        sending = dist.isend(passing, dst=right)\n"
                    "        dist.recv(incoming, src=left)\n"
                    "        sending.wait()\n",
                    "        dist.send(passing, dst=right)\n        dist.recv(incoming, src=left)\n",
                ),
                "deadlock",
                "no rank can proceed",
            ),
            "forgets to add": (edited(s, "        tensor += incoming\n", ""), "wrong result", "the sum over all ranks"),
        },
        "02_fix_a_deadlock": lambda: {
            "the starter": (e.starter, "deadlock", "no rank can proceed"),
            "sends never waited": (
                edited(
                    s,
                    "    dist.send(tensor, dst=left)\n    dist.send(tensor, dst=right)\n",
                    "    dist.isend(tensor, dst=left)\n    dist.isend(tensor, dst=right)\n",
                ),
                "buffer reused before its wait",
                "solution.py:10",
            ),
        },
        "03_binomial_broadcast": lambda: {
            "a flat broadcast": (
                edited(
                    e.starter,
                    "    # your code: rank 0's tensor reaches every rank along a binomial tree\n",
                    "    if rank == 0:\n        for r in range(1, world):\n            dist.send(tensor, dst=r)\n"
                    "    else:\n        dist.recv(tensor, src=0)\n",
                ),
                "wrong result",
                "binomial tree",
            ),
            "forwards before its receive completed": (
                edited(
                    s,
                    "    if rank > 0:\n        dist.recv(tensor, src=rank - step // 2)\n"
                    "    while rank + step < world:\n        dist.send(tensor, dst=rank + step)\n        step *= 2\n",
                    "    receiving = dist.irecv(tensor, src=rank - step // 2) if rank > 0 else None\n"
                    "    while rank + step < world:\n        dist.send(tensor, dst=rank + step)\n        step *= 2\n"
                    "    if receiving is not None:\n        receiving.wait()\n",
                ),
                "wrong result",
                "rank 0 broadcast",
            ),
        },
        "04_halo_exchange": lambda: {
            "never waits": (  # the next step's receive is posted into the halo of one never waited for
                edited(s, "    for request in requests:\n        request.wait()\n", ""),
                "buffer reused before its wait",
                "writes to the buffer of an earlier irecv at solution.py:12",
            ),
            "sends views and waits for the receives only": (
                edited(
                    edited(edited(s, "u[1:2].clone()", "u[1:2]"), "u[4:5].clone()", "u[4:5]"),
                    "    for request in requests:\n",
                    "    for request in requests[::2]:\n",
                ),
                "buffer reused before its wait",
                "isend",
            ),
        },
        "05_parameter_server": lambda: {
            "keeps the arrival order": (
                edited(s, "        grads[sender - 1] = grad\n", "        grads[_] = grad\n"),
                "wrong result",
                "in rank order",
            ),
            "one buffer for every message": (
                edited(
                    edited(s, "        grad = torch.empty(2)\n", ""),
                    "    grads = [None] * (world_size - 1)\n",
                    "    grads = [None] * (world_size - 1)\n    grad = torch.empty(2)\n",
                ),
                "wrong result",
                "in rank order",
            ),
        },
        "06_gradient_bucket": lambda: {
            "one all_reduce per tensor": (
                edited(
                    e.starter,
                    "    # your code: one all_reduce of a flat bucket, then the average back into each gradient\n",
                    "    for g in grads:\n        dist.all_reduce(g)\n        g /= world\n",
                ),
                "wrong result",
                "one all_reduce of one bucket",
            ),
            "reads the bucket before the work is waited for": (
                edited(
                    s,
                    "    dist.all_reduce(bucket)\n    bucket /= world\n",
                    "    work = dist.all_reduce(bucket, async_op=True)\n    bucket /= world\n    work.wait()\n",
                ),
                "wrong result",
                "the average over the ranks",
            ),
        },
    }[name]()


@pytest.mark.parametrize(
    ("name", "mistake"), [(n, m) for n in sorted(SHIPPED) for m in _wrong(n)], ids=lambda x: str(x).replace(" ", "-")
)
def test_a_typical_wrong_solution_fails_with_the_right_explanation(name, mistake):
    source, kind, words = _wrong(name)[mistake]
    verdict = grade(SHIPPED[name], source)
    assert not verdict.passed and verdict.kind == kind, verdict
    assert words in verdict.summary + verdict.report, verdict
    assert verdict.token and f"@world={verdict.world}" in verdict.token
    if name not in RARE:  # a program that names every sender and polls nothing fails in the plain schedule
        assert verdict.token.split("@")[0] == "choices:0", verdict.token


RARE = {
    "02_fix_a_deadlock": (
        lambda s: edited(
            edited(
                s,
                "    receiving = [dist.irecv(from_left, src=left), dist.irecv(from_right, src=right)]\n"
                "    dist.send(tensor, dst=left)\n    dist.send(tensor, dst=right)\n"
                "    for work in receiving:\n",
                "    sending = [dist.isend(tensor, dst=left), dist.isend(tensor, dst=right)]\n"
                "    dist.recv(from_left, src=left)\n    dist.recv(from_right)\n"
                "    for work in sending:\n",
            ),
            "dist.recv(from_right)",
            "dist.recv(from_right)  # the left one is taken already",
        ),
        "deadlock",
        "no rank can proceed",
    ),
    "04_halo_exchange": (
        lambda s: edited(s, "dist.irecv(u[0:1], src=rank - 1)", "dist.irecv(u[0:1])"),
        "deadlock",
        "no rank can proceed",
    ),
    "05_parameter_server": (
        lambda s: edited(s, "        grads[sender - 1] = grad\n", "        grads[_] = grad\n"),
        "wrong result",
        "in rank order",
    ),
}
"""Mistakes that the plain schedule (each rank in turn, in rank order) does not show at any world size:
the trade whose sends are started with ``isend`` and whose receive from the right takes any source
(a left neighbour already in its second step sends first, its message is taken, and the receive of
the next step waits for ever); the halo exchange whose left halo is received from any source (a right
neighbour's message, sent first, takes it, and the receive from the right waits for ever); the server
that keeps arrival order. The other exercises' programs name every sender and poll nothing: what they
do is the same under every schedule, so each of their mistakes shows in the plain one."""

DEADLOCKED = {  # the failing run's last calls of one rank: a receive from any source took another's message
    "02_fix_a_deadlock": (
        1,
        (
            "solution.py:10 recv from rank 0: [0, 0]",
            "solution.py:11 recv from any rank: [100, 100] (from rank 0)",
            "solution.py:9 isend to rank 0: [101, 110]",
            "solution.py:9 isend to rank 2: [101, 110]",
            "solution.py:10 recv from rank 0: never completed",
        ),
    ),
    "04_halo_exchange": (  # rank 2's second halo took rank 1's left receive; the one from rank 2 waits for ever
        1,
        ("solution.py:9 irecv from any rank, waited: [108]", "solution.py:12 irecv from rank 2: never completed"),
    ),
}


@pytest.mark.parametrize("name", sorted(RARE))
def test_a_mistake_only_some_schedules_show_is_found_and_explained_at_the_students_lines(name):
    """The mistake passes the plain schedule at every world size; grading finds a schedule that shows it,
    explains its decisions at the student's lines, and its token replays the failure."""
    e = SHIPPED[name]
    mistake, kind, words = RARE[name]
    source = mistake(e.solution)
    main, check = _program(e, source)
    for world in e.worlds:
        plain = sdt.run(main, world, args=(world,), schedule="choices:0")
        check(plain.values, world)  # no error: right under the plain schedule
    verdict = grade(e, source)
    assert verdict.kind == kind and words in verdict.summary, verdict
    assert verdict.token.split("@")[0] != "choices:0", verdict.token  # a schedule other than the plain one
    assert verdict.decisions and all("solution.py:" in d for d in verdict.decisions), verdict.decisions
    assert len(verdict.calls) == verdict.world and any(verdict.calls), verdict.calls  # what the calls held
    assert all(text.startswith("solution.py:") for texts in verdict.calls for text in texts), verdict.calls
    assert any("from any rank" in text for texts in verdict.calls for text in texts), verdict.calls
    if kind == "deadlock":
        assert verdict.wait_for, verdict  # the wait-for graph of the deadlock
        rank, last = DEADLOCKED[name]
        assert verdict.calls[rank][-len(last) :] == last, verdict.calls
        with pytest.raises(simdist.DeadlockError, match=words):
            sdt.replay(main, verdict.world, verdict.token, args=(verdict.world,))
    else:
        replayed = sdt.replay(main, verdict.world, verdict.token, args=(verdict.world,))
        with pytest.raises(AssertionError, match=words):
            check(replayed.values, verdict.world)


def test_the_failing_runs_calls_show_what_each_rank_sent_and_received_in_order():
    """A broadcast that forwards before its receive completed: rank 1 sends zeros to rank 3, then its receive
    from rank 0 completes with rank 0's values; the record says so, per rank, at the student's lines."""
    e = SHIPPED["03_binomial_broadcast"]
    source, _, _ = _wrong(e.name)["forwards before its receive completed"]
    verdict = grade(e, source)
    assert verdict.world == 4 and verdict.calls == (
        ("solution.py:12 send to rank 1: [3, 1, 4]", "solution.py:12 send to rank 2: [3, 1, 4]"),
        ("solution.py:12 send to rank 3: [0, 0, 0]", "solution.py:10 irecv from rank 0, waited: [3, 1, 4]"),
        ("solution.py:10 irecv from rank 0, waited: [3, 1, 4]",),
        ("solution.py:10 irecv from rank 1, waited: [0, 0, 0]",),
    ), verdict.calls
    gradient = SHIPPED["06_gradient_bucket"]
    source, _, _ = _wrong(gradient.name)["reads the bucket before the work is waited for"]
    calls = grade(gradient, source).calls
    assert calls and all(texts and texts[0].startswith("solution.py:8 all_reduce, waited: [") for texts in calls)


def test_code_that_does_not_compile_or_lacks_the_function_gets_a_verdict_naming_the_line():
    e = SHIPPED["01_ring_all_reduce"]
    broken = grade(e, "def my_all_reduce(tensor):\n    return (\n")
    assert broken.kind == "syntax error" and broken.summary.startswith("solution.py:")
    missing = grade(e, "def something_else(tensor):\n    pass\n")
    assert missing.kind == "missing function" and "my_all_reduce" in missing.summary
    raising = grade(e, "raise ValueError('no')\n")
    assert raising.kind == "exception" and "ValueError: no" in raising.summary
    assert isinstance(broken, Verdict) and not broken.passed


def test_a_teachers_folder_adds_exercises_and_replaces_shipped_ones_of_the_same_name(tmp_path, monkeypatch):
    text = SHIPPED["05_parameter_server"].path.read_text(encoding="utf-8")
    (tmp_path / "07_mine.toml").write_text(text.replace("A parameter server", "My server"), encoding="utf-8")
    (tmp_path / "01_ring_all_reduce.toml").write_text(text.replace("A parameter server", "Replaced"), encoding="utf-8")
    monkeypatch.setenv(EXERCISES_ENV, str(tmp_path))
    by_name = {e.name: e for e in load_all()}
    assert by_name["07_mine"].title.startswith("My server")
    assert by_name["01_ring_all_reduce"].title.startswith("Replaced")
    assert len(by_name) == 7


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("worlds = [3, 4]", "worlds = []"), "'worlds' must be a list of world sizes"),
        (("worlds = [3, 4]", "worlds = [3, 40]"), "'worlds' must be a list of world sizes"),
        (('function = "collect"', "function = 3"), "'function' must be a non-empty string"),
        (("budget = 300", 'budget = "many"'), "'budget' must be an int"),
        (("budget = 300", "budget = 300\nbudjet = 3"), "unknown field(s) ['budjet']"),
        (("budget = 300", "budget = = 300"), "cannot be read as TOML"),
    ],
)
def test_a_bad_exercise_file_is_an_error_naming_the_file_and_the_field(tmp_path, change, words):
    text = SHIPPED["05_parameter_server"].path.read_text(encoding="utf-8")
    path = tmp_path / "bad.toml"
    path.write_text(edited(text, *change), encoding="utf-8")
    with pytest.raises(ExerciseError, match=r"exercise .*bad\.toml") as info:
        load(path)
    assert words in str(info.value)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(RARE))
def test_grading_on_rank_processes_gives_the_verdict_of_rank_threads(name):
    """The search that finds a rare mistake finds it on rank processes too: the same schedules, the same verdict."""
    e = SHIPPED[name]
    source = RARE[name][0](e.solution)
    threads, processes = (grade(e, source, isolation=i) for i in ("threads", "processes"))
    assert not processes.passed and processes.kind == threads.kind
    assert processes == threads  # token, decisions at the student's lines, the failing run's trace and calls
