"""A sandbox's result crosses as JSON of an explicit schema: a forged result file (a
model under --allow_file_ops can write it) is refused without importing anything it
names; the real reports round-trip."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from serving_opt import sandbox
from serving_opt.errors import ServingOptError
from serving_opt.sandbox import results as sandbox_results
from serving_opt.serving.results import Check, LoadTest, ValidationReport


@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """A module whose import creates a file: (module name, that file)."""
    side_effect = tmp_path / "imported"
    package = tmp_path / "lib"
    package.mkdir()
    (package / "sentinel_result_mod.py").write_text(
        f"open({str(side_effect)!r}, 'w').close()\n"
        "def run(*a):\n    return 'ran'\n"
        "class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(package))
    return "sentinel_result_mod", side_effect, str(package)


def _forged_pickle(module: str) -> bytes:
    return f"c{module}\nrun\n(tR.".encode()  # GLOBAL module.run, called with ()


def test_a_forged_pickle_result_imports_nothing(sentinel, tmp_path):
    module, side_effect, path = sentinel
    data = _forged_pickle(module)
    with pytest.raises(ServingOptError, match="not a result"):
        sandbox.loads(data)
    assert module not in sys.modules
    assert not side_effect.exists()
    # CONTROL: an unpickler imports and runs what the same bytes name.
    unpickle = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    subprocess.run([sys.executable, "-c", unpickle], input=data, check=True,
                   env={"PYTHONPATH": path})
    assert side_effect.exists()


@pytest.mark.parametrize("name", ["sentinel_result_mod:Thing", "serving_opt.samples.__main__:main",
                                  "serving_opt.samples:main"])
def test_a_result_naming_a_type_outside_the_schema_is_refused_unimported(sentinel, name):
    module, side_effect, _ = sentinel
    before = set(sys.modules)
    forged = json.dumps({"dict": [["result", {"dataclass": [name, {}]}]]}).encode()
    with pytest.raises(ServingOptError, match="not a type a sandbox may return"):
        sandbox.loads(forged)
    assert set(sys.modules) - before == set()
    assert not side_effect.exists()


@pytest.mark.parametrize("forged", [
    {"ndarray": ["|O8", [1], "AAAAAAAAAAA="]},  # an object array
    {"ndarray": ["<f4", [3], "AAAAAA=="]},  # bytes short of its shape
    {"proto": ["sentinel_result_mod.Thing", ""]},
    {"import": "os"},
    [1, 2],  # a bare list: no kind
    {"dataclass": ["serving_opt.serving.results:Check", {"name": "x", "ok": True,
                                                        "__class__": 1}]},
])
def test_malformed_results_are_refused_in_one_line(forged):
    with pytest.raises(ServingOptError) as e:
        sandbox.loads(json.dumps(forged).encode())
    assert "\n" not in e.value.problem


def test_a_deeply_nested_result_is_refused_not_crashed():
    forged = '{"list":[' * 100_000 + "]}" * 100_000
    with pytest.raises(ServingOptError, match="not a result"):
        sandbox.loads(forged.encode())


def test_the_real_reports_round_trip():
    load = LoadTest(4, 1.5, 100, 0, 66.7, 1.2, float("inf"), "")
    report = ValidationReport(
        ok=True, backend="local", backend_note="", address="127.0.0.1:1", model_name="m",
        model_base="/m", version=1, reference_dir="/m/1",
        checks=(Check("model AVAILABLE", True, "version 1"),), load_test=load,
        failures=(), warmup_records=(b"\x00\xff",), ignored_versions=(2, 3))
    value = {"result": (None, report, [1, {2: "two"}], frozenset({"a"}),
                        np.arange(6, dtype=np.float32).reshape(2, 3),
                        np.array(["x", "yz"]), np.array([True, False]), np.float64(0.5))}
    back = sandbox.loads(sandbox.dumps(value))["result"]
    assert back[:4] == value["result"][:4]
    for got, want in zip(back[4:7], value["result"][4:7]):
        assert got.dtype == want.dtype and (got == want).all()
    assert back[7] == 0.5


def test_a_result_outside_the_schema_is_not_written():
    with pytest.raises(TypeError, match="not a result"):
        sandbox.dumps({"result": np.array([object()])})
    with pytest.raises(TypeError, match="schema"):
        sandbox.dumps({"result": pytest})


def test_the_schema_holds_every_dataclass_the_reports_declare():
    import dataclasses
    import importlib
    import typing

    seen: set[str] = set()

    def walk(tp) -> None:
        for arg in typing.get_args(tp):
            walk(arg)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            name = f"{tp.__module__}:{tp.__qualname__}"
            if name not in seen:
                seen.add(name)
                for hint in typing.get_type_hints(tp).values():
                    walk(hint)

    for name in sandbox_results.SCHEMA:
        module, _, qualname = name.partition(":")
        walk(getattr(importlib.import_module(module), qualname))
    assert seen <= sandbox_results.SCHEMA, seen - sandbox_results.SCHEMA


def test_a_forged_error_sets_text_attributes_only():
    forged = sandbox.loads(sandbox.dumps({"error": {
        "type": "UsageError", "problem": "p", "fix": 3, "report": {"not": "a report"},
        "attrs": {"__class__": "str", "with_report": "x", "flag": "--x"}}}))
    error = sandbox._rebuild_error(forged["error"])
    assert type(error).__name__ == "UsageError" and error.problem == "p"
    assert error.flag == "--x" and callable(error.with_report) and error.report is None
    assert error.fix is None


def test_a_result_of_too_many_small_values_is_refused_before_it_is_built():
    many = sandbox_results.MAX_VALUES + 10
    forged = b'{"list":[' + b",".join([b"0.5"] * many) + b"]}"
    with pytest.raises(ServingOptError, match="not a result"):
        sandbox.loads(forged)
    # CONTROL: the same values, fewer of them, are a result.
    fewer = b'{"list":[' + b",".join([b"0.5"] * 1000) + b"]}"
    assert sandbox.loads(fewer) == [0.5] * 1000
