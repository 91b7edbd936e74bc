"""A small detection model in the Object Detection API's export shape, built in seconds.

What a user of the TF1 Object Detection API has after ``export_inference_graph.py``:
``frozen_inference_graph.pb`` (variables as constants) and ``saved_model/`` with a
``serving_default`` predict signature whose input key is ``inputs``. The graph
(:mod:`serving_opt.detection.network`) has what makes those models hard to optimize and
to compare: an in-graph resize of any frame size, fused and unfused batch norms, anchors
from a dynamic shape and combined NMS. Its class biases are set
(:mod:`serving_opt.detection.calibration`) so that the 480x640 reference :func:`frame`
gives ``detections`` detections (9 by default; up to 3 more where a tie needs them), of
which ``near_ties`` (2 by default) tie, to float precision, with an overlapping box that
NMS suppressed.

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

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving_opt.detection.calibration import NearTie, calibrate
from serving_opt.detection.network import INPUT_NODE, OUTPUT_NODES, Graph, build_graph

INPUT_KEY = "inputs"  # the serving_default input key the OD API exports
FROZEN_GRAPH_NAME = "frozen_inference_graph.pb"
SAVED_MODEL_NAME = "saved_model"

DEFAULT_SIZE = 320
DEFAULT_WIDTH = 8
# The slow variant of issue 22 ("about 0.8 s per image on 2 cores"): ~0.86 s of CPU per
# 480x640 image measured (main --time_images prints wall and CPU time).
SLOW = {"size": 1024, "width": 64}
REFERENCE_FRAME = (480, 640)


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



def _signature(g: Graph):
    import tensorflow as tf

    v1 = tf.compat.v1
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
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    saved_model_dir = os.path.join(output_dir, SAVED_MODEL_NAME)
    frozen_path = os.path.join(output_dir, FROZEN_GRAPH_NAME)
    if os.path.exists(saved_model_dir):
        raise FileExistsError(f"{saved_model_dir} exists; choose an empty --output_dir")
    g = build_graph(size, width, seed)
    with g.graph.as_default(), v1.Session(graph=g.graph) as sess:
        sess.run(v1.global_variables_initializer())
        found, ties = calibrate(sess, g, frame(*REFERENCE_FRAME), detections, near_ties)
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
    """
    import tensorflow as tf

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
    """
    import tensorflow as tf

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
