"""(o) The cost model on shaped links across hosts: simulated times vs the socket backend's, between hosts.

    python benchmarks/bench_cost_model_hosts.py [--rates 1gbit,100mbit] [--worlds 2,3,4] [--json PATH]
    python benchmarks/bench_cost_model_hosts.py --measured JSON [--topology RATE=PATH ...]

Issue 29, item 5. Needs root (hosts as network namespaces, tests/support/netns_hosts.py): 4 hosts on one
bridge, each host's link shaped in both directions (``tc tbf``) to the rate. For each rate:

1. ``simdist calibrate --nnodes 4 --node-rank i --master-addr HOST0 --out FILE`` on every host, as a
   user calibrates a cluster: the links between hosts (ping-pong, shifts, the check's cost), and
   node 0 the terms inside a host over loopback. FILE is kept as
   ``benchmarks/results/DATE-cost-model-hosts-calibrated-RATE.json``.
2. For worlds 2, 3, 4 (one rank per host, hosts 0..w-1): ``simdist run --backend socket --nnodes w``
   on those hosts, every op x algorithm of ``simdist.algorithms.ALGORITHMS`` (barrier aside) at
   :data:`SIZES` of float32 (``nbytes`` as in bench_cost_model.py; roots are rank 0). Each iteration
   is ``barrier(); t0; op; t1`` on every rank, its time the slowest rank's ``t1 - t0``; a case's
   time is the median of :data:`ITERS` iterations after :data:`WARM`.
3. ``simulate`` the same program (every case's loop of barrier and op, one case after the other, in
   one run: each case finds the links as the cases before it left them) at message level on FILE;
   each iteration's time is the slowest rank's time in the op, the case's the median of the same
   iterations. Error = simulated / measured - 1; target: median |error| <= 10 %, worst <= 25 %.

``--measured JSON`` re-simulates the measurements of an earlier ``--json`` run on the topology files
it recorded (or on ``--topology RATE=PATH``), without namespaces or measuring.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from _common import KIB, MIB, finish_info, machine_info, machine_markdown, markdown_table, write_json  # noqa: E402
from bench_cost_model import OPS, make_call  # noqa: E402

import simdist  # noqa: E402
from simdist.launch._calibrate import describe  # noqa: E402
from simdist.algorithms import ALGORITHMS  # noqa: E402
from simdist.backends.sim import simulate  # noqa: E402

SIZES = {"1gbit": (1 * MIB, 4 * MIB, 32 * MIB), "100mbit": (256 * KIB, 1 * MIB, 8 * MIB)}
"""Sizes per rate, within issue 29's ranges (1 Gbit/s: 1-32 MiB; 100 Mbit/s: 256 KiB-8 MiB)."""
WORLDS = (2, 3, 4)
WARM, ITERS = 1, 5
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.25
PORT = 29800
TODAY = _dt.date.today().isoformat()


def size_label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def cases(sizes) -> list[tuple[str, str, int]]:
    return [(op, alg, n) for op in OPS for alg in ALGORITHMS[op] for n in sizes]


# --- one rank of a measuring job (run by `simdist run` on each host) ------------------------------


def rank_main(results: str, sizes: str) -> None:
    """Every case on this rank; rank 0 writes ``{case: [slowest rank's seconds per iteration]}``."""
    import torch

    torch.set_num_threads(1)
    simdist.init_process_group("socket")
    rank, world = simdist.get_rank(), simdist.get_world_size()
    mine = {}
    try:
        for op, alg, n in cases([int(s) for s in sizes.split(",")]):
            call = make_call(simdist, op, alg, n, rank, world)
            times = []
            for _ in range(WARM + ITERS):
                simdist.barrier()
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            mine[f"{op}/{alg}/{n}"] = times
            del call
        every = [None] * world
        simdist.all_gather_object(every, mine)
        if rank == 0:
            slowest = {k: [max(r[k][i] for r in every) for i in range(WARM + ITERS)] for k in mine}
            Path(results).write_text(json.dumps(slowest), encoding="utf-8")
        simdist.barrier()
    finally:
        simdist.destroy_process_group()


# --- the driver -----------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    from simdist.backends.socket import new_secret

    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "SIMDIST_SECRET")}
    env["SIMDIST_SECRET"] = new_secret()
    return env


