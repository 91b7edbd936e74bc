"""Waiting for something that must happen: a deadline that fails the test, never a sleep
that assumes how fast this machine is."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 120.0,
               interval: float = 0.05) -> T:
    """Polls ``condition`` until it returns something true, which is returned; fails the
    test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(interval)
