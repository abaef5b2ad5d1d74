"""The causes of failures of torch's own distributed tests on simdist's sides of ``torch_suite.py``.

One table per side other than gloo (:data:`CAUSES`): ``(cause, pattern, what would fix it)``. The pattern
is searched in a failure's ``error | test_line | call | torch_call | blocked | simdist_frame | deepest``
(``torch_suite.classify``); the first match wins. The fixes name the bridge's ProcessGroup method torch
calls, as torch calls it. Causes since fixed stay, so that ``--report`` names them in earlier runs.
"""

from __future__ import annotations

__all__ = ["CAUSES", "SIM_CAUSES", "SOCKET_CAUSES"]

# Failures on simulated ranks.
SIM_CAUSES: list[tuple[str, str, str]] = [
    (
        "profiler: crash in the shared session",
        r"^crashed: .*simdist/torch_bridge/profiler\.py",
        "a SIGSEGV in torch's profiler __exit__ (profiler.py:434) on the bridge's Kineto thread, called from "
        "simdist/torch_bridge/profiler.py _exit, while the other rank is inside a bridged op (all_gather within "
        "allgather_coalesced); schedule-dependent (seed 0 crashes, 1-3 pass; `--only "
        "'^test_all_gather_coalesced_complex$' --sim-only --seed 0` reproduces it). Suspect: the session is "
        "stopped while that rank's op record is open (started, not ended; not reproduced outside the simulator); "
        "ending the other ranks' open op records before a stop, or recording ops as instant events and setting "
        "is_async afterwards (a prototype that did so passed every profiler test), would rule it out",
    ),
    (
        "profiler: the shared session's stop calls torch.cuda off the rank",
        r"Torch not compiled with CUDA enabled.*profiler\.py",
        "torch.profiler.profile(activities=[CPU, CUDA]) on a simulated GPU: the bridge runs profile.__exit__ on its "
        "Kineto thread, where the rank's simulated torch.cuda is not in effect, and __exit__ calls "
        "torch.cuda.synchronize() (use_device='cuda'): the real, CPU-only torch.cuda raises. Synchronize on the "
        "rank thread first and run the stop without use_device",
    ),
    (
        "profiler: two rank threads open torch's profiler",
        r"(crashed: .*profiler|torch's profiler is already profiling)",
        "torch's profiler (Kineto) holds one session per process and crashes when sessions start and stop on "
        "different threads; every rank opens torch.autograd.profiler.profile (or torch.profiler.profile) and then "
        "counts the backend's events. Bridge: one shared session with _ExperimentalConfig(profile_all_threads=True), "
        "started and stopped on one dedicated thread; a rank's _start_trace joins it and records a marker event on "
        "its thread; its __exit__ stops it (restarting it if other ranks are still inside) and keeps the events of "
        "its own thread; every bridged op records '<get_backend()>:<gloo title>' on the rank thread, and the bridge "
        "sets that event's input_shapes and is_async=True as gloo's are (a global session records no inputs for a "
        "Python record function)",
    ),
    (
        "DDP's logging data names the backend 'simdist'",
        r"'simdist' != 'gloo'.*test_ddp_logging_data",
        "DDP's C++ Logger takes backend_name from ProcessGroup.getBackendName() ('simdist'); answering 'gloo' "
        "there makes it static_cast the group's GLOO backend ('Could not find backend type 1'). The bridge can "
        "correct DistributedDataParallel._get_ddp_logging_data(): backend_name = get_backend(process_group) and, "
        "for 'gloo', what the logger adds for ProcessGroupGloo (gloo_socket_ifname and gloo_device_transport from "
        "the environment or 'N/A', gloo_num_threads 2)",
    ),
    (
        "get_backend() answers 'simdist'",
        r"'simdist' != 'gloo'|only implemented for GLOO backend",
        "torch.distributed.get_backend(group) must answer the name the program gave ('gloo'); "
        "monitored_barrier checks it before calling ProcessGroup.monitored_barrier(timeout, wait_all_ranks)",
    ),
    (
        "bridge lacks a ProcessGroup method",
        r"No backend type associated with device type",
        "torch called a ProcessGroup method the bridge does not define (see the torch call): define it",
    ),
    (
        "allgather_coalesced reads its outputs the wrong way round",
        r"expected \d+ \(the group size\).*allgather_coalesced",
        "torch calls ProcessGroup.allgather_coalesced(output_tensor_lists, input_tensor_list, opts) with "
        "output_tensor_lists[r][i] receiving rank r's input_tensor_list[i] (one list per rank); the bridge's "
        "allgather_coalesced = allgather reads it as allgather's [i][r]. Fix: allgather([[outs[i] for outs in "
        "output_tensor_lists] for i in range(len(input_tensor_list))], input_tensor_list, opts)",
    ),
    (
        "a virtual-time timeout's message is not torch's",
        r"caught collective operation timeout",
        "Work.wait(timeout) now times out in virtual time, with simdist's message ('all_reduce did not complete "
        "within its timeout of 0.1 s (virtual time)'); the test matches ProcessGroupNCCL's wording ('Watchdog "
        "caught collective operation timeout: WorkNCCL(...) ran for N milliseconds before timing out'; gloo: "
        "'Timed out waiting ... for ...'): put the wording of the backend the program named into the message",
    ),
    (
        "monitored_barrier: a rank that never arrives is a deadlock",
        r"monitored_barrier|monitoredBarrier",
        "ProcessGroup.monitored_barrier(timeout, wait_all_ranks) must raise on rank 0, in virtual time, when a rank "
        "never arrives: RuntimeError('Rank {r} failed to pass monitoredBarrier in {ms} ms') (first missing rank), "
        "'Ranks {r1, r2} failed to pass monitoredBarrier' with wait_all_ranks, 'Rank 0 timed out in "
        "monitoredBarrier after {ms} ms' at once with timeout 0; the other ranks return once rank 0 has seen them. "
        "The simulator reports a deadlock instead: it needs timed waits (when no rank can run, the blocked wait "
        "with the earliest deadline fails with its timeout and the virtual clock moves to it)",
    ),
    (
        "async p2p blocks",
        r"DeadlockError.*\| .*(send|recv|batch_isend_irecv)",
        "isend/irecv/batch_isend_irecv must start the transfer and return a work that completes at wait() "
        "(ProcessGroup.send(tensors, dst, tag)/recv(tensors, src, tag) return before the peer arrives)",
    ),
    (
        "sparse tensors",
        r"sparse",
        "ProcessGroup.allreduce([sparse COO tensor], opts) with SUM: gloo replaces the tensor in place by the "
        "coalesced sum of every rank's tensor (nnz differs per rank). The bridge can all_gather_object each "
        "rank's coalesced tensor, sum, coalesce and copy_ into the input; simdist's collectives take dense tensors",
    ),
    (
        "test needs one process per rank (os.getpid)",
        r"in test_get_rank\b",
        "the test names a file per process with os.getpid(); rank threads share one pid (not a bridge matter)",
    ),
    (
        "test needs a real timeout",
        r"_test_barrier_timeout|Timed out",
        "rank 0 alone calls barrier and expects gloo's 'Timed out' error after the group's timeout, measured with "
        "time.time(); the simulator reports the rank that never joins as a deadlock at once (a virtual-time "
        "timeout would still fail the time.time() check)",
    ),
    (
        "simulated GPUs: a CUDA call the facade does not simulate",
        r"expects a simulated torch\.cuda\.Stream|is not simulated on CPU ranks|torch\.cuda\.synchronize\(device=|"
        r"cpu backend doesn't support events",
        "the test runs on the simulator only because the CUDA facade makes each rank see a GPU (gloo skips it here: "
        "no GPUs); the call named in the error needs the facade: Stream.wait_stream with a torch.cuda.Stream made "
        "by torch, torch.cuda.get_rng_state, torch.cuda.synchronize(device) with a CPU device, CUDA events of "
        "autocast/mixed precision",
    ),
    (
        "simulated GPUs: tensors report the CPU",
        r"SyncBatchNorm layers only work with GPU modules|"
        r"in tuple_and_list_validator",
        "simulated GPU tensors are CPU tensors: SyncBatchNorm's is_cuda check refuses them and DDP's output "
        "device index is None instead of the rank's GPU",
    ),
    (
        "race in torch's test (seen under some schedules)",
        r"FileNotFoundError.*_test_post_localSGD_optimizer_step_reload",
        "_rank_temp_file() removes the checkpoint on rank 0 as soon as rank 0 has loaded it; no barrier waits for "
        "the other ranks' torch.load. Fails with seeds 0, 1 and 4, passes with 2, 3 and 5: a bug in the test",
    ),
    ("crash (signal)", r"^crashed: ", "see the per-test log (faulthandler's stacks)"),
    (
        "hang",
        r"^hung: |DistTimeoutError",
        "a rank runs past the timeout without reaching a simdist call: a loop, or a wait outside simdist "
        "(where_by_rank in the JSON: each rank's line in the test and its innermost frame)",
    ),
]


