"""Can a graph this tool writes use the CPU's int8 or bf16 compute in stock TensorFlow?

    .venv/bin/python benchmarks/low_precision.py                      # both models, 5 rounds
    .venv/bin/python benchmarks/low_precision.py --models=mobilenet_v2 --rounds=3
    .venv/bin/python benchmarks/low_precision.py --runtimes=.venv/bin/python,.venv-tf215/bin/python

MobileNetV2 and ResNet-50 from ``keras.applications`` at 224x224, 1000 classes, with
``weights=None`` (no download is reachable here): batch norms take the statistics of
smooth random images (one training-mode pass with momentum 0) and the head is centred
on their mean features, so activations have trained-like scales and the top-1 classes
spread over many classes instead of one. Each model is frozen and run through the
tool's offline Grappler passes: that is the fp32 graph. Variants of it:

* ``bf16``: Grappler's ``auto_mixed_precision_onednn_bfloat16`` run offline, so the
  written GraphDef holds bfloat16 Conv2D/MatMul/... with Casts at the edges;
* ``fpmath_bf16``: the fp32 graph, run with ``ONEDNN_DEFAULT_FPMATH_MODE=BF16`` in the
  environment (oneDNN may then compute fp32 ops in bf16; a server setting, no graph);
* ``int8_qdq``: QuantizeV2 -> Dequantize in front of every Conv2D/depthwise input and
  int8 weights behind a Dequantize: the pattern a runtime would have to fuse;
* ``int8``: explicit fused int8 kernels: every Conv2D/DepthwiseConv2dNative with its
  bias and ReLU/ReLU6 becomes ``_FusedQuantizedConv2D``/``_FusedQuantizedDepthwiseConv2D``
  (per-channel symmetric int8 weights, activations quantized with ranges calibrated
  on 64 images, output requantized to 8 bits), chained in 8 bits from conv to conv and
  dequantized only where a float op (add, pad, pool, matmul) reads it.

Latency: every (variant, round) is a fresh process (a TF1 session on the GraphDef, as
TF Serving runs it: default Grappler at load, oneDNN on), the variants interleaved and
their order rotated each round; per process a warmup, then p50 of ``--runs`` requests
at batch 1 and ``--runs_b32`` at batch 32. Ratios are fp32/variant per round (paired),
reported as median [min, max] over rounds. Agreement (the ``--variants`` asked):
top-1 (argmax) equality with fp32 on ``--agreement_images`` fresh smooth images, under
the model's own head and under a head on the 64 principal directions of the fp32
features, with the features' relative error; and a control, ``fp32_input_noise``: the
fp32 graph with its input moved by bfloat16's unit roundoff (2^-8), which shows how much
of a disagreement the untrained stand-in makes of any perturbation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZE = 224
VARIANTS = ("fp32", "bf16", "fpmath_bf16", "int8_qdq", "int8")
CONV_OPS = ("Conv2D", "DepthwiseConv2dNative")


def smooth_images(n: int, seed: int) -> np.ndarray:
    """Images in [-1, 1] that look like photos to a convnet more than white noise does:
    7x7 random colours upsampled bicubically to SIZE."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    low = rng.uniform(-1, 1, (n, 7, 7, 3)).astype(np.float32)
    return tf.image.resize(low, (SIZE, SIZE), method="bicubic").numpy().clip(-1, 1)


# ---------------------------------------------------------------------------- building

def build_fp32(kind: str):
    """(GraphDef, input tensor, output tensor): the frozen model after the tool's
    offline Grappler passes."""
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    keras.utils.set_random_seed(0)
    ctor = {"mobilenet_v2": keras.applications.MobileNetV2,
            "resnet50": keras.applications.ResNet50}[kind]
    model = ctor(input_shape=(SIZE, SIZE, 3), weights=None, classes=1000,
                 classifier_activation=None)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(smooth_images(32, 1), training=True)
    head = model.get_layer("predictions")
    features = keras.Model(model.input, head.input)(smooth_images(64, 2), training=False)
    weights, _ = head.get_weights()
    head.set_weights([weights, -(np.asarray(features).mean(0) @ weights)])
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, SIZE, SIZE, 3], tf.float32))
    frozen = convert_variables_to_constants_v2(fn)
    graph_def = frozen.graph.as_graph_def()
    inp, out = frozen.inputs[0].name, frozen.outputs[0].name
    return grappler(graph_def, out, ("pruning", "constfold", "arithmetic", "dependency"),
                    rounds=2), inp, out


