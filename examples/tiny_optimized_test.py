"""Checks what `bazel build //examples:tiny_optimized` produced against its source.

Run by `bazel test //examples:tiny_optimized_test` (paths come from `args` in
examples/BUILD); by hand:

    python examples/tiny_optimized_test.py --source=examples/tiny_model/saved_model.pb \\
        --optimized=bazel-bin/examples/tiny_optimized \\
        --report=bazel-bin/examples/tiny_optimized.report.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import unittest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from serving_opt.savedmodel import loader
from serving_opt.stages import parity  # noqa: E402

ARGS = argparse.Namespace(source="", optimized="", report="")


def _meta_graph(saved_model_dir: str):
    return loader.find_meta_graph(loader.read_saved_model(saved_model_dir), {"serve"})


class TinyOptimizedTest(unittest.TestCase):
    """The built directory is a servable SavedModel, optimized, and answers like the source."""

    source = optimized = ""

    @classmethod
    def setUpClass(cls) -> None:
        # --source names saved_model.pb ($(rootpath) of a file); the model is its directory.
        cls.source = os.path.dirname(ARGS.source)
        cls.optimized = ARGS.optimized

    def test_is_a_saved_model_with_the_sources_signatures_and_assets(self) -> None:
        self.assertEqual(sorted(os.listdir(self.optimized)),
                         ["assets", "saved_model.pb", "variables"])  # no scratch left inside
        self.assertEqual(sorted(loader.serving_signatures(_meta_graph(self.optimized))),
                         ["scores_only", "serving_default"])
        with open(os.path.join(self.source, "assets", "vocab.txt")) as want, \
                open(os.path.join(self.optimized, "assets", "vocab.txt")) as got:
            self.assertEqual(got.read(), want.read())

    def test_variables_are_frozen_and_the_graph_is_smaller(self) -> None:
        before, after = _meta_graph(self.source), _meta_graph(self.optimized)
        ops = {n.op for n in after.graph_def.node}
        self.assertFalse(ops & {"VarHandleOp", "VariableV2", "ReadVariableOp"}, ops)
        self.assertLess(len(after.graph_def.node), len(before.graph_def.node) // 2)

    def test_answers_like_the_source(self) -> None:
        keys = sorted(loader.serving_signatures(_meta_graph(self.source)))
        report = parity.check_parity(self.source, self.optimized, frozenset({"serve"}), keys)
        self.assertTrue(report.ok, report.summary())
        self.assertEqual({o.signature for o in report.outputs}, set(keys))
        # Inputs came from the vocabulary asset (plus out-of-vocabulary words).
        self.assertTrue(all(report.input_sources.values()), report.input_sources)

    def test_report_output_group(self) -> None:
        with open(ARGS.report) as f:
            report = json.load(f)
        self.assertTrue(report["published"])
        self.assertTrue(report["parity"]["ok"])
        self.assertTrue(report["frozen"])
        self.assertEqual(report["output_dir"], report["output_base"])
        self.assertIsNone(report["benchmark"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="the source model's saved_model.pb")
    parser.add_argument("--optimized", required=True, help="the built output directory")
    parser.add_argument("--report", required=True, help="the built report JSON")
    args, rest = parser.parse_known_args(argv[1:])
    vars(ARGS).update(vars(args))
    program = unittest.main(argv=[argv[0], *rest], exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
