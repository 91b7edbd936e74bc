"""``--monitoring_config_file``: TF Serving's request metrics, served as Prometheus text.

Upstream (servables/tensorflow/util.cc) keeps, process-wide:

* ``/tensorflow/serving/request_count`` - a counter labelled ``model_name`` and ``status``
  (the status code's name, "OK", "INVALID_ARGUMENT", ...), incremented for every
  Predict/Classify/Regress over gRPC and every REST API call;
* ``/tensorflow/serving/request_latency`` - a histogram of wall time in microseconds,
  labelled ``model_name``, ``API`` ("Predict"/"Classify"/"Regress" over gRPC, the REST
  verb "predict"/"classify"/"regress" over REST) and ``entrypoint`` ("GRPC"/"REST"),
  recorded for successful requests only, in buckets ``Exponential(10, 1.8, 33)``.

util/prometheus_exporter.cc names them ``:tensorflow:serving:request_count`` and
``:tensorflow:serving:request_latency`` (every character outside ``[a-zA-Z0-9_]`` becomes
":") and writes ``# TYPE`` lines, ``_bucket{...,le="..."}`` cumulative counts, ``_sum`` and
``_count``. The page is served on the REST port at the configured path (default
``/monitoring/prometheus/metrics``) when ``prometheus_config { enable: true }``. Other
TensorFlow metrics upstream's page also lists are not kept here. Label values are escaped
as the text format requires (backslash, double quote, newline); a client names the model
of a failed request, so such values are cut to MAX_LABEL_CHARS and their series bounded
by MAX_SERIES.
"""

from __future__ import annotations

import bisect
import re
import threading
from dataclasses import dataclass

DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
REQUEST_COUNT = "/tensorflow/serving/request_count"
REQUEST_LATENCY = "/tensorflow/serving/request_latency"
# monitoring::Buckets::Exponential(10, 1.8, 33): 33 limits, then DBL_MAX ("+Inf").
LATENCY_BUCKET_LIMITS = tuple(10 * 1.8**i for i in range(33))
# Clients choose the model name of a failed request, so the page is bounded: label values
# are cut to MAX_LABEL_CHARS, and once MAX_SERIES label sets of one metric exist, failed
# requests under a new one are counted under OVERFLOW_MODEL instead. A successful request
# names a served model, so those always keep their own series.
MAX_LABEL_CHARS = 256
TRUNCATED = "..."
MAX_SERIES = 1000
OVERFLOW_MODEL = "__other__"


@dataclass(frozen=True)
class PrometheusSettings:
    """What the monitoring config asks for: the page on or off, and its path."""

    enable: bool = False
    path: str = DEFAULT_PROMETHEUS_PATH


def read_monitoring_config(path: str) -> PrometheusSettings:
    """Parses a text ``tensorflow.serving.MonitoringConfig`` file, as upstream's
    ``ParseProtoTextFile``; raises ServingStatusError (INVALID_ARGUMENT) on a bad file.
    """
    from google.protobuf import text_format

    from serving_opt.model_server.extra_protos import message_class
    from serving_opt.model_server.model_config import read_text_file
    from serving_opt.model_server.status import invalid_argument

    config = message_class("tensorflow.serving.MonitoringConfig")()
    try:
        text_format.Parse(read_text_file(path), config)
    except text_format.ParseError as e:
        raise invalid_argument(
            f"Error parsing text-format tensorflow.serving.MonitoringConfig: {e}; "
            f"Invalid protobuf file: '{path}'") from None
    prometheus = config.prometheus_config
    return PrometheusSettings(prometheus.enable, prometheus.path or DEFAULT_PROMETHEUS_PATH)


def prometheus_name(name: str) -> str:
    """``GetPrometheusMetricName``."""
    new = re.sub(r"[^a-zA-Z0-9_]", ":", name)
    return "_" + new if new[:1].isdigit() else new


def _label_value(value: str) -> str:
    # The text format's three escapes: an unescaped newline would end the sample line
    # and let a model name write lines of its own.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def bounded_label(value: str) -> str:
    """A label value cut to MAX_LABEL_CHARS (a client names the model: its name must not
    make every page that long)."""
    if len(value) <= MAX_LABEL_CHARS:
        return value
    return value[:MAX_LABEL_CHARS - len(TRUNCATED)] + TRUNCATED


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> list[str]:
    return [f'{n}="{_label_value(v)}"' for n, v in zip(names, values)]


def _number(value: float) -> str:
    # absl::StrCat(double): shortest of %.6g.
    return f"{value:.6g}"


class Metrics:
    """The process's request metrics (upstream's are process-wide too). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        # (model, api, entrypoint) -> [bucket counts (34), sum]
        self._latency: dict[tuple[str, str, str], list] = {}

    def record(self, model_name: str, api: str, entrypoint: str, status: str,
               latency_us: int) -> None:
        """One request: ``RecordModelRequestCount`` always, ``RecordRequestLatency``
        when it succeeded (``status`` "OK")."""
        model_name = bounded_label(model_name)
        with self._lock:
            key = (model_name, status)
            if key not in self._counts and status != "OK" and len(self._counts) >= MAX_SERIES:
                key = (OVERFLOW_MODEL, status)
            self._counts[key] = self._counts.get(key, 0) + 1
            if status != "OK":
                return
            cell = self._latency.setdefault(
                (model_name, api, entrypoint), [[0] * (len(LATENCY_BUCKET_LIMITS) + 1), 0.0])
            cell[0][bisect.bisect_right(LATENCY_BUCKET_LIMITS, latency_us)] += 1
            cell[1] += latency_us

    def prometheus_page(self) -> str:
        """The page ``PrometheusExporter::GeneratePage`` writes for these two metrics."""
        with self._lock:
            counts = dict(self._counts)
            latency = {k: ([*v[0]], v[1]) for k, v in self._latency.items()}
        lines = []
        if counts:
            name = prometheus_name(REQUEST_COUNT)
            lines.append(f"# TYPE {name} counter")
            for labels, value in counts.items():
                joined = ",".join(_labels(("model_name", "status"), labels))
                lines.append(f"{name}{{{joined}}} {value}")
        if latency:
            name = prometheus_name(REQUEST_LATENCY)
            lines.append(f"# TYPE {name} histogram")
            for labels, (buckets, total) in latency.items():
                label_list = _labels(("model_name", "API", "entrypoint"), labels)
                prefix = f"{name}_bucket{{{','.join(label_list)},"
                cumulative = 0
                for i, count in enumerate(buckets):
                    cumulative += count
                    limit = (_number(LATENCY_BUCKET_LIMITS[i])
                             if i < len(LATENCY_BUCKET_LIMITS) else "+Inf")
                    lines.append(f'{prefix}le="{limit}"}} {cumulative}')
                lines.append(f"{name}_sum{{{','.join(label_list)}}} {_number(total)}")
                lines.append(f"{name}_count{{{','.join(label_list)}}} {cumulative}")
        return "\n".join(lines) + "\n"


METRICS = Metrics()
