"""TensorProto <-> numpy with the C++ semantics TF Serving relies on.

Requests are decoded with TensorFlow's own ``ParseTensor`` kernel, which calls the C++
``Tensor::FromProto`` the real server uses: the same padding of short typed fields with
their last value, the same truncation of long ones, the same rejection of a
``tensor_content`` of the wrong size. Replies are encoded like ``Tensor::AsProtoField``:
dtype, shape and every element in the typed field (``float_val``, ``int_val``, ``half_val``
as uint16 bits...), never ``tensor_content``.

Example:
    >>> import numpy as np
    >>> proto = to_proto_field(np.array([[1.5, 2.0]], np.float32), types_pb2.DT_FLOAT)
    >>> list(proto.float_val), [d.size for d in proto.tensor_shape.dim]
    ([1.5, 2.0], [1, 2])
    >>> from_proto(proto).tolist()
    [[1.5, 2.0]]
"""

from __future__ import annotations

import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

# Quantized types come back from the eager kernel as plain ints; the session must be fed
# TF's structured numpy dtypes or it sees e.g. int8 instead of qint8.
_QUANTIZED = {
    types_pb2.DT_QINT8: "qint8",
    types_pb2.DT_QUINT8: "quint8",
    types_pb2.DT_QINT16: "qint16",
    types_pb2.DT_QUINT16: "quint16",
    types_pb2.DT_QINT32: "qint32",
}

# Which repeated field Tensor::AsProtoField fills for each dtype.
_INT_VAL_TYPES = frozenset(
    {
        types_pb2.DT_INT32,
        types_pb2.DT_INT16,
        types_pb2.DT_INT8,
        types_pb2.DT_UINT8,
        types_pb2.DT_UINT16,
        *_QUANTIZED,
    }
)
_FIELD_BY_TYPE = {
    types_pb2.DT_FLOAT: "float_val",
    types_pb2.DT_DOUBLE: "double_val",
    types_pb2.DT_INT64: "int64_val",
    types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val",
    types_pb2.DT_BOOL: "bool_val",
    types_pb2.DT_STRING: "string_val",
}


def dtype_name(dtype: int) -> str:
    """``DataType_Name``: the enum name C++ error messages print.

    Example:
        >>> dtype_name(types_pb2.DT_FLOAT)
        'DT_FLOAT'
    """
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return str(dtype)


def shape_string(shape) -> str:
    """``TensorShape::DebugString``: ``[2,3]``, ``[]`` for a scalar.

    Example:
        >>> shape_string((2, 3))
        '[2,3]'
    """
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def from_proto(proto: tensor_pb2.TensorProto) -> np.ndarray | None:
    """Decodes a request tensor as C++ ``Tensor::FromProto`` does; None if that would fail.

    Example:
        >>> p = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, int64_val=[7],
        ...                            tensor_shape={"dim": [{"size": 3}]})
        >>> from_proto(p).tolist()  # short typed fields repeat their last value
        [7, 7, 7]
    """
    import tensorflow as tf
    from tensorflow.python.eager import context
    from tensorflow.python.ops import gen_parsing_ops

    dtype = proto.dtype
    if dtype == types_pb2.DT_INVALID or dtype not in types_pb2.DataType.values():
        return None
    try:
        # eager_mode(): request threads must not inherit a graph context from elsewhere.
        with context.eager_mode():
            value = gen_parsing_ops.parse_tensor(
                serialized=proto.SerializeToString(), out_type=tf.as_dtype(dtype)
            ).numpy()
    except (tf.errors.OpError, TypeError, ValueError):
        return None
    value = np.asarray(value)
    if dtype in _QUANTIZED:
        value = value.view(tf.as_dtype(dtype).as_numpy_dtype)
    return value


def to_proto_field(value: np.ndarray, dtype: int) -> tensor_pb2.TensorProto:
    """Encodes a result tensor like C++ ``Tensor::AsProtoField`` (typed fields, no content).

    Raises ValueError for dtypes a TensorProto field cannot hold (resource, variant).

    Example:
        >>> to_proto_field(np.array(np.float16(1.0)), types_pb2.DT_HALF).half_val
        [15360]
    """
    proto = tensor_pb2.TensorProto(dtype=dtype)
    value = np.asarray(value)
    for size in value.shape:
        proto.tensor_shape.dim.add(size=int(size))
    flat = value.reshape(-1)
    if dtype in _FIELD_BY_TYPE:
        field = getattr(proto, _FIELD_BY_TYPE[dtype])
        if dtype == types_pb2.DT_STRING:
            field.extend(bytes(v) for v in flat)
        else:
            field.extend(flat.tolist())
    elif dtype in _INT_VAL_TYPES:
        if value.dtype.fields:  # structured quantized dtype -> its one integer member
            flat = flat.view(value.dtype.fields[next(iter(value.dtype.fields))][0])
        proto.int_val.extend(flat.astype(np.int64).tolist())
    elif dtype in (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16):
        # half_val carries the raw 16 bits of each element, for both 16-bit floats.
        proto.half_val.extend(flat.view(np.uint16).tolist())
    elif dtype == types_pb2.DT_COMPLEX64:
        proto.scomplex_val.extend(flat.astype(np.complex64).view(np.float32).tolist())
    elif dtype == types_pb2.DT_COMPLEX128:
        proto.dcomplex_val.extend(flat.astype(np.complex128).view(np.float64).tolist())
    else:
        raise ValueError(f"cannot encode a {dtype_name(dtype)} tensor in a TensorProto field")
    return proto