def grappler(graph_def, output: str, passes, rounds: int = 1, bf16: bool = False):
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewriter = config.graph_options.rewrite_options
    rewriter.optimizers.extend(passes)
    if bf16:
        rewriter.optimizers.append("auto_mixed_precision_onednn_bfloat16")
    rewriter.min_graph_nodes = -1
    for _ in range(rounds):
        meta = meta_graph_pb2.MetaGraphDef()
        meta.graph_def.CopyFrom(graph_def)
        meta.collection_def["train_op"].node_list.value.append(output.split(":")[0])
        graph_def = tf_optimizer.OptimizeGraph(config, meta, verbose=False, graph_id=b"lp")
    return graph_def


def run_graph(graph_def, inp: str, fetches, images: np.ndarray, batch: int = 32):
    """Each fetch's outputs over ``images``, concatenated along the batch."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    out = [[] for _ in fetches]
    with tf.compat.v1.Session(graph=graph) as sess:
        for start in range(0, len(images), batch):
            for i, value in enumerate(sess.run(list(fetches),
                                               {inp: images[start:start + batch]})):
                out[i].append(value)
    return [np.concatenate(v) for v in out]


def _node(graph_def, name: str, op: str, inputs=(), **attrs):
    node = graph_def.node.add()
    node.name, node.op = name, op
    node.input.extend(inputs)
    for key, value in attrs.items():
        if isinstance(value, bool):
            node.attr[key].b = value
        elif isinstance(value, int):
            node.attr[key].type = value  # every int attr set here is a dtype
        elif isinstance(value, bytes):
            node.attr[key].s = value
        elif isinstance(value, float):
            node.attr[key].f = value
        elif value and isinstance(value[0], bytes):
            node.attr[key].list.s.extend(value)
        elif key.startswith("T"):
            node.attr[key].list.type.extend(value)
        else:
            node.attr[key].list.i.extend(value)
    return node


def _const(graph_def, name: str, array, dtype=None) -> str:
    from tensorflow.python.framework import tensor_util

    tensor = tensor_util.make_tensor_proto(array, dtype=dtype)
    node = _node(graph_def, name, "Const", dtype=tensor.dtype)
    node.attr["value"].tensor.CopyFrom(tensor)
    return name


def _filter_shape(nodes, conv):
    return [d.size for d in
            nodes[conv.input[1].split(":")[0]].attr["value"].tensor.tensor_shape.dim]


def _conv_patterns(graph_def):
    """Conv -> [bias add] -> [Relu|Relu6] chains whose filter and bias are constants:
    ``[(conv, bias_node or None, activation or None, last)]``."""
    from tensorflow.python.framework import tensor_util

    nodes = {n.name: n for n in graph_def.node}
    consumers: dict[str, list] = {}
    for n in graph_def.node:
        for i in n.input:
            consumers.setdefault(i.lstrip("^").split(":")[0], []).append(n)

    def only_consumer(name):
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 else None

    found = []
    for conv in graph_def.node:
        if conv.op not in CONV_OPS or conv.attr["data_format"].s not in (b"", b"NHWC") \
                or nodes[conv.input[1].split(":")[0]].op != "Const" \
                or any(d != 1 for d in conv.attr["dilations"].list.i) \
                or (conv.op == CONV_OPS[1] and _filter_shape(nodes, conv)[3] != 1):
            continue
        last, bias, act = conv, None, None
        nxt = only_consumer(conv.name)
        if nxt is not None and nxt.op in ("BiasAdd", "AddV2", "Add"):
            other = nxt.input[1] if nxt.input[0].split(":")[0] == conv.name else nxt.input[0]
            const = nodes.get(other.split(":")[0])
            if const is not None and const.op == "Const" and \
                    tensor_util.MakeNdarray(const.attr["value"].tensor).ndim == 1:
                bias, last = (nxt, tensor_util.MakeNdarray(const.attr["value"].tensor)), nxt
                nxt = only_consumer(nxt.name)
        if nxt is not None and nxt.op in ("Relu", "Relu6"):
            act, last = nxt.op, nxt
        found.append((conv, bias, act, last))
    return found


def rewrite_int8(graph_def, inp: str, calibration: np.ndarray, qdq_only: bool = False):
    """The int8 variants (module docstring); ranges from ``calibration``."""
    from tensorflow.core.framework import graph_pb2, types_pb2
    from tensorflow.python.framework import tensor_util

    quint8, qint8, f32 = types_pb2.DT_QUINT8, types_pb2.DT_QINT8, types_pb2.DT_FLOAT
    patterns = _conv_patterns(graph_def)
    nodes = {n.name: n for n in graph_def.node}
    tensors = sorted({c.input[0] for c, _, _, _ in patterns} |
                     {last.name + ":0" for _, _, _, last in patterns})
    fetch = [t if ":" in t else t + ":0" for t in tensors]
    values = run_graph(graph_def, inp, fetch, calibration)
    ranges = {t: (float(v.min()), float(v.max())) for t, v in zip(tensors, values)}

    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    replaced = {last.name for _, _, _, last in patterns} | \
        {c.name for c, _, _, _ in patterns} | \
        {b[0].name for _, b, _, _ in patterns if b is not None} | \
        {last.name for _, _, a, last in patterns if a is not None}
    for node in graph_def.node:
        if node.name not in replaced:
            out.node.add().CopyFrom(node)
    quantized_input: dict[str, tuple[str, int]] = {}  # float tensor -> (q node, dtype)
    produced: dict[str, tuple[str, int]] = {}  # last node -> (fused node, out dtype)

    def quantize(tensor: str):
        if tensor in quantized_input:
            return quantized_input[tensor]
        lo, hi = ranges[tensor]
        signed = lo < 0
        peak = max(abs(lo), abs(hi), 1e-6)
        name = f"lp_q/{tensor.replace(':', '_')}"
        dtype = qint8 if signed else quint8
        _node(out, name, "QuantizeV2", [tensor, _const(out, name + "/min",
                                                       np.float32(-peak if signed else 0)),
                                        _const(out, name + "/max", np.float32(peak))],
              T=dtype, mode=b"SCALED", round_mode=b"HALF_TO_EVEN")
        quantized_input[tensor] = (name, dtype)
        return name, dtype

    for conv, bias, act, last in patterns:
        filt = tensor_util.MakeNdarray(nodes[conv.input[1].split(":")[0]].attr["value"].tensor)
        depthwise = conv.op == "DepthwiseConv2dNative"
        channels = filt.shape[2] * filt.shape[3] if depthwise else filt.shape[3]
        per_channel = filt.reshape(-1, filt.shape[2], filt.shape[3])
        per_channel = per_channel.reshape(per_channel.shape[0], -1) if depthwise else \
            per_channel.reshape(-1, filt.shape[3])
        wmax = np.maximum(np.abs(per_channel).max(0), 1e-8).astype(np.float32)
        scale = wmax.reshape((1, 1, filt.shape[2], filt.shape[3]) if depthwise
                             else (1, 1, 1, -1)) / 127.0
        qfilt = np.clip(np.rint(filt / scale), -127, 127).astype(np.int8)
        bias_values = bias[1].astype(np.float32) if bias is not None else \
            np.zeros(channels, np.float32)
        base = "lp_int8/" + conv.name
        if qdq_only:
            qin, dtype = quantize(conv.input[0])
            _node(out, base + "/dq_in", "Dequantize", [qin, qin + ":1", qin + ":2"],
                  T=dtype, mode=b"SCALED", dtype=f32)
            wq = _const(out, base + "/w", qfilt, dtype="qint8")
            _node(out, base + "/dq_w", "Dequantize",
                  [wq, _const(out, base + "/wmin", -wmax), _const(out, base + "/wmax", wmax)],
                  T=qint8, mode=b"SCALED", dtype=f32).attr["axis"].i = 2 if depthwise else 3
            new = out.node.add()
            new.CopyFrom(conv)
            new.input[0], new.input[1] = base + "/dq_in", base + "/dq_w"
            if bias is not None:
                out.node.add().CopyFrom(bias[0])
            if act is not None:
                out.node.add().CopyFrom(last)
            continue
        source = conv.input[0].split(":")[0]
        if source in produced and conv.input[0] in (source, source + ":0"):
            qin, dtype = produced[source]
        else:
            qin, dtype = quantize(conv.input[0])
        lo, hi = ranges[last.name + ":0"]
        if act is not None:
            odtype, omin, omax = quint8, 0.0, min(hi, 6.0) if act == "Relu6" else hi
        else:
            odtype = qint8
            omax = max(abs(lo), abs(hi), 1e-6)
            omin = -omax
        fused = [b"BiasAdd"] + ([b"Relu"] if act else []) + [b"Requantize"]
        name = base + "/int8"
        inputs = [qin, _const(out, base + "/w", qfilt, dtype="qint8"),
                  _const(out, base + "/b", bias_values), qin + ":1", qin + ":2",
                  _const(out, base + "/wmin", -wmax), _const(out, base + "/wmax", wmax),
                  _const(out, base + "/omin", np.float32(omin)),
                  _const(out, base + "/omax", np.float32(omax))]
        node = _node(out, name, "_FusedQuantizedDepthwiseConv2D" if depthwise
                     else "_FusedQuantizedConv2D", inputs,
                     Thost_inputs=[dtype, qint8, f32, f32, f32, f32, f32, f32, f32],
                     Thost_outputs=[odtype, f32, f32], Tinput=dtype, Tfilter=qint8,
                     Tbias=f32, Tsummand=odtype, out_type=odtype, padding=conv.attr["padding"].s,
                     data_format=b"NHWC", fused_ops=fused)
        node.attr["Tdevice_inputs"].list.SetInParent()
        node.attr["Tdevice_outputs"].list.SetInParent()
        node.attr["strides"].CopyFrom(conv.attr["strides"])
        if conv.attr["explicit_paddings"].list.i:
            node.attr["explicit_paddings"].CopyFrom(conv.attr["explicit_paddings"])
        # The float result keeps the old name, so every float reader is unchanged.
        _node(out, last.name, "Dequantize", [name, name + ":1", name + ":2"],
              T=odtype, mode=b"SCALED", dtype=f32)
        produced[last.name] = (name, odtype)
    return out


def cmd_build(args) -> None:
    os.makedirs(args.work_dir, exist_ok=True)
    for kind in args.models.split(","):
        graph_def, inp, out = build_fp32(kind)
        calibration = smooth_images(64, 3)
        graphs = {
            "fp32": graph_def,
            "bf16": grappler(graph_def, out, ("constfold",), bf16=True),
            "int8_qdq": rewrite_int8(graph_def, inp, calibration, qdq_only=True),
            "int8": rewrite_int8(graph_def, inp, calibration),
        }
        for name, g in graphs.items():
            with open(os.path.join(args.work_dir, f"{kind}.{name}.pb"), "wb") as f:
                f.write(g.SerializeToString())
        with open(os.path.join(args.work_dir, f"{kind}.json"), "w") as f:
            json.dump({"input": inp, "output": out}, f)
        print(kind, {k: len(g.node) for k, g in graphs.items()}, flush=True)


# ----------------------------------------------------------------------- measuring

def cmd_time(args) -> None:
    """One fresh process: p50 at batch 1 and 32 of one graph."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    meta = json.load(open(os.path.join(args.work_dir, f"{args.model}.json")))
    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(open(os.path.join(args.work_dir, args.graph), "rb").read())
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    images = smooth_images(32, 4)
    result = {}
    with tf.compat.v1.Session(graph=graph) as sess:
        for batch, runs in ((1, args.runs), (32, args.runs_b32)):
            feed = {meta["input"]: images[:batch]}
            for _ in range(3):
                sess.run(meta["output"], feed)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                sess.run(meta["output"], feed)
                times.append(time.perf_counter() - start)
            result[batch] = statistics.median(times) * 1000
    print(json.dumps(result))


