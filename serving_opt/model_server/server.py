"""Start and stop the local TF-Serving-compatible model server (model_servers/server.cc).

Like ``tensorflow_model_server``: build the model config, load every model (retrying per
``max_num_load_retries``), and only then open the gRPC port with PredictionService and
ModelService, INT32_MAX message limits and client deadlines enforced as session
timeouts. Unlike it: binds 127.0.0.1 unless told otherwise, port 0 picks a free port, and
a failed start raises instead of exiting.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

from serving_opt.errors import ServingOptError
from serving_opt.model_server import model_config
from serving_opt.model_server.core import CoreOptions, ServerCore, State
from serving_opt.model_server.request_options import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_REST_LIMITS,
    RequestOptions,
    RestLimits,
)
from serving_opt.model_server.servable import LoadOptions
from serving_opt.model_server.status import ServingStatusError, invalid_argument

log = logging.getLogger("serving_opt.model_server")

MAX_MESSAGE_BYTES = DEFAULT_MAX_REQUEST_BYTES  # TF Serving: std::numeric_limits<int32_t>::max()
READY_PREFIX = "serving-opt serve:"


class ServerStartError(ServingOptError):
    """The server could not start: bad config, a model that did not load, a busy port."""


@dataclass(frozen=True)
class ServerOptions:
    """tensorflow_model_server's flags that the local server honours (same defaults).

    Give ``model_base_path`` (absolute, holding integer version directories) with
    ``model_name``, or ``model_config_file`` (text ModelServerConfig). ``port`` 0 picks a
    free port. ``rest_api_port`` 0 means no REST API (as upstream); None or -1 picks a
    free port (not upstream: for tests and validate). ``startup_timeout_seconds`` bounds
    the initial load (None: wait forever, like the real server when no version directory
    exists yet). ``model_config_file_poll_wait_seconds`` > 0 re-reads the config file that
    often and applies it (models added or removed). ``enable_batching``: concurrent
    session runs are batched like TF Serving's BatchingSession (batching.py), with the
    ``batching_parameters_file`` BatchingParameters or upstream's defaults.
    ``max_request_bytes`` (not a TF Serving flag; default TF Serving's INT32_MAX message
    limit) bounds what one request may carry or make the server allocate: the gRPC
    receive limit, a REST body, and the decoded size of a request's input tensors.
    """

    model_name: str = "default"
    model_base_path: str | None = None
    model_config_file: str | None = None
    port: int = 8500
    host: str = "127.0.0.1"
    file_system_poll_wait_seconds: float = 1
    saved_model_tags: str = "serve"
    enable_model_warmup: bool = True
    num_request_iterations_for_warmup: int = 0
    enable_signature_method_name_check: bool = False
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    allow_version_labels_for_unavailable_models: bool = False
    enforce_session_run_timeout: bool = True
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    grpc_max_threads: int = 128
    startup_timeout_seconds: float | None = None
    rest_api_port: int | None = 0
    rest_api_num_threads: int = 0
    rest_api_timeout_in_ms: int = 30000
    rest_api_enable_cors_support: bool = False
    model_config_file_poll_wait_seconds: float = 0
    enable_batching: bool = False
    batching_parameters_file: str | None = None
    max_request_bytes: int = MAX_MESSAGE_BYTES
    # Not a TF Serving flag: the local server refuses to load a version with host ops
    # (file, code or network ops: serving_opt.savedmodel.untrusted) unless this is set.
    allow_file_ops: bool = False
    # gRPC also on this unix domain socket (--grpc_socket_path, as upstream).
    grpc_socket_path: str = ""
    # REST on this inherited socket, bound by the process that started this one (serve's
    # sandbox: the port lives in the host's network, the server in a sandbox without one).
    rest_api_fd: int = -1
    # Text MonitoringConfig; prometheus_config { enable: true } serves metrics on REST.
    monitoring_config_file: str = ""
    # tensorflow.ProfilerService on the gRPC port (upstream's default: on).
    enable_profiler: bool = True
    # grpc.health.v1.Health on the gRPC port.
    enable_grpc_healthcheck_service: bool = False
    # "key=value,key=value" gRPC server channel arguments (ints where they parse).
    grpc_channel_arguments: str = ""
    # Serve a version's model.tflite when present (tflite.py).
    prefer_tflite_model: bool = False
    num_tflite_pools: int = 0
    num_tflite_interpreters_per_pool: int = 1
    # Both intra- and inter-op threads, unless either of those is set (as upstream).
    tensorflow_session_parallelism: int = 0
    # Text ConfigProto for every session (threads flags applied on top, as upstream).
    tensorflow_session_config_file: str = ""
    # gRPC Predict answers in tensor_content instead of typed fields.
    enable_serialization_as_tensor_content: bool = False
    # Labels may point at any version, loaded or not (even moving an existing label).
    force_allow_any_version_labels_for_unavailable_models: bool = False
    # "bfloat16": oneDNN's bfloat16 auto mixed precision rewrite (as upstream); "": none.
    mixed_precision: str = ""
    # Not TF Serving flags: the REST port's connection bound and timeouts.
    rest_limits: RestLimits = DEFAULT_REST_LIMITS


def build_model_server_config(options: ServerOptions):
    """The ModelServerConfig the options describe (file, or single model)."""
    if options.model_config_file:
        return model_config.read_config_file(options.model_config_file)
    if not options.model_base_path:
        raise ServerStartError(
            "Both server_options.model_base_path and server_options.model_config_file are "
            "empty!",
            "pass --model_base_path=/abs/path/to/model (holding version directories 1/, 2/...)"
            " or --model_config_file",
        )
    return model_config.single_model_config(options.model_name, options.model_base_path)


def core_options(options: ServerOptions) -> CoreOptions:
    """Maps server flags to the core's loading options."""

    tags = tuple(t for t in options.saved_model_tags.split(",") if t)
    session_config = session_config_of(options)
    interpreters = (max(1, options.num_tflite_pools)
                    * max(1, options.num_tflite_interpreters_per_pool))
    return CoreOptions(
        load_options=LoadOptions(tags=tags, session_config=session_config,
                                 allow_file_ops=options.allow_file_ops,
                                 prefer_tflite_model=options.prefer_tflite_model,
                                 tflite_interpreters=interpreters),
        file_system_poll_wait_seconds=options.file_system_poll_wait_seconds,
        enable_model_warmup=options.enable_model_warmup,
        num_request_iterations_for_warmup=max(1, options.num_request_iterations_for_warmup),
        max_num_load_retries=options.max_num_load_retries,
        load_retry_interval_micros=options.load_retry_interval_micros,
        allow_version_labels_for_unavailable_models=(
            options.allow_version_labels_for_unavailable_models
        ),
        force_allow_any_version_labels_for_unavailable_models=(
            options.force_allow_any_version_labels_for_unavailable_models
        ),
        signature_method_name_check=options.enable_signature_method_name_check,
    )


