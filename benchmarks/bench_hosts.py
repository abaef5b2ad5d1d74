"""(n) Across hosts: the socket backend vs torch's gloo on hosts made as network namespaces.

    flock /tmp/simdist-bench.lock python benchmarks/bench_hosts.py [--reps 2] [--quick] [--json PATH]
        [--links unshaped,1gbit,100mbit] [--layouts 2x1,4x1,2x2,4x2] [--ops all_reduce,...]
        [--algorithm NAME] [--profile] [--profile-timer cpu|wall]

Issue 29, item 4. Needs root, iproute2 and tc (``tests/support/netns_hosts.py``). Four hosts, each a network
namespace whose ``eth0`` is one end of a veth pair on one bridge; a job of H hosts x K ranks runs
``python -m simdist.run --nnodes H --node-rank i --master-addr <host 0> --nproc-per-node K rank.py``
on each host i, as on a lab's machines: 2x1 (world 2), 4x1 and 2x2 (world 4), 4x2 (world 8). Ranks
of one host talk over shared memory (socket backend) or their host's own address (gloo); ranks of
different hosts over TCP through the bridge. Three links, every host's shaped alike in both
directions (tc ``tbf``): unshaped (1, 16, 64 MiB), 1 Gbit/s (1, 16, 32 MiB), 100 Mbit/s (256 KiB,
2 MiB, 8 MiB); all_reduce of float32 by default (``--ops`` adds broadcast, all_gather, reduce_scatter).

The two sides, one after the other in the same run, their order alternating per repetition, with the
loop body of (d) (``bench_socket``'s ``_check`` of the four ops, then per case warm-up calls and
``barrier(); t0; op; t1`` per timed iteration): **ours**, simdist's API (``import simdist as d``) under
``simdist run --backend socket``; **gloo**, ``torch.distributed`` under ``simdist run`` without
``--backend``, which leaves torch code on the backend it names, gloo (as under torchrun;
``GLOO_SOCKET_IFNAME=eth0``, since every namespace has the same host name). Every rank at 1 torch
intra-op thread. The time of a case is rank 0's median over its iterations, as in (d), then the median
over the repetitions. Every rank records its ``t0`` and ``t1`` on the machine's monotonic clock, which
the namespaces share, so the tables also give the **span**: per iteration, from the first rank's start to
the last rank's end (same medians). Rank 0's time can be shorter than the span: its peers may leave the
barrier and start sending before it does, and it may hold the result before they do; on a shaped link
that shows as rank 0's busbw above R. For broadcast rank 0 is the root, which returns once its sends
are queued: read the span there.

Bytes per op follow nccl-tests (see ``bench_socket``); busbw = S/t x 2(n-1)/n for all_reduce. The
ratio is ours/gloo busbw, target >= 1.0x in every case.

**busbw against the link rate.** Every all_reduce algorithm moves at least 2(n-1)/n x S into and out
of each rank, so with one rank per host each host's link carries at least that much each way, and
with links of rate R (shaped per direction, full duplex) busbw <= R: busbw / R is the share of the
link the collective used. With two ranks per host, numbered host by host, a ring in rank order
crosses each host's link once each way and carries the same 2(n-1)/n x S, so busbw <= R holds for it
too (gloo's all_reduce is such a ring). An algorithm that sends more between hosts is bound lower:
recursive halving (Rabenseifner) pairs ranks n/2 apart first, so both ranks of a host send half the
buffer across at once (the link carries 2 S each way at 2x2 and 3 S at 4x2, against the ring's 1.5 S
and 1.75 S: busbw <= 0.75 R and 0.58 R), and recursive doubling, which sends the whole buffer at every
step, 2 S and 4 S; one that reduces within a host first could exceed R. The
bytes on the wire are Ethernet frames: tbf counts 1514 bytes a frame for 1448 bytes of TCP payload,
so TCP's goodput tops out near 0.956 R; the plain TCP rate between two hosts (one stream, 1 MiB
``sendall`` into ``recv_into``) is measured per link in the same run and shown as the ceiling. tbf's
bucket holds 5 ms of traffic at the rate (625 KB at 1 Gbit/s, 62.5 KB at 100 Mbit/s): after the pause of
the barrier the first that many bytes of an op pass at the veth's speed, so ops of a few buckets read
above R (1 MiB at 1 Gbit/s: up to 1.07 R on the span) and 16 MiB ones up to 4% above. The
target, busbw >= 0.9 R at >= 16 MiB, is judged on the shaped links (1 Gbit/s: 16 and 32 MiB). Both
targets are judged on rank 0's time; the summary line also counts them on the span. The column "link
bytes/S" checks the accounting above: what each host's ``eth0`` sent per op (its namespace's counter,
barriers included) over S; headers are counted too, about 4.6% where tbf cuts the kernel's large send
segments into frames (100 Mbit/s), next to nothing where it does not.

``--algorithm NAME`` makes the socket side use that all_reduce algorithm (the group's default)
instead of its automatic choice; the tables name the algorithm the socket group ran per case.
``--profile`` re-runs the case with the lowest ratio on the socket side with rank 0's op loop under
cProfile.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from _common import (  # noqa: E402
    KIB,
    MIB,
    base_parser,
    finish_info,
    fmt_ms,
    fmt_ratio,
    machine_info,
    markdown_table,
    median,
    publish,
    verdict,
)
from bench_socket import bus_factor, size_label  # noqa: E402
from netns_hosts import NetnsTestbed, unavailable  # noqa: E402

from simdist.backends.socket import new_secret  # noqa: E402

RATIO_TARGET, LINK_TARGET, LINK_JUDGED_FROM = 1.0, 0.9, 16 * MIB
LINKS = {  # name: (tc rate, bits per second, {size: (warm-up calls, timed iterations)})
    "unshaped": (None, None, {1 * MIB: (3, 15), 16 * MIB: (2, 6), 64 * MIB: (1, 4)}),
    "1gbit": ("1gbit", 1e9, {1 * MIB: (2, 10), 16 * MIB: (1, 5), 32 * MIB: (1, 4)}),
    "100mbit": ("100mbit", 1e8, {256 * KIB: (2, 10), 2 * MIB: (1, 5), 8 * MIB: (1, 3)}),
}
QUICK_SIZES = {"unshaped": {1 * MIB: (1, 3)}, "1gbit": {16 * MIB: (1, 2)}, "100mbit": {256 * KIB: (1, 3)}}
LINK_TITLES = {"unshaped": "unshaped veth", "1gbit": "1 Gbit/s", "100mbit": "100 Mbit/s"}
LAYOUTS = ((2, 1), (4, 1), (2, 2), (4, 2))  # (hosts, ranks per host)
SIDES = ("socket", "gloo")
PORTS = iter(range(29800, 32000, 4))  # a fresh pair (torch store, simdist store) per job
JOB_TIMEOUT = 600

# One rank of a job. argv: side, output prefix, cases as JSON, algorithm or "", profiled case as JSON or "", timer.
# Every rank writes the (start, end) of each timed op on the machine's monotonic clock, which every namespace shares.
RANK_SCRIPT = """\
import json, sys, time, warnings
sys.path.insert(0, {bench_dir!r})
import torch
from bench_socket import _check, _make_call, _profiled_loop

