"""Models optimized under TF 2.21 (the main .venv) load and answer the same under TF 2.15.

Teams train Estimators on TF <= 2.15 and may run serving-opt on the newest TF, so
both directions matter: the sample classifier built and optimized in 2.21, and a
real Estimator export made here (2.15) and optimized in 2.21, must load and pass
the parity gate in this process's TF 2.15.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest
import tensorflow as tf

from serving_opt.savedmodel import loader
from serving_opt.stages import parity

from .estimator_helpers import FAST, REPO, SERVE, signatures

MAIN_PYTHON = REPO / ".venv" / "bin" / "python"

SCRIPT = textwrap.dedent("""
    import sys
    import tensorflow as tf
    from serving_opt import OptimizeOptions, optimize, samples
    from serving_opt.options import GateOptions, MeasureOptions  # FAST's repr names them

    out, estimator_export = sys.argv[1], sys.argv[2]
    options = OptimizeOptions(**{fast!r})
    samples.build("classifier", out + "/sample/1")
    optimize(out + "/sample/1", out + "/sample_optimized", options)
    optimize(estimator_export, out + "/estimator_optimized", options)
    print(tf.__version__)
""").format(fast=FAST)


def test_models_optimized_under_tf221_load_under_tf215(trained_classifier, tmp_path):
    if not MAIN_PYTHON.exists():
        pytest.fail(f"{MAIN_PYTHON} is missing: this test needs the main TF 2.21 venv; "
                    "run `make venv` (make test creates both venvs)")
    estimator, receiver = trained_classifier
    plain = os.fsdecode(estimator.export_saved_model(str(tmp_path / "plain"), receiver))

    run = subprocess.run([str(MAIN_PYTHON), "-c", SCRIPT, str(tmp_path), plain],
                         capture_output=True, text=True, cwd=str(REPO), timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1].startswith("2.21"), run.stdout
    assert tf.__version__.startswith("2.15")

    for source, optimized in ((tmp_path / "sample" / "1", tmp_path / "sample_optimized" / "1"),
                              (plain, tmp_path / "estimator_optimized" / "1")):
        source, optimized = str(source), str(optimized)
        keys = sorted(signatures(source))
        assert sorted(signatures(optimized)) == keys
        sess, _ = loader.load_session(optimized, SERVE)  # TF Serving's way of loading
        sess.close()
        report = parity.check_parity(
            source, optimized, SERVE, keys,
            inputs=parity.ParityInputs(batch_size=8, num_batches=1))
        assert report.ok, report.summary()
