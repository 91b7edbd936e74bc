"""What tune recommends is one deployable set, never worse than upstream's defaults, and
the hardware it holds for is named.

The decision (upstream's batching defaults against the measured best, interleaved
rounds, an interval over them) and the files are made by the real functions on a
report built from a synthetic profile (``tune_reports.synthetic_report``), with
the rounds' figures given; the model config is parsed by TF Serving's own proto, the
batching file by TF Serving's startup checks (the local server's reader).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from google.protobuf import text_format
from tune_reports import synthetic_report

from serving_opt.model_server.batching import parse_batching_parameters
from serving_opt.tune import decide, hardware, outputs, tuner
from serving_opt.tune.options import SearchOptions, WorkloadOptions
from serving_opt.tune.report import UPSTREAM_LABEL, format_report, headline
from serving_opt.tune.settings import BatchingSettings, ServingSettings, ThreadSettings, cores

AVX2_CPU = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2
"""
AVX512_CPU = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16
"""


def test_the_hardware_names_the_cpu_its_vector_extensions_kernels_and_cores(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(AVX2_CPU)
    amd = hardware.here("Eigen", (("TF_ENABLE_ONEDNN_OPTS", "0"),), cpuinfo=str(path))
    assert amd.cpu_model == "AMD EPYC 7B13"
    assert amd.extensions == ("SSE4.2", "AVX", "AVX2", "FMA", "F16C") and not amd.avx512
    assert amd.cores == cores()
    line = amd.describe()
    assert "AMD EPYC 7B13" in line and "AVX2 FMA (no AVX-512)" in line
    assert "Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0)" in line
    assert "holds for this hardware only" in amd.warning()

    path.write_text(AVX512_CPU)
    xeon = hardware.here("oneDNN", (("TF_ENABLE_ONEDNN_OPTS", None),), cpuinfo=str(path))
    assert xeon.avx512 and "AVX-512-VNNI" in xeon.describe()
    assert "no AVX-512" not in xeon.describe()
    assert "oneDNN kernels (TF_ENABLE_ONEDNN_OPTS unset)" in xeon.describe()


def test_this_machine_is_described_from_its_own_cpuinfo():
    here = hardware.here("Eigen")
    assert here.cpu_model and here.cores >= 1 and here.cpus >= here.cores
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            assert ("avx2" in f.read()) == ("AVX2" in here.extensions)


@pytest.mark.parametrize("tuned, upstream, wins", [
    ([130, 128, 133], [100, 101, 99], True),      # clear: the interval is above 1
    ([112, 91, 104], [100, 100, 100], False),     # within the noise: the interval holds 1
    ([200], [100], False),                        # one round is one number: no claim
    ([90, 92, 91], [100, 100, 100], False),       # worse
])
def test_tuning_wins_only_when_the_interval_over_the_rounds_is_above_one(tuned, upstream,
                                                                         wins):
    interval = decide.ratio_interval(tuned, upstream)
    assert (interval.low > 1.0) == wins
    assert interval.low <= interval.mean <= interval.high
    made = decide.Decision("closed", "grpc", UPSTREAM_LABEL, "tuned", None,
                           {UPSTREAM_LABEL: tuple(upstream), "tuned": tuple(tuned)},
                           {UPSTREAM_LABEL: (10.0,) * len(upstream),
                            "tuned": (10.0,) * len(tuned)})
    assert made.tuned_wins == wins


def test_rounds_alternate_so_that_drift_costs_each_alike():
    assert [decide.order(i, ["u", "t", "a"]) for i in range(3)] == [
        ["u", "t", "a"], ["a", "t", "u"], ["u", "t", "a"]]


def _decision(report, tuned_rows, upstream_rows, alone_rows=None):
    label = report.recommended_label
    rows = {UPSTREAM_LABEL: tuple(upstream_rows), label: tuple(tuned_rows)}
    alone = None
    if alone_rows is not None:
        alone = tuner.ALONE_LABEL
        rows[alone] = tuple(alone_rows)
    return decide.Decision("closed", "grpc", UPSTREAM_LABEL, label, alone, rows,
                           {k: (50.0,) * len(v) for k, v in rows.items()})


def _decided(report, decision):
    rec = tuner.final_recommendation(report.recommendation, decision, list(report.proven),
                                     report.objective, report.model_name)
    return dataclasses.replace(report, recommendation=rec, decision=decision)


def test_nothing_better_than_upstream_within_the_noise_recommends_upstream(tmp_path):
    report = synthetic_report()
    assert report.recommendation.settings != tuner.upstream_batching()
    decided = _decided(report, _decision(report, [105, 96, 103], [100, 100, 100]))
    rec = decided.recommendation
    assert rec.settings == tuner.upstream_batching()
    assert rec.basis.startswith("upstream's batching defaults: tuning found nothing better "
                                "on this hardware")
    first = format_report(decided).splitlines()[1]
    assert first.startswith("  VERDICT: tuning found nothing better than upstream's")
    out = outputs.write(decided, str(tmp_path))
    values = parse_batching_parameters(open(out["batching_parameters"]).read())
    # Upstream's defaults, num_batch_threads left to the server (a core each, wherever).
    assert values["max_batch_size"] == 1000 and values["batch_timeout_micros"] == 0
    assert "num_batch_threads" not in values
    assert "--enable_batching=true" in open(out["flags"]).read()
    data = json.loads(open(out["json"]).read())
    assert data["decision"]["tuned_wins"] is False
    assert data["headline"][0].startswith("VERDICT: tuning found nothing better")


def test_a_tuned_setting_that_beats_upstream_beyond_the_noise_is_kept(tmp_path):
    report = synthetic_report()
    decided = _decided(report, _decision(report, [140, 135, 142], [100, 102, 99]))
    assert decided.recommendation.settings == report.recommendation.settings
    assert "interleaved rounds) upstream's batching defaults" in decided.recommendation.basis
    assert headline(decided)[0].startswith(f"VERDICT: {report.recommended_label} beats")


def _with_threads(report, threads: ThreadSettings):
    """The report's recommendation as if it needed thread flags."""
    settings = ServingSettings(report.recommendation.settings.batching, threads)
    points = tuple(dataclasses.replace(p, settings=settings)
                   if p.settings == report.recommendation.settings else p
                   for p in report.proven)
    rec = dataclasses.replace(report.recommendation, settings=settings,
                              flags=settings.flags("/models/mnv2", "mnv2",
                                                   tuner.CONTAINER_PARAMETERS))
    return dataclasses.replace(report, proven=points, recommendation=rec)


