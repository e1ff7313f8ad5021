#!/usr/bin/env bash
# Runs an example program and shows its output; the test is its exit status.
set -euo pipefail
"$1"
