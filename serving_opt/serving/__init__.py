"""The serving round trip: proving a model through TF Serving's gRPC API.

``validate`` orchestrates; ``backends`` starts a server (Docker image, local binary, or
the project's own ``model_server``); ``warmup`` writes TF Serving warmup records.
"""
