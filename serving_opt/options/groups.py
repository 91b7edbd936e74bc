"""The groups of the options trees: one small frozen dataclass per concern, each checking
its own values, and the constants they choose from.

A field's ``help`` is its command-line flag's help (``serving_opt/cli/option_flags.py``
makes the flags); a field without help has no flag. Imports nothing heavy: the CLI reads
it before TensorFlow or numpy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from serving_opt.errors import UsageError

# Validate's servers; serving.backends runs them.
BACKENDS = ("auto", "docker", "binary", "local")
DEFAULT_IMAGE = "tensorflow/serving:2.20.0"  # the current TF Serving release
# --server=docker's networking: ports published on 127.0.0.1 (bridge), or the host's
# network for engines without a bridge (dockerd --bridge=none).
DOCKER_NETWORKS = ("bridge", "host")
DOCKER_NETWORK_HELP = ("--server=docker's network: bridge publishes the container's ports on "
                       "127.0.0.1 (-p); host shares the host's network (for engines without "
                       "a bridge).")
DEFAULT_SERVING_VERSION = "2.20.0"  # its TensorFlow
_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$")


def check_docker_network(network: str) -> None:
    """UsageError unless ``network`` is one of DOCKER_NETWORKS."""
    if network not in DOCKER_NETWORKS:
        raise UsageError(f"--docker_network={network} is not one of "
                         f"{', '.join(DOCKER_NETWORKS)}", "e.g. --docker_network=host")


def check_version(version: str) -> str:
    """``version`` if it looks like a TensorFlow release (``2.15``, ``2.20.0``)."""
    version = (version or "").strip()
    if not _VERSION_RE.match(version):
        raise UsageError(f"--serving_version={version} is not a TensorFlow version",
                         f"e.g. --serving_version={DEFAULT_SERVING_VERSION}")
    return version


FREEZE_MODES = ("auto", "always", "never")
# stages.quantize.MODES (a test keeps them equal)
QUANTIZE_MODES = ("none", "int8", "int4", "fp16", "bf16")
PROTOCOLS = ("grpc", "rest")
REQUIRE_SERVER = ("any", "tf_serving")
MAX_RTOL = 1.0  # optimize: a relative tolerance above 100% lets any answer through
MAX_GRAPPLER_ROUNDS = 20
MAX_REGRESSION_TOLERANCE = 100.0
MAX_CLIENTS = 1024  # validate's load-phase clients: threads of one process
MAX_DURATION = 24 * 3600.0


def _opt(default: Any, help: str = "", **flag: Any) -> Any:  # noqa: A002 - absl's word
    """A field and its flag: ``help`` (none: no flag), ``choices`` (an enum flag),
    ``none`` (the flag's spelling of None), ``lower_bound``, ``negative_is_none``."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults are immutable")
    return field(default=default, metadata={"help": help, **flag})


# --- the groups ------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildOptions:
    """What to build: the rewrites asked for, and how far freezing and quantizing go."""

    transforms: str | None = _opt(
        None, "Graph Transform Tool spec, e.g. 'strip_unused_nodes fold_constants("
        "ignore_errors=true) fold_batch_norms'. 'default' is a lossless preset; 'none' skips "
        "the tool.", none="default")
    grappler: str | None = _opt(
        None, "Comma list of Grappler passes; 'default' = pruning,constfold,arithmetic,"
        "dependency; 'none' skips Grappler.", none="default")
    grappler_rounds: int = _opt(2, "How many times to run the Grappler passes.")
    signatures: tuple[str, ...] = _opt((), "Signature keys to keep (default: all).")
    freeze: str = _opt(
        "auto", "Freeze variables into constants: auto falls back to keeping them when "
        "freezing fails or the frozen model is worse; always makes that an error.",
        choices=FREEZE_MODES)
    freeze_max_bytes: int = _opt(
        10 * 2**20, "Variables larger than this stay variables (in a new checkpoint holding "
        "only what serving reads); smaller ones become constants. Large constants make TF "
        "Serving load slower and use more memory.")
    max_constant_bytes: int | None = _opt(
        64 * 1024, "Constants still larger than this after folding (e.g. batch-norm-folded "
        "conv weights) are stored as variables of the new checkpoint, so TF Serving restores "
        "them instead of parsing and re-optimizing them at load; -1 keeps them constants.",
        none=-1, negative_is_none=True)
    quantize: str = _opt(
        "none", "Store large float weights as int8 (scale per column for embedding tables, "
        "per row where their rows differ too much in size, per output channel otherwise) "
        "or fp16. Tables are gathered quantized and only the gathered rows dequantized; "
        "other weights are dequantized once, at load. int4: "
        "embedding tables only (two values a byte, a scale per row; about half int8's "
        "table memory, coarser), dense weights stay float32. bf16: compute (convolutions, "
        "matmuls) in bfloat16, float32 at the inputs and outputs; refused on a CPU without "
        "AVX-512-BF16 or AMX-BF16. Lossy: the lossy gate decides.", choices=QUANTIZE_MODES)
    quantize_min_elements: int = _opt(16384, "Weights with fewer elements stay float.")
    input_shapes: str | None = _opt(
        None, "Pin inputs' unknown dimensions, like strip_unused_nodes(shape=...): "
        "'image_tensor:1,1080,1920,3' (an input key or tensor name; -1 leaves a dimension "
        "free; several separated by ';'). Shape computations then fold; the pinned graph is "
        "kept only if it measures faster than the unpinned one, and then serves only that "
        "shape. The parity gate and the measurements use the pinned shape; timing the two "
        "takes up to a quarter of --measure_seconds more.")

    def check(self) -> None:
        """UsageError naming the first bad value (the spec and passes parsed too)."""
        if self.freeze not in FREEZE_MODES:
            raise UsageError(f"--freeze={self.freeze} is not one of {', '.join(FREEZE_MODES)}",
                             "use --freeze=auto, always or never")
        if not 1 <= self.grappler_rounds <= MAX_GRAPPLER_ROUNDS:
            raise UsageError(f"--grappler_rounds={self.grappler_rounds} must be within "
                             f"[1, {MAX_GRAPPLER_ROUNDS}] (a round that changes nothing ends "
                             "the loop anyway)", "e.g. --grappler_rounds=2")
        if self.freeze_max_bytes < 0:
            raise UsageError("--freeze_max_bytes must be >= 0",
                             "e.g. --freeze_max_bytes=10485760 (0 keeps every variable)")
        if self.quantize not in QUANTIZE_MODES:
            raise UsageError(f"--quantize={self.quantize} is not one of "
                             f"{', '.join(QUANTIZE_MODES)}",
                             "use --quantize=int8, int4, fp16 or bf16")
        if self.quantize_min_elements < 0:
            raise UsageError("--quantize_min_elements must be >= 0", "e.g. 16384")
        if self.quantize == "bf16":
            from serving_opt.stages import bf16

            bf16.check_cpu()
        from serving_opt.stages import grappler as grappler_lib
        from serving_opt.stages import transforms as transforms_lib

        transforms_lib.resolve_spec(self.transforms)
        grappler_lib.parse_passes(self.grappler)
        from serving_opt.savedmodel import shapes as shapes_lib

        shapes_lib.parse(self.input_shapes)

    @property
    def lossy(self) -> bool:
        """Weights are quantized: the lossy gate judges instead of the exact one."""
        return self.quantize != "none"


@dataclass(frozen=True)
class InputOptions:
    """Which MetaGraph answers, and what it is asked: the parity gate's and the
    measurements' inputs in optimize, the requests in validate.
    """

    saved_model_tags: str = _opt(
        "serve", "MetaGraph tag set, comma separated; '' selects a MetaGraph with no tags "
        "(old TF Hub exports), as saved_model_cli's --tag_set ''.")
    examples: str | None = _opt(
        None, "Inputs: TFRecord of tf.Example, or JSON lines of {alias: value} requests "
        "(default: synthesized). optimize: the parity gate's and the measurements'; "
        "validate: the requests'.")
    seed: int = 0  # of the synthesized inputs

    def check(self) -> None:
        pass  # every tag set is one: '' is the empty set, which old TF Hub exports use


@dataclass(frozen=True)
class Tolerance:
    """How close an answer must be to the original's: the parity gate, compare, validate."""

    atol: float = _opt(1e-5, "Absolute tolerance for float outputs.")
    rtol: float = _opt(1e-4, "Relative tolerance for float outputs.")

    def check(self, max_rtol: float | None = None) -> None:
        """``max_rtol``: optimize's bound (beyond it nothing is compared); validate has none."""
        if max_rtol is None:
            if not (0 <= self.atol < math.inf and 0 <= self.rtol < math.inf):  # refuses nan
                raise UsageError(f"--atol={self.atol} and --rtol={self.rtol} must be finite "
                                 "and >= 0", "e.g. --atol=1e-5 --rtol=1e-4")
        elif not (0 <= self.atol < math.inf and 0 <= self.rtol <= max_rtol):
            raise UsageError(f"--atol={self.atol} and --rtol={self.rtol} must be finite, "
                             f">= 0, and rtol at most {max_rtol:g} (beyond that nothing is "
                             "compared)", "e.g. --atol=1e-5 --rtol=1e-4")


@dataclass(frozen=True)
class GateOptions:
    """What a candidate must pass to be published, beyond the tolerances: the parity
    gate's sample, the lossy gate, the compare gate and the regression gate.
    """

    parity_batch_size: int = 16
    parity_batches: int = 2
    min_top1_agreement: float = _opt(
        0.995, "With --quantize: fraction of rows whose top-1 class (probabilities/scores) "
        "or whose class ids/names must agree with the original.")
    max_probability_error: float = _opt(
        0.05, "With --quantize: largest change allowed in a probability/score.")
    compare_examples: str | None = _opt(
        None, "A last gate before publishing: compare both models on every example of these "
        "TFRecord/JSON-lines shards (a glob; local, gs://, s3://) on Apache Beam, as "
        "serving-opt compare does. Needs pip install serving-opt[beam].")
    regression_tolerance: float = _opt(
        1.10, "A measure worse than the original by more than this factor (plus a small "
        "absolute slack) blocks publishing.")
    allow_regression: bool = _opt(
        False, "Publish even when the result is slower, bigger in memory or slower to load "
        "than the original (the report says so).")

    def check(self) -> None:
        if self.parity_batch_size < 1 or self.parity_batches < 1:
            raise UsageError("OptimizeOptions.gate.parity_batch_size and parity_batches must be "
                             ">= 1", "e.g. OptimizeOptions(gate=GateOptions(parity_batch_size=16, "
                             "parity_batches=2))")
        if not 0.0 <= self.min_top1_agreement <= 1.0:
            raise UsageError("--min_top1_agreement must be within [0, 1]", "e.g. 0.995")
        if not 0.0 <= self.max_probability_error <= 1.0:
            raise UsageError("--max_probability_error must be within [0, 1]", "e.g. 0.05")
        if not 1.0 <= self.regression_tolerance <= MAX_REGRESSION_TOLERANCE:  # refuses nan
            raise UsageError(f"--regression_tolerance={self.regression_tolerance} must be "
                             f"within [1, {MAX_REGRESSION_TOLERANCE:g}]",
                             "e.g. --regression_tolerance=1.1 (10% worse is tolerated); "
                             "--allow_regression publishes whatever the measures say")
        if self.compare_examples:
            from serving_opt.compare import require_beam

            require_beam()


@dataclass(frozen=True)
class MeasureOptions:
    """What is measured, both models side by side: the cold start and the benchmark,
    and how long that may take.

    ``measure_seconds`` bounds all of one candidate's measurements: the cold start
    counts against it, the benchmark's runs per batch size are sized from what is left
    (a batch size that cannot fit a few runs is skipped and named in the report), and a
    confirmation of a regression gets the rest. The default, 180 s, was sized for a
    model costing about 1 s per image on 2 cores: its cold start (~25 s), batch 1 with
    the 20+ runs the p50 gate needs (~65 s, batch 32 skipped: one run alone takes
    ~30 s per model) and, should a figure look worse, a confirmation (~90 s) fit, so
    the whole optimize stays well under 10 minutes. A model answering in milliseconds
    makes its 100 runs per batch size in seconds, as before.
    """

    cold_start: bool = _opt(
        True, "Load both models in fresh processes (load time, first request, peak RSS) and "
        "refuse a candidate that is worse (--nocold_start skips it).")
    cold_start_rounds: int = _opt(
        1, "Fresh processes per model for the cold start (median is used).")
    # None: sized from measure_seconds; a number (the flag given) is taken as is.
    benchmark_runs: int | None = _opt(
        None, "Interleaved timed runs per batch size, taken as given instead of sized from "
        "--measure_seconds (0 skips the benchmark; default: as many as the budget fits, "
        "5 to 100).")
    benchmark_batch_sizes: tuple[int, ...] = (1, 32)
    measure_seconds: float = _opt(
        180.0, "Time budget in seconds for measuring a candidate: the cold start, the "
        "benchmark (its runs per batch size are sized to fit; a batch size that cannot fit "
        "a few runs is skipped and named in the report) and a confirmation of a "
        "regression. The default fits a model costing about 1 s per image on 2 cores.")

    def check(self) -> None:
        if self.benchmark_runs is not None and self.benchmark_runs < 0:
            raise UsageError("--benchmark_runs must be >= 0", "0 skips the benchmark")
        if self.cold_start_rounds < 1:
            raise UsageError("--cold_start_rounds must be >= 1", "e.g. --cold_start_rounds=3")
        if isinstance(self.measure_seconds, bool) or not isinstance(
                self.measure_seconds, (int, float)) or not 0 < self.measure_seconds < math.inf:
            raise UsageError(f"--measure_seconds={self.measure_seconds} must be a positive, "
                             "finite number of seconds",
                             "e.g. --measure_seconds=180 (--benchmark_runs=N fixes the runs "
                             "instead)")


@dataclass(frozen=True)
class TargetOptions:
    """The TF Serving that will load the model: its TensorFlow release (optimize checks
    every op and attr against its registry; validate's local server runs under it).
    """

    serving_version: str | None = _opt(
        None, "TensorFlow release of the TF Serving that will load the model (e.g. 2.15.1): "
        "optimize refuses an op or attr its registry lacks, and validate's local server runs "
        "under it (installed once into ~/.cache/serving-opt if missing). Default: the current "
        "TF Serving release, used only if its runtime is already here (the report says so).")
    serving_runtime_python: str | None = _opt(
        None, "A python whose TensorFlow is --serving_version's (instead of a cached venv; "
        "also $SERVING_OPT_RUNTIME_<X>_<Y>).")

    def check(self) -> None:
        if self.serving_version is not None:
            check_version(self.serving_version)


@dataclass(frozen=True)
class TrustOptions:
    """What the user trusts the model with: a SavedModel is code."""

    allow_file_ops: bool = _opt(
        False, "Run a model whose signatures touch files or the host (WriteFile, ReadFile, "
        "PyFunc, checkpoint, summary and tf.data file ops, ...; see savedmodel/host_ops.py). "
        "Off: such a model is refused before it runs. Only for models you trust: a "
        "SavedModel is code.")
    allow_unsandboxed: bool = _opt(
        False, "Run the model (and validate's server) even where the bubblewrap sandbox "
        "cannot start (no bwrap, no user namespaces, not Linux). Only for models you trust.")
    # The sandboxed worker's limits (validate takes the wall-clock one, not memory).
    sandbox_memory_bytes: int | None = _opt(
        None, "Memory limit of each sandboxed process (default: 3/4 of the RAM).",
        lower_bound=1 << 28)
    sandbox_timeout_seconds: float | None = _opt(
        None, "Wall-clock limit of the sandboxed run: a model that blocks for ever is "
        "stopped (default: optimize an hour plus four times --measure_seconds and "
        "--validate's load deadline; validate an hour plus --load_deadline; others 6 "
        "hours).", lower_bound=1.0)


OUTPUT_FORMATS = ("saved_model", "graphdef")
GRAPH_DEF_NAME = "frozen_inference_graph.pb"  # the .pb --output_format=graphdef writes


@dataclass(frozen=True)
class OutputOptions:
    """Where optimize publishes: the version directory of the model base."""

    version: int | None = _opt(
        None, "Version directory to write (default: highest existing + 1).")
    overwrite: bool = _opt(False, "Replace an existing version directory.")
    output_format: str = _opt(
        "saved_model", "saved_model, or graphdef: the version directory also holds the "
        f"optimized graph as a frozen GraphDef ({GRAPH_DEF_NAME}) for code that loads "
        ".pb files. graphdef keeps every weight a constant (only frozen candidates are "
        "tried; --max_constant_bytes does not apply).", choices=OUTPUT_FORMATS)

    def check(self) -> None:
        _check_version(self.version, "(int64)")
        if self.output_format not in OUTPUT_FORMATS:
            raise UsageError(f"--output_format={self.output_format} is not one of "
                             f"{', '.join(OUTPUT_FORMATS)}", "use --output_format=graphdef "
                             "or saved_model")


@dataclass(frozen=True)
class GraphDefOptions:
    """How a frozen GraphDef (``frozen_inference_graph.pb``) becomes a servable model:
    which tensors are its inputs and outputs and the signature's input keys. Only for a
    ``.pb`` input (a SavedModel has signatures).
    """

    # Flags --inputs and --outputs (cli/commands/optimize.py renames them); the fields
    # are named apart from OptimizeOptions.inputs, the group.
    graph_inputs: tuple[str, ...] = _opt(
        (), "With a .pb input: its input tensors, with or without :0 (default: the only "
        "Placeholder).")
    graph_outputs: tuple[str, ...] = _opt(
        (), "With a .pb input: its output tensors, e.g. detection_boxes,detection_scores,"
        "detection_classes,num_detections (default: the only node nothing consumes).")
    signature_keys: tuple[str, ...] = _opt(
        (), "With a .pb input: the serving signature's input keys, in --inputs order "
        "(default: 'inputs' for one input, as the Object Detection API exports it; else "
        "the tensor names).")

    def given(self) -> tuple[str, ...]:
        """The flags set, by their command-line names."""
        names = (("inputs", self.graph_inputs), ("outputs", self.graph_outputs),
                 ("signature_keys", self.signature_keys))
        return tuple(name for name, value in names if value)


@dataclass(frozen=True)
class ServingCheck:
    """Validate's own options: how the model is served and probed (optimize's
    ``validate`` group; the shared values come from the tree holding it).
    """

    model_name: str | None = _opt(None, "Model name (default: the base's directory name).")
    server: str = _opt(
        "auto", "docker, binary (tensorflow_model_server on PATH), local (serving-opt serve), "
        "or auto: the first that can run here.", choices=BACKENDS)
    image: str = _opt(DEFAULT_IMAGE, "Docker image for --server=docker.")
    docker_network: str = _opt("bridge", DOCKER_NETWORK_HELP, choices=DOCKER_NETWORKS)
    protocols: tuple[str, ...] = _opt(
        PROTOCOLS, "APIs to validate: grpc, rest or both (every backend serves both).")
    concurrency: int = _opt(8, "Concurrent clients in the load phase (0 skips it).")
    duration: float = _opt(5.0, "Seconds of the load phase.")
    load_deadline: float = _opt(300.0, "Seconds to wait for the model to be AVAILABLE.")
    request_timeout: float = 30.0
    batch_size: int = 8
    write_warmup: bool = _opt(
        False, "Write the requests answered right to assets.extra/tf_serving_warmup_requests "
        "of the validated (optimize: the published) version; the server replays them at "
        "load.")
    require_server: str = _opt(
        "any", "tf_serving: fail when only the local stand-in can run (no Docker engine, no "
        "tensorflow_model_server).", choices=REQUIRE_SERVER)

    def check(self) -> None:
        if self.server not in BACKENDS:
            raise UsageError(f"--server={self.server} is not one of "
                             f"{', '.join(BACKENDS)}", "e.g. --server=auto")
        if not (isinstance(self.concurrency, int) and 0 <= self.concurrency <= MAX_CLIENTS):
            raise UsageError(f"--concurrency={self.concurrency} must be within "
                             f"[0, {MAX_CLIENTS}]", "e.g. --concurrency=8 (0 skips the load "
                             "phase)")
        if not 0 <= self.duration <= MAX_DURATION:  # also refuses nan
            raise UsageError(f"--duration={self.duration} must be within [0, {MAX_DURATION:g}] "
                             "seconds", "e.g. --duration=5 (0 skips the load phase)")
        for name in ("load_deadline", "request_timeout"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise UsageError(f"{name}={value} must be a positive number of seconds",
                                 f"e.g. {name}=30")
        if self.batch_size < 1:
            raise UsageError("batch_size must be >= 1",
                             "e.g. ValidateOptions(serving=ServingCheck(batch_size=8))")
        parse_protocols(self.protocols)
        check_docker_network(self.docker_network)
        if self.require_server not in REQUIRE_SERVER:
            raise UsageError(f"--require_server={self.require_server} is not one of "
                             f"{', '.join(REQUIRE_SERVER)}",
                             "use --require_server=tf_serving or any")
        if self.require_server == "tf_serving" and self.server == "local":
            raise UsageError("--require_server=tf_serving contradicts --server=local (the local "
                             "server is a stand-in, not TF Serving)",
                             "use --server=auto, docker or binary")


def parse_protocols(protocols) -> tuple[str, ...]:
    """``"grpc,rest"`` or a sequence -> the protocols in a fixed order; UsageError else.
    """
    names = protocols.split(",") if isinstance(protocols, str) else list(protocols)
    names = [n.strip().lower() for n in names if n.strip()]
    unknown = [n for n in names if n not in PROTOCOLS]
    if unknown or not names:
        raise UsageError(f"--protocols={','.join(names)} must name grpc, rest or both",
                         "e.g. --protocols=grpc,rest")
    return tuple(p for p in PROTOCOLS if p in names)


def _check_version(version: int | None, int64: str = "") -> None:
    from serving_opt.savedmodel import writer

    if version is not None and not (isinstance(version, int)
                                    and 0 <= version <= writer.MAX_VERSION):
        raise UsageError(f"--version={version} is not a version TF Serving reads",
                         f"pass --version=N with 0 <= N <= {writer.MAX_VERSION}"
                         + (f" {int64}" if int64 else ""))
