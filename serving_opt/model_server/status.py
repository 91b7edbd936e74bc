"""Request and load failures as (gRPC code, message) pairs, like absl::Status in TF Serving.

Every layer of the server raises :class:`ServingStatusError`; the gRPC servicers turn it
into the RPC status and GetModelStatus turns it into a ``StatusProto``. Keeping one type
means a load error, a warmup error and a request error all carry the same code and text
the real ``tensorflow_model_server`` would report.
"""

from __future__ import annotations

import grpc

# grpc.StatusCode values are (int, name) pairs; TF's error codes use the same numbers.
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class ServingStatusError(Exception):
    """A non-OK status: what the server answers instead of a response."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(self.to_text())

    def to_text(self) -> str:
        """absl::Status::ToString(): the form TF Serving logs and nests in other errors."""
        return f"{self.code.name}: {self.message}"

    def to_proto(self):
        """The ``tensorflow.serving.StatusProto`` GetModelStatus reports for a version."""
        return status_proto(self)


def status_proto(error: ServingStatusError | None):
    """``StatusProto`` for an optional error: None is OK (code 0, empty message)."""
    from tensorflow_serving.apis import status_pb2

    if error is None:
        return status_pb2.StatusProto()
    return status_pb2.StatusProto(error_code=error.code.value[0], error_message=error.message)


def code_from_number(number: int) -> grpc.StatusCode:
    """Maps a TF/absl error code number to the gRPC code with the same number."""
    return _CODE_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


def from_tf_error(error: BaseException) -> ServingStatusError:
    """Converts a TensorFlow ``OpError`` (or anything else) into a status, keeping TF's text."""
    if isinstance(error, ServingStatusError):
        return error
    number = getattr(error, "error_code", None)
    message = getattr(error, "message", None)
    if isinstance(number, int) and isinstance(message, str):
        return ServingStatusError(code_from_number(number), message)
    text = str(error).strip() or type(error).__name__
    return ServingStatusError(grpc.StatusCode.UNKNOWN, f"{type(error).__name__}: {text}")


def invalid_argument(message: str) -> ServingStatusError:
    """Example: ``raise invalid_argument("Missing ModelSpec")``."""
    return ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingStatusError:
    """Example: ``raise not_found("Servable not found for request: Latest(m)")``."""
    return ServingStatusError(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str) -> ServingStatusError:
    """Example: ``raise failed_precondition('Serving signature key "x" not found.')``."""
    return ServingStatusError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unimplemented(message: str) -> ServingStatusError:
    """Example: ``raise unimplemented("Unsupported signature method_name: x")``."""
    return ServingStatusError(grpc.StatusCode.UNIMPLEMENTED, message)


def internal(message: str) -> ServingStatusError:
    """Example: ``raise internal("Predict internal error")``."""
    return ServingStatusError(grpc.StatusCode.INTERNAL, message)


def unknown(message: str) -> ServingStatusError:
    """Example: ``raise unknown("1 model(s) did not become available: {...}")``."""
    return ServingStatusError(grpc.StatusCode.UNKNOWN, message)