def tx_bytes():
    \"\"\"Bytes sent so far by this host's eth0 (its namespace's counter; ``ip netns exec`` mounts its /sys).\"\"\"
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())

def chosen(op, nbytes):
    \"\"\"The all_reduce algorithm the socket group runs for ``nbytes``: its default, else its automatic choice.\"\"\"
    if side != "socket" or op != "all_reduce":
        return None
    from simdist.core._group import Options
    return current_world().default_group._pick(op, Options(), nbytes)

def timed_ops(d, rank, world, cases):
    \"\"\"bench_socket's loop body: the check, then per case warm-up calls and barrier(); t0; op; t1; around the
    timed iterations, the bytes this host sent (barriers included).\"\"\"
    _check(d, rank, world)
    out = {{}}
    for op, nbytes, warm, iters in cases:
        call = _make_call(d, op, nbytes, world)
        for _ in range(warm):
            d.barrier()
            call()
        stamps = []
        d.barrier()
        sent = tx_bytes()
        for _ in range(iters):
            d.barrier()
            t0 = time.perf_counter()
            call()
            stamps.append((t0, time.perf_counter()))
        d.barrier()
        tx = (tx_bytes() - sent) / iters
        out[f"{{op}}/{{nbytes}}"] = {{"stamps": stamps, "tx": tx, "algorithm": chosen(op, nbytes)}}
        del call
    d.barrier()
    return out

