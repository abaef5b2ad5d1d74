"""(p) The control plane's load on the store: a job's ranks waiting, old polling vs the heartbeat's watch.

    python benchmarks/bench_control_plane.py --old COMMIT [--worlds 8 16 32] [--json PATH]

Issue 29, item 6. Four hosts made as network namespaces (``tests/support/netns_hosts.py``, needs root), a
job of 8, 16 or 32 ranks spread evenly over them (``simdist run --nnodes 4`` on each host, the socket
backend). Rank 0 sleeps ``WAIT_S`` seconds while the others wait in an all_reduce; node 0's launcher
serves the store and logs its load each second (``--log-dir``: ``store_load.jsonl``: requests and
keys served, and the launcher's CPU time, which is the store's while the ranks print nothing). The
figures are the rates over the wait, from 1 s after it began to 0.5 s before it ended.

Both sides run with this tree's launcher and store; the ranks of "old" import simdist from an
export of ``COMMIT`` (``git archive``), whose waits read the failure records, heartbeats and
goodbyes of every rank they depend on every 0.5 s; the ranks of "new" are this tree's, whose
heartbeat reads one failure key and one other rank's heartbeat every 0.5 s and whose waits ask it.
Expected per second, from the designs, with n - 1 ranks waiting and rank 0 asleep: old
3n - 2 requests and n + 8 (n - 1)^2 keys (a heartbeat per rank, and 2 reads of 4 keys of each of
the n - 1 others per waiting rank); new 3n requests and 9n keys.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import machine_info, machine_markdown, markdown_table, write_json  # noqa: E402
from netns_hosts import NetnsTestbed, unavailable  # noqa: E402

from simdist.backends.socket import new_secret  # noqa: E402

HOSTS = 4
# this tree's launcher (and store) whatever PYTHONPATH says; its ranks import simdist from PYTHONPATH
LAUNCHER = (
    "-c",
    f"import sys; sys.path.insert(0, {str(ROOT)!r}); from simdist.launch.run import main; sys.exit(main())",
)
WAIT_S = 8.0

JOB = """\
import os, time
import torch
import simdist as dist

tree = os.environ["PYTHONPATH"]
if not dist.__file__.startswith(tree):
    raise SystemExit(f"simdist from {dist.__file__}, not from {tree}")
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
dist.all_reduce(t)
if rank == 0:
    start = time.time()
    time.sleep(WAIT_S)
    print(f"waited {start:.3f} {time.time():.3f}", flush=True)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def run(world: int, tree: str | None, work: Path) -> dict:
    """One job of ``world`` ranks on 4 hosts; the store's rates while the ranks wait."""
    script = work / "job.py"
    script.write_text(JOB.replace("WAIT_S", repr(WAIT_S)))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env.update({"SIMDIST_SECRET": new_secret(), "OMP_NUM_THREADS": "1", "PYTHONPATH": tree or str(ROOT)})
    logs = work / f"logs-{world}-{'old' if tree else 'new'}"
    with NetnsTestbed(HOSTS) as bed:
        options = ["--backend", "socket", "--timeout", "300", "--log-dir", f"{logs}/host{{host}}"]
        nodes = bed.launch(
            str(script), per_host=world // HOSTS, port=29730, env=env, options=options, launcher=LAUNCHER
        )
        ends = [node.communicate(timeout=600) for node in nodes]
    if any(node.returncode for node in nodes):
        failed = next(iter(sorted(logs.glob("host*/rank_*.log"))), None)
        raise RuntimeError(
            f"world {world} ({'old' if tree else 'new'}) failed: {ends}\n{failed and failed.read_text()[-3000:]}"
        )
    start, end = map(
        float, re.search(r"waited ([\d.]+) ([\d.]+)", (logs / "host0" / "rank_0.log").read_text()).groups()
    )
    samples = [json.loads(line) for line in (logs / "host0" / "store_load.jsonl").read_text().splitlines()]
    during = [s for s in samples if start + 1.0 <= s["time"] <= end - 0.5]
    seconds = during[-1]["time"] - during[0]["time"]
    rate = {k: (during[-1][k] - during[0][k]) / seconds for k in ("requests", "keys", "cpu")}
    return {"world": world, "seconds": seconds, **rate}


def render(results: dict[str, list[dict]]) -> str:
    """The markdown table of ``results`` (``{"old": [...], "new": [...]}``, one entry per world)."""
    rows = []
    for old, new in zip(results["old"], results["new"]):
        n = old["world"]
        rows.append([
            n,
            f"{old['requests']:.0f}", f"{new['requests']:.0f}",
            f"{old['keys']:.0f}", f"{new['keys']:.0f}", f"{old['keys'] / new['keys']:.1f}x",
            f"{1000 * old['cpu']:.0f}", f"{1000 * new['cpu']:.0f}",
            f"{n + 8 * (n - 1) ** 2} / {9 * n}",
        ])  # fmt: skip
    headers = [
        "ranks", "requests/s old", "requests/s new", "keys/s old", "keys/s new", "old/new keys",
        "store CPU ms/s old", "store CPU ms/s new", "keys/s expected old / new",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, metavar="COMMIT", help="the commit whose ranks poll the old way")
    p.add_argument("--worlds", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"hosts as network namespaces: {reason}")
    info = machine_info()
    results: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="simdist-control-plane-") as tmp:
        work = Path(tmp)
        old_tree = work / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
        for world in args.worlds:
            for side, tree in (("old", str(old_tree)), ("new", None)):
                figures = run(world, tree, work)
                results[side].append(figures)
                print(f"world {world} {side}: {figures}", flush=True)
    table = render(results)
    print(machine_markdown(info))
    print(table)
    if args.json:
        write_json(args.json, {"machine": info, "old": args.old, "wait_s": WAIT_S, "results": results, "table": table})
    return results


if __name__ == "__main__":
    main()
