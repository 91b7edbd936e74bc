#!/bin/bash
# TF Serving's image contract: serve /models/$MODEL_NAME on 8500 (gRPC) and 8501 (REST);
# extra arguments are passed on, after these (a later flag wins, as upstream).
exec tensorflow_model_server --port=8500 --rest_api_port=8501 \
  --model_name="${MODEL_NAME}" --model_base_path="${MODEL_BASE_PATH}/${MODEL_NAME}" "$@"