def session_config_of(options: ServerOptions):
    """The sessions' ConfigProto, built as server.cc does: ``tensorflow_session_config_file``
    (text ConfigProto) first, then the thread flags: intra/inter when either is set, else
    ``tensorflow_session_parallelism`` for both; all three set is INVALID_ARGUMENT; then
    ``mixed_precision`` "bfloat16" turns on oneDNN's bfloat16 auto mixed precision (other
    values: INVALID_ARGUMENT here, where upstream logs a warning and ignores them). None
    when nothing is configured (TensorFlow's defaults).
    """
    import tensorflow as tf
    from google.protobuf import text_format

    intra, inter = (options.tensorflow_intra_op_parallelism,
                    options.tensorflow_inter_op_parallelism)
    both = options.tensorflow_session_parallelism
    if intra > 0 and inter > 0 and both > 0:
        raise invalid_argument(
            "Either configure server_options.tensorflow_session_parallelism or "
            "(server_options.tensorflow_intra_op_parallelism, "
            "server_options.tensorflow_inter_op_parallelism) separately. You cannot "
            "configure all.")
    if options.mixed_precision not in ("", "bfloat16"):
        raise invalid_argument(
            f"{options.mixed_precision} auto mixed precision is not supported. Valid "
            "option: bfloat16")
    if not (options.tensorflow_session_config_file or intra or inter or both
            or options.mixed_precision):
        return None
    config = tf.compat.v1.ConfigProto()
    if options.tensorflow_session_config_file:
        path = options.tensorflow_session_config_file
        try:
            text_format.Parse(model_config.read_text_file(path), config)
        except text_format.ParseError as e:
            raise invalid_argument(
                f"Error parsing text-format tensorflow.ConfigProto: {e}; Invalid protobuf "
                f"file: '{path}'") from None
    if intra > 0 or inter > 0:
        config.intra_op_parallelism_threads = intra
        config.inter_op_parallelism_threads = inter
    else:
        config.intra_op_parallelism_threads = both
        config.inter_op_parallelism_threads = both
    if options.mixed_precision == "bfloat16":  # saved_model_bundle_factory.cc
        from tensorflow.core.protobuf import rewriter_config_pb2

        config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
            rewriter_config_pb2.RewriterConfig.ON)
    return config


