#!/usr/bin/env bash
# Installs the exactcoll wheel into a scratch directory and runs the Python tests against it: what
# a user gets from `pip install exactcoll-*.whl`, not the source tree.
set -euo pipefail
here="${TEST_SRCDIR}/${TEST_WORKSPACE}/python"
wheel=$(ls "$here"/exactcoll-*.whl)
# Debian's python3 (with python3-numpy), not whatever python3 comes first on PATH.
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if ! "$python" -c "import numpy" 2>/dev/null; then
  echo "python_test: $python has no numpy (tools/ensure_deps.sh installs python3-numpy)" >&2
  exit 1
fi
site="${TEST_TMPDIR}/site"
if "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m pip install --quiet --no-deps --no-index --no-compile --target "$site" "$wheel"
  echo "python_test: pip installed $(basename "$wheel") into $site"
else
  "$python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$site"
  echo "python_test: no pip; unzipped $(basename "$wheel") into $site"
fi
cd "$here/tests"
PYTHONPATH="$site:$here/tests" PYTHONDONTWRITEBYTECODE=1 "$python" -m unittest -v test_api test_sim test_torch_cpu test_torch_backend test_linear_cpu