def _on_hosts(hosts, argvs, env: dict[str, str], timeout: float) -> None:
    """Run ``argvs[i]`` on ``hosts[i]`` at once; raise with their output if one fails."""
    procs = [
        h.popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for h, a in zip(hosts, argvs)
    ]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for h, p, out in zip(hosts, procs, outs):
        if p.returncode:
            raise RuntimeError(f"host {h.index} failed ({p.returncode}):\n{out[-4000:]}")
        sys.stderr.write(out)


def calibrate_on(bed, path: Path, port: int, env: dict[str, str], quick: bool = False) -> dict:
    """``simdist calibrate --nnodes N`` on every host of ``bed``; the topology file node 0 wrote."""
    simdist_cli = [sys.executable, "-c", "import sys; from simdist.run import cli; sys.exit(cli())"]
    common = ["calibrate", "--nnodes", str(len(bed)), "--master-addr", bed[0].address, "--master-port", str(port)]
    argvs = [
        [*simdist_cli, *common, "--node-rank", str(h.index), "--out", str(path), *(["--quick"] if quick else [])]
        for h in bed.hosts
    ]
    _on_hosts(bed.hosts, argvs, env, timeout=900)
    return json.loads(path.read_text())


def measure_on(bed, world: int, sizes, port: int, env: dict[str, str]) -> dict[str, list[float]]:
    """The cases at ``world`` ranks, one on each of hosts 0..world-1."""
    results = Path(f"/tmp/simdist-bench-hosts-{os.getpid()}-{world}.json")
    common = ["--backend", "socket", "--nnodes", str(world), "--master-addr", bed[0].address]
    common += ["--master-port", str(port), "--nproc-per-node", "1"]
    argvs = [
        [sys.executable, "-m", "simdist.run", *common, "--node-rank", str(h.index), str(Path(__file__).resolve())]
        + ["--rank", str(results), ",".join(map(str, sizes))]
        for h in bed.hosts[:world]
    ]
    _on_hosts(bed.hosts[:world], argvs, env, timeout=1800)
    out = json.loads(results.read_text())
    results.unlink()
    return out


def _sim_rank(rank: int, todo: list, world: int) -> None:
    """The measuring program of :func:`rank_main`, on a simulated rank."""
    simdist.init_process_group("sim")
    for op, alg, n in todo:
        call = make_call(simdist, op, alg, n, rank, world)
        for _ in range(WARM + ITERS):
            simdist.barrier()
            call()
    simdist.destroy_process_group()


def simulated(world: int, todo: list, topology: str) -> dict[str, list[float]]:
    """Per case, the slowest rank's virtual seconds in the op, per iteration: the measuring program
    simulated as one run, so that each case finds the links as the cases before it left them."""
    res = simulate(_sim_rank, world, (todo, world), topology=topology)
    spans: dict[int, list[float]] = {}
    for e in sorted(res.trace.events, key=lambda e: e.t_start):
        if e.kind == "collective" and e.op not in ("barrier", "new_group"):
            spans.setdefault(e.rank, []).append(e.t_end - e.t_start)
    runs = WARM + ITERS
    return {
        f"{op}/{alg}/{n}": [max(s[k * runs + i] for s in spans.values()) for i in range(runs)]
        for k, (op, alg, n) in enumerate(todo)
    }


