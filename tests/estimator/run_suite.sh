#!/usr/bin/env bash
# The Estimator suite as a Bazel test (//tests:estimator_suite), beside the main suite's shards:
# pytest in the repo's .venv-tf215 (TF 2.15 + tf.estimator), from the source tree, since
# it also runs the main .venv (TF 2.21) to check models optimized there load under 2.15.
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)"
python="$root/.venv-tf215/bin/python"
if [ ! -x "$python" ]; then
  echo "no $python: run make venv-tf215 (make test does)" >&2
  exit 1
fi
cd "$root"
# The runner shards it as it does the main suite (TEST_TOTAL_SHARDS, tests/durations.txt).
exec "$python" tests/pytest_runner.py tests/estimator/test_*.py -- --confcutdir=tests/estimator
