"""``--prefer_tflite_model``: a version directory's ``model.tflite`` served like upstream's
TfLiteSession (servables/tensorflow/tflite_session.cc).

With the flag on and ``model.tflite`` present, upstream loads the TFLite model instead of
the SavedModel; its signature defs come from the model's signature runners (one
SignatureDef per TFLite signature, inputs and outputs keyed by the signature's names,
method ``tensorflow/serving/predict``), so Predict, GetModelMetadata and REST predict work
on it. Here each request runs one ``tf.lite.Interpreter`` signature runner, taken from a
pool of ``num_tflite_pools * num_tflite_interpreters_per_pool`` interpreters (each used by
one request at a time; upstream's defaults give one). TensorInfo names are
``<signature>/<input or output name>``: what Predict feeds and fetches. A model without
signatures (upstream's saved_model_half_plus_two_tflite) gets upstream's one
``serving_default``, its inputs and outputs keyed and named by their tensors' names.

A model.tflite is code too: the version gets the SavedModel path's file checks, and a
Select TF ("flex") op that is a host op fails the load unless ``--allow_file_ops``.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Mapping, Sequence

import numpy as np

from serving_opt.model_server.servable import Fetched, ServableId
from serving_opt.model_server.status import (
    ServingStatusError,
    failed_precondition,
    from_tf_error,
    invalid_argument,
    not_found,
    unimplemented,
)

TFLITE_MODEL = "model.tflite"
PREDICT_METHOD = "tensorflow/serving/predict"
DEFAULT_SIGNATURE = "serving_default"


def tflite_model_exists(export_dir: str) -> bool:
    """Whether upstream's ``--prefer_tflite_model`` would load this version as TFLite."""
    return os.path.isfile(os.path.join(export_dir, TFLITE_MODEL))


def _interpreter(model_content: bytes):
    import warnings

    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        interpreter = tf.lite.Interpreter(model_content=model_content)
    return interpreter


def _tensor_info(name: str, details) -> object:
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    info = meta_graph_pb2.TensorInfo(name=name,
                                     dtype=tf.as_dtype(details["dtype"]).as_datatype_enum)
    for dim in details.get("shape_signature", details["shape"]):
        info.tensor_shape.dim.add(size=int(dim))
    return info


def _signature_runner_defs(interpreter, signatures) -> tuple[dict, dict]:
    from tensorflow.core.protobuf import meta_graph_pb2

    signature_defs: dict = {}
    names: dict[str, tuple] = {}
    for key in signatures:
        runner = interpreter.get_signature_runner(key)
        signature = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
        for alias, details in runner.get_input_details().items():
            signature.inputs[alias].CopyFrom(_tensor_info(f"{key}/{alias}", details))
            names[f"{key}/{alias}"] = (key, alias)
        for alias, details in runner.get_output_details().items():
            signature.outputs[alias].CopyFrom(_tensor_info(f"{key}/{alias}", details))
            names[f"{key}/{alias}"] = (key, alias)
        signature_defs[key] = signature
    return signature_defs, names


def _tensor_name_defs(interpreter) -> tuple[dict, dict]:
    # Upstream's TfLiteSession::Create for a model without SignatureDefs: one
    # serving_default whose inputs and outputs are keyed and named by the tensors' names.
    from tensorflow.core.protobuf import meta_graph_pb2

    signature = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
    names: dict[str, tuple] = {}
    for details, side in ((interpreter.get_input_details(), signature.inputs),
                          (interpreter.get_output_details(), signature.outputs)):
        for tensor in details:
            name = tensor["name"]
            if name in names:
                raise invalid_argument(f"the TFLite model has two tensors named {name}")
            side[name].CopyFrom(_tensor_info(name, tensor))
            names[name] = (None, int(tensor["index"]))
    return {DEFAULT_SIGNATURE: signature}, names


def flex_nodes(content: bytes) -> list:
    """The NodeDefs of the model's Select TF ops ("flex" ops): operators whose custom code
    starts with ``Flex`` carry, as a FlexBuffer vector ``[op name, serialized NodeDef]``,
    the TensorFlow op the Flex delegate runs. Raises ValueError when one cannot be read.
    """
    from flatbuffers import flexbuffers
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(content, 0)
    flex = {}
    for index in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(index).CustomCode() or b""
        if code.startswith(b"Flex"):
            flex[index] = code[len(b"Flex"):].decode("utf-8", "replace")
    nodes = []
    for graph_index in range(model.SubgraphsLength() if flex else 0):
        graph = model.Subgraphs(graph_index)
        for op_index in range(graph.OperatorsLength()):
            operator = graph.Operators(op_index)
            name = flex.get(operator.OpcodeIndex())
            if name is None:
                continue
            options = operator.CustomOptionsAsNumpy()
            fields = flexbuffers.GetRoot(bytes(options) if operator.CustomOptionsLength()
                                         else b"").AsVector
            node = node_def_pb2.NodeDef.FromString(fields[1].AsStringBytes)
            # The delegate runs the NodeDef's op; the code names it too: check both.
            nodes += [node, node_def_pb2.NodeDef(name=node.name, op=name)]
    return nodes


def refuse_host_flex_ops(content: bytes, model_path: str) -> None:
    """A model.tflite is code too: a Select TF op that is a host op (savedmodel.host_ops,
    the graph check's list) fails the load with FAILED_PRECONDITION naming it, as does a
    flex op that cannot be read; a runtime with the Flex delegate would run it."""
    from serving_opt.savedmodel import host_ops
    try:
        nodes = flex_nodes(content)
    except Exception as e:  # noqa: BLE001 - any malformed flatbuffer: refused, not run
        raise failed_precondition(
            f"{model_path}: its Select TF (flex) ops cannot be read ({e}), so they cannot "
            "be checked; pass --allow_file_ops only for a model you trust") from None
    for node in nodes:
        kind = host_ops.host_op_kind(node)
        if kind is not None:
            raise failed_precondition(
                f"{model_path}: Select TF (flex) op {node.op} {kind}; pass --allow_file_ops "
                "only for a model you trust")


