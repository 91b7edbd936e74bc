"""The serving round trip: proving a model through TF Serving's gRPC and REST APIs.

Split the way TFX's ``infra_validator`` splits it: ``validate`` is the executor
(what runs in which order, the ValidationReport); ``requests`` builds the probe
requests and their expected answers; ``clients`` is the client interface
(``ModelServerClient``), with ``client`` (gRPC) and ``rest_client`` (REST) behind it;
``backends`` holds the runners (Docker image, local binary, or the project's own
``model_server``) on ``process.ServerProcess``; ``results`` the report types;
``markers`` writes VALIDATED / NOT_VALIDATED; ``warmup`` writes TF Serving warmup
records; ``api`` imports TF Serving's protos on first use; ``runtime`` is the target
TensorFlow.

Imports point one way: ``validate`` -> ``clients``/``backends``/``requests`` ->
``api``/``process``/``results``; no module here imports ``validate``.
"""
