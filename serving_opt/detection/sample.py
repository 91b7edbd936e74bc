"""A small detection model in the Object Detection API's export shape, built in seconds.

What a user of the TF1 Object Detection API has after ``export_inference_graph.py``:
``frozen_inference_graph.pb`` (variables as constants) and ``saved_model/`` with a
``serving_default`` predict signature whose input key is ``inputs``. The graph has what
makes those models hard to optimize and to compare:

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

The weights are random from ``seed``; the class biases are then set so that the
480x640 reference :func:`frame` gives ``detections`` detections (9 by default; up to 3
more where a tie needs them) and so that ``near_ties`` of them (2 by default) tie, to
float precision, with an overlapping box of another anchor of the same class: NMS keeps
one of the two, and which one is a rounding decision (freezing or folding batch norms
into the convolutions can flip it).

``size=320`` (default, width 8) costs about 0.01 s of CPU per 480x640 image; ``SLOW``
(1024 px, width 64) about 0.8 s of CPU, the "about 0.8 s per image" model of issue 22
(CPU time of all threads: wall time is lower on an idle 2-core machine, several times
higher on a busy one). The cost grows about as width squared.

Usage:
    python -m serving_opt.detection.sample --output_dir=build/detection
    python -m serving_opt.detection.sample --output_dir=build/detection_slow --slow \
        --time_images=3
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INPUT_NODE = "image_tensor"
INPUT_KEY = "inputs"  # the serving_default input key the OD API exports
OUTPUT_NODES = ("detection_boxes", "detection_scores", "detection_classes", "num_detections")
FROZEN_GRAPH_NAME = "frozen_inference_graph.pb"
SAVED_MODEL_NAME = "saved_model"

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

DEFAULT_SIZE = 320
DEFAULT_WIDTH = 8
# The slow variant of issue 22 ("about 0.8 s per image on 2 cores"): ~0.86 s of CPU per
# 480x640 image measured (main --time_images prints wall and CPU time).
SLOW = {"size": 1024, "width": 64}
REFERENCE_FRAME = (480, 640)


@dataclass(frozen=True)
class NearTie:
    """Two overlapping candidates of one class whose scores tie to float precision.

    ``kept`` and ``other`` are anchor indices (``cell * len(ANCHORS) + anchor``) into the
    model's candidates; ``rank`` is the kept detection's place in ``detection_scores``
    on the reference frame; ``iou`` the overlap of the two decoded boxes.
    """

    rank: int
    detection_class: int  # 1-based, as detection_classes
    kept: int
    other: int
    iou: float
    logit_gap: float  # |logit(kept) - logit(other)|, at most a few ulp


@dataclass(frozen=True)
class DetectionSample:
    """What :func:`build` wrote, and what the model answers on the reference frame."""

    output_dir: str
    frozen_graph: str  # .../frozen_inference_graph.pb
    saved_model_dir: str  # .../saved_model (variables kept, as a user's export has them)
    size: int
    width: int
    seed: int
    detections: int  # num_detections on frame(*REFERENCE_FRAME)
    near_ties: tuple[NearTie, ...]

    def summary(self) -> str:
        ties = ", ".join(f"rank {t.rank} class {t.detection_class} (IoU {t.iou:.2f})"
                         for t in self.near_ties) or "none"
        return (f"detection sample {self.size}px width {self.width} seed {self.seed}: "
                f"{self.detections} detections on a {REFERENCE_FRAME[0]}x"
                f"{REFERENCE_FRAME[1]} frame; near-ties: {ties}")


def frame(height: int = REFERENCE_FRAME[0], width: int = REFERENCE_FRAME[1],
          seed: int = 0, batch: int = 1) -> np.ndarray:
    """A synthetic photo: uint8 ``[batch, height, width, 3]``, the same scene at any size.

    Shapes are placed in normalized coordinates, so 480x640 and 720x1280 frames of one
    seed show the same objects (stretched); the noise differs with the size.

    Example:
        >>> frame(480, 640).shape
        (1, 480, 640, 3)
    """
    rng = np.random.default_rng(seed)
    ys = (np.arange(height, dtype=np.float32)[:, None] + 0.5) / height
    xs = (np.arange(width, dtype=np.float32)[None, :] + 0.5) / width
    base = rng.uniform(40, 200, size=3)
    tilt = rng.uniform(-60, 60, size=(2, 3))
    image = np.empty((height, width, 3), np.float32)
    for c in range(3):
        image[:, :, c] = base[c] + tilt[0, c] * ys + tilt[1, c] * xs \
            + 15 * np.sin(6.0 * ys + 4.0 * xs + c)
    for _ in range(7):
        cy, cx = rng.uniform(0.15, 0.85, size=2)
        hh, hw = rng.uniform(0.06, 0.2, size=2)
        color = rng.uniform(0, 255, size=3)
        if rng.random() < 0.5:
            mask = (np.abs(ys - cy) < hh) & (np.abs(xs - cx) < hw)
        else:
            mask = ((ys - cy) / hh) ** 2 + ((xs - cx) / hw) ** 2 < 1.0
        image[mask] = color
    out = np.empty((batch, height, width, 3), np.uint8)
    for b in range(batch):
        noise = np.random.default_rng([seed, height, width, b]).normal(0, 6, image.shape)
        out[b] = np.clip(image + noise, 0, 255).astype(np.uint8)
    return out


def _tf():
    import tensorflow as tf

    return tf


@dataclass(frozen=True)
class _Graph:
    """The built graph's handles the builder needs (not the user)."""

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


