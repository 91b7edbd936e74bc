"""The ``convnet`` sample: a small TF1 conv net with batch norm, taking float images."""

from __future__ import annotations

from serving_opt.samples.tf1 import conv2d, dense, fused_batch_norm, save_tf1


def build_convnet(export_dir: str, seed: int = 0) -> str:
    """Writes a small conv net with batch norm (inference mode) taking float images.

    Signature ``serving_default`` (predict): ``images`` float [None, 16, 16, 3] to
    ``scores`` [None, 4] and ``label`` int64 [None].
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    sigs = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph:
        v1.set_random_seed(seed)
        images = v1.placeholder(tf.float32, [None, 16, 16, 3], name="images")
        net = images
        for i, filters in enumerate((8, 16)):
            net = conv2d(net, filters, f"conv{i}", seed + 10 * i)
            net = tf.nn.relu(fused_batch_norm(net, f"conv{i}_bn", seed + 10 * i + 2))
        net = tf.reduce_mean(net, axis=[1, 2])
        scores = dense(net, 4, "head", seed + 60)
        scores = tf.identity(scores, name="scores")
        label = tf.argmax(scores, axis=1, name="label")
        predict = sigs.predict_signature_def({"images": images}, {"scores": scores, "label": label})
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            save_tf1(sess, export_dir, {"serving_default": predict}, None)
    return export_dir
