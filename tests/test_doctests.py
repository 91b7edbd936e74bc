"""Every example in serving_opt's docstrings runs: a docstring shows `>>>` only where
it is a doctest, and this file finds and runs each of them."""

from __future__ import annotations

import doctest
import importlib
import os

import pytest

import serving_opt

PACKAGE = os.path.dirname(serving_opt.__file__)


def _modules_with_examples() -> list[str]:
    found = []
    for directory, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as f:
                    if ">>>" in f.read():
                        relative = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3]
                        found.append(relative.replace(os.sep, ".").removesuffix(".__init__"))
    return sorted(found)


def test_the_package_has_examples_to_run():
    assert "serving_opt.core.rendering" in _modules_with_examples()


@pytest.mark.parametrize("module", _modules_with_examples())
def test_every_docstring_example_runs(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
