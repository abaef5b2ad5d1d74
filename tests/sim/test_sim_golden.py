"""Simulated runs give exactly what they gave when the fixture was recorded.

Every algorithm of every collective, point-to-point with any-source receives, eager
sends, several topologies and strategies, with ranks as threads and as processes: the SHA-256 of each run's trace JSON (every
event, every field, times bit for bit), its choices, replay token and values must equal
``golden_traces.json``. The fixture changes only when a run is meant to change; rewrite
it with ``python tests/sim/test_sim_golden.py --save`` (``--dump DIR`` writes each run's full
JSON, to diff against another checkout's).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import simdist
import simdist as dist
from simdist import algorithms as alg

FIXTURE = Path(__file__).with_name("golden_traces.json")
HERE = {str(Path(__file__).parent), str(Path(__file__).resolve().parent)}
"""This folder, as call sites in traces name it: digests hold ``<tests>`` instead (a clone may live anywhere)."""


def values_of(rank: int, n: int, kind: str):
    """Rank ``rank``'s ``n`` input values (small integers: sums are exact in any order)."""
    vals = (np.arange(n) % 7 + rank + 1).astype(np.float32)
    return vals if kind == "numpy" else torch.from_numpy(vals)


def one_collective(rank: int, op: str, algorithm: str, n: int, kind: str):
    """``op`` by ``algorithm`` on ``n`` elements a rank; each rank's result as a list."""
    dist.init_process_group("gloo")
    p = dist.get_world_size()
    x = values_of(rank, n, kind)
    if op == "all_reduce":
        dist.all_reduce(x, algorithm=algorithm)
        out = x
    elif op == "broadcast":
        dist.broadcast(x, src=p - 1, algorithm=algorithm)
        out = x
    elif op == "reduce":
        dist.reduce(x, dst=1 % p, algorithm=algorithm)
        out = x
    elif op == "all_gather":
        outs = [values_of(0, n, kind) * 0 for _ in range(p)]
        dist.all_gather(outs, x, algorithm=algorithm)
        out = np.concatenate([np.asarray(o) for o in outs])
    elif op == "reduce_scatter":
        ins = [values_of(rank + i, n, kind) for i in range(p)]
        out = values_of(0, n, kind) * 0
        dist.reduce_scatter(out, ins, algorithm=algorithm)
    elif op == "all_to_all":
        ins = [values_of(rank * p + i, n, kind) for i in range(p)]
        outs = [values_of(0, n, kind) * 0 for _ in range(p)]
        dist.all_to_all(outs, ins, algorithm=algorithm)
        out = np.concatenate([np.asarray(o) for o in outs])
    elif op == "gather":
        outs = [values_of(0, n, kind) * 0 for _ in range(p)] if rank == 0 else None
        dist.gather(x, outs, dst=0, algorithm=algorithm)
        out = np.concatenate([np.asarray(o) for o in outs]) if outs else x
    elif op == "scatter":
        ins = [values_of(i, n, kind) for i in range(p)] if rank == p - 1 else None
        out = values_of(0, n, kind) * 0
        dist.scatter(out, ins, src=p - 1, algorithm=algorithm)
    else:
        dist.barrier(algorithm=algorithm)
        out = x
    dist.destroy_process_group()
    return np.asarray(out).tolist()


def mixed(rank: int):
    """Any-source receives, tagged and async point-to-point, a subgroup and an overlapped all_reduce."""
    dist.init_process_group("gloo")
    p = dist.get_world_size()
    got = []
    if rank == 0:
        buf = torch.zeros(3)
        for _ in range(2 * (p - 1)):
            src = dist.recv(buf)  # any source
            got.append((src, buf.tolist()))
    else:
        dist.send(torch.full((3,), float(rank)), dst=0)
        w = dist.isend(torch.full((3,), 10.0 * rank), dst=0, tag=0)
        w.wait()
    sub = dist.new_group([1, 2, 3])
    y = torch.arange(5.0) + rank
    work = dist.all_reduce(y, async_op=True, algorithm="recursive_doubling")
    if rank in (1, 2, 3):
        z = torch.ones(4) * rank
        dist.all_reduce(z, group=sub, algorithm="ring")
        got.append(z.tolist())
    if rank % 2 == 0 and rank + 1 < p:
        dist.send(torch.ones(2) * rank, dst=rank + 1, tag=7)
    elif rank % 2 == 1:
        b = torch.zeros(2)
        dist.recv(b, src=rank - 1, tag=7)
        got.append(b.tolist())
    work.wait()
    got.append(y.tolist())
    dist.destroy_process_group()
    return got


