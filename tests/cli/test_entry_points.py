"""Every entry point the package names as a string resolves: the ``module:function``
targets handed to sandboxed workers and measuring processes, the ``python -m`` modules
started as processes, the CLI's command modules and the console script. A rename that
misses one of these strings fails here, not in a sandboxed child at run time."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re

import pytest

PACKAGE = os.path.dirname(os.path.realpath(importlib.util.find_spec("serving_opt").origin))
ROOT = os.path.dirname(PACKAGE)
TARGET = re.compile(r"""["'](serving_opt(?:\.\w+)+):(\w+)["']""")
MODULE_RUN = re.compile(r"""["']-m["'],\s*["'](serving_opt(?:\.\w+)*)["']""")


def _sources() -> dict[str, str]:
    out = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, ROOT)] = f.read()
    return out


SOURCES = _sources()
# Docstring examples name targets too ("Example: >>> call(...)"): checked all the same.
TARGETS = sorted({m.groups() for text in SOURCES.values() for m in TARGET.finditer(text)})
RUN_MODULES = sorted({m.group(1) for text in SOURCES.values() for m in MODULE_RUN.finditer(text)})


def test_the_scan_finds_the_known_entry_points():
    # The control: if the patterns stopped matching, every test below would pass vacuously.
    assert ("serving_opt.pipeline.optimizer", "build_in_worker") in TARGETS
    assert "serving_opt.cli" in RUN_MODULES and len(TARGETS) >= 5


@pytest.mark.parametrize("module,function", TARGETS, ids=[f"{m}:{f}" for m, f in TARGETS])
def test_each_named_target_is_a_callable(module, function):
    assert callable(getattr(importlib.import_module(module), function, None)), \
        f"{module}:{function} is named as an entry point but does not exist"


@pytest.mark.parametrize("module", RUN_MODULES)
def test_each_module_started_with_dash_m_runs_as_main(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"python -m {module}: no such module"
    if spec.submodule_search_locations:  # a package runs its __main__
        assert importlib.util.find_spec(f"{module}.__main__") is not None
    else:
        with open(spec.origin, encoding="utf-8") as f:
            assert 'if __name__ == "__main__":' in f.read(), f"{module} has no main block"


def test_each_cli_command_module_has_its_entry():
    from serving_opt.cli import main

    for name in main.COMMANDS:
        module = main._command_module(name)
        for attribute in ("main", "define_flags"):  # what cli.main calls on each
            assert callable(getattr(module, attribute, None)), f"serving-opt {name}: {attribute}"
        assert isinstance(module.SUMMARY, str) and module.SUMMARY


def test_the_console_script_resolves():
    # No tomllib: the package supports Python 3.9. The [project.scripts] table's lines.
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        table = f.read().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', table, re.M))
    assert scripts, "no [project.scripts] entry found"
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function, None)), name
