"""Example readers: TFRecords of tf.Example and JSON lines of requests, read one way.

``--examples`` (optimize, validate) and ``serving-opt compare``'s shards are either

  * a TFRecord of serialized ``tf.Example`` protos, for signatures whose input is a
    batch of serialized examples (classify, regress, Estimator predict), or
  * JSON lines, one request per line: ``{"alias": value, ...}`` with the batch
    dimension included, exactly what a Predict request carries. Strings may be
    given as ``{"b64": "..."}``, like TF Serving's REST API.

Which one a file is, is told by its first bytes (:func:`examples_format`): a TFRecord
starts with a length whose checksum holds, JSON lines with ``{``. TensorFlow is not
imported: the TFRecord framing is read here (:func:`iter_tfrecords`), the records'
tf.Example structure is checked where the model is read (:func:`check_examples`).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, first_line

# Enough of a file to tell its format: a TFRecord header is 12 bytes, and JSON lines
# may start with some whitespace.
HEAD_BYTES = 64
_HEADER_BYTES = 12  # uint64 length + uint32 masked CRC32C of the length
_READ_CHUNK = 1 << 20  # a damaged length must not make one read allocate gigabytes


@dataclass(frozen=True)
class UserInputs:
    """What ``--examples`` provided: serialized tf.Examples and/or JSON requests."""

    examples: tuple[bytes, ...] = ()
    requests: tuple[dict, ...] = ()
    path: str = ""


# --- TFRecord framing ---------------------------------------------------------------------

def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def _crc32c_python(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@functools.cache
def _crc32c():
    try:
        import google_crc32c  # the beam extra's: C, for records of any size
    except ImportError:
        return _crc32c_python
    return google_crc32c.value


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C of ``data``, rotated and offset ("masked").
    """
    crc = _crc32c()(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_exact(f, n: int) -> bytes:
    """Up to ``n`` bytes of the file object ``f``: fewer only at its end."""
    chunks, left = [], n
    while left:
        chunk = f.read(min(left, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def looks_like_tfrecord(head: bytes) -> bool:
    """Whether the first 12 bytes are a TFRecord length with its checksum."""
    return len(head) >= _HEADER_BYTES and \
        struct.unpack("<I", head[8:12])[0] == masked_crc32c(head[:8])


def examples_format(head: bytes) -> str | None:
    """"tfrecord" or "json" from a file's first bytes, None when it is neither.
    """
    if looks_like_tfrecord(head):
        return "tfrecord"
    if head.lstrip()[:1] == b"{":
        return "json"
    return None


class TFRecordError(ValueError):
    """A damaged TFRecord: record ``index``, starting at byte ``offset``, has a
    ``problem``: "partial header", "length checksum", "truncated" (its ``length`` bytes
    run past the end of the file) or "data checksum"."""

    MESSAGES = {
        "partial header": "truncated record header at byte {offset}",
        "length checksum": "bad length checksum at byte {offset}",
        "truncated": "record of {length} bytes runs past the end of the file",
        "data checksum": "bad data checksum at byte {offset}",
    }

    def __init__(self, problem: str, index: int, offset: int, length: int = 0,
                 got: int = 0) -> None:
        super().__init__(self.MESSAGES[problem].format(offset=offset, length=length))
        self.problem, self.index, self.offset = problem, index, offset
        self.length, self.got = length, got


def iter_tfrecords(f, *, check_data: bool = True) -> Iterator[tuple[int, bytes]]:
    """``(index, record)`` for each record of the TFRecord file object ``f``.

    A record is ``uint64 length, uint32 masked CRC32C of the length, data, uint32
    masked CRC32C of the data``. The length's checksum is always checked (a file of
    another format fails at once); the data's when ``check_data``. Raises
    :class:`TFRecordError`.
    """
    index = offset = 0
    while True:
        header = read_exact(f, _HEADER_BYTES)
        if not header:
            return
        if len(header) < _HEADER_BYTES:
            raise TFRecordError("partial header", index, offset)
        length, crc = struct.unpack("<QI", header)
        if masked_crc32c(header[:8]) != crc:
            raise TFRecordError("length checksum", index, offset)
        data = read_exact(f, length)
        footer = read_exact(f, 4)
        if len(data) < length or len(footer) < 4:
            raise TFRecordError("truncated", index, offset, length, len(data))
        if check_data and struct.unpack("<I", footer)[0] != masked_crc32c(data):
            raise TFRecordError("data checksum", index, offset, length, len(data))
        yield index, data
        index += 1
        offset += _HEADER_BYTES + length + 4


def tfrecord_records(path: str) -> list[bytes]:
    """The records of a TFRecord file (uncompressed), without TensorFlow.

    The data's checksums are left to the reader that parses the records.
    """
    with open(path, "rb") as f:
        return [record for _, record in iter_tfrecords(f, check_data=False)]


# --- JSON lines ---------------------------------------------------------------------------

def decode_json_value(value):
    """A JSON request's value as a signature takes it: strings (and ``{"b64": ...}``) as
    bytes, lists element by element.
    """
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [decode_json_value(v) for v in value]
    if isinstance(value, str):
        return value.encode()
    return value


def _read_json_lines(path: str) -> list[dict]:
    requests = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except json.JSONDecodeError as e:
                raise ServingOptError(
                    f"--examples {path} line {number} is not valid JSON ({e.msg})",
                    'write one JSON object per line, e.g. {"images": [[...]]}',
                ) from None
            if not isinstance(request, dict):
                raise ServingOptError(
                    f"--examples {path} line {number} is not a JSON object",
                    'write one {"alias": value} object per line',
                )
            requests.append({k: decode_json_value(v) for k, v in request.items()})
    if not requests:
        raise ServingOptError(f"--examples {path} holds no requests", "give at least one line")
    return requests


# --- --examples ---------------------------------------------------------------------------

def read_examples_file(path: str) -> UserInputs:
    """Reads ``--examples``: a TFRecord of tf.Example, or JSON lines of requests.

    Each record's length is checked against its CRC32C here; the records' tf.Example
    structure by :func:`check_examples`, where the model is read.
    """
    if not os.path.isfile(path):
        raise ServingOptError(f"--examples file {path} does not exist", "check the path")
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    if examples_format(head) == "json":
        return UserInputs(requests=tuple(_read_json_lines(path)), path=path)
    try:
        records = tfrecord_records(path)
    except TFRecordError as e:
        raise ServingOptError(
            f"--examples {path} is neither JSON lines nor a TFRecord of tf.Example ({e})",
            "write a TFRecord of serialized tf.Example, or one JSON request per line",
        ) from e
    if not records:
        raise ServingOptError(f"--examples {path} holds no records", "give at least one example")
    return UserInputs(examples=tuple(records), path=path)


def check_examples(user: UserInputs | None) -> None:
    """Every record of a TFRecord ``--examples`` parses as a tf.Example."""
    if user is None or not user.examples:
        return
    from tensorflow.core.example import example_pb2

    for index, record in enumerate(user.examples):
        try:
            example_pb2.Example().ParseFromString(record)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise ServingOptError(
                f"--examples {user.path} is neither JSON lines nor a TFRecord of tf.Example "
                f"(record {index}: {first_line(e)})",
                "write a TFRecord of serialized tf.Example, or one JSON request per line",
            ) from e
