#!/usr/bin/env bash
# Installs simdist with the app and test extras. Installs the CPU build of torch
# first when torch is missing or older than simdist supports (2.11): pip would otherwise
# resolve pyproject's torch>=2.11 to the newest release, several GB of CUDA packages.
# torch comes from PyTorch's CPU index (SIMDIST_TORCH_INDEX overrides it); when that index does
# not serve it (10 s a try, one retry), from pip's own index. Either way it says where torch came from.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip --version >/dev/null
if ! python3 -c "import sys, torch; sys.exit(tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]) < (2, 11))" 2>/dev/null; then
  cpu_index="${SIMDIST_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
  report="$(mktemp)"
  trap 'rm -f "$report"' EXIT
  if python3 -m pip install --quiet --timeout 10 --retries 1 --report "$report" \
      --index-url "$cpu_index" "torch==2.13.0"; then
    asked="the CPU index $cpu_index"
  else
    echo "install.sh: the CPU index $cpu_index did not serve torch==2.13.0; trying pip's own index" >&2
    python3 -m pip install --quiet --report "$report" "torch==2.13.0"
    asked="pip's own index (the CPU index did not answer)"
  fi
  python3 - "$report" "$asked" <<'EOF'
import json, sys
torch = next(i for i in json.load(open(sys.argv[1]))["install"] if i["metadata"]["name"] == "torch")
version = torch["metadata"]["version"]
build = "the CPU build" if version.endswith("+cpu") else "not the CPU build: on Linux, with CUDA's packages"
print(f"install.sh: torch {version} ({build}) from {torch['download_info']['url']}, asking {sys.argv[2]}")
EOF
fi
python3 -m pip install --quiet --disable-pip-version-check -e ".[app,test]"