def grpc_channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """``parseGrpcChannelArgs``: "k=v,k=v" -> gRPC options, ints where they parse.
    """
    result: list[tuple[str, int | str]] = []
    for item in (part for part in text.split(",") if part):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise invalid_argument(
                f"grpc_channel_arguments: {item!r} is not key=value")
        try:
            number = int(value)
            result.append((key, number) if -2**31 <= number < 2**31 else (key, value))
        except ValueError:
            result.append((key, value))
    return result


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class RunningServer:
    """A started server: ``port``, ``address``, ``core``; ``stop()`` shuts it down.

    Usable as a context manager.
    """

    def __init__(
        self, grpc_server, core: ServerCore, host: str, port: int, rest_server=None
    ) -> None:
        self.core = core
        self.host = host
        self.port = port
        self._grpc_server = grpc_server
        self._rest_server = rest_server
        #: The REST port (0: REST is off).
        self.rest_port = rest_server.port if rest_server is not None else 0
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None

    def poll_config_file(self, path: str, wait_seconds: float) -> None:
        """Re-reads ``path`` every ``wait_seconds`` and reloads the core with it, like
        ``--model_config_file_poll_wait_seconds``; a bad file is logged and skipped."""

        def poll() -> None:
            while not self._stop_polling.wait(wait_seconds):
                try:
                    self.core.reload_config(model_config.read_config_file(path))
                except ServingStatusError as e:
                    log.error("Failed to reload config file %s: %s", path, e.to_text())
                except Exception:  # noqa: BLE001 - keep polling, like the C++ thread
                    log.exception("Failed to reload config file %s", path)

        self._poller = threading.Thread(
            target=poll, name="serving-opt-config-poll", daemon=True
        )
        self._poller.start()

    @property
    def address(self) -> str:
        """``host:port`` for ``grpc.insecure_channel``."""
        return _bind_address(self.host, self.port)

    @property
    def rest_address(self) -> str | None:
        """``host:port`` of the REST API, or None when REST is off."""
        return _bind_address(self.host, self.rest_port) if self.rest_port else None

    def available_versions(self) -> dict[str, list[int]]:
        """Every model's AVAILABLE versions, ascending."""
        return {name: self.core.available_versions(name) for name in self.core.model_names()}

    def ready_line(self) -> str:
        """The one line the ``serve`` command prints once the port is open."""
        parts = []
        for name, versions in self.available_versions().items():
            shown = ", ".join(str(v) for v in versions) or "none"
            noun = "version" if len(versions) == 1 else "versions"
            parts.append(f"model '{name}' {noun} {shown}")
        models = "; ".join(parts) or "no models"
        rest = f", REST on {self.rest_address}" if self.rest_port else ""
        return (
            f"{READY_PREFIX} {models} {State.AVAILABLE.name} on {self.address}{rest} "
            "(local TF-Serving-compatible server)"
        )

    def stop(self, grace: float | None = 5.0) -> None:
        """Stops accepting RPCs, lets in-flight ones finish (up to ``grace`` s), unloads.

        Idempotent and safe from any thread.
        """
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self._stop_polling.set()
            if self._poller is not None:
                self._poller.join()
            if self._rest_server is not None:
                self._rest_server.stop()
            self._grpc_server.stop(grace).wait()
            self.core.stop()
            self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until ``stop()`` has finished; True if it has."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _start_rest(options: ServerOptions, core: ServerCore, grpc_port: int, grpc_server):
    from serving_opt.model_server.rest import start_rest_server

    if options.rest_api_port == grpc_port:
        grpc_server.stop(None)
        core.stop()
        raise ServerStartError(
            f"server_options.grpc_port: {grpc_port} is same as server_options.http_port: "
            f"{options.rest_api_port}",
            "give --rest_api_port a port different from --port",
        )
    timeout = options.rest_api_timeout_in_ms if options.rest_api_timeout_in_ms > 0 else None
    prometheus_path = None
    if options.monitoring_config_file:
        from serving_opt.model_server.monitoring import read_monitoring_config

        try:
            settings = read_monitoring_config(options.monitoring_config_file)
        except ServingStatusError as e:
            grpc_server.stop(None)
            core.stop()
            raise ServerStartError(f"Failed to start server. Error: {e.to_text()}") from None
        prometheus_path = settings.path if settings.enable else None
    try:
        return start_rest_server(
            core,
            RequestOptions(
                signature_method_name_check=options.enable_signature_method_name_check,
                timeout_ms=timeout if options.enforce_session_run_timeout else None,
                max_request_bytes=options.max_request_bytes,
            ),
            host=options.host,
            port=max(0, options.rest_api_port or 0),
            num_threads=options.rest_api_num_threads,
            enable_cors=options.rest_api_enable_cors_support,
            listen_fd=options.rest_api_fd,
            prometheus_path=prometheus_path,
            limits=options.rest_limits,
        )
    except OSError as e:
        grpc_server.stop(None)
        core.stop()
        address = _bind_address(options.host, max(0, options.rest_api_port or 0))
        raise ServerStartError(
            f"could not listen on {address} for the REST API: {e.strerror or e}",
            "pick another --rest_api_port (or 0 to turn REST off)",
        ) from None


