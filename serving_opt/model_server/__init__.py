"""A local, TF-Serving-compatible model server: the dev/CI stand-in for tensorflow_model_server.

It speaks the real gRPC API (PredictionService, ModelService) with TF Serving's status
codes and messages, loads SavedModel versions from a base path like the real server, and
runs them through the C++ session - see /work/shared/reference/tf-serving-contract.md.

Modules mirror tensorflow_serving/: ``servable`` (one loaded version), ``predict``,
``classifier``, ``regressor``, ``multi_inference``, ``warmup`` (servables/tensorflow),
``storage_path`` (sources/storage_path), ``core`` (ServerCore + manager),
``prediction_service`` / ``model_service`` (gRPC), ``rest`` (the HTTP API) with
``json_codec`` (util/json_tensor, split into ``json_read``, ``json_write``,
``json_dtypes``, ``json_predict`` and ``json_examples``), ``server`` (start/stop),
``tflite`` (--prefer_tflite_model), ``monitoring`` (Prometheus metrics), ``extra_services``
(profiler and health services) with ``extra_protos``.

Example:
    >>> from serving_opt.model_server import ServerOptions, serve
    >>> server = serve(ServerOptions(model_name="m", model_base_path="/models/m", port=0))
    >>> server.port > 0
    True
    >>> server.stop()
"""

from serving_opt.model_server.server import (
    RunningServer,
    ServerOptions,
    ServerStartError,
    serve,
)

__all__ = ["RunningServer", "ServerOptions", "ServerStartError", "serve"]
