"""Serve SavedModels over TF Serving's gRPC and REST APIs with the local, TF-Serving-compatible
server.

The dev/CI stand-in for tensorflow_model_server (flags are the same):

    serving-opt serve --model_name=m --model_base_path=/abs/models/m --port=8500 \
        --rest_api_port=8501

The base path holds integer version directories (1/, 2/, ...); the highest is served and
new ones are picked up every --file_system_poll_wait_seconds. Each tensorflow_model_server
flag works as upstream's (--enable_batching with --batching_parameters_file merges
concurrent requests into shared session runs like TF Serving's BatchingSession;
--prefer_tflite_model, --monitoring_config_file's Prometheus page, the profiler and health
services, the session thread flags, ...) or is a usage error at start-up naming what the
stand-in does not do (REFUSED_FLAGS: TLS/ALTS, GPU, platform configs, ...) unless given at
upstream's default; NO_OP_FLAGS only save memory or touch absent hardware upstream.
--version prints upstream's two lines. --host defaults to 127.0.0.1 where upstream
listens on all interfaces. One flag is its own: --max_request_bytes (default TF Serving's
2 GB gRPC message limit) bounds what
one request may carry or make the server allocate, so a few bytes declaring a huge tensor
are an error, not an out-of-memory kill. The port opens once the models are loaded; one
line is printed then. SIGTERM or Ctrl-C stops the server cleanly.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from absl import flags

from serving_opt.cli import main as cli
from serving_opt.errors import UsageError

SUMMARY = "run a local TF-Serving-compatible gRPC/REST model server (dev/CI stand-in)"


# tensorflow_model_server flags (model_servers/main.cc) the local server does not
# implement: each is a usage error at start-up, naming what the stand-in does not do,
# unless given at upstream's default value (then it changes nothing).
# (type, name, upstream's default, what the stand-in does not do)
REFUSED_FLAGS = (
    (bool, "enable_per_model_batching_parameters", False,
     "per-model batching parameters (batching_params.pbtxt in version directories)"),
    (int, "num_load_threads", 0,
     "parallel loading: it loads versions one at a time (upstream's default, 0)"),
    (int, "num_unload_threads", 0,
     "parallel unloading: it unloads versions one at a time (upstream's default, 0)"),
    (bool, "use_alts_credentials", False, "ALTS: its gRPC port is plaintext"),
    (str, "ssl_config_file", "", "TLS: its gRPC port is plaintext"),
    (str, "platform_config_file", "",
     "platform configs: it serves the 'tensorflow' platform with flag-built configs only"),
    (float, "per_process_gpu_memory_fraction", 0.0, "GPUs: it runs on the CPU only"),
    (bool, "xla_gpu_compilation_enabled", False, "GPUs: it runs on the CPU only"),
    (str, "thread_pool_factory_config_file", "", "custom inter/intra-op thread pools"),
)

# tensorflow_model_server flags accepted with no effect here, because they have none that
# a client or this machine can observe: they free memory or initialize hardware that is
# absent (see the README's flag table).
NO_OP_FLAGS = (
    (bool, "flush_filesystem_caches", True,
     "Free file-system caches after loads (memory only; nothing to flush here)."),
    (bool, "remove_unused_fields_from_bundle_metagraph", True,
     "Drop unused MetaGraphDef fields after loading (memory only; answers are the same)."),
    (bool, "skip_initialize_tpu", False,
     "TPU builds only: skip TPU initialization (no TPU here either way)."),
)


def refuse_unimplemented_flags(fv: flags.FlagValues) -> None:
    """A usage error for the first given tensorflow_model_server flag the local server
    does not implement, unless it is at upstream's default value.
    """
    for _, name, default, missing in REFUSED_FLAGS:
        if fv[name].present and fv[name].value != default:
            raise UsageError(
                f"--{name} is not implemented by serving-opt serve, the local stand-in for "
                f"tensorflow_model_server: no {missing}",
                f"drop --{name} here, or run the real tensorflow_model_server "
                "(serving-opt validate --server=docker|binary)")
    if fv.mixed_precision not in ("", "bfloat16"):
        raise UsageError(
            f"--mixed_precision={fv.mixed_precision} is not supported: the only mode is "
            "bfloat16 (upstream logs a warning and ignores other values)",
            "pass --mixed_precision=bfloat16 or drop the flag")
    if fv.prefer_tflite_model and fv.enable_batching:
        raise UsageError(
            "--prefer_tflite_model with --enable_batching is not implemented by serving-opt "
            "serve: no batching of TFLite models",
            "drop --enable_batching (or --prefer_tflite_model)")


def print_version() -> None:
    """``--version``, in upstream's two-line shape."""
    from importlib import metadata

    import serving_opt

    try:
        tf_version = metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        tf_version = "not installed"
    print(f"TensorFlow ModelServer: {serving_opt.__version__}-serving-opt (serving-opt "
          "serve, the local stand-in for tensorflow_model_server)")
    print(f"TensorFlow Library: {tf_version}")


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_integer("port", 8500, "gRPC port; 0 picks a free port (printed when ready).",
                         flag_values=fv)
    flags.DEFINE_string("host", "127.0.0.1",
                        "Address to listen on. Default 127.0.0.1 (this machine only), safer "
                        "than upstream: tensorflow_model_server listens on all interfaces "
                        "(0.0.0.0); pass --host=0.0.0.0 for that.",
                        flag_values=fv)
    flags.DEFINE_boolean("version", False,
                         "Print the version (upstream's two lines) and exit.", flag_values=fv)
    flags.DEFINE_integer("rest_api_port", 0,
                         "HTTP/REST port (TF Serving's REST API); 0: no REST, -1: a free "
                         "port (printed when ready; not in TF Serving).", flag_values=fv)
    flags.DEFINE_integer("rest_api_num_threads", 0,
                         "Requests the REST API runs at once (0: 4 per CPU, like TF "
                         "Serving's auto setting).", flag_values=fv)
    flags.DEFINE_integer("rest_api_timeout_in_ms", 30000,
                         "Session run timeout of REST requests (<= 0: none).", flag_values=fv)
    flags.DEFINE_boolean("rest_api_enable_cors_support", False,
                         "Add CORS headers to REST answers.", flag_values=fv)
    flags.DEFINE_string("model_name", "default",
                        "Name of the model (ignored with --model_config_file).", flag_values=fv)
    cli.define_model_dir(fv, cli.MODEL_BASE_PATH,
                         "Absolute path of the model base directory holding version "
                         "directories (ignored with --model_config_file).", is_required=False)
    flags.DEFINE_string("model_config_file", None,
                        "Text ModelServerConfig listing the models to serve.", flag_values=fv)
    flags.DEFINE_float("file_system_poll_wait_seconds", 1,
                       "Seconds between polls of the base paths for new versions; 0 polls "
                       "once.", flag_values=fv)
    flags.DEFINE_string("saved_model_tags", "serve",
                        "Comma-separated tag set of the MetaGraph to load.", flag_values=fv)
    flags.DEFINE_boolean("enable_model_warmup", True,
                         "Replay assets.extra/tf_serving_warmup_requests at load.",
                         flag_values=fv)
    flags.DEFINE_integer("num_request_iterations_for_warmup", 0,
                         "Times each warmup request is replayed (0 means 1).", flag_values=fv)
    flags.DEFINE_boolean("enable_signature_method_name_check", False,
                         "Check SignatureDef.method_name against the API called.",
                         flag_values=fv)
    flags.DEFINE_integer("max_num_load_retries", 5,
                         "Retries of a failed model load before giving up.", flag_values=fv)
    flags.DEFINE_integer("load_retry_interval_micros", 60_000_000,
                         "Microseconds between load retries.", flag_values=fv)
    flags.DEFINE_boolean("allow_version_labels_for_unavailable_models", False,
                         "Allow version_labels for versions not loaded yet.", flag_values=fv)
    flags.DEFINE_integer("tensorflow_intra_op_parallelism", 0,
                         "Threads per op (0: TensorFlow's default).", flag_values=fv)
    flags.DEFINE_integer("tensorflow_inter_op_parallelism", 0,
                         "Ops run in parallel (0: TensorFlow's default).", flag_values=fv)
    flags.DEFINE_boolean("enable_batching", False,
                         "Batch concurrent session runs like TF Serving (parameters from "
                         "--batching_parameters_file, else upstream's defaults).",
                         flag_values=fv)
    flags.DEFINE_string("batching_parameters_file", None,
                        "Text BatchingParameters for --enable_batching, validated like TF Serving.",
                        flag_values=fv)
    flags.DEFINE_float("model_config_file_poll_wait_seconds", 0,
                       "Seconds between re-reads of --model_config_file (0: read once).",
                       flag_values=fv)
    defines = {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer,
               float: flags.DEFINE_float, str: flags.DEFINE_string}
    for kind, name, default, missing in REFUSED_FLAGS:
        defines[kind](name, default, f"tensorflow_model_server flag, not implemented here (no "
                      f"{missing}): a usage error unless at upstream's default.",
                      flag_values=fv)
    for kind, name, default, help_text in NO_OP_FLAGS:
        defines[kind](name, default, f"tensorflow_model_server flag. {help_text}",
                      flag_values=fv)
    flags.DEFINE_boolean("xla_cpu_compilation_enabled", False,
                         "Allow XLA:CPU JIT (jit_compile functions). Here XLA:CPU is always "
                         "available: unlike upstream at the default (false), such models run "
                         "instead of failing their first request.", flag_values=fv)
    flags.DEFINE_string("monitoring_config_file", "",
                        "Text MonitoringConfig; prometheus_config { enable: true } serves "
                        "upstream's request_count/request_latency metrics as Prometheus text "
                        "on the REST port (default path /monitoring/prometheus/metrics).",
                        flag_values=fv)
    flags.DEFINE_boolean("enable_profiler", True,
                         "Serve tensorflow.ProfilerService/Profile on the gRPC port (traces "
                         "are returned to the client, which saves them).", flag_values=fv)
    flags.DEFINE_boolean("enable_grpc_healthcheck_service", False,
                         "Serve grpc.health.v1.Health on the gRPC port.", flag_values=fv)
    flags.DEFINE_string("grpc_channel_arguments", "",
                        "Comma-separated key=value gRPC server channel arguments (ints where "
                        "they parse), as upstream.", flag_values=fv)
    flags.DEFINE_boolean("prefer_tflite_model", False,
                         "Serve a version's model.tflite (Predict on its signature runners) "
                         "instead of its SavedModel when present.", flag_values=fv)
    flags.DEFINE_integer("num_tflite_pools", 0,
                         "With --prefer_tflite_model: interpreter pools (times "
                         "--num_tflite_interpreters_per_pool interpreters per model).",
                         flag_values=fv)
    flags.DEFINE_integer("num_tflite_interpreters_per_pool", 1,
                         "With --prefer_tflite_model: interpreters per pool.", flag_values=fv)
    flags.DEFINE_integer("tensorflow_session_parallelism", 0,
                         "Intra- and inter-op threads of every session, unless "
                         "--tensorflow_intra_op_parallelism/--tensorflow_inter_op_parallelism "
                         "are set (0: TensorFlow's default).", flag_values=fv)
    flags.DEFINE_boolean("force_allow_any_version_labels_for_unavailable_models", False,
                         "Let config version_labels point at any version, loaded or not, "
                         "even moving an existing label (as upstream).", flag_values=fv)
    flags.DEFINE_string("mixed_precision", "",
                        "bfloat16: run with oneDNN's bfloat16 auto mixed precision rewrite, "
                        "as upstream; other values are refused (upstream ignores them with "
                        "a warning).", flag_values=fv)
    flags.DEFINE_boolean("enable_serialization_as_tensor_content", False,
                         "gRPC Predict answers in tensor_content instead of typed fields "
                         "(float_val, ...), as upstream.", flag_values=fv)
    flags.DEFINE_string("tensorflow_session_config_file", "",
                        "Text ConfigProto for every session (the thread flags apply on top, "
                        "as upstream).", flag_values=fv)
    flags.DEFINE_integer("grpc_max_threads", 128, "Threads handling gRPC requests.",
                         flag_values=fv)
    flags.DEFINE_boolean("allow_file_ops", False,
                         "Load versions whose graph has host ops (file writes and reads, "
                         "code execution, network): a SavedModel is code, and without this "
                         "such a version fails to load, named by the static check. Not a "
                         "TF Serving flag.", flag_values=fv)
    flags.DEFINE_integer("max_request_bytes", 2**31 - 1,
                         "Most bytes one request may carry or make the server allocate: the "
                         "gRPC message limit, the REST body limit (413 over it), and the "
                         "decoded size of a request's input tensors (a short float_val is "
                         "padded to its declared shape; INVALID_ARGUMENT over it). Default: "
                         "TF Serving's gRPC message limit. Not a TF Serving flag.",
                         flag_values=fv)
    flags.DEFINE_string("grpc_socket_path", "",
                        "Also serve gRPC on this unix domain socket (as upstream).",
                        flag_values=fv)
    flags.DEFINE_boolean("allow_unsandboxed", False,
                         "Serve even where the bubblewrap sandbox cannot start (no bwrap, "
                         "no user namespaces, not Linux): the models then run in this "
                         "process. Only for models you trust. Not a TF Serving flag.",
                         flag_values=fv)
    flags.DEFINE_integer("sandbox_memory_bytes", 0,
                         "Memory limit of the sandboxed server (0: three quarters of the "
                         "machine's). Not a TF Serving flag.", flag_values=fv)
    flags.DEFINE_integer("rest_api_fd", -1,
                         "Internal (set by serve's sandbox): serve REST on this inherited "
                         "bound socket.", flag_values=fv)
    flags.DEFINE_integer("parent_pipe_fd", -1,
                         "Internal (set by validate): stop when this inherited pipe reaches "
                         "EOF, i.e. when the process that started the server is gone.",
                         flag_values=fv)