class TfLiteServable:
    """A loaded ``model.tflite``: the Servable interface the request code uses."""

    def __init__(self, servable_id: ServableId, path: str, signature_defs, pool, names):
        self.id = servable_id
        self.path = path
        self._signature_defs = signature_defs
        self._pool = pool
        # TensorInfo name -> (signature key, input/output name), or, for a model without
        # signatures, (None, tensor index)
        self._names = names
        self.batching = None

    @property
    def signature_defs(self):
        return self._signature_defs

    @classmethod
    def load(cls, servable_id: ServableId, path: str, pool_size: int = 1,
             allow_file_ops: bool = False) -> TfLiteServable:
        """Loads ``path``'s model.tflite after the SavedModel path's file checks, from the
        bytes that were checked; raises ServingStatusError."""
        from serving_opt.model_server.servable import _read_model_file, check_model_files

        model_path = os.path.join(path, TFLITE_MODEL)
        check_model_files(path)
        try:
            content = _read_model_file(model_path)
        except FileNotFoundError as e:
            raise not_found(f"{model_path}: {e.strerror or e}") from None
        if not allow_file_ops:
            refuse_host_flex_ops(content, model_path)
        try:
            interpreters = [_interpreter(content) for _ in range(max(1, pool_size))]
        except ValueError as e:  # not a FlatBuffer model
            raise invalid_argument(f"Could not load {model_path}: {e}") from None
        signatures = interpreters[0].get_signature_list()
        if signatures:
            signature_defs, names = _signature_runner_defs(interpreters[0], signatures)
        else:
            signature_defs, names = _tensor_name_defs(interpreters[0])
            for interpreter in interpreters:
                interpreter.allocate_tensors()
        pool: queue.SimpleQueue = queue.SimpleQueue()
        for interpreter in interpreters:
            pool.put((interpreter,
                      {key: interpreter.get_signature_runner(key) for key in signatures}))
        return cls(servable_id, path, signature_defs, pool, names)

    def enable_batching(self, scheduler) -> None:
        # Upstream batches TFLite through its own scheduler; refused at start-up instead.
        raise unimplemented("--enable_batching is not implemented for TFLite models")

    def run(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str],
            timeout_ms: int | None = None) -> list[Fetched]:
        return self.run_direct(feeds, fetches, timeout_ms)

    def run_direct(self, feeds: Mapping[str, np.ndarray], fetches: Sequence[str],
                   timeout_ms: int | None = None) -> list[Fetched]:
        import tensorflow as tf

        keys = {self._names[n][0] for n in [*feeds, *fetches] if n in self._names}
        for name in [*feeds, *fetches]:
            if name not in self._names:
                raise not_found(f"Tensor {name} not found in the TFLite model")
        if len(keys) != 1:
            raise invalid_argument("a TFLite run feeds and fetches one signature's tensors")
        key = keys.pop()
        interpreter, runners = self._pool.get()
        try:
            if key is None:
                return self._run_tensors(interpreter, feeds, fetches)
            runner = runners[key]
            details = runner.get_input_details()
            inputs = {}
            for name, value in feeds.items():
                alias = self._names[name][1]
                wanted = details[alias]["dtype"]
                if np.asarray(value).dtype != wanted:
                    raise invalid_argument(
                        f"Input {alias} of signature {key} is "
                        f"{tf.as_dtype(wanted).name}, not {np.asarray(value).dtype}")
                inputs[alias] = value
            try:
                outputs = runner(**inputs)
            except (ValueError, RuntimeError) as e:
                raise invalid_argument(str(e)) from None
        except ServingStatusError:
            raise
        except Exception as e:  # noqa: BLE001 - a request error, not a server crash
            raise from_tf_error(e) from None
        finally:
            self._pool.put((interpreter, runners))
        result = []
        for name in fetches:
            value = np.asarray(outputs[self._names[name][1]])
            result.append(Fetched(value, tf.as_dtype(value.dtype).as_datatype_enum))
        return result

    def _run_tensors(self, interpreter, feeds: Mapping[str, np.ndarray],
                     fetches: Sequence[str]) -> list[Fetched]:
        # A model without signatures, fed and fetched by tensor index; an input of a new
        # shape resizes the interpreter, as upstream's FillTfLiteTensorFromInput does.
        import tensorflow as tf

        details = {d["index"]: d for d in interpreter.get_input_details()}
        values = {}
        for name, value in feeds.items():
            index = self._names[name][1]
            wanted = details[index]["dtype"]
            value = np.asarray(value)
            if value.dtype != wanted:
                raise invalid_argument(
                    f"Input {name} is {tf.as_dtype(wanted).name}, not {value.dtype}")
            values[index] = value
        try:
            if any(tuple(details[i]["shape"]) != v.shape for i, v in values.items()):
                for index, value in values.items():
                    interpreter.resize_tensor_input(index, list(value.shape))
                interpreter.allocate_tensors()
            for index, value in values.items():
                interpreter.set_tensor(index, value)
            interpreter.invoke()
        except (ValueError, RuntimeError) as e:
            raise invalid_argument(str(e)) from None
        result = []
        for name in fetches:
            value = np.array(interpreter.get_tensor(self._names[name][1]))
            result.append(Fetched(value, tf.as_dtype(value.dtype).as_datatype_enum))
        return result

    def close(self) -> None:
        """Drops the interpreters (nothing to release explicitly)."""
        self._pool = queue.SimpleQueue()
