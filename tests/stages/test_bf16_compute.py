"""--quantize=bf16: the compute in bfloat16 with float32 at the edges, the weights folded to
bfloat16 constants, and the mode refused on a CPU without bfloat16 arithmetic (faked
/proc/cpuinfo, so it runs on every machine)."""

from __future__ import annotations

import numpy as np
import pytest

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.options import BuildOptions
from serving_opt.savedmodel import loader
from serving_opt.savedmodel.graph import ServingGraph
from serving_opt.stages import bf16

FLOAT, BFLOAT16 = 1, 14  # types_pb2.DT_FLOAT, DT_BFLOAT16


def _conv_net():
    """A TF1 conv -> bias -> relu -> mean -> matmul graph, its weights, and a runner."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    rng = np.random.default_rng(0)
    kernel = rng.normal(0, 0.3, (3, 3, 3, 16)).astype(np.float32)
    bias = rng.normal(0, 0.1, 16).astype(np.float32)
    dense = rng.normal(0, 0.3, (16, 10)).astype(np.float32)
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="x")
        hidden = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias))
        y = tf.identity(tf.matmul(tf.reduce_mean(hidden, [1, 2]), dense), name="y")
    sig = meta_graph_pb2.SignatureDef(method_name=loader.METHOD_PREDICT)
    sig.inputs["x"].name, sig.outputs["y"].name = x.name, y.name
    sig.inputs["x"].dtype = sig.outputs["y"].dtype = FLOAT  # Grappler's item builder reads it
    serving = ServingGraph(graph_def=graph.as_graph_def(), signature_defs={"s": sig},
                           tags=frozenset({loader.SERVE_TAG}))

    def run(graph_def, value):
        with tf.Graph().as_default() as g:
            tf.graph_util.import_graph_def(graph_def, name="")
            with v1.Session(graph=g) as sess:
                return sess.run("y:0", {"x:0": value})

    return serving, (kernel, bias, dense), run


def _numpy_reference(x, kernel, bias, dense):
    """The float32 answer, computed without TensorFlow: SAME 3x3 convolution by hand."""
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    conv = np.zeros(x.shape[:3] + (kernel.shape[3],), np.float64)
    for i in range(3):
        for j in range(3):
            conv += padded[:, i:i + x.shape[1], j:j + x.shape[2], :] @ kernel[i, j]
    return np.maximum(conv + bias, 0).mean(axis=(1, 2)) @ dense


def test_bf16_rewrite_computes_in_bfloat16_with_float32_edges_and_bf16_weights():
    serving, weights, run = _conv_net()
    assert bf16.bf16_compute_nodes(serving.graph_def) == []  # control: float32 before
    # This suite runs with oneDNN's ops off (conftest), as the optimizing process does:
    # to_bf16 runs Grappler's pass in a child with them on.
    graph, count = bf16.to_bf16(serving)
    converted = graph.graph_def
    nodes = {n.name: n for n in converted.node}
    computing = {nodes[name].op for name in bf16.bf16_compute_nodes(converted)}
    assert {"Conv2D", "MatMul"} <= computing
    assert count == len(bf16.bf16_compute_nodes(converted))
    # float32 at the edges: the signature's tensors keep their dtype.
    assert nodes["x"].attr["dtype"].type == FLOAT and nodes["y"].attr["T"].type == FLOAT
    # The weights were folded to bfloat16 constants: no request casts a weight.
    for node in converted.node:
        if node.op == "Cast":
            assert nodes[node.input[0].split(":")[0]].op != "Const", node.name
        if node.op in ("Conv2D", "MatMul"):
            weight = nodes[node.input[1].split(":")[0]]
            assert weight.op == "Const" and weight.attr["dtype"].type == BFLOAT16
    x = np.random.default_rng(1).uniform(-1, 1, (4, 8, 8, 3)).astype(np.float32)
    expected = _numpy_reference(x, *weights)
    before, after = run(serving.graph_def, x), run(converted, x)
    assert after.dtype == np.float32
    np.testing.assert_allclose(before, expected, rtol=1e-4, atol=1e-4)
    scale = np.abs(expected).max()
    # bfloat16 keeps 8 significant bits: within a few 2^-8 of the float32 answer, and
    # really rounded (not float32 under another name).
    assert np.abs(after - expected).max() <= 4 * 2.0 ** -8 * scale
    assert np.abs(after - before).max() > 0


def test_bf16_rewrite_that_converts_nothing_is_an_error_naming_the_cause(monkeypatch):
    serving, _, _ = _conv_net()
    monkeypatch.setattr(bf16, "_run_passes_in_child", lambda graph: graph)
    monkeypatch.setattr(bf16, "_run_passes", lambda graph: graph)
    with pytest.raises(ServingOptError, match="no op into bfloat16"):
        bf16.to_bf16(serving)


def test_bf16_is_tried_on_the_frozen_graph_only():
    from serving_opt.pipeline.attempts import candidates

    assert [c.describe() for c in candidates("auto", "bf16")] == ["frozen, bf16 compute"]
    assert [c.describe() for c in candidates("auto", "int8")][-1] == \
        "variables kept, int8: tables only"  # control: other modes fall back
    serving, _, _ = _conv_net()
    with pytest.raises(ServingOptError, match="needs the frozen graph"):
        bf16.to_bf16(serving.replace(variables_dir="/models/m/1/variables"))


def _cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nmodel name\t: Test CPU\nflags\t\t: {flags}\n")
    return str(path)


def test_bf16_refused_before_any_work_on_a_cpu_without_bfloat16(tmp_path, monkeypatch):
    monkeypatch.setattr(bf16, "CPUINFO", _cpuinfo(tmp_path, "fpu sse4_2 avx2 fma avx512f "
                                                            "avx512_vnni amx_tile amx_int8"))
    with pytest.raises(UsageError) as refused:
        BuildOptions(quantize="bf16").check()
    message = str(refused.value)
    assert "bfloat16" in message and "slower" in message and "\n" not in message.strip()
    BuildOptions(quantize="int8").check()  # control: only bf16 asks the CPU


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_bf16_accepted_on_a_cpu_with_either_bfloat16_flag(tmp_path, monkeypatch, flag):
    monkeypatch.setattr(bf16, "CPUINFO", _cpuinfo(tmp_path, f"fpu avx2 avx512f {flag}"))
    BuildOptions(quantize="bf16").check()
    assert flag in bf16.cpu_flags()


def test_bf16_unreadable_cpuinfo_is_a_cpu_without_bfloat16(tmp_path, monkeypatch):
    monkeypatch.setattr(bf16, "CPUINFO", str(tmp_path / "missing"))
    assert bf16.cpu_flags() == frozenset()
    with pytest.raises(UsageError, match="AVX-512-BF16 or AMX-BF16"):
        bf16.check_cpu()