def _options(fv: flags.FlagValues):
    # Flag mistakes are reported before importing TensorFlow (seconds) for the server.
    refuse_unimplemented_flags(fv)
    for name in ("num_tflite_pools", "num_tflite_interpreters_per_pool",
                 "tensorflow_session_parallelism"):
        if fv[name].value < 0:
            raise UsageError(f"--{name}={fv[name].value} is negative",
                             "pass 0 or a positive count")
    if not -1 <= fv.rest_api_port <= 65535:
        raise UsageError(
            f"--rest_api_port={fv.rest_api_port} is not a TCP port",
            "pass 1..65535, 0 (no REST API) or -1 (any free port)",
        )
    if fv.rest_api_port > 0 and fv.rest_api_port == fv.port:
        # tensorflow_model_server refuses this too.
        raise UsageError(
            f"--rest_api_port={fv.rest_api_port} is the same as --port",
            "give the REST API its own port (TF Serving uses 8500 for gRPC, 8501 for REST)",
        )
    if not fv.model_config_file and not fv.model_base_path:
        raise UsageError(
            "missing --model_base_path (or --model_config_file)",
            "pass --model_base_path=/abs/path/to/model holding version directories 1/, 2/...",
        )
    if fv.model_base_path and not fv.model_config_file and not os.path.isabs(
        fv.model_base_path
    ):
        # TF Serving refuses relative base paths too; say how to fix it.
        raise UsageError(
            f"--model_base_path={fv.model_base_path} is relative; TF Serving requires an "
            "absolute path",
            f"pass --model_base_path={os.path.abspath(fv.model_base_path)}",
        )
    if not 0 <= fv.port <= 65535:
        raise UsageError(f"--port={fv.port} is not a TCP port", "pass 0..65535 (0: any)")
    if fv.sandbox_memory_bytes < 0 or 0 < fv.sandbox_memory_bytes < _MIN_SANDBOX_MEMORY:
        # The bound optimize's and compare's --sandbox_memory_bytes have: below it
        # TensorFlow cannot even import.
        raise UsageError(
            f"--sandbox_memory_bytes={fv.sandbox_memory_bytes} is below "
            f"{_MIN_SANDBOX_MEMORY} (256 MiB)",
            "pass at least 268435456 bytes, or 0 for three quarters of the machine's")
    if fv.max_request_bytes <= 0:
        raise UsageError(
            f"--max_request_bytes={fv.max_request_bytes} is not a byte count",
            "pass a positive number of bytes (default 2147483647, TF Serving's gRPC limit)",
        )
    from serving_opt.model_server import ServerOptions

    return ServerOptions(
        model_name=fv.model_name,
        model_base_path=fv.model_base_path,
        model_config_file=fv.model_config_file,
        port=fv.port,
        host=fv.host,
        file_system_poll_wait_seconds=fv.file_system_poll_wait_seconds,
        saved_model_tags=fv.saved_model_tags,
        enable_model_warmup=fv.enable_model_warmup,
        num_request_iterations_for_warmup=fv.num_request_iterations_for_warmup,
        enable_signature_method_name_check=fv.enable_signature_method_name_check,
        max_num_load_retries=fv.max_num_load_retries,
        load_retry_interval_micros=fv.load_retry_interval_micros,
        allow_version_labels_for_unavailable_models=(
            fv.allow_version_labels_for_unavailable_models
        ),
        tensorflow_intra_op_parallelism=fv.tensorflow_intra_op_parallelism,
        tensorflow_inter_op_parallelism=fv.tensorflow_inter_op_parallelism,
        grpc_max_threads=fv.grpc_max_threads,
        rest_api_port=fv.rest_api_port,
        rest_api_num_threads=fv.rest_api_num_threads,
        rest_api_timeout_in_ms=fv.rest_api_timeout_in_ms,
        rest_api_enable_cors_support=fv.rest_api_enable_cors_support,
        model_config_file_poll_wait_seconds=fv.model_config_file_poll_wait_seconds,
        enable_batching=fv.enable_batching,
        batching_parameters_file=fv.batching_parameters_file,
        max_request_bytes=fv.max_request_bytes,
        allow_file_ops=fv.allow_file_ops,
        grpc_socket_path=fv.grpc_socket_path,
        rest_api_fd=fv.rest_api_fd,
        monitoring_config_file=fv.monitoring_config_file,
        enable_profiler=fv.enable_profiler,
        enable_grpc_healthcheck_service=fv.enable_grpc_healthcheck_service,
        grpc_channel_arguments=fv.grpc_channel_arguments,
        prefer_tflite_model=fv.prefer_tflite_model,
        num_tflite_pools=fv.num_tflite_pools,
        num_tflite_interpreters_per_pool=fv.num_tflite_interpreters_per_pool,
        tensorflow_session_parallelism=fv.tensorflow_session_parallelism,
        tensorflow_session_config_file=fv.tensorflow_session_config_file,
        enable_serialization_as_tensor_content=fv.enable_serialization_as_tensor_content,
        force_allow_any_version_labels_for_unavailable_models=(
            fv.force_allow_any_version_labels_for_unavailable_models),
        mixed_precision=fv.mixed_precision,
    )