def _head_input(graph_def) -> str:
    """The features the classifier head (the last MatMul) reads."""
    return [n.input[0] for n in graph_def.node if n.op == "MatMul"][-1]


def agreement(ref_logits, logits, ref_features, features, components: int = 64) -> dict:
    """Top-1 agreement with fp32, under the model's own head and under a head on the
    directions in which the images' features actually differ (see the docs), with the
    feature error that decides both."""
    rng = np.random.default_rng(7)
    mean = ref_features.mean(0)
    _, sdev, vt = np.linalg.svd(ref_features - mean, full_matrices=False)
    basis = vt[:components].T / (sdev[:components] / np.sqrt(len(ref_features)))
    head = rng.normal(0, 1, (components, 1000)).astype(np.float32)

    def pca_logits(f):
        return ((f - mean) @ basis) @ head

    same = logits.argmax(1) == ref_logits.argmax(1)
    same_pca = pca_logits(features).argmax(1) == pca_logits(ref_features).argmax(1)
    norm = np.linalg.norm(ref_features, axis=1)
    return {"top1": float(same.mean()), "top1_pca_head": float(same_pca.mean()),
            "feature_rel_error": float(np.median(
                np.linalg.norm(features - ref_features, axis=1) / norm)),
            "feature_spread": float(np.median(
                np.linalg.norm(ref_features - mean, axis=1) / norm))}


