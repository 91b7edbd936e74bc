"""Runs one test file through pytest: the `main` of every py_test in tests/BUILD.

Usage (Bazel passes the file via `args`): pytest_runner.py tests/test_x.py [pytest args...]
"""
import os
import sys

import pytest


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: pytest_runner.py <test file> [pytest args...]")
    test_file, extra = argv[1], argv[2:]
    # Under `bazel test`, put pytest's output (junit XML) where Bazel collects it.
    args = [test_file, "-q", "-p", "no:cacheprovider"]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append("--junitxml=" + xml)
    return pytest.main(args + extra)


if __name__ == "__main__":
    sys.exit(int(main(sys.argv)))