def _log_to_stderr(verbosity: int) -> None:
    # Load, retry and unload events are what a server operator watches; show them.
    logger = logging.getLogger("serving_opt.model_server")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    logger.propagate = False


def _exit_with_parent(fd: int, grace_seconds: float = 10.0) -> None:
    """Stops the server when the pipe ``fd`` reaches EOF: the parent holds its only write
    end and never writes, so EOF means the parent is gone (even killed with SIGKILL)."""

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # the clean way out, as a TF Serving stop
        # A main thread stuck in C++ (a long model load) runs no Python signal handler.
        time.sleep(grace_seconds)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class _StoppedBeforeReady(Exception):
    """SIGTERM/SIGINT while the models were still loading."""


_MIN_SANDBOX_MEMORY = 1 << 28

# Flags the sandboxed server gets from serve_sandboxed itself, not from the user's.
_HOST_SIDE_FLAGS = frozenset({"port", "host", "rest_api_port", "grpc_socket_path", "version",
                              "allow_unsandboxed", "sandbox_memory_bytes", "rest_api_fd",
                              "parent_pipe_fd", "model_name", "model_base_path",
                              "model_config_file"})
_PATH_FLAGS = ("model_config_file", "batching_parameters_file", "monitoring_config_file",
               "tensorflow_session_config_file")


