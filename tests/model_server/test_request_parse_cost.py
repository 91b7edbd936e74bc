"""The parsed size the gRPC services charge a request before parsing it
(request_cost.parse_cost) is at least what parsing it really takes, for the shapes that
cost most per byte sent (up to 20x): many empty strings, empty messages, map entries, dimensions and
packed varints. Measured as the resident growth of a fresh process that parses them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from serving_opt.model_server import request_cost

COUNT = 1_000_000

# Builds one message of a shape, serialized; the same text builds it in the child.
SHAPES = {
    "empty strings": (
        "from tensorflow.core.framework import tensor_pb2 as m\n"
        "cls = m.TensorProto\n"
        "msg = cls(string_val=[b''] * N)"),
    "empty examples": (
        "from tensorflow_serving.apis import input_pb2 as m\n"
        "from tensorflow.core.example import example_pb2\n"
        "cls = m.Input\n"
        "msg = cls()\n"
        "msg.example_list.examples.extend([example_pb2.Example()] * N)"),
    "map entries": (
        "from tensorflow_serving.apis import predict_pb2 as m\n"
        "cls = m.PredictRequest\n"
        "msg = cls()\n"
        "for i in range(N // 10): msg.inputs[str(i)]"),
    "dimensions": (
        "from tensorflow.core.framework import tensor_pb2 as m, tensor_shape_pb2 as s\n"
        "cls = m.TensorProto\n"
        "msg = cls()\n"
        "msg.tensor_shape.dim.extend([s.TensorShapeProto.Dim()] * N)"),
    "packed varints": (
        "from tensorflow.core.framework import tensor_pb2 as m\n"
        "cls = m.TensorProto\n"
        "msg = cls(int64_val=[1] * N)"),
}

_CHILD = """
import gc, sys
N = int(sys.argv[1])
{build}
wire = msg.SerializeToString()
del msg
gc.collect()
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
before = rss()
parsed = cls.FromString(wire)
print(rss() - before, len(wire))
"""


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_charged_parse_cost_covers_what_parsing_takes(shape):
    build = SHAPES[shape]
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(build=build), str(COUNT)], check=True,
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300).stdout.split()
    growth, wire_size = int(out[-2]), int(out[-1])
    namespace = {"N": COUNT}
    exec(build, namespace)  # noqa: S102 - the same fixed text the child ran
    message = namespace["msg"]
    wire = message.SerializeToString()
    assert len(wire) == wire_size
    charged = request_cost.parse_cost(wire, message.DESCRIPTOR, 2**62)
    # Control: the measurement sees the parse (each shape costs more than it sent).
    assert growth > wire_size, (shape, growth, wire_size)
    assert charged >= growth, (shape, charged, growth)


def test_an_unknown_group_does_not_hide_what_follows_it():
    from tensorflow.core.framework import tensor_pb2

    strings = tensor_pb2.TensorProto(string_val=[b""] * 100_000).SerializeToString()
    # Field 1000, wire type 3 (start group) then 4 (end group): upb keeps it as an unknown
    # field and goes on to parse the strings after it.
    group = bytes([0xC3, 0x3E, 0xC4, 0x3E])
    hidden = group + strings
    assert len(tensor_pb2.TensorProto.FromString(hidden).string_val) == 100_000
    budget = request_cost.parse_cost(strings, tensor_pb2.TensorProto.DESCRIPTOR, 2**62)
    with pytest.raises(request_cost.RequestTooCostly):
        request_cost.parse_cost(hidden, tensor_pb2.TensorProto.DESCRIPTOR, budget)


def test_repeated_identical_elements_cost_what_distinct_ones_do():
    from tensorflow.core.example import example_pb2, feature_pb2
    from tensorflow.core.framework import tensor_pb2
    from tensorflow_serving.apis import input_pb2

    def cost(message) -> int:
        wire = message.SerializeToString()
        # A budget low enough that the wire is walked, high enough not to refuse it.
        return request_cost.parse_cost(wire, message.DESCRIPTOR, 180 * len(wire))

    same = tensor_pb2.TensorProto(string_val=[b"a"] * 50_000)
    mixed = tensor_pb2.TensorProto(string_val=[b"a", b"b"] * 25_000)
    assert cost(same) == cost(mixed)
    one = example_pb2.Example()
    one.features.feature["k"].CopyFrom(feature_pb2.Feature())
    other = example_pb2.Example()
    other.features.feature["j"].CopyFrom(feature_pb2.Feature())
    same = input_pb2.Input()
    same.example_list.examples.extend([one] * 20_000)
    mixed = input_pb2.Input()
    mixed.example_list.examples.extend([one, other] * 10_000)
    assert cost(same) == cost(mixed)
