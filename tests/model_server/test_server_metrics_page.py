"""The Prometheus page of the local server under client-chosen model names: every label
value is escaped as the text format requires (no name can write a sample line of its
own), and neither long nor many unique names grow the page without bound."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import re  # noqa: E402
import urllib.error  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

from local_server import running  # noqa: E402

from serving_opt.model_server import monitoring  # noqa: E402
from serving_opt.model_server.monitoring import Metrics  # noqa: E402

# The text format, strictly: a TYPE line, or name{label="value",...} number. A label value
# is any text whose backslash, double quote and newline are escaped.
_VALUE = r'(?:[^"\\\n]|\\[\\"n])*'
_LABEL = rf'[a-zA-Z_][a-zA-Z0-9_]*="{_VALUE}"'
_SAMPLE = re.compile(
    rf"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)\}} "
    r"(?P<value>[0-9.e+-]+|\+Inf)"
)
_TYPE = re.compile(r"# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (?:counter|histogram)")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

# A model name that writes a sample line of its own if newlines pass through (the rest of
# its line becomes a comment), with a quote and a backslash that must come back as sent.
FORGING = 'q"uote\\\nforged_total 999\n# '


def parse_page(page: str) -> list[tuple[str, dict[str, str], str]]:
    """(metric, labels, value) of every sample; fails on any line the format does not allow."""
    assert page.endswith("\n")
    samples = []
    for line in page[:-1].split("\n"):
        if _TYPE.fullmatch(line):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match, f"not a Prometheus text line: {line[:200]!r}"
        labels = {
            key: re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)
            for key, value in re.findall(rf'([a-zA-Z_][a-zA-Z0-9_]*)="({_VALUE})"',
                                         match.group("labels"))
        }
        samples.append((match.group("name"), labels, match.group("value")))
    return samples


def model_names(samples) -> set[str]:
    return {labels["model_name"] for _, labels, _ in samples}


def test_a_model_name_with_a_newline_and_quotes_forges_no_sample():
    metrics = Metrics()
    metrics.record(FORGING, "predict", "REST", "NOT_FOUND", 10)
    metrics.record("m", "predict", "REST", "OK", 10)
    samples = parse_page(metrics.prometheus_page())
    assert model_names(samples) == {FORGING, "m"}  # the name comes back exactly
    assert len([s for s in samples if s[0].endswith("request_count")]) == 2
    # Control: written with only the old escapes, the same name is a second sample.
    naive = metrics.prometheus_page().replace("\\n", "\n")
    assert "forged_total 999" in naive.split("\n")


def test_long_and_many_unique_model_names_do_not_grow_the_page():
    metrics = Metrics()
    metrics.record("served", "Predict", "GRPC", "OK", 10)
    long_name = "n" * (4 << 20)
    metrics.record(long_name, "Predict", "GRPC", "NOT_FOUND", 10)
    samples = parse_page(metrics.prometheus_page())
    assert max(len(n) for n in model_names(samples)) == monitoring.MAX_LABEL_CHARS
    for i in range(monitoring.MAX_SERIES - 2):  # with the two above: the bound
        metrics.record(f"{i:04d}" + "y" * 1000, "Predict", "GRPC", "NOT_FOUND", 10)
    at_bound = metrics.prometheus_page()
    for i in range(3 * monitoring.MAX_SERIES):
        metrics.record(f"z{i}" + "y" * 1000, "Predict", "GRPC", "NOT_FOUND", 10)
    page = metrics.prometheus_page()
    samples = parse_page(page)
    # Control: the first names filled the page to its bound; the later ones added nothing
    # but one overflow series, and a served model's success is still counted on its own.
    assert len(at_bound) > monitoring.MAX_SERIES * monitoring.MAX_LABEL_CHARS
    assert len(page) < len(at_bound) + 200
    counts = {labels["model_name"]: value for name, labels, value in samples
              if name.endswith("request_count")}
    assert counts[monitoring.OVERFLOW_MODEL] == str(3 * monitoring.MAX_SERIES)
    metrics.record("served", "Predict", "GRPC", "OK", 10)
    assert ('{model_name="served",status="OK"} 2' in metrics.prometheus_page())


def test_the_served_page_escapes_a_model_name_from_a_rest_path(tmp_path, classifier_base):
    config = tmp_path / "monitoring.config"
    config.write_text("prometheus_config { enable: true }")
    with running(model_name="clf", model_base_path=classifier_base, port=0, rest_api_port=-1,
                 monitoring_config_file=str(config), max_num_load_retries=0) as server:
        base = f"http://127.0.0.1:{server.rest_port}"
        name = urllib.parse.quote(FORGING, safe="")
        request = urllib.request.Request(f"{base}/v1/models/{name}:predict",
                                          data=b'{"instances": [1]}', method="POST")
        try:
            urllib.request.urlopen(request, timeout=60)
            raise AssertionError("an unknown model answered")
        except urllib.error.HTTPError as e:
            assert e.code == 404
        with urllib.request.urlopen(f"{base}/monitoring/prometheus/metrics", timeout=60) as r:
            samples = parse_page(r.read().decode())
    assert FORGING in model_names(samples)
    assert not any(name.startswith("forged") for name, _, _ in samples)
