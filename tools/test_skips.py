"""Prints every skipped test of the last `make test`, with its reason, and fails on a
skip that a fresh Debian machine should not take.

The allowed reasons are the regular expressions of tests/expected_skips.txt, each with
why it is expected. Results come from the JUnit XML files pytest wrote: Bazel's
test.xml of each shard of //tests:suite, and build/junit/*.xml for the pytest
runs outside Bazel.

    python tools/test_skips.py            # exit 1 on an unexpected skip
"""

from __future__ import annotations

import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def allowed_patterns(path: str) -> list[re.Pattern]:
    patterns = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                patterns.append(re.compile(line))
    return patterns


def result_files(root: str) -> list[str]:
    """The suite's shards and the Estimator suite (tests/BUILD), then build/junit/*.xml."""
    logs = os.path.join(root, "bazel-testlogs", "tests")
    files = []
    for target in ("suite", "golden_onednn", "estimator_suite"):
        files += sorted(glob.glob(os.path.join(logs, target, "**", "test.xml"),
                                  recursive=True))
    return files + sorted(glob.glob(os.path.join(root, "build", "junit", "*.xml")))


def files_without_results(root: str, xml_paths: list[str]) -> list[str]:
    """Test files no result mentions: a file that was never run is not a pass either."""
    ran = {part for path in xml_paths for case in ET.parse(path).getroot().iter("testcase")
           for part in case.get("classname", "").split(".")}
    tests = os.path.join(root, "tests")
    files = glob.glob(os.path.join(tests, "test_*.py")) + \
        glob.glob(os.path.join(tests, "*", "test_*.py"))
    names = sorted(os.path.splitext(os.path.basename(path))[0] for path in files)
    return [name for name in names if name not in ran]


def skips(xml_path: str) -> list[tuple[str, str]]:
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            out.append((name, skipped.get("message") or (skipped.text or "").strip()))
    return out


def main() -> int:
    patterns = allowed_patterns(os.path.join(ROOT, "tests", "expected_skips.txt"))
    files = result_files(ROOT)
    if not files:
        print("test skips: no JUnit results found; run make test first", file=sys.stderr)
        return 1
    missing = files_without_results(ROOT, files)
    if missing:
        print(f"test skips: no result for {', '.join(missing)}: each tests/test_*.py must "
              "run in the suite (tests/BUILD); run make test", file=sys.stderr)
        return 1
    found = [(name, reason) for path in files for name, reason in skips(path)]
    unexpected = [(n, r) for n, r in found if not any(p.search(r) for p in patterns)]
    print(f"test skips: {len(found)} skipped in {len(files)} result files, "
          f"{len(unexpected)} unexpected")
    for name, reason in found:
        mark = "UNEXPECTED" if (name, reason) in unexpected else "expected"
        print(f"  {mark:10} {name}: {reason}")
    if unexpected:
        print("test skips: a fresh Debian machine runs these tests; install what they "
              "need (make test does) or add the reason to tests/expected_skips.txt "
              "with why", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
