"""What clients of the sandboxed ``serving-opt serve`` reach, on the host: one sandbox
per model base, and in front of them a gRPC router (:mod:`.grpc_router`) and a REST
front end (:mod:`.rest_front`) that pick the sandbox from the model name a request
carries. Nothing here imports TensorFlow or TF Serving's protos: requests stay bytes.
"""