def test_a_batching_file_worse_alone_says_so_first_and_in_the_file(tmp_path):
    report = _with_threads(synthetic_report(), ThreadSettings(1, 0))
    decided = _decided(report, _decision(report, [224, 220, 230], [150, 148, 152],
                                         alone_rows=[95, 92, 97]))
    assert decided.recommendation.settings.threads == ThreadSettings(1, 0)
    lines = format_report(decided).splitlines()
    assert lines[1].startswith("  VERDICT:") and lines[2].startswith("  WARNING: the batching "
                                                                     "file alone (without "
                                                                     "--tensorflow_intra_op")
    out = outputs.write(decided, str(tmp_path))
    text = open(out["batching_parameters"]).read()
    assert text.startswith("# NOT ON ITS OWN: measured x0.")
    assert "--tensorflow_intra_op_parallelism=1" in text.splitlines()[1]
    values = parse_batching_parameters(text)  # TF Serving reads it as before
    assert values["max_batch_size"] == decided.recommendation.settings.batching.max_batch_size
    assert "--tensorflow_intra_op_parallelism=1" in open(out["flags"]).read()


def test_a_batching_file_as_good_alone_is_written_plain(tmp_path):
    report = _with_threads(synthetic_report(), ThreadSettings(1, 0))
    decided = _decided(report, _decision(report, [224, 220, 230], [150, 148, 152],
                                         alone_rows=[180, 175, 182]))
    out = outputs.write(decided, str(tmp_path))
    assert open(out["batching_parameters"]).read() == decided.recommendation.parameters_text
    assert not any(line.startswith("WARNING") for line in headline(decided))


