"""Proof that TF2's loader takes the optimized model: ``tf.saved_model.load``.

TF Serving uses the session loader (exercised by the parity gate); TF2 Python users
and ``tf.function`` serving go through ``tf.saved_model.load``, which reads a model
without an object graph through ``load_v1_in_v2`` and is stricter about init ops,
assets and savers. This stage loads the written candidate that way.
"""

from __future__ import annotations

import os

from serving_opt.errors import ServingOptError, first_line
from serving_opt.savedmodel import writer


def check_loads_in_tf2(candidate_dir: str, reference_dir: str, tags: frozenset[str],
                       signature_defs: dict) -> str:
    """Loads the candidate with ``tf.saved_model.load`` (TF2 Python serving, tf.function
    users) and checks every kept signature is there with the same output aliases.

    The session loader (TF Serving's) already ran in the parity gate, on the real
    model. This check is about structure (signatures, init op, assets, saver), so it
    loads a copy whose large constants are stored as one broadcast zero: a second
    full load would cost as much as the parity gate. A model whose source does not
    load this way either is not held to it.
    """
    import gc
    import shutil
    import tempfile

    import tensorflow as tf
    from tensorflow.python.eager import context

    def load(path: str) -> dict:
        # TF2 Python serving loads eagerly, and never into the caller's default graph
        # (finalized inside train_and_evaluate: both loads would fail, skipping the check).
        with tf.Graph().as_default(), context.eager_mode():
            loaded = tf.saved_model.load(path, tags=sorted(tags))
            out = {k: sorted(loaded.signatures[k].structured_outputs)
                   for k in signature_defs if k in loaded.signatures}
        del loaded
        gc.collect()
        return out

    scratch = tempfile.mkdtemp(prefix="serving-opt-tf2-load-")
    try:
        copy = writer.structure_copy(candidate_dir, os.path.join(scratch, "1"))
        try:
            outputs = load(copy)
        except Exception as e:  # noqa: BLE001 - judged against the source below
            try:
                load(reference_dir)
            except Exception:  # noqa: BLE001
                return "not loadable with tf.saved_model.load (neither is the source)"
            raise ServingOptError(
                f"the optimized model does not load with tf.saved_model.load: "
                f"{first_line(e)}",
                "rerun with --freeze=never, and report this",
            ) from e
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wrong = [k for k, sig in signature_defs.items()
             if outputs.get(k) != sorted(sig.outputs)]
    if wrong:
        raise ServingOptError(
            f"tf.saved_model.load does not see signature(s) {', '.join(wrong)} of the "
            "optimized model with their outputs", "rerun with --freeze=never, and report this")
    return f"loads with tf.saved_model.load ({len(outputs)} signatures)"


