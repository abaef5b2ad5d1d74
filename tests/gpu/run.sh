#!/usr/bin/env bash
# The GPU suite and the NCCL benchmark, on a machine with a GPU:
#
#     bash tests/gpu/run.sh [OUT_DIR]
#
# Uses the python3 on PATH with what it already has (torch with CUDA, cupy with NCCL,
# numpy, networkx, hypothesis, pytest, pytest-timeout; pytest-xdist is not needed): simdist is installed without its
# dependencies, so nothing is downloaded (GPU machines may have no network). Writes the
# test log, the benchmark's table and its JSON to OUT_DIR (default gpu-results/).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mkdir -p "${1:-gpu-results}" && cd "${1:-gpu-results}" && pwd)
# cupy finds NCCL's library through the loader: point it at the one pip's nvidia-nccl wheel holds.
nccl_lib=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("nvidia.nccl")
print(os.path.join(list(s.submodule_search_locations)[0], "lib") if s else "")' 2>/dev/null || true)
if [ -n "$nccl_lib" ] && [ -d "$nccl_lib" ]; then
  export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
  python3 -c 'import cupy; from cupy.cuda import nccl; print("cupy", cupy.__version__, "nccl", nccl.get_version())' \
    || echo "cupy's NCCL bindings are not importable"
} 2>&1 | tee "$out/machine.txt"
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index . >"$out/install.log" 2>&1; then
  # No build tools: the checkout on the path imports as installed (simdist/_source_layout.py maps
  # backends/ and visualize/ into the package), in this process and in the ranks it starts.
  echo "pip could not install simdist (see $out/install.log); using the checkout through PYTHONPATH"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
start=$SECONDS
# -o addopts=: one process (the GPU is one), and no need of pytest-xdist, which pyproject's addopts ask for.
python3 -m pytest tests/gpu -o addopts= -v -rs -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.log"
status=${PIPESTATUS[0]}
python3 benchmarks/bench_library.py --backend nccl --json "$out/bench-nccl.json" 2>&1 | tee "$out/bench-nccl.md"
python3 benchmarks/bench_library.py --backend nccl --world 2 --json "$out/bench-nccl-world2.json" 2>&1 | tee "$out/bench-nccl-world2.md"
echo "== $(grep -E '^=+ .*(passed|failed|skipped|error).* =+$' "$out/gpu-tests.log" | tail -1 | tr -d '=' | xargs)" \
  "in $((SECONDS - start)) s; the log and the NCCL tables are in $out:"
ls -1 "$out" | sed 's/^/   /'
exit "$status"
