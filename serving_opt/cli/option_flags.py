"""Command-line flags made from the option groups of ``serving_opt.options``.

A field with ``help`` in its metadata is a flag of the same name: its type from the
field's annotation, its default from the field's default (None spelled as the field
says: ``--transforms=default``, ``--max_constant_bytes=-1``), its choices and lower
bound from the metadata. No default is written twice. A few more metadata keys, for
flags whose text is not the value: ``flag`` (the flag's name when it is not the
field's), ``flag_default`` (the flag's default when it is not the field's, e.g. None
for a required flag), ``flag_type`` (``"str"``: the flag is text) and ``parse`` (a
function of the text and the flag name giving the value; it raises UsageError).

    define(fv, BuildOptions)                 # --transforms, --grappler, ... --quantize
    build = read(fv, BuildOptions)           # BuildOptions(transforms=..., ...)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping

from absl import flags


def flag_fields(group: type, skip: Iterable[str] = ()) -> list[dataclasses.Field]:
    """The fields of ``group`` that are flags (they have help), in field order."""
    return [f for f in dataclasses.fields(group)
            if f.metadata.get("help") and f.name not in set(skip)]


def flag_name(f: dataclasses.Field, rename: Mapping[str, str] | None = None) -> str:
    """The flag of field ``f``: ``rename``'s, else the field's ``flag`` metadata, else
    its name.
    """
    return (rename or {}).get(f.name) or f.metadata.get("flag") or f.name


def _kind(f: dataclasses.Field) -> str:
    if "flag_type" in f.metadata:
        return f.metadata["flag_type"]
    # Annotations are strings (``from __future__ import annotations``): "int | None".
    annotation = str(f.type).replace(" ", "")
    base = annotation.split("|")[0]
    if base.startswith("tuple["):
        return "list"
    if "choices" in f.metadata:
        return "enum"
    if base not in ("bool", "int", "float", "str"):
        raise TypeError(f"{f.name}: no flag type for {f.type}")
    return base


def _flag_default(f: dataclasses.Field):
    if "flag_default" in f.metadata:
        return f.metadata["flag_default"]
    if f.default is None and "none" in f.metadata:
        return f.metadata["none"]
    if isinstance(f.default, tuple):
        return list(f.default)
    return f.default


def define(fv: flags.FlagValues, group: type, *, skip: Iterable[str] = (),
           help_prefix: str = "", help: Mapping[str, str] | None = None,  # noqa: A002
           rename: Mapping[str, str] | None = None,
           module_name: str | None = None) -> tuple[str, ...]:
    """Defines a flag on ``fv`` per flag field of ``group``; returns the flag names.

    ``help_prefix`` starts every help (``"With --validate: "``); ``help`` replaces one
    field's; ``rename`` gives a field another flag name.
    """
    # Listed under the calling command in --help, and found by its required-flag check.
    module_name = module_name or sys._getframe(1).f_globals["__name__"]
    names = []
    for f in flag_fields(group, skip):
        name = flag_name(f, rename)
        text = (help or {}).get(f.name, f.metadata["help"])
        if help_prefix and text[:2].istitle():  # "With --validate: seconds of ..."
            text = text[0].lower() + text[1:]
        text = help_prefix + text
        default = _flag_default(f)
        common = dict(flag_values=fv, module_name=module_name)
        kind = _kind(f)
        if kind == "bool":
            flags.DEFINE_bool(name, default, text, **common)
        elif kind == "int":
            flags.DEFINE_integer(name, default, text, lower_bound=f.metadata.get("lower_bound"),
                                 **common)
        elif kind == "float":
            flags.DEFINE_float(name, default, text, **common)
        elif kind == "enum":
            flags.DEFINE_enum(name, default, list(f.metadata["choices"]), text, **common)
        elif kind == "list":
            flags.DEFINE_list(name, default, text, **common)
        else:
            flags.DEFINE_string(name, default, text, **common)
        names.append(name)
    return tuple(names)


def value(fv: flags.FlagValues, f: dataclasses.Field, name: str | None = None):
    """The option value of field ``f`` from its parsed flag (the flag's spelling of None
    read back as None, a list as a tuple)."""
    name = name or flag_name(f)
    given = fv[name].value
    if "parse" in f.metadata:
        return f.metadata["parse"](given, f"--{name}")
    if isinstance(given, list):
        return tuple(given)
    if f.metadata.get("negative_is_none") and given is not None and given < 0:
        return None
    if "none" in f.metadata and given == f.metadata["none"]:
        return None
    return given


def read(fv: flags.FlagValues, group: type, *, skip: Iterable[str] = (),
         rename: Mapping[str, str] | None = None, **fixed):
    """``group`` built from the parsed flags its fields define; ``fixed`` values win, and
    fields without a flag keep their defaults.
    """
    values = {f.name: value(fv, f, flag_name(f, rename))
              for f in flag_fields(group, skip) if f.name not in fixed}
    return group(**values, **fixed)
