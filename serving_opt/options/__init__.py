"""Every option of ``optimize`` and ``validate``: one tree of small frozen groups, checked once.

    options = OptimizeOptions(build=BuildOptions(quantize="int8"),
                              measure=MeasureOptions(benchmark_runs=0))
    options.check()      # UsageError naming the first bad option; optimize's plan() calls it

One group per concern: what to build (``build``), which MetaGraph answers and what it
is asked (``inputs``), how close is equal (``tolerance``), what a candidate must pass
(``gate``), what is measured (``measure``), the TF Serving that will load it
(``target``), what the user trusts (``trust``), where it is published (``output``),
and how it is served before that (``validate``, optional). A value optimize and
validate share lives in ONE group that both trees hold: optimize's ``validate`` group
(:class:`ServingCheck`) has only what is validate's own, and the ValidateOptions the
validation runs with is built from the optimize tree (:meth:`OptimizeOptions.
validate_options`), so the gates and the validation cannot judge differently.

Each option has one spelling, its group's: ``OptimizeOptions(tolerance=Tolerance(atol=
1e-3))``, ``options.tolerance.atol``. A flat keyword (``OptimizeOptions(atol=1e-3)``) is
a TypeError and a flat read an AttributeError, each naming the group to use.

A field's ``help`` is its command-line flag's help: ``serving_opt/cli/option_flags.py``
defines the flags (name, type, default) from these fields. A field without help has no
flag. This module imports nothing heavy: the CLI reads it before TensorFlow or numpy.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from serving_opt.errors import UsageError
from serving_opt.options.groups import (  # the package's public names too
    BACKENDS,
    DEFAULT_IMAGE,
    DEFAULT_SERVING_VERSION,
    DOCKER_NETWORK_HELP,
    DOCKER_NETWORKS,
    FREEZE_MODES,
    GRAPH_DEF_NAME,
    MAX_CLIENTS,
    MAX_DURATION,
    MAX_GRAPPLER_ROUNDS,
    MAX_REGRESSION_TOLERANCE,
    MAX_RTOL,
    OUTPUT_FORMATS,
    PROTOCOLS,
    QUANTIZE_MODES,
    REQUIRE_SERVER,
    BuildOptions,
    GateOptions,
    GraphDefOptions,
    InputOptions,
    MeasureOptions,
    OutputOptions,
    ServingCheck,
    TargetOptions,
    Tolerance,
    TrustOptions,
    _check_version,
    _opt,
    check_docker_network,
    check_version,
    parse_protocols,
)

__all__ = [
    "BACKENDS",
    "BuildOptions",
    "check_options",
    "check_docker_network",
    "check_version",
    "DEFAULT_IMAGE",
    "DEFAULT_SERVING_VERSION",
    "DOCKER_NETWORK_HELP",
    "DOCKER_NETWORKS",
    "FREEZE_MODES",
    "GateOptions",
    "GRAPH_DEF_NAME",
    "GraphDefOptions",
    "InputOptions",
    "MAX_CLIENTS",
    "MAX_DURATION",
    "MAX_GRAPPLER_ROUNDS",
    "MAX_REGRESSION_TOLERANCE",
    "MAX_RTOL",
    "MeasureOptions",
    "OptimizeOptions",
    "OptionTree",
    "OUTPUT_FORMATS",
    "OutputOptions",
    "parse_protocols",
    "PROTOCOLS",
    "QUANTIZE_MODES",
    "REQUIRE_SERVER",
    "ServingCheck",
    "TargetOptions",
    "Tolerance",
    "TrustOptions",
    "ValidateOptions",
]


# --- the trees: one spelling per option, the group's ---------------------------------

_UNSET: Any = object()


def _all_groups(cls: type) -> dict[str, type]:
    return {**cls.OPTIONAL_GROUPS, **cls.GROUPS}


@functools.cache
def _groups_of(cls: type) -> dict[str, str]:
    return {f.name: group for group, kind in _all_groups(cls).items()
            for f in dataclasses.fields(kind)}


def _not_a_field(cls: type, name: str) -> str:
    """Why ``name`` is not ``cls``'s: the group that holds it, how to spell it there."""
    group = _groups_of(cls).get(name)
    if group is None:
        return f"{cls.__name__} has no option {name!r}"
    kind = _all_groups(cls)[group].__name__
    return (f"{name} is an option of {cls.__name__}.{group}: "
            f"{cls.__name__}({group}={kind}({name}=...))")


