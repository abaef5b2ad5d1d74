#!/usr/bin/env bash
# The GPU suite and the NCCL benchmark, on a machine with a GPU:
#
#     bash tests/gpu/run.sh [OUT_DIR]
#
# Uses the python3 on PATH with what it already has (torch with CUDA, cupy with NCCL,
# numpy, networkx, hypothesis, pytest, pytest-timeout): simdist is installed without its
# dependencies, so nothing is downloaded (GPU machines may have no network). Writes the
# test log, the benchmark's table and its JSON to OUT_DIR (default gpu-results/).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-gpu-results}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
  python3 -c 'import cupy; from cupy.cuda import nccl; print("cupy", cupy.__version__, "nccl", nccl.get_version())' \
    || echo "cupy's NCCL bindings are not importable"
} 2>&1 | tee "$out/machine.txt"
python3 -m pip install -q --no-deps --no-build-isolation --no-index . || exit 1
python3 -m pytest tests/gpu -v -rs -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.log"
status=${PIPESTATUS[0]}
python3 benchmarks/bench_nccl.py --json "$out/bench-nccl.json" 2>&1 | tee "$out/bench-nccl.md"
python3 benchmarks/bench_nccl.py --world 2 --json "$out/bench-nccl-world2.json" 2>&1 | tee "$out/bench-nccl-world2.md"
exit "$status"