def cases() -> dict[str, tuple]:
    """Name -> (fn, nprocs, args, simulate keywords)."""
    out: dict[str, tuple] = {}
    for op, table in alg.ALGORITHMS.items():
        for name in table:
            for world, n in ((4, 37), (6, 5), (5, 1)):
                out[f"{op}/{name}/w{world}/n{n}"] = (one_collective, world, (op, name, n, "torch"), {})
    for op, name in (
        ("all_reduce", "ring"),
        ("all_reduce", "rabenseifner"),
        ("all_gather", "ring"),
        ("reduce_scatter", "ring"),
        ("barrier", "dissemination"),
    ):
        out[f"{op}/{name}/w6/n5/no-steps"] = (one_collective, 6, (op, name, 5, "torch"), {"record_steps": False})
    out["all_reduce/ring/numpy"] = (one_collective, 5, ("all_reduce", "ring", 9, "numpy"), {})
    out["all_gather/bruck/numpy"] = (one_collective, 5, ("all_gather", "bruck", 3, "numpy"), {})
    out["all_reduce/ring/w16/n256/no-steps"] = (
        one_collective,
        16,
        ("all_reduce", "ring", 256, "torch"),
        {"record_steps": False},
    )
    out["all_reduce/ring_pipelined/large"] = (
        one_collective,
        3,
        ("all_reduce", "ring_pipelined", (9 << 20) // 4, "torch"),
        {"record_steps": False},
    )
    out["reduce_scatter/ring_pipelined/large"] = (
        one_collective,
        3,
        ("reduce_scatter", "ring_pipelined", (9 << 20) // 4, "torch"),
        {"record_steps": False},
    )
    out["broadcast/chain_pipelined/large"] = (
        one_collective,
        4,
        ("broadcast", "chain_pipelined", (5 << 20) // 4, "torch"),
        {"record_steps": False},
    )
    for topo in ("ring", "two_level", "ib-hdr-4node"):
        out[f"all_reduce/rabenseifner/{topo}"] = (
            one_collective,
            8,
            ("all_reduce", "rabenseifner", 100, "torch"),
            {"topology": topo},
        )
    out["all_reduce/hierarchical/two_level"] = (  # 2 machines of 4 ranks: its two levels
        one_collective,
        8,
        ("all_reduce", "hierarchical", 100, "torch"),
        {"topology": "two_level"},
    )
    for seed in (0, 1, 2):
        out[f"mixed/seed{seed}"] = (mixed, 6, (), {"seed": seed})
    out["mixed/eager"] = (mixed, 6, (), {"seed": 3, "eager_limit": 64})
    out["mixed/round_robin"] = (mixed, 5, (), {"strategy": "round_robin"})
    out["mixed/pct"] = (mixed, 5, (), {"strategy": "pct", "seed": 4})
    out["all_to_all/direct/eager"] = (one_collective, 5, ("all_to_all", "direct", 3, "torch"), {"eager_limit": 1024})
    return out


def run_case(fn, nprocs, args, kw) -> tuple[dict, str]:
    """The run's digest (what the fixture stores) and its full trace JSON."""
    res = simdist.simulate(fn, nprocs, args, leaks="ignore", **kw)
    text = res.trace.to_json()
    for folder in sorted(HERE, key=len, reverse=True):
        text = text.replace(json.dumps(folder)[1:-1], "<tests>")
    digest = {
        "trace": hashlib.sha256(text.encode()).hexdigest(),
        "events": len(res.trace.events),
        "choices": hashlib.sha256(json.dumps(res.choices).encode()).hexdigest(),
        "schedule": res.schedule,
        "values": hashlib.sha256(json.dumps(res.values).encode()).hexdigest(),
    }
    return digest, text


CASES = cases()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ["threads", "processes"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_run_matches_golden(name, isolation):
    """Ranks as threads or as processes (``isolation``): the same trace, choices, token and values."""
    golden = json.loads(FIXTURE.read_text())
    assert name in golden, f"no golden digest for {name}: rewrite the fixture with --save"
    fn, nprocs, args, kw = CASES[name]
    digest, _ = run_case(fn, nprocs, args, {**kw, "isolation": isolation})
    assert digest == golden[name]


def test_fixture_names_every_case():
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(CASES)


def main(argv: list[str]) -> None:
    dump = Path(argv[argv.index("--dump") + 1]) if "--dump" in argv else None
    result = {}
    for name in sorted(CASES):
        result[name], text = run_case(*CASES[name])
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / (name.replace("/", "_") + ".json")).write_text(text)
    if "--save" in argv:
        FIXTURE.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    else:
        golden = json.loads(FIXTURE.read_text())
        bad = [n for n in sorted(CASES) if golden.get(n) != result[n]]
        print(f"{len(CASES) - len(bad)}/{len(CASES)} runs match" + (": differ " + ", ".join(bad) if bad else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
