"""Which models to serve: ``--model_name/--model_base_path`` or a ModelServerConfig file.

Builds and validates the same ``tensorflow.serving.ModelServerConfig`` proto TF Serving
uses, with its rules: unique model names, absolute base paths, platform "tensorflow".
"""

from __future__ import annotations

import os
import re

from serving_opt.model_server.status import invalid_argument, not_found

TENSORFLOW_PLATFORM = "tensorflow"
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def single_model_config(name: str, base_path: str):
    """The config TF Serving builds from ``--model_name`` and ``--model_base_path``."""
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = name
    model.base_path = base_path
    model.model_platform = TENSORFLOW_PLATFORM
    return config


def parse_config_text(text: str, source: str = "<config>"):
    """Parses a text-format ModelServerConfig."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        # Upstream's words: protobuf's TextFormat error, then ParseProtoTextFile's.
        raise invalid_argument(
            f"Error parsing text-format tensorflow.serving.ModelServerConfig: {e}; "
            f"Invalid protobuf file: '{source}'") from None
    return config


def read_config_file(path: str):
    """Reads ``--model_config_file`` (text ModelServerConfig)."""
    return parse_config_text(read_text_file(path), path)


def read_text_file(path: str) -> str:
    """A text config file the server was given, failing with the server's status errors."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise not_found(f"{path}; No such file or directory") from None
    except OSError as e:
        raise invalid_argument(f"Could not read {path}: {e.strerror or e}") from None


def platform_of(model) -> str:
    """A ModelConfig's platform, honouring the deprecated ``model_type`` like C++ GetPlatform."""
    from tensorflow_serving.config import model_server_config_pb2

    if model.model_type != model_server_config_pb2.MODEL_TYPE_UNSPECIFIED:
        if model.model_platform:
            raise invalid_argument(
                "Illegal setting both ModelServerConfig::model_type (deprecated) and "
                f"ModelServerConfig::model_platform, model name is {model.name}"
            )
        if model.model_type == model_server_config_pb2.TENSORFLOW:
            return TENSORFLOW_PLATFORM
        raise invalid_argument(
            f"ModelServerConfig::model_type choice {model.model_type} not supported."
        )
    if not model.model_platform:
        raise invalid_argument(
            "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
            f"ModelServerConfig::model_platform, model name is {model.name}"
        )
    return model.model_platform


def validate(config) -> None:
    """Raises ServingStatusError for a config TF Serving would refuse (or we cannot serve)."""
    kind = config.WhichOneof("config")
    if kind == "custom_model_config":
        raise invalid_argument("ModelServer does not yet support custom model config.")
    if kind is None:
        return
    names = set()
    for model in config.model_config_list.config:
        if model.name in names:
            raise invalid_argument(
                f"Illegal to list model {model.name} multiple times in config list"
            )
        names.add(model.name)
    for model in config.model_config_list.config:
        if _URI_SCHEME.match(model.base_path):
            # Not a TF Serving rule: this stand-in reads the local file system only.
            raise invalid_argument(
                f"Model {model.name} has base_path {model.base_path}, but the local server "
                "only reads local directories"
            )
        if not os.path.isabs(model.base_path):
            raise invalid_argument(
                f"Expected model {model.name} to have an absolute path or URI; got "
                f"base_path()={model.base_path}"
            )
    for model in config.model_config_list.config:
        platform = platform_of(model)
        if platform != TENSORFLOW_PLATFORM:
            raise invalid_argument(
                f"Model {model.name} requests unsupported platform {platform}"
            )


def model_configs(config) -> list:
    """The ModelConfig entries (none for an empty config)."""
    if config.WhichOneof("config") != "model_config_list":
        return []
    return list(config.model_config_list.config)