def _build_graph(size: int, width: int, seed: int) -> _Graph:
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
    return _Graph(graph, image, outputs, logits, boxes, class_bias, class_weights)


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


# ---------------------------------------------------------------- calibration (numpy)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box ``a`` [4] with each of ``b`` [M, 4] (ymin, xmin, ymax, xmax)."""
    ih = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    iw = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = ih * iw
    area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])  # noqa: E731
    union = area(a) + area(b) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _ranked(logits: np.ndarray, boxes: np.ndarray, top: int = 64) -> list[tuple]:
    """What combined NMS keeps with no score threshold, best first: (logit, anchor
    index, class) per detection. Per class greedy NMS over the ``top`` best candidates,
    as the op does."""
    # The op compares the boxes as decoded; clip_boxes clips only what it returns.
    kept: list[tuple] = []
    for c in range(NUM_CLASSES):
        column = logits[:, c + 1]
        order = np.argsort(-column, kind="stable")[:top]
        chosen: list[int] = []
        for i in order:
            if chosen and np.any(_iou(boxes[i], boxes[chosen]) > IOU_THRESHOLD):
                continue
            chosen.append(int(i))
            if len(chosen) == MAX_PER_CLASS:
                break
        kept.extend((float(column[i]), i, c) for i in chosen)
    kept.sort(key=lambda t: -t[0])
    return kept[:MAX_DETECTIONS]


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


class _Calibrator:
    """Sets the class biases of a live session: near-ties, then the detection count."""

    def __init__(self, sess, g: _Graph, reference: np.ndarray) -> None:
        self.sess, self.g, self.feed = sess, g, {g.image: reference}
        self.bias = sess.run(g.class_bias).astype(np.float64)

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        logits, boxes = self.sess.run([self.g.logits, self.g.boxes], self.feed)
        return logits[0], boxes[0]

    def set_bias(self, bias: np.ndarray) -> None:
        self.bias = bias
        self.g.class_bias.load(bias.astype(np.float32), self.sess)

    def make_tie(self, kept_index: int, other: int, cls: int, iou: float) -> NearTie:
        """Raises another overlapping anchor's class bias so that its logit equals the
        kept one's at this cell (to a few ulp)."""
        k = len(ANCHORS)
        channel = (other % k) * (NUM_CLASSES + 1) + cls + 1
        for _ in range(4):  # float32 rounding of conv + bias: converge to a few ulp
            logits, _ = self.run()
            diff = float(logits[kept_index, cls + 1]) - float(logits[other, cls + 1])
            if diff == 0.0:
                break
            bias = self.bias.copy()
            bias[channel] += diff
            self.set_bias(bias)
        logits, _ = self.run()
        gap = abs(float(logits[kept_index, cls + 1]) - float(logits[other, cls + 1]))
        return NearTie(-1, cls + 1, kept_index, other, iou, gap)

    def set_count(self, target: int) -> int:
        """Shifts every class logit so the score threshold falls halfway between the
        ``target``-th and the next detection NMS keeps; returns the count the model
        then answers. Where the numpy model of NMS and the op disagree (a tie ordered
        the other way), the neighbouring gaps are tried."""
        logits, boxes = self.run()
        levels = [r[0] for r in _ranked(logits, boxes)]
        base = self.bias.copy()
        found = 0
        for want in (target, target + 1, target - 1, target + 2, target - 2):
            if not 0 < want < len(levels) or levels[want - 1] == levels[want]:
                continue
            middle = (levels[want - 1] + levels[want]) / 2.0
            self.set_bias(base + (_logit(SCORE_THRESHOLD) - middle))
            found = int(self.sess.run(self.g.outputs["num_detections"], self.feed)[0])
            if found == want:
                return found
        if not found:
            self.set_bias(base)
            raise RuntimeError(f"the model keeps only {len(levels)} candidates")
        return found


