"""Loading like TF Serving: version directories, failed loads, warmup, labels, reloads.

Each test serves its own copy of a model base (``model_copy``) with fast polling and no
load retries, changes the directory the way a user would, and watches GetModelStatus.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib  # noqa: E402
import shutil  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from local_server import running  # noqa: E402
from saved_model_io import save_tf1  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
)

from serving_opt.model_server import ServerOptions, ServerStartError, serve  # noqa: E402
from serving_opt.model_server.model_config import single_model_config  # noqa: E402

State = get_model_status_pb2.ModelVersionStatus.State
FAST = {"port": 0, "file_system_poll_wait_seconds": 0.1, "max_num_load_retries": 0}


def build_counter(export_dir: str) -> str:
    """Predict returns ``y = 2x`` and how many times the model has run (a variable)."""
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None], name="x")
        counter = v1.get_variable(
            "runs", [], tf.int64, initializer=v1.zeros_initializer(), use_resource=True
        )
        with tf.control_dependencies([counter.assign_add(1, read_value=False)]):
            runs = tf.identity(counter.read_value(), name="runs")
        signature = v1.saved_model.signature_def_utils.predict_signature_def(
            {"x": x}, {"y": tf.identity(x * 2.0, name="y"), "runs": runs}
        )
        return save_tf1(graph, export_dir, {"serving_default": signature})


@pytest.fixture(scope="module")
def counter_base(tmp_path_factory) -> str:
    base = str(tmp_path_factory.mktemp("counter"))
    build_counter(os.path.join(base, "1"))
    return base


def add_version_atomically(base: str, source: str, version: int) -> str:
    """How versions must appear under a served base: complete, by rename."""
    staging = os.path.join(base, f".staging-{version}")
    shutil.copytree(source, staging)
    target = os.path.join(base, str(version))
    os.rename(staging, target)
    return target


def write_warmup(version_dir: str, records: list[bytes]) -> None:
    extra = os.path.join(version_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(extra, "tf_serving_warmup_requests")) as writer:
        for record in records:
            writer.write(record)


def predict_log(signature: str = "", **inputs) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    log = prediction_log_pb2.PredictionLog()
    log.predict_log.request.CopyFrom(request)
    return log.SerializeToString()


def counter_request(model: str = "m", **spec) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0], np.float32)))
    return request


class Client:
    def __init__(self, server) -> None:
        self.channel = grpc.insecure_channel(server.address)
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)

    def status(self, model: str = "m") -> dict[int, tuple[int, int, str]]:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        response = self.models.GetModelStatus(request, timeout=30)
        return {
            s.version: (s.state, s.status.error_code, s.status.error_message)
            for s in response.model_version_status
        }

    def wait_for(self, predicate, timeout: float = 60.0, model: str = "m"):
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.status(model)
                if predicate(status):
                    return status
            except grpc.RpcError:
                status = None
            if time.monotonic() > deadline:
                raise AssertionError(f"GetModelStatus never satisfied the test: {status}")
            time.sleep(0.05)


@pytest.fixture
def serving():
    """serving(**options) starts a server; every one started is stopped after the test."""
    with contextlib.ExitStack() as started:

        def start(**options):
            server = started.enter_context(running(**{**FAST, **options}))
            return server, Client(server)

        yield start


def test_a_new_version_directory_is_loaded_and_replaces_the_old(
    serving, model_copy, counter_base
):
    base = model_copy(counter_base)
    server, client = serving(model_name="m", model_base_path=base)

    add_version_atomically(base, os.path.join(base, "1"), 2)
    status = client.wait_for(lambda s: s.get(1, (0,))[0] == State.END)

    assert status[2][0] == State.AVAILABLE
    assert status[1] == (State.END, 0, "")
    reply = client.predictions.Predict(counter_request(), timeout=30)
    assert reply.model_spec.version.value == 2


def test_an_unloaded_version_is_not_found_when_asked_for_specifically(
    serving, model_copy, counter_base
):
    base = model_copy(counter_base)
    server, client = serving(model_name="m", model_base_path=base)
    add_version_atomically(base, os.path.join(base, "1"), 2)
    client.wait_for(lambda s: s.get(1, (0,))[0] == State.END)

    with pytest.raises(grpc.RpcError) as info:
        client.predictions.Predict(counter_request(version=1), timeout=30)

    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Servable not found for request: Specific(m, 1)"


def test_a_broken_new_version_ends_with_its_error_and_the_old_one_keeps_serving(
    serving, model_copy, counter_base
):
    base = model_copy(counter_base)
    server, client = serving(model_name="m", model_base_path=base)
    broken = os.path.join(base, ".staging")
    shutil.copytree(os.path.join(base, "1"), broken)
    with open(os.path.join(broken, "saved_model.pb"), "wb") as f:
        f.write(b"\x0fnot a SavedModel at all")
    os.rename(broken, os.path.join(base, "2"))

    status = client.wait_for(lambda s: s.get(2, (0,))[0] == State.END)

    state, code, message = status[2]
    assert code == grpc.StatusCode.DATA_LOSS.value[0]
    assert message == f"Can't parse {base}/2/saved_model.pb as binary proto"
    assert status[1][0] == State.AVAILABLE
    reply = client.predictions.Predict(counter_request(), timeout=30)
    assert reply.model_spec.version.value == 1


def test_a_new_version_linked_to_dev_zero_ends_with_its_error_and_the_old_one_serves(
    serving, model_copy, counter_base
):
    # The warmup file as a link to /dev/zero: read until std::bad_alloc aborts the server
    # unless the version's files are checked as optimize checks them.
    base = model_copy(counter_base)
    server, client = serving(model_name="m", model_base_path=base)
    staging = os.path.join(base, ".staging")
    shutil.copytree(os.path.join(base, "1"), staging)
    os.makedirs(os.path.join(staging, "assets.extra"), exist_ok=True)
    os.symlink("/dev/zero", os.path.join(staging, "assets.extra", "tf_serving_warmup_requests"))
    os.rename(staging, os.path.join(base, "2"))

    status = client.wait_for(lambda s: s.get(2, (0,))[0] == State.END)

    state, code, message = status[2]
    assert code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "tf_serving_warmup_requests is a symlink" in message and "/dev/zero" in message
    assert status[1][0] == State.AVAILABLE
    reply = client.predictions.Predict(counter_request(), timeout=30)
    assert reply.model_spec.version.value == 1


def test_a_model_that_does_not_load_fails_the_start(model_copy, counter_base):
    base = model_copy(counter_base)
    os.remove(os.path.join(base, "1", "saved_model.pb"))

    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=base, **FAST))

    assert str(info.value).startswith(
        "Failed to start server. Error: UNKNOWN: 1 model(s) did not become available: "
        "{{{name: m version: 1} due to error: NOT_FOUND: Specified file path does not "
        "appear to contain a SavedModel bundle (should have a file called `saved_model.pb`)\n"
        f"Specified file path: {base}/1"
    )


def test_a_failed_load_is_retried_before_giving_up(model_copy, counter_base, caplog):
    base = model_copy(counter_base)
    good = os.path.join(base, "good")
    os.rename(os.path.join(base, "1"), good)
    os.makedirs(os.path.join(base, "1"))  # empty version directory: the load fails

    def restore_after_first_failure():
        time.sleep(0.5)
        os.rmdir(os.path.join(base, "1"))
        os.rename(good, os.path.join(base, "1"))

    fixer = threading.Thread(target=restore_after_first_failure)
    fixer.start()
    caplog.set_level("INFO", logger="serving_opt.model_server")
    try:
        server = serve(
            ServerOptions(
                model_name="m",
                model_base_path=base,
                port=0,
                file_system_poll_wait_seconds=0.1,
                max_num_load_retries=5,
                load_retry_interval_micros=300_000,
            )
        )
    finally:
        fixer.join()

    try:
        assert server.available_versions() == {"m": [1]}
    finally:
        server.stop()
    # It really failed first (the empty directory) and was loaded by a retry.
    messages = [r.getMessage() for r in caplog.records if r.name == "serving_opt.model_server"]
    failed = [i for i, m in enumerate(messages)
              if m.startswith("Loading servable: {name: m version: 1} failed:")]
    retried = [i for i, m in enumerate(messages)
               if m.startswith("Retrying of Loading servable: {name: m version: 1} retry:")]
    loaded = [i for i, m in enumerate(messages)
              if m == "Successfully loaded servable version {name: m version: 1}"]
    assert failed and retried and loaded, messages
    assert failed[0] < retried[0] < loaded[-1]


def test_warmup_requests_are_replayed_at_load(serving, model_copy, counter_base):
    base = model_copy(counter_base)
    write_warmup(os.path.join(base, "1"), [predict_log(x=np.ones(2, np.float32))] * 3)
    server, client = serving(model_name="m", model_base_path=base)

    reply = client.predictions.Predict(counter_request(), timeout=30)

    assert list(reply.outputs["runs"].int64_val) == [4]  # three warmup runs came first


def test_warmup_is_skipped_when_disabled(serving, model_copy, counter_base):
    base = model_copy(counter_base)
    write_warmup(os.path.join(base, "1"), [predict_log(x=np.ones(2, np.float32))] * 3)
    server, client = serving(model_name="m", model_base_path=base, enable_model_warmup=False)

    reply = client.predictions.Predict(counter_request(), timeout=30)

    assert list(reply.outputs["runs"].int64_val) == [1]


def test_a_failing_warmup_request_fails_the_load(model_copy, counter_base):
    base = model_copy(counter_base)
    write_warmup(os.path.join(base, "1"), [predict_log("nope", x=np.ones(2, np.float32))])

    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=base, **FAST))

    assert 'FAILED_PRECONDITION: Serving signature key "nope" not found.' in str(info.value)


def test_a_warmup_file_that_is_not_a_tfrecord_fails_the_load(model_copy, counter_base):
    base = model_copy(counter_base)
    os.makedirs(os.path.join(base, "1", "assets.extra"))
    with open(os.path.join(base, "1", "assets.extra", "tf_serving_warmup_requests"), "wb") as f:
        f.write(b"this is not a TFRecord file, just some bytes")

    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=base, **FAST))

    assert "DATA_LOSS" in str(info.value)
    assert "Please verify your warmup data is in TFRecord format." in str(info.value)


def test_more_than_1000_warmup_records_fail_the_load(model_copy, counter_base):
    base = model_copy(counter_base)
    write_warmup(os.path.join(base, "1"), [b""] * 1001)  # empty logs: nothing to run

    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_name="m", model_base_path=base, **FAST))

    assert "Number of warmup records exceeds the maximum (1000)" in str(info.value)


def labelled_config(tmp_path, base: str, labels: dict[str, int]) -> str:
    entries = "".join(f"version_labels {{ key: '{k}' value: {v} }} " for k, v in labels.items())
    path = tmp_path / "models.config"
    path.write_text(
        f"model_config_list {{ config {{ name: 'm' base_path: '{base}' "
        f"model_platform: 'tensorflow' model_version_policy {{ all {{}} }} {entries} }} }}"
    )
    return str(path)


def test_version_labels_resolve_to_their_version(serving, model_copy, counter_base, tmp_path):
    base = model_copy(counter_base)
    add_version_atomically(base, os.path.join(base, "1"), 2)
    config = labelled_config(tmp_path, base, {"stable": 1, "canary": 2})
    server, client = serving(
        model_config_file=config, allow_version_labels_for_unavailable_models=True
    )
    # Start-up only waits for one version per model (the real server does the same).
    client.wait_for(lambda s: all(s.get(v, (0,))[0] == State.AVAILABLE for v in (1, 2)))

    stable = client.predictions.Predict(counter_request(version_label="stable"), timeout=30)
    canary = client.predictions.Predict(counter_request(version_label="canary"), timeout=30)

    assert (stable.model_spec.version.value, canary.model_spec.version.value) == (1, 2)
    assert not stable.model_spec.version_label  # labels are never echoed


def test_an_unknown_version_label_is_invalid_argument(
    serving, model_copy, counter_base, tmp_path
):
    base = model_copy(counter_base)
    config = labelled_config(tmp_path, base, {"stable": 1})
    server, client = serving(
        model_config_file=config, allow_version_labels_for_unavailable_models=True
    )

    with pytest.raises(grpc.RpcError) as info:
        client.predictions.Predict(counter_request(version_label="canary"), timeout=30)

    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "Unrecognized servable version label: canary"


def test_labels_for_versions_not_yet_loaded_fail_the_start_by_default(
    model_copy, counter_base, tmp_path
):
    base = model_copy(counter_base)
    config = labelled_config(tmp_path, base, {"stable": 1})

    with pytest.raises(ServerStartError) as info:
        serve(ServerOptions(model_config_file=config, **FAST))

    assert str(info.value) == (
        "Failed to start server. Error: FAILED_PRECONDITION: Request to assign label to "
        "version 1 of model m, which is not currently available for inference"
    )


def test_reload_config_adds_a_model_and_may_label_loaded_versions(
    serving, model_copy, counter_base
):
    base = model_copy(counter_base)
    other = model_copy(counter_base, "other")
    server, client = serving(model_name="m", model_base_path=base)
    request = model_management_pb2.ReloadConfigRequest()
    request.config.CopyFrom(single_model_config("m", base))
    request.config.model_config_list.config[0].version_labels["stable"] = 1
    added = request.config.model_config_list.config.add()
    added.CopyFrom(single_model_config("n", other).model_config_list.config[0])

    reply = client.models.HandleReloadConfigRequest(request, timeout=60)

    assert reply.status.error_code == 0
    assert client.status("n") == {1: (State.AVAILABLE, 0, "")}
    labelled = client.predictions.Predict(counter_request(version_label="stable"), timeout=30)
    assert labelled.model_spec.version.value == 1


def test_reload_config_without_a_model_unloads_it(serving, model_copy, counter_base):
    base = model_copy(counter_base)
    other = model_copy(counter_base, "other")
    server, client = serving(model_name="m", model_base_path=base)
    request = model_management_pb2.ReloadConfigRequest()
    request.config.CopyFrom(single_model_config("n", other))

    client.models.HandleReloadConfigRequest(request, timeout=60)

    status = client.wait_for(lambda s: s[1][0] == State.END)
    assert status == {1: (State.END, 0, "")}
    assert client.status("n")[1][0] == State.AVAILABLE


# ------------------------------------- issue 18: version names and hostile saved_model.pb


def test_version_directory_names_parse_like_safe_strto64():
    # tensorflow_serving's ParseVersionNumber is strings::safe_strto64: C isspace around,
    # an optional '-' (no '+'), ASCII digits, within int64.
    from serving_opt.model_server import storage_path

    assert storage_path.parse_version("02") == 2
    assert storage_path.parse_version(" 7\t") == 7
    assert storage_path.parse_version("-3") == -3
    for name in ("+3", "٣", "²", "0x10", "1_0", "", " ", "-", str(2**63)):
        assert storage_path.parse_version(name) is None, name


def test_02_and_2_are_one_version_served_from_2_with_a_warning(tmp_path, caplog):
    from tensorflow_serving.config import model_server_config_pb2

    from serving_opt.model_server import storage_path

    base = tmp_path / "m"
    for name in ("1", "02", "2"):
        (base / name).mkdir(parents=True)
    policy = model_server_config_pb2.ModelConfig().model_version_policy
    with caplog.at_level("WARNING", logger="serving_opt.model_server"):
        aspired = storage_path.aspired_versions("m", str(base), policy)
    # Upstream indexes the sorted names by version; the last one ("2" > "02") wins.
    assert aspired == [storage_path.AspiredVersion(2, str(base / "2"))]
    assert "Version 2 will be loaded from 2, 02 will be ignored" in caplog.text


def _fails_fast(call, seconds: int = 30):
    """Runs ``call`` with an alarm: a blocking open() of a FIFO is interrupted, not hung."""
    import signal

    def alarm(signum, frame):
        raise TimeoutError(f"hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        with pytest.raises(Exception) as info:
            call()
        return info.value
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_saved_model_pb_that_is_not_a_regular_file_fails_the_load(counter_base, tmp_path):
    from serving_opt.model_server import servable
    from serving_opt.model_server.status import ServingStatusError

    version = tmp_path / "1"
    shutil.copytree(os.path.join(counter_base, "1"), version)
    pb = version / "saved_model.pb"
    pb.unlink()
    os.mkfifo(pb)
    error = _fails_fast(lambda: servable.read_saved_model(str(version)))
    assert isinstance(error, ServingStatusError), error
    assert error.code == grpc.StatusCode.DATA_LOSS
    assert f"{pb} is a named pipe (FIFO), not a regular file" in error.message
    pb.unlink()
    os.symlink("/dev/zero", pb)
    error = _fails_fast(lambda: servable.read_saved_model(str(version)))
    assert isinstance(error, ServingStatusError) and f"{pb} is a symlink" in error.message
    pb.unlink()
    shutil.copy(os.path.join(counter_base, "1", "saved_model.pb"), pb)
    os.mkfifo(version / "variables" / "extra")
    error = _fails_fast(lambda: servable.Servable.load(
        servable.ServableId("m", 1), str(version), servable.LoadOptions()))
    assert isinstance(error, ServingStatusError), error
    assert "variables/extra is a named pipe (FIFO)" in error.message
