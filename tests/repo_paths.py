"""Where the tests and the repository are, for test files in any directory under tests/."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
# The source tree itself, also when a test runs from Bazel's runfiles (symlinks into it):
# where the repo's venvs are.
SOURCE_REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