# Failures on the socket side: rank processes whose torch.distributed groups are simdist socket groups. The
# first three are fixed (kept so that --report names them in earlier runs).
SOCKET_CAUSES: list[tuple[str, str, str]] = [
    (
        "a rank whose torch rendezvous is file:// finds no simdist store",
        r"nothing launched this process as a rank",
        "torch's tests join through a file:// store and set no MASTER_ADDR, which simdist's env:// asked for although "
        "$SIMDIST_STORE names the store; the process bridge now joins at $SIMDIST_STORE as tcp:// (fixed in 7a69d50)",
    ),
    (
        "the profiler sees no bridged op in a process",
        r"Expected 1 but got 0.*distributed_test\.py:\d+ in (call_dist_op|\w*profil\w*)",
        "the bridge recorded '<backend>:<op>' events only in the simulator's shared profiler session; it now records "
        "them whenever the process profiles (fixed in 73b9384)",
    ),
    (
        "a torch group's timeout is not its socket group's",
        r"does not match \"rank \d+ timed out in",
        "new_group(timeout=1 s): the bridge created the socket group without torch's timeout and the socket backend "
        "ignored new_group's timeout, so rank 0's lone barrier waited for the world's 60 s, and the message had no "
        "' timeout ' as gloo's 'Timed out waiting ...' has (fixed in f96f9c0 and 91229e5)",
    ),
    ("crash (signal)", r"^crashed: ", "see the per-test log (faulthandler's stacks)"),
    (
        "hang",
        r"^hung: |terminated or timed out",
        "a rank process runs past --timeout: torch's harness logs each rank's stack (the per-test log)",
    ),
]

CAUSES: dict[str, list[tuple[str, str, str]]] = {"sim": SIM_CAUSES, "socket": SOCKET_CAUSES}
"""The causes of failures, per side other than gloo."""
