"""Shared helpers for the simdist benchmarks (timing, torch's threaded group, tables, profiles).

Benchmarks are scripts, not tests: each prints markdown tables that can be pasted into
BENCHMARKS.md and can write its raw figures as JSON (``--json PATH``). Nothing here is
imported by simdist or by the test suite.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as _dt
import io
import json
import os
import platform
import pstats
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

import simdist

__all__ = [
    "KIB",
    "MIB",
    "base_parser",
    "bench_main",
    "finish_info",
    "fmt_int",
    "fmt_ms",
    "fmt_ratio",
    "machine_info",
    "machine_markdown",
    "markdown_table",
    "median",
    "profile_call",
    "run_sim",
    "run_threaded",
    "timed",
    "timed_cpu",
    "verdict",
    "write_json",
]

KIB = 1024
MIB = 1024 * 1024


# --- the machine ------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """What the figures were measured on (``nproc``, CPU model, versions, date)."""
    return {
        "date": _dt.date.today().isoformat(),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "simdist": getattr(simdist, "__version__", "?"),
        "switchinterval_s": sys.getswitchinterval(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def machine_markdown(info: dict[str, Any] | None = None) -> str:
    info = info or machine_info()
    return (
        f"Machine: {info['cpu']}, nproc {info['nproc']} (usable {info['affinity']}), "
        f"{info['platform']}; Python {info['python']} ({info['implementation']}), "
        f"torch {info['torch']} ({info['torch_threads']} intra-op threads), simdist {info['simdist']}; "
        f"date {info['date']}; 1-min load average {_load_text(info)}."
        + (
            " **Other work was running on the machine: absolute times are inflated; ratios measured side by "
            "side (interleaved) hold better.**"
            if _busy(info)
            else ""
        )
    )


def finish_info(info: dict[str, Any]) -> dict[str, Any]:
    """Record the load average after measuring (call at the end of a benchmark)."""
    info["loadavg_1m_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return info


def _load_text(info: dict[str, Any]) -> str:
    a, b = info.get("loadavg_1m"), info.get("loadavg_1m_end")
    if a is None:
        return "unknown"
    return f"{a:.2f} at start" + (f", {b:.2f} at end" if b is not None else "")


def _busy(info: dict[str, Any]) -> bool:
    n = info.get("nproc") or 1
    loads = [x for x in (info.get("loadavg_1m"), info.get("loadavg_1m_end")) if x is not None]
    return bool(loads) and max(loads) > 0.5 * n + 1.0


# --- timing -------------------------------------------------------------------------------


def median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall-clock seconds of one call of ``fn()`` and its result."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def timed_cpu(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall-clock seconds, process CPU seconds (all threads) of one call of ``fn()``, and its result."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def run_sim(fn: Callable, nprocs: int, args: tuple = (), **options: Any):
    """``simdist.simulate`` with leak reports off (benchmarks measure speed, not hygiene)."""
    options.setdefault("leaks", "ignore")
    return simdist.simulate(fn, nprocs, args=args, **options)


# --- torch's own threaded test process group ----------------------------------------------


def run_threaded(fn: Callable, world_size: int, args: tuple = ()) -> list:
    """Run ``fn(rank, *args)`` on ``world_size`` threads over torch's threaded test group.

    This is what torch's own tests do (``spawn_threads_and_init_comms`` and
    ``MultiThreadedTestCase._spawn_threads`` in
    ``torch/testing/_internal/common_distributed.py``): turn on thread isolation, install
    the thread-local world (``_install_threaded_pg``), share one ``HashStore``, and let each
    thread call ``init_process_group("threaded", rank=r, world_size=n, store=store)``.
    Here the process group is initialised before ``fn`` runs and destroyed after; the
    ranks' return values come back in rank order and the first failure is re-raised.
    """
    import torch.distributed as tdist
    from torch.testing._internal.distributed import multi_threaded_pg as mtp

    # every init_process_group chains a "[rankN]: " prefixing sys.excepthook; put it back afterwards
    saved_hook = sys.excepthook
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    world = mtp._install_threaded_pg()
    store = tdist.HashStore()
    values: list = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def worker(rank: int) -> None:
        try:
            tdist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            values[rank] = fn(rank, *args)
        except BaseException as exc:  # noqa: BLE001 - reported below, like torch's harness
            errors.append((rank, exc))
            mtp.ProcessLocalGroup.exception_handle(exc)
        finally:
            if tdist.distributed_c10d._world is world and tdist.is_initialized():
                tdist.destroy_process_group()

    threads = [threading.Thread(target=worker, args=(r,), name=f"threaded-pg-{r}") for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
            if t.is_alive():
                raise TimeoutError(f"{t.name} did not finish within 300 s (torch threaded group hang)")
    finally:
        mtp.ProcessLocalGroup.reset()
        mtp._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        sys.excepthook = saved_hook
    if errors:
        rank, exc = errors[0]
        raise RuntimeError(f"rank {rank} failed on torch's threaded group: {exc!r}") from exc
    return values


# --- tables -------------------------------------------------------------------------------


def fmt_ms(seconds: float | None, digits: int = 3) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def fmt_int(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (numbers right-aligned)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in cells) if cells else False for i in range(len(headers))]

    def line(vals: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, numeric)) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if n else ("-" * (w + 2)) for w, n in zip(widths, numeric)) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


def _is_number(s: str) -> bool:
    s = s.replace(",", "").rstrip("x%").lstrip("<>~")
    try:
        float(s)
        return True
    except ValueError:
        return s == "-"


# --- profiles -------------------------------------------------------------------------------


def profile_call(fn: Callable[[], Any], *, top: int = 25, timer: str = "cpu") -> str:
    """Run ``fn()`` under cProfile in *every* thread; return the top ``top`` rows by tottime.

    cProfile only sees the thread that enabled it, and the simulator runs user code and
    its own scheduling on rank threads, so a profiler is started in each new thread (through
    ``threading.setprofile``) and the per-thread statistics are merged. ``timer='cpu'``
    (default) uses per-thread CPU time (``time.thread_time``): a rank blocked on the baton
    costs nothing, so the table shows where CPU goes. ``timer='wall'`` uses wall-clock time,
    where the baton hand-off shows up as time in ``lock.acquire``.
    """
    clock = time.thread_time if timer == "cpu" else time.perf_counter
    profiles: list[cProfile.Profile] = []
    guard = threading.Lock()

    def hook(frame, event, arg):  # runs once, on the first call in each new thread
        sys.setprofile(None)
        p = cProfile.Profile(clock)
        with guard:
            profiles.append(p)
        p.enable()

    main = cProfile.Profile(clock)
    threading.setprofile(hook)
    main.enable()
    try:
        fn()
    finally:
        main.disable()
        threading.setprofile(None)
    stats = pstats.Stats(main, stream=io.StringIO())
    for p in profiles:
        stats.add(p)
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    keep = text[text.find("   ncalls") :] if "   ncalls" in text else text
    total = f"{len(profiles) + 1} threads profiled ({timer} time), total {stats.total_tt:.3f} s\n"
    return total + keep.rstrip() + "\n"


# --- command line -----------------------------------------------------------------------------


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--reps", type=int, default=None, help="repetitions per figure (median reported)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and iterations (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="also write the raw figures as JSON to PATH")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after measuring, profile the benchmark's slowest case (cProfile, top 25 by tottime)",
    )
    p.add_argument(
        "--profile-timer",
        choices=("cpu", "wall"),
        default="cpu",
        help="profile clock: per-thread CPU time (default) or wall time",
    )
    return p


def write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")


def publish(
    name: str,
    args: argparse.Namespace,
    info: dict[str, Any],
    reps: int,
    raw: Any,
    text: str,
    verdicts: list,
    profile: Callable[[str, bool], str],
    **extra: Any,
) -> dict[str, Any]:
    """Print a benchmark's tables and machine line, add its profile if asked, write its JSON if asked."""
    print(text)
    print(machine_markdown(info))
    result = {
        "benchmark": name,
        "machine": info,
        "reps": reps,
        "raw": raw,
        "verdicts": verdicts,
        **extra,
        "markdown": text,
    }
    if args.profile:
        prof = profile(args.profile_timer, args.quick)
        print("\n" + prof)
        result["profile"] = prof
    if args.json:
        write_json(args.json, result)
    return result


def bench_main(
    doc: str,
    name: str,
    measure: Callable[[int, bool], Any],
    report: Callable[[Any, int], tuple],
    profile: Callable[[str, bool], str],
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A benchmark's ``main``: parse the common options, measure, report and publish."""
    args = base_parser(doc.splitlines()[0]).parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    info = machine_info()
    raw = measure(reps, args.quick)
    finish_info(info)
    text, verdicts = report(raw, reps)
    return publish(name, args, info, reps, raw, text, verdicts, profile)
