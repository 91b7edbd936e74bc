"""Asset filenames as TensorFlow's C++ layer reads them.

Every loader feeds an asset node ``io::JoinPath(<model>, "assets", filename)``
(loader.cc ``AddAssetsTensorsToInputs``; Python's loader ``os.path.join``), and the op
reading it hands that string to open(2). So a filename is judged the way C++ and the
kernel will use it, not the way Python would:

* a NUL byte ends the path at open(2), while Python compares the whole string:
  ``../../x\\0/../../model/assets/vocab.txt`` is ``../../x`` to the kernel;
* JoinPath only concatenates; ``..`` is resolved by the kernel one component at a
  time, after following symlinks, so ``link/../x`` leaves ``assets/`` whenever ``link``
  does, whatever a lexical normpath says;
* an absolute name is kept under ``assets/`` by JoinPath but replaces the directory in
  Python's ``os.path.join``: the two loaders disagree, so it is refused.
"""

from __future__ import annotations

# What a refusal shows of a filename: a 1 MB name stays a one-line error.
_SHOWN = 120


def shown_filename(filename: str) -> str:
    """``repr`` of a filename, cut to a readable length."""
    text = repr(filename)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 3]}...' ({len(filename)} chars)"


def asset_path_problem(filename: str) -> str:
    """Why ``<model>/assets/<filename>`` would not be a file inside ``assets/`` as the C++
    file layer opens it; "" when it is one."""
    if "\0" in filename:
        return "holds a NUL byte, where TensorFlow's C++ file layer ends the path"
    if filename.startswith("/"):
        return "is absolute"
    parts = filename.split("/")
    if ".." in parts:
        return "has a '..' component, which the kernel resolves after following symlinks"
    if all(part in ("", ".") for part in parts):
        return "names the assets directory itself, not a file in it"
    return ""


__all__ = ["asset_path_problem", "shown_filename"]