class OptionTree:
    """Nested groups: each option has one spelling, its group's (``options.tolerance.atol``,
    ``OptimizeOptions(tolerance=Tolerance(atol=...))``). A flat keyword is a TypeError
    and a flat read an AttributeError, each naming the group to use. Also the base of
    other commands' trees (tune's)."""

    GROUPS: ClassVar[dict[str, type]] = {}
    # Groups that may be None (not made by default): named by errors all the same.
    OPTIONAL_GROUPS: ClassVar[dict[str, type]] = {}

    def _assign_keywords(self, options: dict[str, Any]) -> None:
        """``_assign`` with one set of keywords: the tree's own fields by name."""
        options = dict(options)
        given = {f.name: options.pop(f.name, _UNSET) for f in dataclasses.fields(self)}
        self._assign(given, options)

    def _assign(self, given: dict[str, Any], unknown: dict[str, Any]) -> None:
        cls = type(self)
        for name in unknown:
            raise TypeError(_not_a_field(cls, name))
        for f in dataclasses.fields(cls):
            value = given[f.name]
            kind = cls.GROUPS.get(f.name)
            if kind is not None:
                if value is _UNSET:
                    value = kind()
                elif not isinstance(value, kind):
                    raise TypeError(f"{cls.__name__}.{f.name} must be a {kind.__name__}, "
                                    f"not a {type(value).__name__}")
            elif value is _UNSET:
                value = f.default
            object.__setattr__(self, f.name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached when the name is not a field: say where the option lives.
        if name.startswith("_") or name not in _groups_of(type(self)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise AttributeError(_not_a_field(type(self), name))


@dataclass(frozen=True, init=False)
class ValidateOptions(OptionTree):
    """Options of ``serving-opt validate``: the served version, its reference, and the
    groups it shares with optimize.
    """

    serving: ServingCheck = field(default_factory=ServingCheck)
    inputs: InputOptions = field(default_factory=InputOptions)
    tolerance: Tolerance = field(default_factory=Tolerance)
    target: TargetOptions = field(default_factory=TargetOptions)
    trust: TrustOptions = field(default_factory=TrustOptions)
    version: int | None = _opt(None, "Version to validate (default: the highest).")
    reference_dir: str | None = _opt(
        None, "SavedModel whose answers are expected (default: the served version).")

    GROUPS: ClassVar[dict[str, type]] = {
        "serving": ServingCheck, "inputs": InputOptions, "tolerance": Tolerance,
        "target": TargetOptions, "trust": TrustOptions}

    def __init__(self, serving: ServingCheck = _UNSET, inputs: InputOptions = _UNSET,
                 tolerance: Tolerance = _UNSET, target: TargetOptions = _UNSET,
                 trust: TrustOptions = _UNSET, version: int | None = _UNSET,
                 reference_dir: str | None = _UNSET, **unknown: Any) -> None:
        self._assign(dict(serving=serving, inputs=inputs, tolerance=tolerance, target=target,
                          trust=trust, version=version, reference_dir=reference_dir), unknown)

    def check(self) -> None:
        """UsageError naming the first bad option; validate() calls it before starting
        anything, optimize's plan() before any work.
        """
        self.serving.check()
        self.tolerance.check()
        _check_version(self.version)
        self.inputs.check()
        self.target.check()


@dataclass(frozen=True, init=False)
class OptimizeOptions(OptionTree):
    """Everything ``serving-opt optimize`` can be told; defaults are the safe choice."""

    build: BuildOptions = field(default_factory=BuildOptions)
    inputs: InputOptions = field(default_factory=InputOptions)
    tolerance: Tolerance = field(default_factory=Tolerance)
    gate: GateOptions = field(default_factory=GateOptions)
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    target: TargetOptions = field(default_factory=TargetOptions)
    trust: TrustOptions = field(default_factory=TrustOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    graph_def: GraphDefOptions = field(default_factory=GraphDefOptions)
    # Serve the result over gRPC and REST before publishing (serving-opt validate); None:
    # skip. A ValidateOptions is taken too: its own group, its shared values checked
    # against this tree's.
    validate: ServingCheck | None = None

    GROUPS: ClassVar[dict[str, type]] = {
        "build": BuildOptions, "inputs": InputOptions, "tolerance": Tolerance,
        "gate": GateOptions, "measure": MeasureOptions, "target": TargetOptions,
        "trust": TrustOptions, "output": OutputOptions, "graph_def": GraphDefOptions}
    OPTIONAL_GROUPS: ClassVar[dict[str, type]] = {"validate": ServingCheck}

    def __init__(self, **options: Any) -> None:
        # Keywords only, a group by its name (build=BuildOptions(...)): ten groups make
        # positional calls unreadable.
        self._assign_keywords(options)
        if isinstance(self.validate, ValidateOptions):
            object.__setattr__(self, "validate", self._own_serving_check(self.validate))

    def _own_serving_check(self, given: ValidateOptions) -> ServingCheck:
        """A ValidateOptions given as ``validate``: its own group; a shared value it sets
        must be this tree's (one setting for the whole run)."""
        defaults = ValidateOptions()
        for group in ("inputs", "tolerance", "target", "trust"):
            for f in dataclasses.fields(getattr(given, group)):
                mine = getattr(getattr(self, group), f.name)
                theirs = getattr(getattr(given, group), f.name)
                if theirs != getattr(getattr(defaults, group), f.name) and theirs != mine:
                    raise UsageError(f"ValidateOptions.{group}.{f.name}={theirs!r} disagrees "
                                     f"with OptimizeOptions.{group}.{f.name}={mine!r}",
                                     f"set {group}.{f.name} once, on OptimizeOptions")
        if given.version is not None and self.output.version is not None \
                and given.version != self.output.version:
            raise UsageError(f"ValidateOptions.version={given.version} disagrees with "
                             f"OptimizeOptions.output.version={self.output.version}",
                             "leave ValidateOptions.version unset: optimize validates the "
                             "version it writes")
        return given.serving

    def check(self) -> None:
        """UsageError naming the first bad option; used before any work is done.

        Also parses the transform spec, Grappler passes and tags, so an Estimator
        exporter can fail at construction rather than after training.
        """
        self.build.check()
        self.tolerance.check(max_rtol=MAX_RTOL)
        self.output.check()
        self.gate.check()
        self.measure.check()
        self.inputs.check()
        self.target.check()
        if self.output.output_format == "graphdef" and self.build.freeze == "never":
            raise UsageError("--output_format=graphdef needs a frozen model and --freeze=never "
                             "keeps the variables", "drop one of them")
        if self.validate is not None:
            if not isinstance(self.validate, ServingCheck):
                raise UsageError(f"OptimizeOptions.validate is a "
                                 f"{type(self.validate).__name__}, not a ServingCheck",
                                 "pass validate=ServingCheck(...) (or a ValidateOptions), "
                                 "or None")
            self.validate.check()

    def validate_options(self) -> ValidateOptions | None:
        """The ValidateOptions ``validate`` runs with: this tree's shared groups and its
        own ``validate`` group (the version and reference are set when it runs).
        """
        if self.validate is None:
            return None
        return ValidateOptions(serving=self.validate, inputs=self.inputs,
                               tolerance=self.tolerance, target=self.target, trust=self.trust)


def check_options(options: OptimizeOptions | ValidateOptions) -> None:
    """Raises UsageError naming the first bad option of either tree, before any work."""
    options.check()
