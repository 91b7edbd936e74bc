"""Text for people (aligned tables, escaped names) and JSON for pipelines, for every report."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import unicodedata
from collections.abc import Sequence

# Characters a terminal acts on instead of showing: control characters (newline, ESC,
# ...), line and paragraph separators, and format characters (bidi overrides).
_UNPRINTABLE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    r"""``str(text)`` with control and format characters escaped as in ``repr``.

    A signature key, tensor name or path with a newline or an escape sequence in it
    would otherwise break a table's rows or recolour the terminal; names are data.

    >>> printable("pre\ndict\x1b[31m")
    'pre\\ndict\\x1b[31m'
    """
    text = str(text)
    if text.isprintable() and text.isascii():
        return text  # the common case, unchanged
    out = []
    for char in text:
        if unicodedata.category(char) not in _UNPRINTABLE_CATEGORIES:
            out.append(char)
        elif char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}")
    return "".join(out)


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'; None (not measured) -> '-'.

    >>> human_bytes(1536), human_bytes(3 * 2**40), human_bytes(None)
    ('1.5 KiB', '3.0 TiB', '-')
    """
    if n is None or n < 0:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def ratio(before: float | None, after: float | None) -> str:
    """'after/before' as a multiplier.

    >>> ratio(100, 42)
    '0.42x'
    """
    if not before or after is None:
        return "-"
    return f"{after / before:.2f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, indent: str = "",
          rule: bool = True) -> str:
    """A plain aligned text table, every line prefixed with ``indent``; ``rule`` draws
    dashes under the headers. Cells are :func:`printable`: one row is one line.

    >>> print(table(["a", "b"], [[1, 2]]))
    a  b
    -  -
    1  2
    """
    cells = [[printable(h) for h in headers]] + [[printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return (indent + "  ".join(c.ljust(w) for c, w in zip(row, widths))).rstrip()

    lines = [line(cells[0])]
    if rule:
        lines.append(indent + "  ".join("-" * w for w in widths))
    lines.extend(line(row) for row in cells[1:])
    return "\n".join(lines)


def to_jsonable(value):
    """Dataclasses, tuples and numpy scalars into plain JSON types."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [to_jsonable(v) for v in items]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def write_json(report, path: str) -> str:
    """Writes a report as JSON atomically (a reader never sees half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(to_jsonable(report), f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path