def _child_flags(fv: flags.FlagValues) -> list[str]:
    """The user's flags, as the sandboxed server takes them (paths made absolute: it
    runs in /tmp)."""
    own = flags.FlagValues()
    define_flags(own)
    names = [name for name in own if name not in _HOST_SIDE_FLAGS and fv[name].present]
    forwarded = []
    for name in names:
        if name in _PATH_FLAGS and fv[name].value:
            forwarded.append(f"--{name}={os.path.abspath(fv[name].value)}")
        else:
            forwarded.append(fv[name].serialize())
    if fv["verbosity"].present:
        forwarded.append(fv["verbosity"].serialize())
    return forwarded


def _serve_sandboxed(fv: flags.FlagValues, options) -> int:
    from serving_opt import sandbox
    from serving_opt.model_server.server import ServerStartError
    from serving_opt.model_server.status import ServingStatusError
    from serving_opt.serving import sandboxed_server

    if options.model_config_file and fv.model_config_file_poll_wait_seconds > 0:
        raise UsageError(
            "--model_config_file_poll_wait_seconds cannot apply to the sandboxed serve: each "
            "model runs in a sandbox of its own, made for the config given at start",
            "restart serve with the new config, or pass --allow_unsandboxed for models you "
            "trust")
    try:
        tenants = sandboxed_server.tenants(options.model_name, options.model_base_path,
                                           options.model_config_file)
    except ServingStatusError as e:  # a bad --model_config_file, in upstream's words
        raise ServerStartError(f"Failed to start server. Error: {e.to_text()}") from None
    # Other files every sandboxed server reads, as the same read-only binds.
    read_only = [os.path.abspath(path) for path in (
        options.batching_parameters_file, options.monitoring_config_file,
        options.tensorflow_session_config_file) if path]
    endpoints = sandboxed_server.Endpoints(
        host=options.host, port=options.port,
        rest_port=None if options.rest_api_port == 0 else max(0, options.rest_api_port or 0),
        grpc_socket_path=options.grpc_socket_path)
    policy = sandbox.Policy(read_only=tuple(read_only),
                            memory_bytes=fv.sandbox_memory_bytes or None)
    return sandboxed_server.serve_sandboxed(endpoints, tenants, _child_flags(fv), policy,
                                            max_request_bytes=fv.max_request_bytes,
                                            grpc_threads=fv.grpc_max_threads,
                                            grpc_channel_arguments=fv.grpc_channel_arguments)


