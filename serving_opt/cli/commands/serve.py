"""Serve SavedModels over TF Serving's gRPC and REST APIs with the local, TF-Serving-compatible
server.

The dev/CI stand-in for tensorflow_model_server (flags are the same):

    serving-opt serve --model_name=m --model_base_path=/abs/models/m --port=8500 \
        --rest_api_port=8501

The base path holds integer version directories (1/, 2/, ...); the highest is served and
new ones are picked up every --file_system_poll_wait_seconds. Every tensorflow_model_server
flag is accepted: the ones that change answers or loading are implemented (including
--rest_api_port, --model_config_file_poll_wait_seconds, and --enable_batching with
--batching_parameters_file: concurrent requests are merged into shared session runs like
TF Serving's BatchingSession); the others (threads, TLS, monitoring,
TPU/GPU/TFLite options; IGNORED_FLAGS) are ignored with a one-line warning each. One flag
is its own: --max_request_bytes (default TF Serving's 2 GB gRPC message limit) bounds what
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


# tensorflow_model_server flags (model_servers/main.cc) the local server accepts so the same
# command line works, and ignores with a one-line warning: they tune threads, memory,
# security or platforms of the real server, not what it answers.
IGNORED_FLAGS = (
    (str, "grpc_socket_path", ""),
    (str, "grpc_channel_arguments", ""),
    (bool, "enable_per_model_batching_parameters", False),
    (bool, "force_allow_any_version_labels_for_unavailable_models", False),
    (int, "num_load_threads", 0),
    (int, "num_unload_threads", 0),
    (bool, "flush_filesystem_caches", True),
    (int, "tensorflow_session_parallelism", 0),
    (str, "tensorflow_session_config_file", ""),
    (bool, "use_alts_credentials", False),
    (str, "ssl_config_file", ""),
    (str, "platform_config_file", ""),
    (float, "per_process_gpu_memory_fraction", 0.0),
    (str, "monitoring_config_file", ""),
    (bool, "remove_unused_fields_from_bundle_metagraph", True),
    (bool, "prefer_tflite_model", False),
    (int, "num_tflite_pools", 0),
    (int, "num_tflite_interpreters_per_pool", 1),
    (bool, "xla_cpu_compilation_enabled", False),
    (bool, "xla_gpu_compilation_enabled", False),
    (bool, "enable_profiler", True),
    (str, "thread_pool_factory_config_file", ""),
    (str, "mixed_precision", ""),
    (bool, "skip_initialize_tpu", False),
    (bool, "enable_grpc_healthcheck_service", False),
    (bool, "enable_serialization_as_tensor_content", False),
)


def _warn(message: str) -> None:
    print(f"serving-opt serve: warning: {message}", file=sys.stderr, flush=True)


def warn_ignored_flags(fv: flags.FlagValues) -> list[str]:
    """One warning line per given tensorflow_model_server flag the local server ignores.

    Example:
        >>> warn_ignored_flags(fv)   # after --ssl_config_file=/etc/ssl.config
        serving-opt serve: warning: --ssl_config_file is a tensorflow_model_server flag ...
        ['ssl_config_file']
    """
    given = [name for _, name, _ in IGNORED_FLAGS if fv[name].present]
    for name in given:
        _warn(f"--{name} is a tensorflow_model_server flag the local server does not "
              "implement; ignored")
    return given


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_integer("port", 8500, "gRPC port; 0 picks a free port (printed when ready).",
                         flag_values=fv)
    flags.DEFINE_string("host", "127.0.0.1",
                        "Address to listen on (the real server listens on 0.0.0.0).",
                        flag_values=fv)
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
    for kind, name, default in IGNORED_FLAGS:
        define = {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer,
                  float: flags.DEFINE_float, str: flags.DEFINE_string}[kind]
        define(name, default, "tensorflow_model_server flag: accepted, not implemented by the "
               "local server (a warning says so).", flag_values=fv)
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
    flags.DEFINE_integer("parent_pipe_fd", -1,
                         "Internal (set by validate): stop when this inherited pipe reaches "
                         "EOF, i.e. when the process that started the server is gone.",
                         flag_values=fv)


def _options(fv: flags.FlagValues):
    # Flag mistakes are reported before importing TensorFlow (seconds) for the server.
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
    if fv.max_request_bytes <= 0:
        raise UsageError(
            f"--max_request_bytes={fv.max_request_bytes} is not a byte count",
            "pass a positive number of bytes (default 2147483647, TF Serving's gRPC limit)",
        )
    from serving_opt.serving.model_server import ServerOptions

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


def main(fv: flags.FlagValues) -> int:
    options = _options(fv)
    warn_ignored_flags(fv)
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

        from serving_opt.serving.model_server import serve

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