def _tie_candidates(logits: np.ndarray, boxes: np.ndarray,
                    ranked: list[tuple]) -> list[tuple]:
    """(logit gap, kept, other, class, IoU) for each kept detection and another anchor of
    its cell that NMS suppressed for it alone (no better kept box of the class overlaps
    it): raised to a tie, which of the two is kept is a rounding decision. Smallest gap
    first: the smaller the raise, the fewer candidates elsewhere it lifts."""
    k = len(ANCHORS)
    found = []
    for rank, (logit, index, cls) in enumerate(ranked):
        better = [i for _, i, c in ranked[:rank] if c == cls]
        cell, anchor = divmod(index, k)
        for other_anchor in range(k):
            other = cell * k + other_anchor
            gap = logit - float(logits[other, cls + 1])
            if other_anchor == anchor or gap < 0:
                continue
            iou = float(_iou(boxes[index], boxes[other][None])[0])
            if iou < IOU_THRESHOLD + 0.01:  # whichever NMS keeps suppresses the other
                continue
            if better and np.any(_iou(boxes[other], boxes[better]) > IOU_THRESHOLD):
                continue
            found.append((gap, index, other, cls, iou))
    return sorted(found)


def _correlate_anchors(sess, g: _Graph, spread: float = 0.25) -> None:
    """Makes the anchors of a cell score alike, as trained heads do (neighbouring anchors
    see the same object): each anchor's class kernel becomes the mean over anchors plus
    ``spread`` times its own deviation."""
    kernel = sess.run(g.class_weights)
    shape = kernel.shape
    per_anchor = kernel.reshape(shape[:3] + (len(ANCHORS), NUM_CLASSES + 1))
    mean = per_anchor.mean(axis=3, keepdims=True)
    mixed = mean + spread * (per_anchor - mean)
    g.class_weights.load(mixed.reshape(shape).astype(np.float32), sess)


def _pair_rank(ranked: list[tuple[int, int]], tie: NearTie) -> int | None:
    cls = tie.detection_class - 1
    places = [r for r, found in enumerate(ranked) if found in ((tie.kept, cls), (tie.other, cls))]
    return places[0] if places else None