def report(rate: str, measured: dict, predicted: dict, sizes) -> tuple[str, dict]:
    rows, errors, per_world = [], [], {}
    for world in map(int, measured):
        mine = []
        for op in OPS:
            for alg in ALGORITHMS[op]:
                if f"{op}/{alg}/{sizes[0]}" not in measured[str(world)]:
                    continue  # an algorithm added after these measurements (with --measured)
                row = [str(world), op, alg]
                for n in sizes:
                    key = f"{op}/{alg}/{n}"
                    m = statistics.median(measured[str(world)][key][WARM:])
                    p = statistics.median(predicted[str(world)][key][WARM:])
                    mine.append((abs(p / m - 1), f"{op}/{alg} w{world} {size_label(n)}", p / m))
                    row.append(f"{m * 1e3:.1f} / {p * 1e3:.1f} ({p / m:.2f}x)")
                rows.append(row)
        errs = sorted(e[0] for e in mine)
        per_world[world] = {
            "median_error": statistics.median(errs),
            "worst_error": max(mine)[0],
            "worst_case": max(mine)[1],
        }
        errors += mine
    table = markdown_table(["world", "op", "algorithm", *(size_label(n) for n in sizes)], rows)
    errs = sorted(e[0] for e in errors)
    worst = max(errors)
    summary = {
        "rate": rate,
        "cases": len(errors),
        "median_error": statistics.median(errs),
        "worst_error": worst[0],
        "worst_case": worst[1],
        "within_10": sum(e <= 0.10 for e in errs),
        "within_25": sum(e <= 0.25 for e in errs),
        "per_world": per_world,
    }
    text = (
        f"Cells: measured ms / simulated ms (simulated / measured), {rate}.\n\n" + table + "\n\n"
        f"{rate}: {summary['cases']} cases: median |error| {summary['median_error']:.1%} "
        f"(target <= {TARGET_MEDIAN:.0%}), worst {summary['worst_error']:.1%} ({summary['worst_case']}; "
        f"target <= {TARGET_WORST:.0%}); {summary['within_10']} within 10 %, {summary['within_25']} within 25 %. "
        + "; ".join(
            f"world {w}: median {s['median_error']:.1%}, worst {s['worst_error']:.1%}" for w, s in per_world.items()
        )
    )
    return text, summary


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1gbit,100mbit", help="comma-separated tc rates (default 1gbit,100mbit)")
    p.add_argument("--worlds", default="2,3,4", help="comma-separated worlds, one rank a host (default 2,3,4)")
    p.add_argument("--json", metavar="PATH", help="write measurements, predictions and tables as JSON")
    p.add_argument("--quick", action="store_true", help="the smallest size only; simdist calibrate --quick")
    p.add_argument("--measured", metavar="JSON", help="re-simulate the measurements of an earlier --json run")
    p.add_argument("--topology", action="append", default=[], metavar="RATE=PATH", help="with --measured: a file")
    args = p.parse_args(argv)
    started = time.perf_counter()
    rates = args.rates.split(",")
    worlds = [int(w) for w in args.worlds.split(",")]
    files = dict(t.split("=", 1) for t in args.topology)

    def sizes_of(rate: str) -> tuple[int, ...]:
        return SIZES[rate][:1] if args.quick else SIZES[rate]

    if args.measured:
        previous = json.loads(Path(args.measured).read_text())
        info, runs = previous["machine"], previous["runs"]
        global WARM, ITERS
        WARM, ITERS = previous.get("iterations", (1, 3))  # simulate the loop that was measured
        rates = [r for r in rates if r in runs]
        for rate in rates:
            if rate in files:
                runs[rate]["topology"] = json.loads(Path(files[rate]).read_text())
    else:
        from netns_hosts import NetnsTestbed, unavailable

        reason = unavailable()
        if reason is not None:
            raise SystemExit(f"hosts as network namespaces: {reason}")
        info, runs, env = machine_info(), {}, _env()
        for k, rate in enumerate(rates):
            with NetnsTestbed(max(worlds), rate) as bed:
                path = HERE / "results" / f"{TODAY}-cost-model-hosts-calibrated-{rate}.json"
                t0 = time.perf_counter()
                spec = calibrate_on(bed, path, PORT + 100 * k, env, args.quick)
                runs[rate] = {"topology": spec, "calibrate_seconds": time.perf_counter() - t0, "measured": {}}
                runs[rate]["load_1m"] = {"calibrated": os.getloadavg()[0]}  # other work on the machine, as it went
                for j, world in enumerate(worlds):
                    t0 = time.perf_counter()
                    runs[rate]["measured"][str(world)] = measure_on(
                        bed, world, sizes_of(rate), PORT + 100 * k + 10 * (j + 1), env
                    )
                    runs[rate]["load_1m"][str(world)] = os.getloadavg()[0]
                    print(f"{rate} world {world}: measured in {time.perf_counter() - t0:.0f} s", flush=True)
        finish_info(info)
    texts, summaries = [], {}
    for rate in rates:
        run = runs[rate]
        path = Path(f"/tmp/simdist-bench-hosts-{os.getpid()}-{rate}.json")
        path.write_text(json.dumps(run["topology"]))
        sizes = sizes_of(rate)
        run["predicted"] = {w: simulated(int(w), cases(sizes), str(path)) for w in run["measured"]}
        path.unlink()
        text, summaries[rate] = report(rate, run["measured"], run["predicted"], sizes)
        texts.append(f"Topology ({rate}): {describe(run['topology'])}.\n\n{text}")
    markdown = "\n\n".join(texts)
    print(markdown)
    print(machine_markdown(info))
    print(f"runtime {time.perf_counter() - started:.0f} s")
    result = {
        "benchmark": "cost_model_hosts",
        "iterations": [WARM, ITERS],
        "machine": info,
        "runs": runs,
        "summary": summaries,
        "markdown": markdown,
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(*sys.argv[2:4])
    else:
        main()
