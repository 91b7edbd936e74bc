"""The serving round trip: proving a model through TF Serving's gRPC API.

Split the way TFX's ``infra_validator`` splits it: ``validate`` is the executor
(what runs in which order, the ValidationReport); ``requests`` builds the probe
requests and their expected answers; ``client`` talks gRPC to the server;
``backends`` starts and stops one (Docker image, local binary, or the project's own
``model_server``); ``markers`` writes VALIDATED / NOT_VALIDATED; ``warmup`` writes TF
Serving warmup records.
"""