def _calibrate(sess, g: _Graph, detections: int, near_ties: int,
               slack: int = 3) -> tuple[int, tuple[NearTie, ...]]:
    """Sets the class biases: ``near_ties`` ties among the best detections, then the
    threshold so that ``detections`` (up to ``slack`` more, to keep a tie in) pass."""
    _correlate_anchors(sess, g)
    calibrator = _Calibrator(sess, g, frame(*REFERENCE_FRAME))
    original = calibrator.bias.copy()
    ties: list[NearTie] = []
    count = detections
    logits, boxes = calibrator.run()
    k = len(ANCHORS)
    for _, index, other, cls, iou in _tie_candidates(
            logits, boxes, _ranked(logits, boxes)[:detections + slack])[:16]:
        if len(ties) == near_ties:
            break
        channels = {(t.other % k, t.detection_class) for t in ties} | \
            {(t.kept % k, t.detection_class) for t in ties}
        if (other % k, cls + 1) in channels or (index % k, cls + 1) in channels:
            continue  # one raise per channel, or the first tie would move
        saved = calibrator.bias.copy()
        tie = calibrator.make_tie(index, other, cls, iou)
        logits, boxes = calibrator.run()
        ranked = [(i, c) for _, i, c in _ranked(logits, boxes)]
        # Kept only if every tie stays among the detections (a raised bias lifts that
        # anchor's candidates everywhere); NMS keeps one of each pair.
        ranks = [_pair_rank(ranked, t) for t in ties + [tie]]
        if all(r is not None and r < detections + slack for r in ranks):
            ties.append(tie)
            count = max(detections, max(r for r in ranks if r is not None) + 1)
        else:
            calibrator.set_bias(saved)
    try:
        calibrator.set_count(count)
    except RuntimeError:
        calibrator.set_bias(original)
        raise
    out = sess.run(g.outputs, calibrator.feed)
    found = int(out["num_detections"][0])
    logits, _ = calibrator.run()
    ranked_ties = []
    scores = out["detection_scores"][0]
    classes = out["detection_classes"][0]
    for tie in ties:
        score = 1.0 / (1.0 + math.exp(-float(logits[tie.kept, tie.detection_class])))
        ranks = [r for r in range(found) if classes[r] == tie.detection_class
                 and abs(scores[r] - score) < 1e-6]
        gap = abs(float(logits[tie.kept, tie.detection_class])
                  - float(logits[tie.other, tie.detection_class]))
        ranked_ties.append(NearTie(ranks[0] if ranks else -1, tie.detection_class,
                                   tie.kept, tie.other, tie.iou, gap))
    return found, tuple(ranked_ties)


# ------------------------------------------------------------------------- writing


def _signature(g: _Graph):
    v1 = _tf().compat.v1
    return v1.saved_model.signature_def_utils.predict_signature_def(
        {INPUT_KEY: g.image}, dict(g.outputs))


def build(output_dir: str, size: int = DEFAULT_SIZE, seed: int = 0,
          width: int = DEFAULT_WIDTH, detections: int = 9,
          near_ties: int = 2) -> DetectionSample:
    """Writes ``output_dir/frozen_inference_graph.pb`` and ``output_dir/saved_model/``.

    ``size`` is the in-graph resize (320: milliseconds per image; 1024 with ``width=64``:
    the slow variant, ``SLOW``); ``width`` the first layer's channels (later layers have
    2x and 4x). The SavedModel keeps its variables, as a user's training export has
    them; the frozen graph is the same model with variables as constants. Deterministic
    for (size, width, seed) on one machine.

    Example:
        >>> sample = build("/tmp/det")
        >>> sample.detections, os.path.basename(sample.frozen_graph)
        (9, 'frozen_inference_graph.pb')
    """
    tf = _tf()
    v1 = tf.compat.v1
    saved_model_dir = os.path.join(output_dir, SAVED_MODEL_NAME)
    frozen_path = os.path.join(output_dir, FROZEN_GRAPH_NAME)
    if os.path.exists(saved_model_dir):
        raise FileExistsError(f"{saved_model_dir} exists; choose an empty --output_dir")
    g = _build_graph(size, width, seed)
    with g.graph.as_default(), v1.Session(graph=g.graph) as sess:
        sess.run(v1.global_variables_initializer())
        found, ties = _calibrate(sess, g, detections, near_ties)
        builder = v1.saved_model.Builder(saved_model_dir)
        builder.add_meta_graph_and_variables(
            sess, [v1.saved_model.tag_constants.SERVING],
            signature_def_map={"serving_default": _signature(g)}, strip_default_attrs=True)
        builder.save()
        frozen = v1.graph_util.convert_variables_to_constants(
            sess, g.graph.as_graph_def(), list(OUTPUT_NODES))
    with open(frozen_path, "wb") as f:
        f.write(frozen.SerializeToString())
    return DetectionSample(output_dir, frozen_path, saved_model_dir, size, width, seed,
                           found, ties)


