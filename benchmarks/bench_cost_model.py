"""(m) The calibrated cost model: simulated times vs the socket backend's measured times.

    python benchmarks/bench_cost_model.py [--topology PATH] [--measured JSON] [--json PATH] [--quick]

Issue 18, item 4. Every op x algorithm of ``simdist.algorithms.ALGORITHMS`` (barrier aside) at
worlds 2, 3, 4 and 64 KiB, 1 MiB, 16 MiB, 64 MiB of float32 (``nbytes`` as the cost model counts
it: the buffer; all_gather and gather: the whole output; reduce_scatter, all_to_all and scatter:
the whole input; roots are rank 0).

Measured: real processes of the socket backend on this machine (``simdist.spawn``). Each timed
iteration is ``barrier(); t0; op; t1`` on every rank; an iteration's time is the largest
``t1 - t0`` over the ranks, and a case's time the median over 5 iterations after one warm-up.
Simulated: ``simulate(..., topology=PATH)`` at message level, every rank starting the op at
virtual time 0; the case's time is the last rank's end. PATH is the topology file that
``simdist calibrate`` writes (by default this script runs it first, into
``benchmarks/results/DATE-calibrated.json``). Error = simulated / measured - 1; target: median
|error| <= 15 %, worst <= 40 %.

``--measured JSON`` reuses the measurements of an earlier ``--json`` run (to compare topology
files on the same measurements).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import KIB, MIB, finish_info, machine_info, machine_markdown, markdown_table, write_json

import simdist
from simdist.launch._calibrate import calibrate, describe
from simdist.algorithms import ALGORITHMS
from simdist.backends.sim import simulate

OPS = tuple(op for op in ALGORITHMS if op != "barrier")
SIZES = (64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB)
QUICK_SIZES = (64 * KIB, 1 * MIB)
WORLDS = (2, 3, 4)
ITERS, WARM = 5, 1
TARGET_MEDIAN, TARGET_WORST = 0.15, 0.40


def size_label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def make_call(d, op: str, algorithm: str, nbytes: int, rank: int, world: int):
    """The op as a no-argument callable on float32 zeros of ``nbytes`` (rounded down to whole blocks)."""
    block = nbytes // 4 // world
    full = block * world
    z = torch.zeros
    if op == "all_reduce":
        t = z(nbytes // 4)
        return lambda: d.all_reduce(t, algorithm=algorithm)
    if op == "broadcast":
        t = z(nbytes // 4)
        return lambda: d.broadcast(t, src=0, algorithm=algorithm)
    if op == "reduce":
        t = z(nbytes // 4)
        return lambda: d.reduce(t, dst=0, algorithm=algorithm)
    if op == "all_gather":
        out, inp = z(full), z(block)
        return lambda: d.all_gather_into_tensor(out, inp, algorithm=algorithm)
    if op == "reduce_scatter":
        out, inp = z(block), z(full)
        return lambda: d.reduce_scatter_tensor(out, inp, algorithm=algorithm)
    if op == "all_to_all":
        out, inp = z(full), z(full)
        return lambda: d.all_to_all_single(out, inp, algorithm=algorithm)
    if op == "gather":
        inp = z(block)
        outs = [z(block) for _ in range(world)] if rank == 0 else None
        return lambda: d.gather(inp, outs, dst=0, algorithm=algorithm)
    if op == "scatter":
        out = z(block)
        ins = [z(block) for _ in range(world)] if rank == 0 else None
        return lambda: d.scatter(out, ins, src=0, algorithm=algorithm)
    raise ValueError(op)


def cases(sizes) -> list[tuple[str, str, int]]:
    return [(op, alg, n) for op in OPS for alg in ALGORITHMS[op] for n in sizes]


def socket_rank(rank: int, world: int, todo: list) -> dict:
    """Every case on this rank: ``{key: [seconds per iteration]}``."""
    torch.set_num_threads(1)
    simdist.init_process_group("socket")
    out = {}
    try:
        for op, alg, n in todo:
            call = make_call(simdist, op, alg, n, rank, world)
            times = []
            for i in range(WARM + ITERS):
                simdist.barrier()
                t0 = time.perf_counter()
                call()
                if i >= WARM:
                    times.append(time.perf_counter() - t0)
            out[f"{op}/{alg}/{n}"] = times
            del call
        simdist.barrier()
    finally:
        simdist.destroy_process_group()
    return out


def measure(world: int, todo: list) -> dict[str, float]:
    """Median over iterations of the slowest rank's time, per case."""
    per_rank = simdist.spawn(socket_rank, args=(world, todo), nprocs=world, backend="socket")
    return {k: statistics.median(max(r[k][i] for r in per_rank) for i in range(ITERS)) for k in per_rank[0]}


