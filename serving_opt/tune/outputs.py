"""What a deployment uses, written into ``--output_dir``.

* ``batching_parameters.txt``: the text ``BatchingParameters`` TF Serving reads with
  ``--batching_parameters_file`` (only when batching is recommended);
* ``tensorflow_model_server.flags``: the server's command line with those settings;
* ``docker/Dockerfile`` and ``docker/compose.yaml``: this project's docker files with
  the settings in (the image's entrypoint passes extra arguments to the server), and
  ``docker/docker.env`` for ``docker/compose.tuned.yaml``, the override the project's
  ``docker/`` directory carries for any tuned output;
* ``models.config``: a ``--model_config_file`` ModelServerConfig serving the model, the
  other flags it needs in its header;
* ``docker.diff``: the change to the project's docker files (or, outside the checkout,
  to the copies this release ships), as a unified diff: the env and args added;

When the batching file was measured worse than upstream's defaults without the thread
flags next to it, ``batching_parameters.txt`` starts with a comment saying so and
naming them (the report says so in its first lines too).
* ``tune.json`` (the whole report), ``tune.txt`` (the table), and a chart: throughput
  against p99 of every proven setting, as measured; and the session's latency against
  batch size. PNG with matplotlib (``pip install matplotlib``), else the same as SVG.

Every file is written whole and renamed into place.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import tempfile

from serving_opt.errors import ServingOptError
from serving_opt.serving import backends
from serving_opt.tune.report import TuneReport, format_report
from serving_opt.tune.settings import PARAMETERS_FILENAME

FLAGS_FILENAME = "tensorflow_model_server.flags"
MODEL_CONFIG_FILENAME = "models.config"
CONTAINER_CONFIG = "/config"


def prepare(output_dir: str) -> None:
    """Creates ``output_dir`` and checks it is writable, before any work."""
    try:
        os.makedirs(output_dir, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=output_dir, prefix=".tune-probe-", delete=True)
        probe.close()
    except OSError as e:
        raise ServingOptError(f"cannot write into --output_dir={output_dir}: "
                              f"{e.strerror or e}", "pick a writable directory") from None


def _write(path: str, data: str | bytes) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tune-", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
    return path


def write(report: TuneReport, output_dir: str) -> dict[str, str]:
    """Writes every output; returns {what: path}."""
    prepare(output_dir)
    out: dict[str, str] = {}
    rec = report.recommendation
    if rec is not None:
        if rec.parameters_text:
            out["batching_parameters"] = _write(
                os.path.join(output_dir, PARAMETERS_FILENAME), parameters_file(report))
        out["flags"] = _write(os.path.join(output_dir, FLAGS_FILENAME), rec.command + "\n")
        out["model_config"] = _write(os.path.join(output_dir, MODEL_CONFIG_FILENAME),
                                     model_config(report))
        out.update(_docker(report, output_dir))
    out["chart"] = chart(report, output_dir)
    out["json"] = os.path.join(output_dir, "tune.json")
    out["table"] = os.path.join(output_dir, "tune.txt")
    final = _with_outputs(report, out)
    _write(out["json"], json.dumps(final.to_dict(), indent=2) + "\n")
    _write(out["table"], format_report(final) + "\n")
    return out


def parameters_file(report: TuneReport) -> str:
    """batching_parameters.txt: the recommended parameters; when they were measured worse
    than upstream's defaults without the thread flags, a header says which flags they
    need (text-proto comments: TF Serving reads the file as before).
    """
    rec = report.recommendation
    decision = report.decision
    alone = decision.alone_vs_upstream if decision is not None else None
    if decision is None or not decision.alone_worse or alone is None:
        return rec.parameters_text
    needed = " ".join(rec.settings.threads.flags())
    return (f"# NOT ON ITS OWN: measured {alone.describe()} upstream's batching defaults\n"
            f"# without {needed}. Serve it only with every flag of {FLAGS_FILENAME}\n"
            f"# (serving-opt tune, {report.model_name} version {report.version}).\n"
            + rec.parameters_text)


def model_config(report: TuneReport) -> str:
    """A ``--model_config_file`` ModelServerConfig serving the tuned model, with the rest
    of the recommended flags in a comment (batching and threads are server flags, not
    model config fields).
    """
    rec = report.recommendation
    rest = [f for f in rec.flags
            if not f.startswith(("--model_name=", "--model_base_path="))]
    return "\n".join([
        f"# serving-opt tune: {report.model_name} version {report.version}; use as",
        f"#   tensorflow_model_server --model_config_file=/config/{MODEL_CONFIG_FILENAME} \\",
        f"#     {' '.join(rest)}",
        "model_config_list {",
        "  config {",
        f"    name: '{report.model_name}'",
        f"    base_path: '/models/{report.model_name}'",
        "    model_platform: 'tensorflow'",
        "  }",
        "}",
    ]) + "\n"


def _with_outputs(report: TuneReport, out: dict) -> TuneReport:
    import dataclasses

    return dataclasses.replace(report, outputs=dict(out))


# -------------------------------------------------------------------------- docker


def project_docker_dir() -> str | None:
    """The project's ``docker/`` directory beside the package, when this is a checkout."""
    from serving_opt import sandbox

    path = os.path.join(sandbox.package_parent(), "docker")
    return path if os.path.isdir(path) else None


