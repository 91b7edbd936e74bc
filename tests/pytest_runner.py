"""Runs test files through pytest: the `main` of the py_tests in tests/BUILD.

Usage: pytest_runner.py [--env=NAME=VALUE]... <test file>... [-- pytest args...]

Under Bazel's sharding (TEST_TOTAL_SHARDS), this process runs only its shard's files, in
one pytest session, so TensorFlow is imported and the session's models are built once for
many files. Files go to shards longest first by tests/durations.txt (seconds per file,
refreshed with `python tests/pytest_runner.py --durations`), so shards end together.
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DURATIONS = os.path.join(HERE, "durations.txt")
UNKNOWN_SECONDS = 30.0  # a file not yet in durations.txt: about an average e2e file


def durations(path: str = DURATIONS) -> dict[str, float]:
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    seconds, name = line.split()
                    out[name] = float(seconds)
    return out


def shard(files: list[str], index: int, total: int, seconds: dict[str, float]) -> list[str]:
    """The files of shard ``index``: longest first, each to the least loaded shard."""
    def weight(f):
        return seconds.get(os.path.basename(f), UNKNOWN_SECONDS)

    loads = [0.0] * total
    mine = []
    for f in sorted(files, key=lambda f: (-weight(f), os.path.basename(f))):
        least = min(range(total), key=lambda i: (loads[i], i))
        loads[least] += weight(f)
        if least == index:
            mine.append(f)
    return sorted(mine)


def write_durations(testlogs: str) -> None:
    """durations.txt from the JUnit files of the last `bazel test` (per-test times).

    The golden runs' second pass (oneDNN on) is left out: it runs a few tests of each
    file, and the suite's balance is about whole files.
    """
    per_file: dict[str, float] = {}
    for xml in glob.glob(os.path.join(testlogs, "**", "test.xml"), recursive=True):
        if "golden_onednn" in xml:
            continue
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("classname", "").split(".")[-1] + ".py"
            per_file[name] = per_file.get(name, 0.0) + float(case.get("time") or 0)
    with open(DURATIONS, "w") as f:
        f.write("# seconds per test file in one `make test` (tests/pytest_runner.py --durations)\n")
        for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
            if name.startswith("test_"):
                f.write(f"{seconds:.0f} {name}\n")


def main(argv):
    if argv[1:2] == ["--durations"]:
        write_durations(argv[2] if len(argv) > 2 else os.path.join(HERE, "..", "bazel-testlogs"))
        return 0
    args = argv[1:]
    while args and args[0].startswith("--env="):
        name, _, value = args.pop(0)[len("--env="):].partition("=")
        os.environ[name] = value  # before conftest reads it
    extra = args[args.index("--") + 1:] if "--" in args else []
    files = args[:args.index("--")] if "--" in args else args
    if not files:
        sys.exit("usage: pytest_runner.py <test file>... [-- pytest args...]")
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    if total > 1:
        # Tells Bazel this runner shards (it fails a sharded test that does not say so).
        status = os.environ.get("TEST_SHARD_STATUS_FILE")
        if status:
            open(status, "w").close()
        files = shard(files, int(os.environ["TEST_SHARD_INDEX"]), total, durations())
    # Under `bazel test`, put pytest's output (junit XML) where Bazel collects it.
    options = ["-q", "-p", "no:cacheprovider"]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        options.append("--junitxml=" + xml)
    return pytest.main(files + options + extra)


if __name__ == "__main__":
    sys.exit(int(main(sys.argv)))