side, out_path, cases, algorithm, profiled, timer = sys.argv[1:7]
torch.set_num_threads(1)
if side == "socket":
    import simdist as d
    from simdist.core._world import current_world
    d.init_process_group("socket")
    if algorithm:
        current_world().default_group.set_default_algorithm("all_reduce", algorithm)
else:
    import torch.distributed as d
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's notice
    d.init_process_group("gloo")
rank, world = d.get_rank(), d.get_world_size()
try:
    if profiled:
        result = _profiled_loop(d, rank, world, tuple(json.loads(profiled)), timer)
    else:
        result = timed_ops(d, rank, world, [tuple(c) for c in json.loads(cases)])
finally:
    d.destroy_process_group()
if result is not None:
    with open(f"{{out_path}}.{{rank}}", "w") as f:
        json.dump(result, f)
"""

# Plain TCP between two hosts: one stream of 1 MiB sendall into 1 MiB recv_into; receiver prints bytes/s.
TCP_RECEIVER = """\
import socket, time
srv = socket.create_server(("0.0.0.0", 5201))
print("ready", flush=True)
conn, _ = srv.accept()
view = memoryview(bytearray(1 << 20))
got = conn.recv_into(view)
t0 = time.perf_counter()
while n := conn.recv_into(view):
    got += n
print(got / (time.perf_counter() - t0), flush=True)
"""
TCP_SENDER = """\
import socket, sys
with socket.create_connection((sys.argv[1], 5201)) as s:
    buf = bytearray(1 << 20)
    for _ in range(int(sys.argv[2])):
        s.sendall(buf)