def cmd_agree(args) -> dict:
    from tensorflow.core.framework import graph_pb2

    images = smooth_images(args.agreement_images, 5)
    table = {}
    for kind in args.models.split(","):
        meta = json.load(open(os.path.join(args.work_dir, f"{kind}.json")))
        logits, features = {}, {}
        for variant in ("fp32",) + tuple(v for v in args.variants.split(",")
                                         if v not in ("fp32", "fpmath_bf16")):
            graph_def = graph_pb2.GraphDef()
            graph_def.ParseFromString(open(os.path.join(
                args.work_dir, f"{kind}.{variant}.pb"), "rb").read())
            out, feat = run_graph(graph_def, meta["input"],
                                  [meta["output"], _head_input(graph_def) + ":0"], images)
            logits[variant], features[variant] = out, feat.astype(np.float32)
        graph_def = graph_pb2.GraphDef()
        graph_def.ParseFromString(open(os.path.join(args.work_dir, f"{kind}.fp32.pb"),
                                       "rb").read())
        # The control: fp32 itself, its input moved by bf16's unit roundoff (2^-8).
        noise = np.random.default_rng(11).normal(0, 2.0 ** -8, images.shape)
        out, feat = run_graph(graph_def, meta["input"],
                              [meta["output"], _head_input(graph_def) + ":0"],
                              (images * (1 + noise)).astype(np.float32))
        logits["fp32_input_noise"], features["fp32_input_noise"] = out, feat
        if "fpmath_bf16" in args.variants.split(","):
            logits["fpmath_bf16"], features["fpmath_bf16"] = cmd_fpmath(args, kind)
        table[kind] = {"fp32_classes": int(len(set(logits["fp32"].argmax(1))))}
        for variant in logits:
            table[kind][variant] = agreement(logits["fp32"], logits[variant],
                                             features["fp32"], features[variant])
    return table


