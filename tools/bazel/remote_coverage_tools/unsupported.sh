#!/bin/sh
# Offline stand-in for Bazel's coverage tools: coverage is not supported offline.
echo "remote_coverage_tools stand-in: coverage is not supported in the offline Bazel setup" >&2
exit 0