"""


def layout_label(layout: tuple[int, int]) -> str:
    return f"{layout[0]}x{layout[1]}"


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "SIMDIST_SECRET")}
    env.update(extra)
    return env


def run_job(bed, layout, side: str, cases: list, work: Path, algorithm: str = "", profiled=None, timer="cpu"):
    """One job on the first ``layout[0]`` hosts of ``bed``: per rank, each case's (start, end) per timed op
    (with ``profiled``: rank 0's profile)."""
    hosts, per_node = layout
    port = next(PORTS)
    out = work / f"result-{port}.json"
    script = work / "rank.py"
    env = _env({"SIMDIST_SECRET": new_secret(), "GLOO_SOCKET_IFNAME": "eth0"})
    backend = ["--backend", "socket"] if side == "socket" else []
    procs = []
    for i in range(hosts):
        argv = [sys.executable, "-m", "simdist.run", *backend, "--nnodes", str(hosts), "--node-rank", str(i)]
        argv += ["--master-addr", bed[0].address, "--master-port", str(port), "--nproc-per-node", str(per_node)]
        argv += [str(script), side, str(out), json.dumps(cases), algorithm, json.dumps(profiled) if profiled else ""]
        argv.append(timer)
        procs.append(bed[i].popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work))
    errors = []
    try:
        for i, p in enumerate(procs):
            _, err = p.communicate(timeout=JOB_TIMEOUT)
            if p.returncode != 0:
                errors.append(f"host {i} exited {p.returncode}:\n{err[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for i in range(hosts):
            bed[i].processes.clear()
    files = sorted(work.glob(f"{out.name}.*"), key=lambda f: int(f.suffix[1:]))
    if errors or not files:
        raise RuntimeError(f"{side} job {layout_label(layout)} failed:\n" + "\n".join(errors))
    results = []
    for f in files:
        results.append(json.loads(f.read_text(encoding="utf-8")))
        f.unlink()
    return results[0] if profiled else results


def tcp_ceiling(bed, rate_bits: float | None) -> float:
    """Plain TCP bytes/s from host 0 to host 1 (one stream), about 2 s of traffic."""
    chunks = 2048 if rate_bits is None else max(16, int(2 * rate_bits / 8 / MIB))
    recv = bed[1].popen([sys.executable, "-c", TCP_RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout is None or recv.stdout.readline().strip() != "ready":
            raise RuntimeError("the TCP receiver on host 1 did not start")
        sent = bed[0].run([sys.executable, "-c", TCP_SENDER, bed[1].address, str(chunks)], timeout=120)
        if sent.returncode != 0:
            raise RuntimeError(f"TCP sender failed: {sent.stderr[-1000:]}")
        return float(recv.stdout.readline())
    finally:
        recv.kill()
        recv.wait(timeout=10)
        bed[1].processes.clear()


# --- measuring -------------------------------------------------------------------------------------


def measure(bed, links: list, layouts: list, ops: list, reps: int, quick: bool, algorithm: str, work: Path) -> dict:
    ceilings, runs = {}, {}
    for link in links:
        rate, bits, iters = LINKS[link]
        sizes = QUICK_SIZES[link] if quick else iters
        cases = [(op, s, *sizes[s]) for s in sizes for op in ops]
        for host in bed.hosts:
            host.shape(rate)
        ceilings[link] = tcp_ceiling(bed, bits)
        print(f"{link}: plain TCP {ceilings[link] / 1e6:.1f} MB/s", file=sys.stderr, flush=True)
        for r in range(reps):
            for layout in layouts:
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    t0 = time.perf_counter()
                    res = run_job(bed, layout, side, cases, work, algorithm if side == "socket" else "")
                    runs.setdefault(f"{link}/{layout_label(layout)}/{side}", []).append(res)
                    print(
                        f"  rep {r + 1}/{reps} {link} {layout_label(layout)} {side}: {time.perf_counter() - t0:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    return {"ceilings": ceilings, "runs": runs}


# --- report ----------------------------------------------------------------------------------------


def _mbs(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def _bw(x: float, link_bytes: float | None) -> str:
    """A busbw as a share of the link rate, or in MB/s on an unshaped link."""
    return f"{x / link_bytes:.2f}" if link_bytes else _mbs(x)


def op_times(ranks: list, key: str, per_node: int) -> tuple[float, float, float]:
    """One job's (rank 0's median op time, median span over all ranks, median over hosts of the bytes a host's
    link sent per op) for case ``key``.

    The span of an iteration is from the first rank's start to the last rank's end: rank 0 may start
    after its peers have begun sending, or finish before they have received their last bytes."""
    stamps = [r[key]["stamps"] for r in ranks]
    rank0 = median(end - start for start, end in stamps[0])
    spans = (max(s[i][1] for s in stamps) - min(s[i][0] for s in stamps) for i in range(len(stamps[0])))
    return rank0, median(spans), median(r[key]["tx"] for r in ranks[::per_node])


def report(measured: dict, links: list, layouts: list, ops: list, quick: bool) -> tuple:
    raw, verdicts, parts = [], [], []
    for link in links:
        rate, bits, iters = LINKS[link]
        sizes = QUICK_SIZES[link] if quick else iters
        link_bytes = bits / 8 if bits else None
        tcp = measured["ceilings"][link]
        rows = []
        for layout in layouts:
            hosts, per_node = layout
            world = hosts * per_node
            for op in ops:
                for s in sizes:
                    key = f"{op}/{s}"
                    per_rep = {
                        side: [
                            op_times(job, key, per_node)
                            for job in measured["runs"][f"{link}/{layout_label(layout)}/{side}"]
                        ]
                        for side in SIDES
                    }
                    t = {side: median(x[0] for x in per_rep[side]) for side in SIDES}
                    span = {side: median(x[1] for x in per_rep[side]) for side in SIDES}
                    sent = {side: median(x[2] for x in per_rep[side]) / s for side in SIDES}
                    f = bus_factor(op, world)
                    bus = {side: s / t[side] * f for side in SIDES}
                    span_bus = {side: s / span[side] * f for side in SIDES}
                    ratio, span_ratio = bus["socket"] / bus["gloo"], span_bus["socket"] / span_bus["gloo"]
                    share = {side: bus[side] / link_bytes for side in SIDES} if link_bytes else None
                    span_share = {side: span_bus[side] / link_bytes for side in SIDES} if link_bytes else None
                    entry = {
                        "link": link,
                        "hosts": hosts,
                        "ranks_per_host": per_node,
                        "world": world,
                        "op": op,
                        "bytes": s,
                        "size": size_label(s),
                        "algorithm": measured["runs"][f"{link}/{layout_label(layout)}/socket"][0][0][key]["algorithm"]
                        or "-",
                        "gloo_s": t["gloo"],
                        "socket_s": t["socket"],
                        "gloo_busbw": bus["gloo"],
                        "socket_busbw": bus["socket"],
                        "ratio": ratio,
                        "socket_link_share": share and share["socket"],
                        "gloo_link_share": share and share["gloo"],
                        "span_gloo_s": span["gloo"],
                        "span_socket_s": span["socket"],
                        "span_ratio": span_ratio,
                        "span_socket_link_share": span_share and span_share["socket"],
                        "span_gloo_link_share": span_share and span_share["gloo"],
                        "gloo_link_bytes_per_S": sent["gloo"],
                        "socket_link_bytes_per_S": sent["socket"],
                        "per_rep_rank0_s_span_s_link_bytes": per_rep,
                    }
                    raw.append(entry)
                    ok_ratio = ratio >= RATIO_TARGET
                    verdicts.append({**entry, "target": "ratio", "met": ok_ratio})
                    marks = [f">= 1.0x gloo: {verdict(ok_ratio)}"]
                    if bool(link_bytes) and s >= LINK_JUDGED_FROM and op == "all_reduce":
                        ok_link = share["socket"] >= LINK_TARGET
                        verdicts.append({**entry, "target": "link", "met": ok_link})
                        marks.append(f">= 0.9 R: {verdict(ok_link)}")
                    rows.append(
                        [
                            layout_label(layout),
                            world,
                            *([op] if len(ops) > 1 else []),
                            size_label(s),
                            entry["algorithm"],
                            fmt_ms(t["gloo"], 2),
                            fmt_ms(t["socket"], 2),
                            _bw(bus["gloo"], link_bytes),
                            _bw(bus["socket"], link_bytes),
                            f"{ratio:.3f}x",
                            fmt_ms(span["gloo"], 2),
                            fmt_ms(span["socket"], 2),
                            _bw(span_bus["gloo"], link_bytes),
                            _bw(span_bus["socket"], link_bytes),
                            f"{span_ratio:.3f}x",
                            f"{sent['gloo']:.2f}",
                            f"{sent['socket']:.2f}",
                            "; ".join(marks),
                        ]
                    )
        unit = "/R" if link_bytes else " MB/s"
        headers = [
            "hosts x ranks",
            "world",
            *(["op"] if len(ops) > 1 else []),
            "size",
            "ours: algorithm",
            "gloo ms",
            "ours ms",
            f"gloo busbw{unit}",
            f"ours busbw{unit}",
            "ours/gloo",
            "span: gloo ms",
            "span: ours ms",
            f"span: gloo busbw{unit}",
            f"span: ours busbw{unit}",
            "span: ours/gloo",
            "link bytes/S: gloo",
            "link bytes/S: ours",
            "target (rank 0's time)",
        ]
        rate_text = f"link rate R = {_mbs(link_bytes)} MB/s; " if link_bytes else ""
        share_text = f" ({tcp / link_bytes:.3f} R)" if link_bytes else ""
        parts.append(
            f"**{LINK_TITLES[link]}** ({rate_text}plain TCP host 0 -> host 1, one stream: "
            f"{_mbs(tcp)} MB/s{share_text}):\n\n" + markdown_table(headers, rows)
        )
    ratio_v = [v for v in verdicts if v["target"] == "ratio"]
    link_v = [v for v in verdicts if v["target"] == "link"]

    def misses(vs: list, field: str, fmt) -> str:
        missed = [v for v in vs if not v["met"]]
        if not missed:
            return "none missed"
        return "missed: " + ", ".join(
            f"{v['link']} {v['hosts']}x{v['ranks_per_host']} {'' if v['op'] == 'all_reduce' else v['op'] + ' '}"
            f"{v['size']} ({fmt(v[field])})"
            for v in missed
        )

    span_ok = sum(v["span_ratio"] >= RATIO_TARGET for v in ratio_v)
    span_link_ok = sum(v["span_socket_link_share"] >= LINK_TARGET for v in link_v)
    summary = (
        f"Verdict (rank 0's time): busbw >= 1.0x gloo in {sum(v['met'] for v in ratio_v)} of {len(ratio_v)} cases "
        f"({misses(ratio_v, 'ratio', '{:.3f}x'.format)}); busbw >= 0.9 R at >= 16 MiB in "
        f"{sum(v['met'] for v in link_v)} of {len(link_v)} cases "
        f"({misses(link_v, 'socket_link_share', '{:.2f} R'.format)}). On the span over all ranks: "
        f"{span_ok} of {len(ratio_v)} and {span_link_ok} of {len(link_v)}."
    )
    parts.append(summary)
    return "\n\n".join(parts), raw, verdicts


def _terminate(signum, frame):  # SIGTERM: unwind, so that the testbed's namespaces are removed
    raise SystemExit(128 + signum)


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--links", default=",".join(LINKS), help="comma-separated links (default: all three)")
    parser.add_argument("--layouts", default=",".join(map(layout_label, LAYOUTS)), help="HOSTSxRANKS, comma-separated")
    parser.add_argument("--ops", default="all_reduce", help="comma-separated ops (default all_reduce)")
    parser.add_argument("--algorithm", default="", help="all_reduce algorithm for the socket side (default: automatic)")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"bench_hosts: hosts as network namespaces: {reason}")
    links = args.links.split(",")
    layouts = [tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(",")]
    ops = args.ops.split(",")
    reps = args.reps or (1 if args.quick else 2)
    signal.signal(signal.SIGTERM, _terminate)
    info = machine_info()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, NetnsTestbed(max(h for h, _ in layouts)) as bed:
        work = Path(tmp)
        (work / "rank.py").write_text(RANK_SCRIPT.format(bench_dir=str(HERE)))
        measured = measure(bed, links, layouts, ops, reps, args.quick, args.algorithm, work)
        elapsed = time.perf_counter() - t_start
        finish_info(info)
        text, raw, verdicts = report(measured, links, layouts, ops, args.quick)
        head = (
            f"float32, {', '.join(ops)}; per-op time = median over repetitions ({reps}, sides "
            "alternating) of rank 0's median over its timed iterations (barrier before each op); span = the same "
            "medians of (last rank's end - first rank's start) per iteration; R = the link's shaped rate; "
            "link bytes/S = bytes a host's eth0 sent per timed op (barriers included; median over hosts) / the "
            "buffer's bytes S; "
            "MB/s = 1e6 bytes/s; every rank at 1 torch intra-op thread"
            + (f"; socket side forced to all_reduce algorithm {args.algorithm!r}" if args.algorithm else "")
            + f". Whole run: {elapsed:.0f} s."
        )
        text = head + "\n\n" + text

        def profile(timer: str, quick: bool) -> str:
            worst = min((v for v in verdicts if v["target"] == "ratio"), key=lambda v: v["ratio"])
            link, layout = worst["link"], (worst["hosts"], worst["ranks_per_host"])
            for host in bed.hosts:
                host.shape(LINKS[link][0])
            sizes = QUICK_SIZES[link] if quick else LINKS[link][2]
            case = [worst["op"], worst["bytes"], *sizes[worst["bytes"]]]
            prof = run_job(bed, layout, "socket", [], work, args.algorithm, profiled=case, timer=timer)
            return (
                f"Profile of rank 0, socket backend, {worst['op']} {worst['size']} on {link}, "
                f"{layout_label(layout)} (ratio {fmt_ratio(worst['ratio'])}), {case[3]} iterations, {timer} time:"
                f"\n\n```\n{prof}```"
            )

        return publish(
            "bench_hosts",
            args,
            info,
            reps,
            raw,
            text,
            verdicts,
            profile,
            ceilings={f"tcp_{link}_Bps": v for link, v in measured["ceilings"].items()},
            link_rates_bps={link: LINKS[link][1] for link in links},
            elapsed_s=elapsed,
        )


if __name__ == "__main__":
    main()
