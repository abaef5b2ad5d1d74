#!/usr/bin/env bash
# Installs simdist with the app and test extras. Installs the CPU build of torch
# first when torch is missing or older than simdist supports (2.11): pip would otherwise
# resolve pyproject's torch>=2.11 to the newest release, several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip --version >/dev/null
if ! python3 -c "import sys, torch; sys.exit(tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]) < (2, 11))" 2>/dev/null; then
  python3 -m pip install --quiet "torch==2.13.0" || python3 -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
fi
python3 -m pip install --quiet --disable-pip-version-check -e ".[app,test]"
