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
"""

__all__ = ["RunningServer", "ServerOptions", "ServerStartError", "serve"]


def __getattr__(name: str):
    # Imported on first use: the host-side front end (serving/front) imports this
    # package's TF-free http_connections, and must not load TensorFlow with it.
    if name in __all__:
        from serving_opt.model_server import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