def main(fv: flags.FlagValues) -> int:
    if fv.version:
        print_version()
        return 0
    from serving_opt.savedmodel import tf_process

    tf_process.keep_plotting_out()  # a server never plots (and the sandboxed one has no fonts)
    options = _options(fv)
    from serving_opt import sandbox

    if sandbox.require(fv.allow_unsandboxed, "serve"):
        return _serve_sandboxed(fv, options)
    _log_to_stderr(fv.verbosity)
    stop = threading.Event()
    ready = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)
        stop.set()
        if not ready.is_set():
            # The initial load can take minutes (or wait forever for a first version):
            # unwind out of serve(), which stops the loader on its way out.
            raise _StoppedBeforeReady()

    def on_ready(line: str) -> None:
        ready.set()
        print(line, flush=True)

    # Installed before loading, so a SIGTERM during a long load still exits cleanly.
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    if fv.parent_pipe_fd >= 0:
        _exit_with_parent(fv.parent_pipe_fd)
    try:
        import tensorflow as tf

        from serving_opt.model_server import serve

        # Which TensorFlow answers: validate reads this line into its report and marker.
        print(f"serving-opt serve: TensorFlow {tf.__version__} ({sys.executable})",
              file=sys.stderr, flush=True)
        try:
            server = serve(options, on_ready=on_ready)
        except _StoppedBeforeReady:
            name = signal.Signals(received[0]).name
            print(f"serving-opt serve: stopped ({name}) before the models were loaded",
                  file=sys.stderr, flush=True)
            return 128 + received[0]
        try:
            while not stop.wait(1.0):
                pass
        finally:
            server.stop()
        name = signal.Signals(received[0]).name if received else "stop"
        print(f"serving-opt serve: stopped ({name})", file=sys.stderr, flush=True)
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