def _add_unix_port(grpc_server, path: str) -> bool:
    try:
        return bool(grpc_server.add_insecure_port(f"unix:{os.path.abspath(path)}"))
    except RuntimeError:
        return False


def serve(
    options: ServerOptions,
    *,
    config=None,
    on_ready: Callable[[str], None] | None = None,
) -> RunningServer:
    """Loads the models, then opens the gRPC port (and the REST port); returns the server.

    ``config`` (a ModelServerConfig proto) overrides the model flags, for callers that
    build it in memory. ``on_ready`` receives :meth:`RunningServer.ready_line`. Raises
    ServerStartError (a ServingOptError) if a model does not load or the port is taken.
    """
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    from serving_opt.model_server.grpc_util import BoundedServer
    from serving_opt.model_server.model_service import ModelService
    from serving_opt.model_server.prediction_service import PredictionService

    if options.max_request_bytes <= 0:
        raise ServerStartError(
            f"max_request_bytes must be positive, not {options.max_request_bytes}",
            "pass a positive --max_request_bytes (default: TF Serving's gRPC message limit)",
        )
    batching = None
    if options.enable_batching:
        from serving_opt.model_server.batching import (
            BatchingOptions,
            read_batching_parameters,
        )

        values = {}
        if options.batching_parameters_file:
            try:
                values = read_batching_parameters(options.batching_parameters_file)
            except ServingStatusError as e:
                raise ServerStartError(
                    f"Failed to start server. Error: {e.to_text()}"
                ) from None
        batching = BatchingOptions.from_values(values)
    from serving_opt.model_server.servable import load_custom_op_libraries

    # TF Serving links TensorFlow Text's ops into the binary: register them before loading.
    for module in load_custom_op_libraries():
        log.info("Registered the ops of %s", module)
    try:
        base_options = core_options(options)
        channel_arguments = grpc_channel_arguments(options.grpc_channel_arguments)
    except ServingStatusError as e:
        raise ServerStartError(f"Failed to start server. Error: {e.to_text()}") from None
    core = ServerCore(dataclasses.replace(base_options, batching=batching))
    try:
        server_config = config if config is not None else build_model_server_config(options)
        # Like the real server, the port opens only once every model is AVAILABLE.
        core.reload_config(server_config, timeout=options.startup_timeout_seconds)
    except ServingStatusError as e:
        core.stop()
        raise ServerStartError(f"Failed to start server. Error: {e.to_text()}") from None
    except BaseException:
        core.stop()
        raise

    grpc_server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=max(1, options.grpc_max_threads),
            thread_name_prefix="serving-opt-grpc",
        ),
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # A message over the bound is RESOURCE_EXHAUSTED before it is even parsed.
            ("grpc.max_receive_message_length", min(options.max_request_bytes,
                                                    MAX_MESSAGE_BYTES)),
            # One server per port: never share a port with a stale process (SO_REUSEPORT).
            ("grpc.so_reuseport", 0),
            *channel_arguments,
        ],
    )
    # Requests are parsed only once their parsed size fits --max_request_bytes.
    bounded = BoundedServer(grpc_server, options.max_request_bytes)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(
            core,
            RequestOptions(
                signature_method_name_check=options.enable_signature_method_name_check,
                max_request_bytes=options.max_request_bytes,
                tensor_content=options.enable_serialization_as_tensor_content,
            ),
            enforce_session_run_timeout=options.enforce_session_run_timeout,
        ),
        bounded,
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(core), bounded)
    extra = []
    if options.enable_profiler:
        from serving_opt.model_server.extra_services import profiler_handler

        extra.append(profiler_handler())
        log.info("Profiler service is enabled")
    if options.enable_grpc_healthcheck_service:
        from serving_opt.model_server.extra_services import health_handler

        extra.append(health_handler(["ModelService", "PredictionService"]))
    if extra:
        bounded.add_generic_rpc_handlers(extra)
    address = _bind_address(options.host, options.port)
    try:
        port = grpc_server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if not port:
        core.stop()
        raise ServerStartError(
            f"could not listen on {address}",
            "the port is in use or the host is not a local address; pick another --port "
            "(0 chooses a free one) or --host",
        )
    if options.grpc_socket_path and not _add_unix_port(grpc_server, options.grpc_socket_path):
        core.stop()
        raise ServerStartError(
            f"could not listen on the unix socket {options.grpc_socket_path}",
            "give --grpc_socket_path a path in an existing, writable directory where no "
            "file of that name exists",
        )
    rest_server = None
    if options.rest_api_port != 0:
        rest_server = _start_rest(options, core, port, grpc_server)
    grpc_server.start()
    running = RunningServer(grpc_server, core, options.host, port, rest_server)
    log.info("Running gRPC ModelServer at %s ...", running.address)
    if rest_server is not None:
        log.info("Exporting HTTP/REST API at:%s ...", running.rest_address)
    if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
        running.poll_config_file(
            options.model_config_file, options.model_config_file_poll_wait_seconds
        )
    if on_ready is not None:
        on_ready(running.ready_line())
    return running