def _extra_flags(report: TuneReport) -> list[str]:
    return [f for f in report.recommendation.flags
            if f.startswith(("--enable_batching", "--batching_param", "--tensorflow_"))]


def _project_file(name: str) -> str | None:
    directory = project_docker_dir()
    path = os.path.join(directory, name) if directory else None
    if path and os.path.isfile(path):
        with open(path) as f:
            return f.read()
    return None


def dockerfile(report: TuneReport, parameters_source: str, base: str | None = None) -> str:
    """The project's Dockerfile (``base``) with the recommended settings added: the
    parameters file copied to /config and the flags as the image's CMD (its entrypoint
    passes them to tensorflow_model_server)."""
    rec = report.recommendation
    base = base if base is not None else (_project_file("Dockerfile") or _shipped(_DOCKERFILE))
    lines = base.rstrip("\n").split("\n")
    out = []
    for line in lines:
        if line.startswith("ARG MODEL="):
            line = f"ARG MODEL={report.model_name}"
        if line.startswith("ARG MODEL_BASE="):
            line = f"ARG MODEL_BASE=build/models/{report.model_name}"
        out.append(line)
        if line.startswith("ARG MODEL_BASE=") and rec.parameters_text:
            out.append(f"ARG BATCHING_PARAMETERS={parameters_source}")
        if line.startswith("COPY ${MODEL_BASE}") and rec.parameters_text:
            out.append(f"COPY ${{BATCHING_PARAMETERS}} {CONTAINER_CONFIG}/{PARAMETERS_FILENAME}")
    extra = _extra_flags(report)
    if extra:
        out += ["", "# What `serving-opt tune` proved for this model and load; the image's "
                "entrypoint", "# passes these to tensorflow_model_server.",
                "CMD [" + ", ".join(json.dumps(f) for f in extra) + "]"]
    return "\n".join(out) + "\n"


def compose(report: TuneReport, parameters_source: str, base: str | None = None) -> str:
    """The project's compose.yaml (``base``) with the parameters file mounted and the
    flags added to the server's command."""
    rec = report.recommendation
    base = base if base is not None else (_project_file("compose.yaml") or _shipped(_COMPOSE))
    lines = base.rstrip("\n").split("\n")
    out, in_command = [], False
    for line in lines:
        out.append(line)
        if ":/models/" in line and line.strip().startswith("- ") and rec.parameters_text:
            out.append(line[:len(line) - len(line.lstrip())]
                       + f"- {parameters_source}:{CONTAINER_CONFIG}/{PARAMETERS_FILENAME}:ro")
        if line.strip() == "command:":
            in_command = True
    indent = "      "
    if not in_command:
        out.append("    command:")
    out += [f"{indent}- {flag}" for flag in _extra_flags(report)]
    return "\n".join(out) + "\n"


def _shipped(template: str) -> str:
    tag = backends.DEFAULT_IMAGE.split(":", 1)[1]
    return (template.replace("tensorflow/serving:2.20.0", backends.DEFAULT_IMAGE)
            .replace("ARG TF_SERVING_TAG=2.20.0", f"ARG TF_SERVING_TAG={tag}"))


# The project's docker files as this release ships them (used when the package runs
# outside its checkout, where docker/ is not beside it).
_DOCKERFILE = """ARG TF_SERVING_IMAGE=tensorflow/serving
ARG TF_SERVING_TAG=2.20.0
FROM ${TF_SERVING_IMAGE}:${TF_SERVING_TAG}

ARG MODEL=classifier
ARG MODEL_BASE=build/models/classifier

# The image's entrypoint reads MODEL_NAME and MODEL_BASE_PATH (default /models).
ENV MODEL_NAME=${MODEL} \\
    MODEL_BASE_PATH=/models

COPY ${MODEL_BASE} /models/${MODEL}

# gRPC and REST, as in the base image.
EXPOSE 8500 8501
"""
_COMPOSE = """services:
  serving:
    image: tensorflow/serving:2.20.0
    ports:
      - "${GRPC_PORT:-8500}:8500"   # gRPC (PredictionService, ModelService)
      - "${REST_PORT:-8501}:8501"   # REST
    environment:
      MODEL_NAME: ${MODEL_NAME:-classifier}
    volumes:
      - ${MODEL_BASE:-../build/models/classifier}:/models/${MODEL_NAME:-classifier}:ro
    command:
      - --file_system_poll_wait_seconds=1
      - --enable_model_warmup=true
"""