def cmd_fpmath(args, kind: str):
    """(logits, features) of the fp32 graph run with ONEDNN_DEFAULT_FPMATH_MODE=BF16, in a
    child process: oneDNN reads the mode when it starts."""
    env = dict(os.environ, ONEDNN_DEFAULT_FPMATH_MODE="BF16")
    path = os.path.join(args.work_dir, f"{kind}.fpmath.npz")
    subprocess.run([sys.executable, __file__, "--stage=agree_fpmath",
                    f"--work_dir={args.work_dir}", f"--model={kind}",
                    f"--agreement_images={args.agreement_images}"],
                   env=env, capture_output=True, text=True, check=True)
    data = np.load(path)
    return data["logits"], data["features"]


def cmd_agree_fpmath(args) -> None:
    from tensorflow.core.framework import graph_pb2

    images = smooth_images(args.agreement_images, 5)
    meta = json.load(open(os.path.join(args.work_dir, f"{args.model}.json")))
    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString(open(os.path.join(args.work_dir, f"{args.model}.fp32.pb"),
                                   "rb").read())
    logits, features = run_graph(graph_def, meta["input"],
                                 [meta["output"], _head_input(graph_def) + ":0"], images)
    np.savez(os.path.join(args.work_dir, f"{args.model}.fpmath.npz"), logits=logits,
             features=features)