def run_frozen_graph(frozen_graph: str, images: np.ndarray,
                     outputs: Sequence[str] = OUTPUT_NODES) -> dict[str, np.ndarray]:
    """Runs a frozen GraphDef in a session, as a TF1 user does: output name -> array.

    For this project's own samples and tests: a user's .pb is untrusted and never run
    on the build host outside the sandbox.

    Example:
        >>> run_frozen_graph(sample.frozen_graph, frame())["num_detections"]
        array([9.], dtype=float32)
    """
    tf = _tf()
    v1 = tf.compat.v1
    graph_def = v1.GraphDef()
    with open(frozen_graph, "rb") as f:
        graph_def.ParseFromString(f.read())
    with tf.Graph().as_default() as graph:
        tf.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph) as sess:
            values = sess.run([f"{name}:0" for name in outputs], {f"{INPUT_NODE}:0": images})
    return dict(zip(outputs, values))


@dataclass(frozen=True)
class Timing:
    """Per-image cost of the frozen graph (batch 1), medians over ``images`` runs."""

    wall_seconds: float
    cpu_seconds: float  # process CPU time: all threads, so up to cores x wall
    images: int


def time_per_image(frozen_graph: str, images: int = 3,
                   shape: tuple[int, int] = REFERENCE_FRAME) -> Timing:
    """Runs ``images`` frames (batch 1) through the frozen graph after a warm-up run and
    returns the median wall and CPU time of one.

    Example:
        >>> time_per_image(sample.frozen_graph).wall_seconds < 0.1
        True
    """
    tf = _tf()
    v1 = tf.compat.v1
    graph_def = v1.GraphDef()
    with open(frozen_graph, "rb") as f:
        graph_def.ParseFromString(f.read())
    fetches = [f"{name}:0" for name in OUTPUT_NODES]
    walls, cpus = [], []
    with tf.Graph().as_default() as graph:
        tf.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph) as sess:
            sess.run(fetches, {f"{INPUT_NODE}:0": frame(*shape)})
            for i in range(images):
                feed = {f"{INPUT_NODE}:0": frame(*shape, seed=i + 1)}
                start, cpu = time.perf_counter(), time.process_time()
                sess.run(fetches, feed)
                walls.append(time.perf_counter() - start)
                cpus.append(time.process_time() - cpu)
    return Timing(float(np.median(walls)), float(np.median(cpus)), images)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--size", type=int, default=None,
                        help=f"in-graph resize (default {DEFAULT_SIZE}; --slow: "
                             f"{SLOW['size']})")
    parser.add_argument("--width", type=int, default=None,
                        help=f"first layer's channels (default {DEFAULT_WIDTH}; --slow: "
                             f"{SLOW['width']})")
    parser.add_argument("--slow", action="store_true",
                        help="the ~0.8 s per image variant (1024 px, wide backbone)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write_frames", default=None,
                        help="also write two 480x640 frames as JSON lines ({'inputs': ...}) "
                             "to this file, for optimize --examples")
    parser.add_argument("--time_images", type=int, default=0,
                        help="then time this many 480x640 images through the frozen graph")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from serving_opt.savedmodel import tf_process

    tf_process.quiet_tensorflow_import()
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    preset = SLOW if args.slow else {"size": DEFAULT_SIZE, "width": DEFAULT_WIDTH}
    size = args.size if args.size is not None else preset["size"]
    width = args.width if args.width is not None else preset["width"]
    if os.path.exists(os.path.join(args.output_dir, SAVED_MODEL_NAME)):
        print(f"{args.output_dir} already holds a detection sample; leaving it as it is")
    else:
        sample = build(args.output_dir, size=size, seed=args.seed, width=width)
        print(sample.summary())
        print(f"wrote {sample.frozen_graph} and {sample.saved_model_dir}")
    if args.write_frames:
        import json

        with open(args.write_frames, "w") as f:
            for seed in (0, 1):
                f.write(json.dumps({"inputs": frame(seed=seed).tolist()}) + "\n")
        print(f"wrote {args.write_frames} (2 frames of {REFERENCE_FRAME[0]}x"
              f"{REFERENCE_FRAME[1]})")
    if args.time_images:
        timing = time_per_image(os.path.join(args.output_dir, FROZEN_GRAPH_NAME),
                                args.time_images)
        print(f"{timing.wall_seconds:.3f} s per 480x640 image, {timing.cpu_seconds:.3f} s "
              f"of CPU (median of {timing.images}, batch 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