def docker_env(report: TuneReport, output_dir: str) -> str:
    """Variables for the project's docker/compose.tuned.yaml override."""
    threads = report.recommendation.settings.threads
    return "\n".join([
        f"MODEL_NAME={report.model_name}",
        f"MODEL_BASE={report.model_base}",
        f"TUNE_DIR={os.path.abspath(output_dir)}",
        f"TF_INTRA_OP={threads.intra_op}",
        f"TF_INTER_OP={threads.inter_op}",
    ]) + "\n"


def _docker(report: TuneReport, output_dir: str) -> dict[str, str]:
    docker_out = os.path.join(output_dir, "docker")
    relative = os.path.relpath(os.path.join(output_dir, PARAMETERS_FILENAME))
    build_source = relative if not relative.startswith("..") else os.path.abspath(
        os.path.join(output_dir, PARAMETERS_FILENAME))
    out = {
        "dockerfile": _write(os.path.join(docker_out, "Dockerfile"),
                             dockerfile(report, build_source)),
        # compose resolves relative paths from the file's own directory.
        "docker_compose": _write(os.path.join(docker_out, "compose.yaml"),
                                 compose(report, f"../{PARAMETERS_FILENAME}")),
    }
    if report.recommendation.parameters_text:
        # For the project's docker/compose.tuned.yaml override (batching on).
        out["docker_env"] = _write(os.path.join(docker_out, "docker.env"),
                                   docker_env(report, output_dir))
    # The diff against the project's docker files, or against the shipped copies of them
    # when the package runs outside its checkout: the env and args a deployment adds.
    diffs = []
    for name, key in (("Dockerfile", "dockerfile"), ("compose.yaml", "docker_compose")):
        shipped = _shipped(_DOCKERFILE if name == "Dockerfile" else _COMPOSE)
        before = (_project_file(name) or shipped).splitlines(keepends=True)
        with open(out[key]) as f:
            after = f.read().splitlines(keepends=True)
        diffs += difflib.unified_diff(before, after, f"docker/{name}", f"docker/{name} (tuned)")
    if diffs:
        out["docker_diff"] = _write(os.path.join(output_dir, "docker.diff"), "".join(diffs))
    return out


# --------------------------------------------------------------------------- chart

_COLORS = {"TF Serving default (no batching)": "#d62728",
           "upstream batching defaults": "#ff7f0e",
           "upstream batching defaults, again": "#ffbb78",
           "your parameters file": "#9467bd"}
RECOMMENDED_COLOR = "#2ca02c"


def _color(label: str, recommended: str) -> str:
    if label == recommended:
        return RECOMMENDED_COLOR
    return _COLORS.get(label, "#17becf")


def _chart_data(report: TuneReport) -> dict:
    """What both renderers draw, from the report only."""
    primary = report.objective.workloads()[0]
    protocol = report.proven[0].protocol if report.proven else "grpc"
    recommended = report.recommended_label
    proven = [{"label": point.label, "color": _color(point.label, recommended),
               "measured": (point.measured.p99_ms, point.measured.rows_per_second)}
              for point in report.proven
              if (point.workload, point.protocol) == (primary, protocol)
              and math.isfinite(point.measured.p99_ms)]
    curves = [{"label": c.threads.describe(), "sizes": list(c.batch_sizes),
               "ms": [m * 1000 for m in c.median_s],
               "rows": [c.rows_per_second(n) for n in c.batch_sizes]}
              for c in report.profile.curves]
    title = (f"{report.model_name}: {report.objective.clients} clients" if primary == "closed"
             else f"{report.model_name}: {report.objective.rate:g} requests/s")
    return {"proven": proven, "curves": curves,
            "slo": report.objective.slo_p99_ms, "title": f"{title} ({protocol}, {primary} loop)"}