def measure(args) -> dict:
    """{(runtime, model, variant): [ {1: ms, 32: ms} per round ]}, interleaved."""
    runtimes = [r for r in args.runtimes.split(",") if r]
    jobs = [(rt, kind, v) for rt in runtimes for kind in args.models.split(",")
            for v in args.variants.split(",")]
    results: dict = {job: [] for job in jobs}
    for rnd in range(args.rounds):
        shift = rnd % len(jobs)
        for rt, kind, variant in jobs[shift:] + jobs[:shift]:
            env = dict(os.environ)
            graph = f"{kind}.{'fp32' if variant == 'fpmath_bf16' else variant}.pb"
            if variant == "fpmath_bf16":
                env["ONEDNN_DEFAULT_FPMATH_MODE"] = "BF16"
            proc = subprocess.run(
                [os.path.join(ROOT, rt) if not os.path.isabs(rt) else rt, __file__,
                 "--stage=time", f"--work_dir={args.work_dir}", f"--model={kind}",
                 f"--graph={graph}", f"--runs={args.runs}", f"--runs_b32={args.runs_b32}"],
                env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                print(f"round {rnd}: {rt} {kind} {variant} failed: {err[:200]}", flush=True)
                results[(rt, kind, variant)].append(None)
                continue
            value = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1])
                     .items()}
            results[(rt, kind, variant)].append(value)
            print(f"round {rnd}: {rt} {kind} {variant} {value}", flush=True)
    return results


def summarize(results: dict) -> list[str]:
    lines = ["| TF | model | variant | p50 b1 ms | p50 b32 ms | speedup b1 | speedup b32 |",
             "|---|---|---|---|---|---|---|"]
    for (rt, kind, variant), rounds in results.items():
        base = results.get((rt, kind, "fp32"), [])
        cells = []
        for batch in (1, 32):
            ms = [r[batch] for r in rounds if r]
            cells.append(f"{statistics.median(ms):.2f}" if ms else "failed")
        for batch in (1, 32):
            ratios = [b[batch] / r[batch] for b, r in zip(base, rounds) if b and r]
            cells.append(f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-"
                         f"{max(ratios):.2f}]" if ratios else "-")
        label = "2.15" if "215" in rt else "2.21"
        lines.append(f"| {label} | {kind} | {variant} | " + " | ".join(cells) + " |")
    return lines


def cpu_description() -> str:
    name, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and name == "?":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags |= set(line.split(":", 1)[1].split())
    wanted = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
    return f"{name}, {os.cpu_count()} cores; flags: " + \
        " ".join(f for f in wanted if f in flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", default="all",
                        choices=("all", "build", "time", "agree", "agree_fpmath", "measure"))
    parser.add_argument("--work_dir", default="/tmp/low_precision")
    parser.add_argument("--models", default="mobilenet_v2,resnet50")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--runtimes", default=".venv/bin/python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--runs_b32", type=int, default=8)
    parser.add_argument("--agreement_images", type=int, default=1000)
    parser.add_argument("--model")
    parser.add_argument("--graph")
    args = parser.parse_args()
    if args.stage == "time":
        return cmd_time(args)
    if args.stage == "agree_fpmath":
        return cmd_agree_fpmath(args)
    print(cpu_description(), flush=True)
    if args.stage in ("all", "build"):
        cmd_build(args)
    if args.stage in ("all", "agree"):
        table = cmd_agree(args)
        print(json.dumps(table, indent=1), flush=True)
    if args.stage in ("all", "measure"):
        print("\n".join(summarize(measure(args))), flush=True)


if __name__ == "__main__":
    main()
