"""(n2) The hierarchical all_reduce in 1, 2 and 4 pieces, side by side on network-namespace hosts.

    flock /tmp/simdist-bench.lock python benchmarks/bench_hierarchical_pieces.py [--iters 12] [--json PATH]
        [--links unshaped,1gbit,100mbit] [--layouts 4x2,2x2]

Issue 29, item 4. Needs root (``tests/support/netns_hosts.py``). The socket backend's ``hierarchical``
all_reduce cuts its buffer into pieces (``simdist.algorithms._chunks.pieces``) so that one piece's
phases within the machines run beside another's across them. Each job here (``simdist run --backend
socket`` on every host, H hosts x K ranks) forces the piece count of each iteration (it sets the
algorithm's piece size to ``S / P``), the counts alternating in order from iteration to iteration:
``barrier(); t0; all_reduce(algorithm="hierarchical"); t1`` on every rank. A case's time per count is
the median over the iterations after the first of the span (first rank's start to last rank's end, on
the monotonic clock the namespaces share) and of rank 0's ``t1 - t0``; the ratio is to 1 piece.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from _common import finish_info, machine_info, machine_markdown, markdown_table, write_json  # noqa: E402
from netns_hosts import NetnsTestbed, unavailable  # noqa: E402

LINKS = {"unshaped": (None, (4, 16, 64)), "1gbit": ("1gbit", (16, 32)), "100mbit": ("100mbit", (8, 16))}
"""Per link: the tc rate and the sizes in MiB."""
PIECES = (1, 2, 4)
PORT = 29960

RANK_SCRIPT = """
import json, sys, time
import torch
import simdist as d
from simdist.algorithms import _allreduce

sizes, counts, iters, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
d.init_process_group("socket")
mine = {}
for mib in sizes:
    t = torch.ones(mib * 2**18)
    for i in range(iters + 1):
        for p in counts if i % 2 else counts[::-1]:
            _allreduce.hierarchical.__kwdefaults__["piece_bytes"] = mib * 2**20 // p
            d.barrier()
            t0 = time.monotonic()
            d.all_reduce(t, algorithm="hierarchical")
            mine.setdefault(f"{mib}/{p}", []).append((t0, time.monotonic()))
every = [None] * d.get_world_size()
d.all_gather_object(every, mine)
if d.get_rank() == 0:
    open(out, "w").write(json.dumps(every))
d.destroy_process_group()
"""


def run_job(bed, hosts: int, per_host: int, sizes, iters: int, work: Path, port: int) -> list[dict]:
    script, out = work / "rank.py", work / f"out-{port}.json"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env["SIMDIST_SECRET"] = os.urandom(16).hex()
    procs = []
    for i in range(hosts):
        argv = [sys.executable, "-m", "simdist.run", "--backend", "socket", "--nnodes", str(hosts)]
        argv += ["--node-rank", str(i), "--master-addr", bed[0].address, "--master-port", str(port)]
        argv += ["--nproc-per-node", str(per_host), str(script), json.dumps(list(sizes)), json.dumps(PIECES)]
        argv += [str(iters), str(out)]
        procs.append(bed[i].popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    errors = []
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=900)
        if p.returncode:
            errors.append(f"host {i} exited {p.returncode}:\n{err[-2000:]}")
    if errors:
        raise RuntimeError("\n".join(errors))
    return json.loads(out.read_text())


def figures(ranks: list[dict], key: str) -> tuple[float, float]:
    """``(span, rank 0's time)``: medians over the iterations after the first."""
    per_rank = [r[key][1:] for r in ranks]
    spans = [max(t1 for _, t1 in its) - min(t0 for t0, _ in its) for its in zip(*per_rank)]
    return statistics.median(spans), statistics.median(t1 - t0 for t0, t1 in per_rank[0])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=12, help="timed iterations per piece count")
    parser.add_argument("--links", default=",".join(LINKS))
    parser.add_argument("--layouts", default="4x2,2x2", help="HOSTSxRANKS, comma-separated")
    parser.add_argument("--json", help="also write the raw figures as JSON to PATH")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"bench_hierarchical_pieces: hosts as network namespaces: {reason}")
    layouts = [tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(",")]
    info, t_start, rows, raw, port = machine_info(), time.perf_counter(), [], {}, PORT
    with tempfile.TemporaryDirectory(prefix="bench-pieces-") as tmp, NetnsTestbed(max(h for h, _ in layouts)) as bed:
        for link in args.links.split(","):
            rate, sizes = LINKS[link]
            for host in bed.hosts:
                host.shape(rate)
            for hosts, per_host in layouts:
                ranks = run_job(bed, hosts, per_host, sizes, args.iters, Path(tmp), port)
                port += 2
                raw[f"{link}/{hosts}x{per_host}"] = ranks
                for mib in sizes:
                    one = figures(ranks, f"{mib}/1")
                    row = [link, f"{hosts}x{per_host}", f"{mib} MiB"]
                    for p in PIECES:
                        span, rank0 = figures(ranks, f"{mib}/{p}")
                        row += [f"{span * 1e3:.1f}", f"{span / one[0]:.3f}", f"{rank0 / one[1]:.3f}"]
                    rows.append(row)
                    print(" | ".join(row), flush=True)
    finish_info(info)
    headers = ["link", "hosts x ranks", "size"]
    for p in PIECES:
        headers += [f"{p} piece{'s' if p > 1 else ''}: span ms", f"{p}: span / 1 piece", f"{p}: rank 0 / 1 piece"]
    text = (
        f"Whole run: {time.perf_counter() - t_start:.0f} s, {args.iters} timed iterations per piece count.\n\n"
        + markdown_table(headers, rows)
        + "\n\n"
        + machine_markdown(info)
    )
    print(text)
    payload = {"benchmark": "bench_hierarchical_pieces", "machine": info, "markdown": text, "raw": raw}
    if args.json:
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