def chart(report: TuneReport, output_dir: str) -> str:
    """tune.png with matplotlib, else tune.svg; returns its path."""
    data = _chart_data(report)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _write(os.path.join(output_dir, "tune.svg"), _svg(data))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    for point in data["proven"]:
        mx, my = point["measured"]
        left.scatter([mx], [my], s=70, color=point["color"], label=point["label"], zorder=3)
    left.axvline(data["slo"], color="#d62728", lw=0.8, ls="--", label="p99 SLO")
    left.set_xlabel("p99 latency (ms)")
    left.set_ylabel("throughput (rows/s)")
    left.set_title(data["title"] + "\nmeasured")
    left.set_xscale("log")
    left.grid(alpha=0.3)
    # Below the plot: inside it hid measured points.
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    for curve in data["curves"]:
        right.plot(curve["sizes"], curve["ms"], marker="o", label=f"latency, {curve['label']}")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("batch size (rows)")
    right.set_ylabel("session run latency (ms)")
    twin = right.twinx()
    for curve in data["curves"]:
        twin.plot(curve["sizes"], curve["rows"], ls="--", marker=".",
                  label=f"rows/s, {curve['label']}")
    twin.set_ylabel("rows/s (dashed)")
    right.set_title("the session alone (profile)")
    right.grid(alpha=0.3)
    right.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = os.path.join(output_dir, "tune.png")
    fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".png", dir=output_dir)
    os.close(fd)
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _svg(data: dict) -> str:
    """The same two panels as plain SVG (no dependency)."""
    width, height, pad = 1200, 480, 60
    panel = (width - 3 * pad) / 2
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>']

    def axis(x0: float, xs: list[float], ys: list[float], xlabel: str, ylabel: str,
             title: str, logx: bool):
        xs = [x for x in xs if x > 0 and math.isfinite(x)] or [1.0]
        ys = [y for y in ys if math.isfinite(y)] or [1.0]
        fx = (lambda v: math.log10(v)) if logx else (lambda v: v)
        lo_x, hi_x = fx(min(xs)), fx(max(xs))
        if hi_x - lo_x < 1e-9:
            lo_x, hi_x = lo_x - 1, hi_x + 1
        lo_y, hi_y = 0.0, max(ys) * 1.1 or 1.0

        def sx(v: float) -> float:
            return x0 + (fx(max(v, 1e-9)) - lo_x) / (hi_x - lo_x) * panel

        def sy(v: float) -> float:
            return height - pad - (v - lo_y) / (hi_y - lo_y) * (height - 2 * pad)

        parts.append(f'<rect x="{x0}" y="{pad}" width="{panel}" height="{height - 2 * pad}" '
                     'fill="none" stroke="#999"/>')
        parts.append(f'<text x="{x0 + panel / 2}" y="{height - 20}" text-anchor="middle">'
                     f'{_esc(xlabel)}</text>')
        parts.append(f'<text x="{x0 - 45}" y="{height / 2}" transform="rotate(-90 {x0 - 45} '
                     f'{height / 2})" text-anchor="middle">{_esc(ylabel)}</text>')
        parts.append(f'<text x="{x0 + panel / 2}" y="{pad - 20}" text-anchor="middle" '
                     f'font-weight="bold">{_esc(title)}</text>')
        for i in range(5):
            v = lo_y + (hi_y - lo_y) * i / 4
            parts.append(f'<text x="{x0 - 5}" y="{sy(v) + 4}" text-anchor="end">{v:,.0f}</text>')
        for v in (min(xs), max(xs)):
            parts.append(f'<text x="{sx(v)}" y="{height - pad + 15}" text-anchor="middle">'
                         f'{v:,.3g}</text>')
        return sx, sy

    xs = [pt["measured"][0] for pt in data["proven"]] + [data["slo"]]
    ys = [pt["measured"][1] for pt in data["proven"]]
    sx, sy = axis(pad, xs, ys, "p99 latency (ms, log)", "throughput (rows/s)",
                  data["title"], True)
    parts.append(f'<line x1="{sx(data["slo"]):.1f}" y1="{pad}" x2="{sx(data["slo"]):.1f}" '
                 f'y2="{height - pad}" stroke="#d62728" stroke-dasharray="4"/>')
    for i, pt in enumerate(data["proven"]):
        mx, my = pt["measured"]
        parts.append(f'<circle cx="{sx(mx):.1f}" cy="{sy(my):.1f}" r="6" fill="{pt["color"]}"/>')
        parts.append(f'<text x="{pad + 10}" y="{pad + 15 + 14 * i}" fill="{pt["color"]}">'
                     f'{_esc(pt["label"])}</text>')
    sizes = [n for c in data["curves"] for n in c["sizes"]]
    ms = [m for c in data["curves"] for m in c["ms"]]
    sx2, sy2 = axis(2 * pad + panel, sizes, ms, "batch size (rows, log)",
                    "session run latency (ms)", "the session alone (profile)", True)
    palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
    for i, curve in enumerate(data["curves"]):
        color = palette[i % len(palette)]
        points = " ".join(f"{sx2(n):.1f},{sy2(m):.1f}" for n, m in zip(curve["sizes"], curve["ms"]))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}"/>')
        parts.append(f'<text x="{2 * pad + panel + 10}" y="{pad + 15 + 14 * i}" fill="{color}">'
                     f'{_esc(curve["label"])}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _esc(text: str) -> str:
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))
