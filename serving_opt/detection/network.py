"""The detection sample's network, in the Object Detection API's TF1 shape.

* ``image_tensor``: uint8 ``[None, None, None, 3]``, any frame size;
* ``Preprocessor/``: cast, in-graph ``ResizeBilinear`` to ``size`` x ``size``, scale to
  [-1, 1];
* ``FeatureExtractor/``: five 3x3 convolutions (strides 2, 2, 2, 2, 1) with ReLU6; the
  batch norms of layers 0 and 2 are fused (``FusedBatchNormV3``), those of layers 1, 3 and
  4 old-style unfused (the Rsqrt/Mul/Sub/Add chain ``tf.nn.batch_normalization`` and
  ``tf.compat.v1.layers.batch_normalization(fused=False)`` build);
* ``BoxPredictor/``: box encodings and class logits (with a background class) per anchor,
  a ``CheckNumerics`` on the box encodings;
* ``Postprocessor/``: anchors computed from the feature map's dynamic shape, box decoding
  (Faster R-CNN coder, scales 10, 10, 5, 5), sigmoid, and
  ``tf.image.combined_non_max_suppression``;
* outputs, as the OD API's exporter names and types them: ``detection_boxes`` float32
  ``[batch, 100, 4]`` (ymin, xmin, ymax, xmax, normalized), ``detection_scores`` float32
  ``[batch, 100]``, ``detection_classes`` float32 ``[batch, 100]`` (1-based) and
  ``num_detections`` float32 ``[batch]``.

The weights are random from the seed; :mod:`serving_opt.detection.calibration` then sets
the class biases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INPUT_NODE = "image_tensor"
OUTPUT_NODES = ("detection_boxes", "detection_scores", "detection_classes", "num_detections")

NUM_CLASSES = 4  # foreground classes; the logits have one more (background) column
MAX_DETECTIONS = 100
MAX_PER_CLASS = 50
SCORE_THRESHOLD = 0.3
IOU_THRESHOLD = 0.5
BOX_CODER_SCALES = (10.0, 10.0, 5.0, 5.0)
# (scale, aspect ratio) of each anchor of a cell. The first three overlap (IoU 0.55-0.69, over
# IOU_THRESHOLD), so NMS chooses between them: where the near-ties are made.
ANCHORS = ((1.0, 1.0), (1.2, 1.0), (1.0, 2.0), (1.0, 0.5))
ANCHOR_SIZE = 0.15  # of the image, for an anchor of scale 1 (3 cells at size 320)


def _tf():
    import tensorflow as tf

    return tf


@dataclass(frozen=True)
class Graph:
    """The built graph's handles the sample's builder and calibration need (not the
    user)."""

    graph: object
    image: object
    outputs: dict
    logits: object  # [batch, anchors, NUM_CLASSES + 1], before the sigmoid
    boxes: object  # [batch, anchors, 4], decoded, before NMS
    class_bias: object  # the class head's bias variable
    class_weights: object  # and its kernel


def _conv(x, filters: int, stride: int, name: str, seed: int, bias: bool = False,
          stddev: float | None = None):
    tf = _tf()
    v1 = tf.compat.v1
    channels = int(x.shape[-1])
    std = stddev if stddev is not None else math.sqrt(2.0 / (9 * channels))
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "weights", [3, 3, channels, filters],
            initializer=v1.random_normal_initializer(stddev=std, seed=seed))
        out = tf.nn.conv2d(x, kernel, strides=stride, padding="SAME")
        if bias:
            b = v1.get_variable("biases", [filters], initializer=v1.zeros_initializer())
            out = tf.nn.bias_add(out, b)
    return out


def _bn_variables(channels: int, seed: int):
    v1 = _tf().compat.v1
    gamma = v1.get_variable(
        "gamma", [channels], initializer=v1.random_uniform_initializer(0.5, 1.5, seed=seed))
    beta = v1.get_variable(
        "beta", [channels], initializer=v1.random_normal_initializer(stddev=0.2, seed=seed + 1))
    mean = v1.get_variable(
        "moving_mean", [channels],
        initializer=v1.random_normal_initializer(stddev=0.2, seed=seed + 2))
    variance = v1.get_variable(
        "moving_variance", [channels],
        initializer=v1.random_uniform_initializer(0.5, 2.0, seed=seed + 3))
    return gamma, beta, mean, variance


def _batch_norm(x, name: str, seed: int, fused: bool):
    tf = _tf()
    v1 = tf.compat.v1
    with v1.variable_scope(name):
        gamma, beta, mean, variance = _bn_variables(int(x.shape[-1]), seed)
        if fused:
            y, _, _ = v1.nn.fused_batch_norm(x, gamma, beta, mean=mean, variance=variance,
                                             epsilon=1e-3, is_training=False)
            return y
        # What fused=False layers built: Rsqrt(var + eps) * gamma, x * that, and
        # beta - mean * that added: the chain fold_old_batch_norms is asked about.
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def build_graph(size: int, width: int, seed: int) -> Graph:
    tf = _tf()
    v1 = tf.compat.v1
    k = len(ANCHORS)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        image = v1.placeholder(tf.uint8, [None, None, None, 3], name=INPUT_NODE)
        with v1.name_scope("Preprocessor"):
            net = tf.cast(image, tf.float32, name="ToFloat")
            net = v1.image.resize_bilinear(net, [size, size], align_corners=False,
                                           half_pixel_centers=True)
            net = net * (2.0 / 255.0) - 1.0
        layers = ((width, 2, True), (2 * width, 2, False), (4 * width, 2, True),
                  (4 * width, 2, False), (4 * width, 1, False))
        with v1.variable_scope("FeatureExtractor"):
            for i, (filters, stride, fused) in enumerate(layers):
                net = _conv(net, filters, stride, f"Conv2d_{i}", seed + 10 * i)
                net = _batch_norm(net, f"Conv2d_{i}/BatchNorm", seed + 10 * i + 3, fused)
                net = tf.nn.relu6(net)
        with v1.variable_scope("BoxPredictor"):
            encodings = _conv(net, k * 4, 1, "BoxEncodingPredictor", seed + 100, bias=True,
                              stddev=0.3 / math.sqrt(9 * int(net.shape[-1])))
            encodings = tf.debugging.check_numerics(encodings, "box encodings")
            logits = _conv(net, k * (NUM_CLASSES + 1), 1, "ClassPredictor", seed + 200,
                           bias=True)
            encodings = tf.reshape(encodings, [tf.shape(encodings)[0], -1, 4])
            logits = tf.reshape(logits, [tf.shape(logits)[0], -1, NUM_CLASSES + 1],
                                name="class_logits")
        with v1.name_scope("Postprocessor"):
            boxes = _decode(encodings, _anchors(net))
            scores = tf.sigmoid(logits)[:, :, 1:]
            nmsed = tf.image.combined_non_max_suppression(
                tf.expand_dims(boxes, 2), scores, max_output_size_per_class=MAX_PER_CLASS,
                max_total_size=MAX_DETECTIONS, iou_threshold=IOU_THRESHOLD,
                score_threshold=SCORE_THRESHOLD, pad_per_class=False, clip_boxes=True)
        outputs = {
            "detection_boxes": tf.identity(nmsed.nmsed_boxes, name="detection_boxes"),
            "detection_scores": tf.identity(nmsed.nmsed_scores, name="detection_scores"),
            # The OD API's label_id_offset: class 0 is background.
            "detection_classes": tf.identity(nmsed.nmsed_classes + 1.0,
                                             name="detection_classes"),
            "num_detections": tf.identity(tf.cast(nmsed.valid_detections, tf.float32),
                                          name="num_detections"),
        }
        with v1.variable_scope("BoxPredictor/ClassPredictor", reuse=True):
            class_bias = v1.get_variable("biases")
            class_weights = v1.get_variable("weights")
    return Graph(graph, image, outputs, logits, boxes, class_bias, class_weights)


def _anchors(features):
    """[cells * len(ANCHORS), 4] (ycenter, xcenter, height, width), from the feature
    map's dynamic shape as the OD API's grid anchor generator computes them."""
    tf = _tf()
    with tf.compat.v1.name_scope("GridAnchorGenerator"):
        shape = tf.shape(features)
        fh, fw = tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
        ys = (tf.cast(tf.range(shape[1]), tf.float32) + 0.5) / fh
        xs = (tf.cast(tf.range(shape[2]), tf.float32) + 0.5) / fw
        cy, cx = tf.meshgrid(ys, xs, indexing="ij")
        scales = tf.constant([s for s, _ in ANCHORS], tf.float32)
        ratios = tf.sqrt(tf.constant([r for _, r in ANCHORS], tf.float32))
        heights = ANCHOR_SIZE * scales / ratios
        widths = ANCHOR_SIZE * scales * ratios
        k = len(ANCHORS)
        grid = tf.stack([cy, cx], axis=-1)[:, :, None, :] * tf.ones([1, 1, k, 1])
        sizes = tf.stack([heights, widths], axis=-1)[None, None, :, :] * \
            tf.ones_like(grid)
        return tf.reshape(tf.concat([grid, sizes], axis=-1), [-1, 4])


def _decode(encodings, anchors):
    """Faster R-CNN box coder: encodings [batch, N, 4] against anchors [N, 4]."""
    tf = _tf()
    with tf.compat.v1.name_scope("Decode"):
        ty, tx, th, tw = tf.unstack(encodings / tf.constant(BOX_CODER_SCALES), axis=-1)
        ya, xa, ha, wa = tf.unstack(anchors, axis=-1)
        h = tf.exp(th) * ha
        w = tf.exp(tw) * wa
        yc = ty * ha + ya
        xc = tx * wa + xa
        return tf.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