def test_the_whole_set_is_written_and_the_model_config_is_one_tf_serving_reads(tmp_path):
    from tensorflow_serving.config import model_server_config_pb2

    report = _with_threads(synthetic_report(), ThreadSettings(1, 0))
    out = outputs.write(report, str(tmp_path))
    for key in ("batching_parameters", "flags", "model_config", "docker_diff", "docker_env"):
        assert os.path.getsize(out[key]) > 0, key
    config = text_format.Parse(open(out["model_config"]).read(),
                               model_server_config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == (
        "mnv2", "/models/mnv2", "tensorflow")
    header = open(out["model_config"]).read().splitlines()[:3]
    assert "--model_config_file=/config/models.config" in header[1]
    assert "--tensorflow_intra_op_parallelism=1" in header[2]
    assert "--batching_parameters_file=/config/batching_parameters.txt" in header[2]
    flags_line = open(out["flags"]).read()
    assert "--tensorflow_intra_op_parallelism=1" in flags_line
    diff = open(out["docker_diff"]).read()
    assert "+      - --tensorflow_intra_op_parallelism=1" in diff


def test_a_load_generator_over_a_tenth_of_the_cores_is_flagged():
    report = synthetic_report()
    decision = dataclasses.replace(_decision(report, [140, 135, 142], [100, 102, 99]),
                                   generator_cpu_share=0.23)
    decided = _decided(report, decision)
    assert any("load generator took 23% of the cores" in line for line in headline(decided))
    calm = _decided(report, dataclasses.replace(decision, generator_cpu_share=0.05))
    assert not any("load generator" in line for line in headline(calm))


def test_upstreams_parameters_file_is_upstreams_defaults():
    text = tuner.upstream_parameters_text()
    values = parse_batching_parameters(text)
    defaults = BatchingSettings()
    assert values["max_batch_size"] == defaults.max_batch_size
    assert values["max_enqueued_batches"] == defaults.max_enqueued_batches
    assert "num_batch_threads" not in values


def test_a_deployment_sets_flags_are_taken_as_written_but_ports_and_model_path():
    from serving_opt.tune import prove

    written = ServingSettings(BatchingSettings(max_batch_size=8, num_batch_threads=1),
                              ThreadSettings(1, 2)).flags("/models/m", "m",
                                                          tuner.CONTAINER_PARAMETERS)
    flags = prove.Deployed("max_batch_size { value: 8 }\n", written).server_flags("/tmp/b")
    assert flags == ["--tensorflow_intra_op_parallelism=1",
                     "--tensorflow_inter_op_parallelism=2", "--enable_batching=true",
                     "--batching_parameters_file=/tmp/b"]
    with pytest.raises(ValueError, match="no text"):
        prove.Deployed("", written).server_flags(None)


def test_the_proof_server_runs_the_written_deployment_set_exactly(convnet_base):
    # A real `serving-opt serve` subprocess, started from the set's text and flags: it
    # loads the model with them (a file or flag it refused would fail the start).
    from serving_opt.serving import backends
    from serving_opt.tune import prove

    settings = ServingSettings(BatchingSettings(max_batch_size=4, num_batch_threads=1),
                               ThreadSettings(1, 0))
    text = "# NOT ON ITS OWN: a header comment, as written\n" + \
        settings.batching.text_proto()
    deployed = prove.Deployed(text, settings.flags("/models/convnet", "convnet",
                                                   tuner.CONTAINER_PARAMETERS))
    spec = backends.ServerSpec("convnet", convnet_base, version=1, rest_api=False)
    with prove.running("local", spec, settings, load_deadline=120.0,
                       deployed=deployed) as server:
        command = list(server.command)
        path = next(f.split("=", 1)[1] for f in command
                    if f.startswith("--batching_parameters_file="))
        with open(path) as f:
            assert f.read() == text
        assert "--tensorflow_intra_op_parallelism=1" in command
        assert "--enable_batching=true" in command
        assert "--port=8500" not in command and "--model_base_path=/models/convnet" \
            not in command


def test_upstream_measured_best_is_written_without_this_machines_thread_count():
    report = synthetic_report()
    upstream = tuner.upstream_batching()
    rec = dataclasses.replace(report.recommendation, settings=upstream,
                              parameters_text=upstream.batching.text_proto())
    final = tuner.final_recommendation(rec, None, list(report.proven), report.objective,
                                       report.model_name)
    assert final.parameters_text == tuner.upstream_parameters_text()
    assert "num_batch_threads" not in parse_batching_parameters(final.parameters_text)


def test_tensorflows_default_threads_are_always_profiled():
    # TF Serving's default and upstream's defaults run with them: asked only for intra 1,
    # their curve is still measured and shown.
    from serving_opt.tune.options import TuneOptions

    threads = tuner.plan(TuneOptions(workload=WorkloadOptions(clients=4),
                                     search=SearchOptions(intra_op=(1,))), 2).thread_settings
    assert threads == (ThreadSettings(0, 0), ThreadSettings(1, 0))
    assert tuner.plan(TuneOptions(workload=WorkloadOptions(clients=4),
                                  search=SearchOptions(intra_op=(0, 1))), 2).thread_settings == (
        ThreadSettings(0, 0), ThreadSettings(1, 0))
