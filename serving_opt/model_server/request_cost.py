"""What parsing a request costs the server, read from its wire bytes before it is parsed.

A protobuf request costs far more in memory than on the wire where it holds many small
elements: an empty ``string_val`` element is 2 bytes sent and ~40 bytes parsed (upb's
string view in an array that grows by doubling), a map entry ~12 bytes sent and up to
~260 parsed. gRPC parses a request before any handler sees it, so a 19 MiB message of
10M empty strings held 400 MB before the server could refuse it. :func:`parse_cost`
walks the wire format with the message's descriptor and charges every field at least
what upb allocates for it, stopping as soon as the total passes the budget; the gRPC
services' deserializers (grpc_util.BoundedServer) refuse such a request unparsed.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time

from google.protobuf import descriptor as _descriptor

# Bytes charged per field occurrence (an array slot with its share of doubling, or the
# field inside its message), per parsed message on top of its fields, and per map entry
# (upb's hash table node, key and value message). Measured on upb 4/5 (protobuf 5/6),
# rounded up.
FIELD_BYTES = 48
MESSAGE_BYTES = 64
MAP_ENTRY_BYTES = 256
# A packed varint element is 1 byte sent and up to 8 parsed; fixed-size ones at most 2x
# what was sent (array doubling).
_PACKED_VARINT_FACTOR = 8
_PACKED_FIXED_FACTOR = 2
# Below this many bytes per wire byte no message can exceed a budget, so small requests
# are not walked (a 2-byte empty sub-message or map entry is the costliest element).
_MAX_COST_PER_WIRE_BYTE = (FIELD_BYTES + MAP_ENTRY_BYTES + MESSAGE_BYTES) // 2 + 1

_MAX_DEPTH = 100  # upb's default recursion limit
_FD = _descriptor.FieldDescriptor
_FIXED_TYPES = frozenset({_FD.TYPE_DOUBLE, _FD.TYPE_FLOAT, _FD.TYPE_FIXED32, _FD.TYPE_FIXED64,
                          _FD.TYPE_SFIXED32, _FD.TYPE_SFIXED64})


class RequestTooCostly(Exception):
    """The request would cost more than the budget once parsed: (cost so far, budget)."""

    def __init__(self, cost: int, budget: int) -> None:
        super().__init__(f"{cost} > {budget}")
        self.cost = cost
        self.budget = budget


def parse_cost(data: bytes, descriptor, budget: int) -> int:
    """The bytes ``data`` will hold once parsed as ``descriptor``'s message (an upper
    estimate). Raises RequestTooCostly once the total passes ``budget``; a malformed
    message is charged what was read of it (the parser refuses it anyway)."""
    if len(data) * _MAX_COST_PER_WIRE_BYTE <= budget:
        return len(data) * _MAX_COST_PER_WIRE_BYTE
    return _walk(bytes(data), 0, len(data), descriptor, budget, 0, 0)


def _walk(data: bytes, pos: int, end: int, descriptor, budget: int, cost: int,
          depth: int) -> int:
    fields = _fields(descriptor)
    cost += MESSAGE_BYTES
    while pos < end:
        start = pos
        before = cost
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _varint(data, pos, end, tag)
        wire_type = tag & 7
        cost += FIELD_BYTES
        if wire_type == 2:
            length = data[pos] if pos < end else 0
            pos += 1
            if length >= 0x80:
                length, pos = _varint(data, pos, end, length)
            if length > end - pos:
                return cost  # truncated: the parser refuses it
            kind, sub = fields.get(tag >> 3, _UNKNOWN)
            if kind == _BYTES:
                cost += length
            elif kind == _MESSAGE or kind == _MAP_ENTRY:
                if kind == _MAP_ENTRY:
                    cost += MAP_ENTRY_BYTES
                if depth < _MAX_DEPTH:  # deeper, upb refuses to parse it
                    cost = _walk(data, pos, pos + length, sub, budget, cost, depth + 1)
            elif kind == _FIXED:
                cost += length * _PACKED_FIXED_FACTOR
            else:
                cost += length * _PACKED_VARINT_FACTOR
            pos += length
            if pos - start <= 16:
                # The same short element repeated (the cheapest way to send many) costs
                # the same each time: skipped at C speed, a thousand a step.
                run = data[start:pos] * 1024
                each = cost - before
                while data.startswith(run, pos, end):
                    pos += len(run)
                    cost += 1024 * each
                    if cost > budget:
                        raise RequestTooCostly(cost, budget)
                if kind == _BYTES and data[start] < 0x80:
                    # Other short strings of the field, in the loop with the fewest steps
                    # an element (most of a hostile request's time is here).
                    pos, cost = _short_run(data, pos, end, data[start], cost, budget)
                    continue
        elif wire_type == 0:
            while pos < end and data[pos] >= 0x80:
                pos += 1
            pos += 1
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            # A group (kept as an unknown field: its contents are not walked) or an
            # invalid wire type: no API message has either, so charge the rest at the
            # costliest rate rather than trust what follows.
            cost += (end - pos) * _MAX_COST_PER_WIRE_BYTE
            pos = end
        if cost > budget:
            raise RequestTooCostly(cost, budget)
    return cost


_BYTES, _MESSAGE, _MAP_ENTRY, _FIXED, _VARINT = range(5)
_UNKNOWN = (_BYTES, None)  # upb keeps an unknown field's bytes as they came


@functools.cache
def _fields(descriptor) -> dict[int, tuple[int, object]]:
    """Field number -> (how its length-delimited form is charged, message descriptor)."""
    fields = {}
    for number, field in descriptor.fields_by_number.items():
        if field.type in (_FD.TYPE_STRING, _FD.TYPE_BYTES):
            fields[number] = (_BYTES, None)
        elif field.type == _FD.TYPE_MESSAGE:
            sub = field.message_type
            fields[number] = (_MAP_ENTRY if sub.GetOptions().map_entry else _MESSAGE, sub)
        elif field.type in _FIXED_TYPES:
            fields[number] = (_FIXED, None)
        else:
            fields[number] = (_VARINT, None)
    return fields


def _short_run(data: bytes, pos: int, end: int, tag: int, cost: int, budget: int):
    """Skips the elements of one string field that follow (a 1-byte tag and length each);
    returns (position after them, cost with them)."""
    last = end - 1
    left = (budget - cost) // FIELD_BYTES + 1
    start = pos
    count = 0
    while pos < last and data[pos] == tag and count < left:
        length = data[pos + 1]
        if length >= 0x80:
            break
        pos += 2 + length
        count += 1
    cost += count * FIELD_BYTES + (pos - start) - 2 * count
    if cost > budget:
        raise RequestTooCostly(cost, budget)
    return pos, cost


def _varint(data: bytes, pos: int, end: int, first: int) -> tuple[int, int]:
    value = first & 0x7F
    shift = 7
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    return value, end


# glibc keeps what a large request freed for the next allocation of the same thread's
# arena (the 10M-string request left 350 MB resident): after a request of this many bytes,
# malloc_trim hands it back, once the request's own references are gone.
TRIM_AFTER_BYTES = 16 << 20
_TRIM_DELAY_SECONDS = 0.5
_trim_wanted = threading.Event()
_trimmer_lock = threading.Lock()
_trimmer: list[threading.Thread] = []


def release_memory_soon(request_bytes: int) -> None:
    """After a request of ``request_bytes``: give freed memory back to the system shortly
    (a background thread, so the request's parsed form is gone by then)."""
    if request_bytes < TRIM_AFTER_BYTES or _malloc_trim() is None:
        return
    with _trimmer_lock:
        if not _trimmer:
            thread = threading.Thread(target=_trim_loop, name="serving-opt-trim", daemon=True)
            thread.start()
            _trimmer.append(thread)
    _trim_wanted.set()


def _trim_loop() -> None:
    trim = _malloc_trim()
    while True:
        _trim_wanted.wait()
        time.sleep(_TRIM_DELAY_SECONDS)  # let the request's last references go first
        _trim_wanted.clear()
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only; elsewhere nothing to do
    except (OSError, AttributeError):
        return None