def _sim_rank(rank: int, op: str, alg: str, n: int, world: int) -> None:
    simdist.init_process_group("sim")
    make_call(simdist, op, alg, n, rank, world)()
    simdist.destroy_process_group()


def simulated(world: int, todo: list, topology: str) -> dict[str, float]:
    out = {}
    for op, alg, n in todo:
        res = simulate(_sim_rank, world, (op, alg, n, world), topology=topology)
        ends = [e.t_end for e in res.trace.events if e.kind == "collective" and e.op not in ("new_group",)]
        out[f"{op}/{alg}/{n}"] = max(ends)
    return out


def report(measured: dict, predicted: dict, sizes) -> tuple[str, dict]:
    rows, errors = [], []
    for world in WORLDS:
        for op in OPS:
            for alg in ALGORITHMS[op]:
                row = [str(world), op, alg]
                for n in sizes:
                    key = f"{op}/{alg}/{n}"
                    m, p = measured[str(world)][key], predicted[str(world)][key]
                    errors.append((abs(p / m - 1), f"{op}/{alg} w{world} {size_label(n)}", p / m))
                    row.append(f"{m * 1e3:.2f} / {p * 1e3:.2f} ({p / m:.2f}x)")
                rows.append(row)
    table = markdown_table(["world", "op", "algorithm", *(size_label(n) for n in sizes)], rows)
    errs = sorted(e[0] for e in errors)
    worst = max(errors)
    summary = {
        "cases": len(errors),
        "median_error": statistics.median(errs),
        "worst_error": worst[0],
        "worst_case": worst[1],
        "within_15": sum(e <= 0.15 for e in errs),
        "within_40": sum(e <= 0.40 for e in errs),
    }
    text = (
        "Cells: measured ms / simulated ms (simulated / measured).\n\n" + table + "\n\n"
        f"{summary['cases']} cases: median |error| {summary['median_error']:.1%} "
        f"(target <= {TARGET_MEDIAN:.0%}), worst {summary['worst_error']:.1%} ({summary['worst_case']}; "
        f"target <= {TARGET_WORST:.0%}); {summary['within_15']} within 15 %, {summary['within_40']} within 40 %."
    )
    return text, summary


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", metavar="PATH", help="topology file to simulate on (default: calibrate now)")
    p.add_argument("--measured", metavar="JSON", help="reuse the measurements of an earlier --json run")
    p.add_argument("--json", metavar="PATH", help="write measurements, predictions and the table as JSON")
    p.add_argument("--quick", action="store_true", help="64 KiB and 1 MiB only")
    args = p.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    todo = cases(sizes)
    info = machine_info()
    started = time.perf_counter()
    topology = args.topology
    if topology is None:
        topology = str(Path(__file__).resolve().parent / "results" / f"{_dt.date.today()}-calibrated.json")
        calibrate(topology)
    if args.measured:
        previous = json.loads(Path(args.measured).read_text())
        measured, info = previous["measured"], previous["machine"]
    else:
        measured = {str(w): measure(w, todo) for w in WORLDS}
        finish_info(info)
    predicted = {str(w): simulated(w, todo, topology) for w in WORLDS}
    text, summary = report(measured, predicted, sizes)
    spec = json.loads(Path(topology).read_text())
    text = f"Topology {Path(topology).name}: {describe(spec)}.\n\n" + text
    print(text)
    print(machine_markdown(info))
    print(f"runtime {time.perf_counter() - started:.0f} s")
    result = {
        "benchmark": "cost_model",
        "machine": info,
        "topology": spec,
        "measured": measured,
        "predicted": predicted,
        "summary": summary,
        "markdown": text,
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
