"""Hostile and broken inputs, files and versions (issue 12, items 2, 3 and 6 in part).

Nothing outside the model directory reaches the output (symlinks in assets/,
assets.extra/ or variables/ are refused, or resolved when they stay inside the model);
the target version is never the source; versions are ASCII int64; odd entries of a
model base do not break versioning; an unwritable base and non-finite tolerances are
refused before any work; `inspect` reports broken files and exits non-zero on risks.

Issue 18 (items 3, 4, 6 in part): the source is compared by (st_dev, st_ino), so a bind
mount, symlink or alias name (``01``) cannot make the target the source; saved_model.pb
is read only as a regular file within 2 GiB (FIFOs, links to /dev/zero and sparse giants
are refused unread, in fresh processes with a timeout); special files anywhere in the
model are refused; version names count as TF Serving reads them (``02`` is 2); --version
is ASCII decimal; names are escaped in tables; a full disk is one line.

Every refusal is checked the same way: one line, nothing published (no version, no
staging directory) and the source byte-identical.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

import pytest
import repo_paths
from conftest import tree_snapshot

from serving_opt import inspection
from serving_opt.errors import ServingOptError, UsageError
from serving_opt.options import BuildOptions, MeasureOptions, OutputOptions, ServingCheck, Tolerance
from serving_opt.pipeline.optimizer import OptimizeOptions, optimize, plan
from serving_opt.savedmodel import writer

REPO = repo_paths.REPO
QUICK = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def _host_file(tmp_path, name: str, data: bytes) -> str:
    """A file of the "build host", outside every model directory."""
    path = os.path.join(str(tmp_path), "host", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _snapshot(path: str) -> dict:
    """tree_snapshot that records symlinks (dangling ones too) instead of following them."""
    out = {}
    for root, dirs, files in os.walk(path):  # directory links are not entered
        for name in dirs + files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            elif name in files:
                with open(full, "rb") as f:
                    out[rel] = f.read()
    return out


def _nothing_published(base: str) -> None:
    if not os.path.isdir(base):
        return
    left = [n for n in os.listdir(base)
            if n.isdigit() or n.startswith(writer.STAGING_PREFIX)]
    assert left == [], left


def _refused(model: str, base: str, options: OptimizeOptions = QUICK,
             error=ServingOptError) -> str:
    """Runs optimize expecting a refusal; returns the one-line message."""
    before = _snapshot(model)
    with pytest.raises(error) as info:
        optimize(model, base, options)
    message = str(info.value)
    assert "\n" not in message
    _nothing_published(base)
    assert _snapshot(model) == before
    return message


# ------------------------------------------------------------------------------ files


def test_asset_symlink_to_a_host_file_is_refused(classifier_dir, model_copy, tmp_path):
    model = model_copy(classifier_dir)
    vocab = os.path.join(model, "assets", "vocab.txt")
    with open(vocab, "rb") as f:
        host = _host_file(tmp_path, "secret.txt", f.read())  # a working vocabulary, even
    os.remove(vocab)
    os.symlink(host, vocab)
    message = _refused(model, str(tmp_path / "out"))
    assert "assets/vocab.txt is a symlink that points outside the model directory" in message
    assert host in message and "copy of the file" in message


def test_assets_extra_directory_symlink_is_refused(classifier_dir, model_copy, tmp_path):
    model = model_copy(classifier_dir)
    host_dir = os.path.dirname(_host_file(tmp_path, "tf_serving_warmup_requests", b"x"))
    os.symlink(host_dir, os.path.join(model, "assets.extra"))
    message = _refused(model, str(tmp_path / "out"))
    assert "assets.extra is a symlink that points outside the model directory" in message


def test_variables_file_symlink_is_refused_with_variables_kept(classifier_dir, model_copy,
                                                               tmp_path):
    model = model_copy(classifier_dir)
    data = os.path.join(model, "variables", "variables.data-00000-of-00001")
    host = os.path.join(str(tmp_path), "host.data")
    shutil.move(data, host)
    os.symlink(host, data)
    options = OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        build=BuildOptions(freeze="never"))
    message = _refused(model, str(tmp_path / "out"), options)
    assert "variables.data-00000-of-00001 is a symlink" in message


def test_variables_directory_symlink_is_refused(classifier_dir, model_copy, tmp_path):
    model = model_copy(classifier_dir)
    host = os.path.join(str(tmp_path), "host_variables")
    shutil.move(os.path.join(model, "variables"), host)
    os.symlink(host, os.path.join(model, "variables"))
    message = _refused(model, str(tmp_path / "out"))
    assert "/variables is a symlink that points outside" in message


def test_dangling_and_looping_symlinks_are_refused(classifier_dir, model_copy, tmp_path):
    model = model_copy(classifier_dir)
    os.symlink("no-such-file", os.path.join(model, "assets", "gone.txt"))
    assert "points to nothing" in _refused(model, str(tmp_path / "out"))
    os.remove(os.path.join(model, "assets", "gone.txt"))
    os.symlink("..", os.path.join(model, "assets", "loop"))
    assert "loops back" in _refused(model, str(tmp_path / "out"))


def test_symlink_inside_the_model_is_resolved_to_a_real_file(classifier_dir, model_copy,
                                                            tmp_path):
    model = model_copy(classifier_dir)
    vocab = os.path.join(model, "assets", "vocab.txt")
    os.makedirs(os.path.join(model, "shared"))
    inside = os.path.join(model, "shared", "vocab.txt")
    shutil.move(vocab, inside)
    os.symlink(os.path.join("..", "shared", "vocab.txt"), vocab)
    before = tree_snapshot(model)
    report = optimize(model, str(tmp_path / "out"), QUICK)
    published = os.path.join(report.output_dir, "assets", "vocab.txt")
    assert not os.path.islink(published)
    with open(published, "rb") as f, open(inside, "rb") as g:
        assert f.read() == g.read()
    assert tree_snapshot(model) == before


def test_validate_refuses_a_served_model_with_a_symlink_out(classifier_dir, tmp_path):
    from serving_opt.serving.validate import ValidateOptions, validate

    base = str(tmp_path / "base")
    shutil.copytree(classifier_dir, os.path.join(base, "1"))
    vocab = os.path.join(base, "1", "assets", "vocab.txt")
    os.remove(vocab)
    os.symlink(_host_file(tmp_path, "vocab.txt", b"a\nb\n"), vocab)
    with pytest.raises(ServingOptError, match="assets/vocab.txt is a symlink"):
        validate(base, ValidateOptions(serving=ServingCheck(server="local", write_warmup=True)))
    assert not os.path.exists(os.path.join(base, "1", "assets.extra"))


def test_inspect_reports_symlinks_out_as_errors(classifier_dir, model_copy, tmp_path):
    model = model_copy(classifier_dir)
    host = _host_file(tmp_path, "passwd", b"root:x:0:0\n")
    vocab = os.path.join(model, "assets", "vocab.txt")
    os.remove(vocab)
    os.symlink(host, vocab)
    report = inspection.inspect_saved_model(model)
    (risk,) = report.risks
    assert (risk.code, risk.severity, risk.subject) == ("symlink", "error", "assets/vocab.txt")
    # The host file is not even measured.
    assert report.meta_graphs[0].assets[0].size_bytes is None


# ---------------------------------------------------------------------- never lose data


def test_target_version_that_is_the_source_is_refused(classifier_dir, tmp_path):
    base = str(tmp_path / "B")
    model = os.path.join(base, "1")
    shutil.copytree(classifier_dir, model)
    options = OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=1, overwrite=True))
    before = tree_snapshot(model)
    with pytest.raises(ServingOptError, match="is the input model") as info:
        optimize(model, base, options)
    assert "\n" not in str(info.value)
    assert tree_snapshot(model) == before
    assert sorted(os.listdir(base)) == ["1"]


def test_target_version_reached_through_a_symlink_is_refused(classifier_dir, tmp_path):
    base = str(tmp_path / "B")
    model = os.path.join(base, "1")
    shutil.copytree(classifier_dir, model)
    other = str(tmp_path / "C")
    os.makedirs(other)
    os.symlink(model, os.path.join(other, "7"))
    options = OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=7, overwrite=True))
    before = tree_snapshot(model)
    with pytest.raises(ServingOptError, match="is the input model"):
        optimize(os.path.join(other, "7"), other, options)
    with pytest.raises(ServingOptError, match="is the input model"):
        optimize(model, other, options)
    assert tree_snapshot(model) == before
    assert os.listdir(other) == ["7"]


def test_target_version_containing_the_source_is_refused(classifier_dir, tmp_path):
    base = str(tmp_path / "B")
    model = os.path.join(base, "3", "export")
    shutil.copytree(classifier_dir, model)
    options = OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=3, overwrite=True))
    before = tree_snapshot(model)
    with pytest.raises(ServingOptError, match="or contains it"):
        optimize(model, base, options)
    assert tree_snapshot(model) == before
    assert sorted(os.listdir(base)) == ["3"]


def test_version_beyond_int64_is_refused(classifier_dir, tmp_path):
    for version in (99999999999999999999999, 2**63):
        message = _refused(classifier_dir, str(tmp_path / "out"),
                           OptimizeOptions(
                               measure=MeasureOptions(benchmark_runs=0),
                               output=OutputOptions(version=version)), UsageError)
        assert "int64" in message
    assert plan(classifier_dir, str(tmp_path / "out"),
                OptimizeOptions(output=OutputOptions(version=2**63 - 1))).version == 2**63 - 1


def test_non_ascii_digit_names_are_not_versions(classifier_dir, tmp_path):
    base = str(tmp_path / "out")
    for name in ("²", "٣", "１"):  # superscript two, Arabic-Indic three, fullwidth one
        os.makedirs(os.path.join(base, name))
    assert writer.existing_versions(base) == []
    assert plan(classifier_dir, base, QUICK).version == 1
    os.makedirs(os.path.join(base, "99999999999999999999999"))  # beyond int64: not one
    assert plan(classifier_dir, base, QUICK).version == 1
    # A base passed as --input_dir: a one-line hint, not an internal error on "²".
    message = _refused(base, str(tmp_path / "other"))
    assert message.startswith(f"no saved_model.pb in {base}")


def test_a_file_named_like_a_version_is_skipped(classifier_dir, tmp_path):
    base = str(tmp_path / "out")
    os.makedirs(base)
    with open(os.path.join(base, "1"), "w") as f:
        f.write("not a model")
    assert writer.existing_versions(base) == []
    assert plan(classifier_dir, base, QUICK).version == 2
    with pytest.raises(ServingOptError, match="next free: 2"):
        plan(classifier_dir, base, OptimizeOptions(output=OutputOptions(version=1)))


def _unwritable_base(tmp_path) -> str:
    if os.geteuid() != 0:
        parent = tmp_path / "ro"
        parent.mkdir()
        parent.chmod(0o555)
        return str(parent / "base")
    base = "/sys/serving-opt-hostile-test"  # root may write anywhere, but not here
    try:
        os.mkdir(base)
    except OSError:
        return base
    os.rmdir(base)
    pytest.skip("no unwritable directory for root on this machine")


def test_unwritable_base_is_refused_before_any_work(classifier_dir, tmp_path):
    base = _unwritable_base(tmp_path)
    try:
        with pytest.raises(ServingOptError, match="is not writable") as info:
            plan(classifier_dir, base, QUICK)
        assert "\n" not in str(info.value)
        message = _refused(classifier_dir, base)
        assert "--output_base" in message and "is not writable" in message
        assert not os.path.exists(base)
    finally:
        if os.path.isdir(tmp_path / "ro"):
            (tmp_path / "ro").chmod(0o755)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("atol,rtol", [(float("nan"), 1e-4), (1e-5, float("inf")),
                                       (float("inf"), float("nan"))])
def test_non_finite_tolerances_are_usage_errors(classifier_dir, tmp_path, atol, rtol):
    message = _refused(classifier_dir, str(tmp_path / "out"),
                       OptimizeOptions(
                           measure=MeasureOptions(benchmark_runs=0),
                           tolerance=Tolerance(atol=atol, rtol=rtol)), UsageError)
    assert "must be finite" in message


def test_inspect_reports_missing_variables_index(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    os.remove(os.path.join(model, "variables", "variables.index"))
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.severity, risk.tags) == ("variables_missing", "error", ("serve",))


def test_inspect_reports_a_missing_asset(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    os.remove(os.path.join(model, "assets", "vocab.txt"))
    (risk,) = inspection.inspect_saved_model(model).risks
    assert (risk.code, risk.subject) == ("asset_missing", "vocab.txt")


def _duplicate_escaping_asset(model: str, filename: str = "../../etc/passwd") -> None:
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    path = os.path.join(model, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        saved_model.ParseFromString(f.read())
    values = saved_model.meta_graphs[0].collection_def["saved_model_assets"].any_list.value
    asset = meta_graph_pb2.AssetFileDef()
    values[0].Unpack(asset)
    asset.filename = filename
    values[0].Pack(asset)
    values.add().Pack(asset)  # the same asset declared twice
    with open(path, "wb") as f:
        f.write(saved_model.SerializeToString())


def test_inspect_lists_an_escaping_asset_once(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    _duplicate_escaping_asset(model)
    risks = inspection.inspect_saved_model(model).risks
    assert [r.code for r in risks] == ["asset_path_escapes"]


# -------------------------------------------------------------------------------- CLI


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def cli_runs(classifier_dir, tmp_path_factory) -> dict:
    """Every CLI case of this module, started at once (each imports TensorFlow)."""
    scratch = str(tmp_path_factory.mktemp("hostile_cli"))
    risky = os.path.join(scratch, "risky")
    shutil.copytree(classifier_dir, risky)
    _duplicate_escaping_asset(risky)
    base = os.path.join(scratch, "B")
    shutil.copytree(classifier_dir, os.path.join(base, "1"))
    out = os.path.join(scratch, "out")
    optimize_ = ["optimize", f"--input_dir={classifier_dir}", f"--output_base={out}",
                 "--benchmark_runs=0", "--nocold_start", "--noprogress"]
    cases = {
        "inspect_risky": ["inspect", f"--saved_model_dir={risky}"],
        "inspect_risky_never": ["inspect", f"--saved_model_dir={risky}", "--fail_on=never"],
        "inspect_clean_warning": ["inspect", f"--saved_model_dir={classifier_dir}",
                                  "--fail_on=warning"],
        "inspect_bad_fail_on": ["inspect", f"--saved_model_dir={classifier_dir}",
                                "--fail_on=sometimes"],
        "version_too_big": [*optimize_, "--version=99999999999999999999999"],
        "atol_nan": [*optimize_, "--atol=nan"],
        "rtol_inf": [*optimize_, "--rtol=inf"],
        "overwrite_source": ["optimize", f"--input_dir={os.path.join(base, '1')}",
                             f"--output_base={base}", "--version=1", "--overwrite",
                             "--benchmark_runs=0", "--nocold_start", "--noprogress"],
    }
    before = tree_snapshot(os.path.join(base, "1"))
    procs = {name: subprocess.Popen([sys.executable, "-m", "serving_opt.cli", *args],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=_env(), cwd=REPO)
             for name, args in cases.items()}
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    results["_source_intact"] = tree_snapshot(os.path.join(base, "1")) == before
    results["_base"] = sorted(os.listdir(base))
    results["_out"] = os.path.exists(out) and os.listdir(out)
    return results


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    return lines[-1]


def test_cli_inspect_exits_1_on_error_risks(cli_runs):
    result = cli_runs["inspect_risky"]
    assert result.returncode == 1
    assert "asset_path_escapes" in result.stdout  # the report is printed either way
    assert result.stdout.count("asset_path_escapes") == 1
    line = _error_line(result)
    assert line.startswith("serving-opt inspect: error: 1 risk(s) at or above --fail_on=error")


def test_cli_inspect_fail_on_never_and_clean_model(cli_runs):
    assert cli_runs["inspect_risky_never"].returncode == 0
    assert cli_runs["inspect_clean_warning"].returncode == 0
    assert cli_runs["inspect_bad_fail_on"].returncode == 2


def test_cli_refuses_a_version_beyond_int64(cli_runs):
    result = cli_runs["version_too_big"]
    assert result.returncode == 2, result.stderr
    assert "int64" in _error_line(result)
    assert not cli_runs["_out"]


@pytest.mark.parametrize("case", ["atol_nan", "rtol_inf"])
def test_cli_refuses_non_finite_tolerances(cli_runs, case):
    result = cli_runs[case]
    assert result.returncode == 2, result.stderr
    assert "must be finite" in _error_line(result)


def test_cli_refuses_overwriting_the_source(cli_runs):
    result = cli_runs["overwrite_source"]
    assert result.returncode == 1, result.stderr
    assert "is the input model" in _error_line(result)
    assert cli_runs["_source_intact"]
    assert cli_runs["_base"] == ["1"]


# ------------------------------------------- issue 18: the same directory by another path


@contextlib.contextmanager
def _bind_mount(source: str, mount_point: str):
    """``mount --bind source mount_point`` for the test's duration (needs CAP_SYS_ADMIN)."""
    os.makedirs(mount_point, exist_ok=True)
    result = subprocess.run(["mount", "--bind", source, mount_point], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here ({result.stderr.strip()}); "
                    "the symlink, alias and hard-link tests cover the same checks")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", mount_point], check=False)


def test_target_version_reached_through_a_bind_mount_is_refused(classifier_dir, tmp_path):
    base = str(tmp_path / "B")
    model = os.path.join(base, "1")
    shutil.copytree(classifier_dir, model)
    before = tree_snapshot(model)
    options = OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=1, overwrite=True))
    with _bind_mount(base, str(tmp_path / "M")) as mounted:
        # realpath(M/1) is M/1, not B/1: only (st_dev, st_ino) says they are one directory.
        with pytest.raises(ServingOptError, match="is the input model") as info:
            optimize(model, mounted, options)
        assert "\n" not in str(info.value)
        with pytest.raises(ServingOptError, match="is the input model"):
            writer.check_not_source(model, mounted, 1)
        # The output base inside the source, through the mount.
        with pytest.raises(UsageError, match="is inside --input_dir"):
            optimize(model, os.path.join(mounted, "1", "out"), QUICK)
        assert tree_snapshot(model) == before
        assert sorted(os.listdir(mounted)) == ["1"]
        assert sorted(os.listdir(model)) == sorted(os.listdir(classifier_dir))


def test_target_version_reached_through_a_symlinked_base_is_refused(classifier_dir, tmp_path):
    base = str(tmp_path / "B")
    model = os.path.join(base, "1")
    shutil.copytree(classifier_dir, model)
    linked = str(tmp_path / "L")
    os.symlink(base, linked)
    before = tree_snapshot(model)
    with pytest.raises(ServingOptError, match="is the input model"):
        writer.check_not_source(model, linked, 1)
    with pytest.raises(ServingOptError, match="is the input model"):
        writer.check_not_source(os.path.join(linked, "1"), base, 1)
    with pytest.raises(UsageError, match="is inside --input_dir"):
        writer.check_not_source(os.path.join(linked, "1"), os.path.join(model, "out"))
    writer.check_not_source(model, linked, 2)  # another version: fine
    assert tree_snapshot(model) == before


def test_overwriting_a_version_that_is_the_source_under_another_name_is_refused(
        classifier_dir, tmp_path):
    # TF Serving reads "01" as version 1: overwriting version 1 replaces it.
    base = str(tmp_path / "B")
    model = os.path.join(base, "01")
    shutil.copytree(classifier_dir, model)
    options = OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=1, overwrite=True))
    message = _refused_keeping(model, base, options)
    assert "is the input model" in message and f"{base}/01" in message
    assert sorted(os.listdir(base)) == ["01"]


def _refused_keeping(model: str, base: str, options: OptimizeOptions) -> str:
    before = tree_snapshot(model)
    with pytest.raises(ServingOptError) as info:
        optimize(model, base, options)
    assert "\n" not in str(info.value)
    assert tree_snapshot(model) == before
    return str(info.value)


def test_overwrite_replaces_hard_linked_files_by_rename_and_never_writes_into_them(
        classifier_dir, tmp_path):
    # A version made with `cp -al` from the source shares its files' inodes: writing
    # into them would rewrite the source. Overwrite must replace the directory.
    model = str(tmp_path / "source")
    shutil.copytree(classifier_dir, model)
    base = str(tmp_path / "B")
    shutil.copytree(model, os.path.join(base, "1"), copy_function=os.link)
    before = tree_snapshot(model)
    pb = os.path.join(model, "saved_model.pb")
    assert os.stat(pb).st_nlink == 2
    writer.check_not_source(model, base, 1)  # a hard-linked file is not the directory
    report = optimize(model, base, OptimizeOptions(
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        output=OutputOptions(version=1, overwrite=True)))
    assert tree_snapshot(model) == before
    published = os.path.join(report.output_dir, "saved_model.pb")
    assert os.stat(published).st_ino != os.stat(pb).st_ino
    assert os.stat(pb).st_nlink == 1  # the old version's link was unlinked, not written
    assert sorted(os.listdir(base)) == ["1"]


# ------------------------------------------------ issue 18: saved_model.pb is a regular file

# Reads a model in a fresh process that cannot hang the test run or eat the machine's
# memory: 1 GiB of address space (a bounded refusal needs no TensorFlow) and a timeout.
_READ_MODEL = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
from serving_opt.errors import ServingOptError
from serving_opt.savedmodel import loader, model_files
try:
    loader.read_saved_model(sys.argv[1])
except ServingOptError as e:
    print(e)
    sys.exit(3)
print("read without error")
"""


def _read_in_a_fresh_process(model: str) -> str:
    result = subprocess.run([sys.executable, "-c", _READ_MODEL, model], capture_output=True,
                            text=True, timeout=60, env=_env(), cwd=REPO)
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr[-2000:])
    (line,) = result.stdout.splitlines()
    return line


def test_saved_model_pb_symlink_to_dev_zero_is_refused_unread(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    pb = os.path.join(model, "saved_model.pb")
    os.remove(pb)
    os.symlink("/dev/zero", pb)
    line = _read_in_a_fresh_process(model)
    assert line.startswith(f"{pb} is a symlink to a character device (/dev/zero), not to a "
                           "regular file"), line
    assert "copy" in line


def test_saved_model_pb_symlink_to_a_regular_file_is_read(classifier_dir, model_copy,
                                                          tmp_path):
    # Bazel runfiles and Kubernetes volumes present model files as links; TF Serving
    # follows them. Only the kind and size of what the link leads to matter.
    from serving_opt.savedmodel import loader

    model = model_copy(classifier_dir)
    pb = os.path.join(model, "saved_model.pb")
    real = str(tmp_path / "real.pb")
    shutil.move(pb, real)
    os.symlink(real, pb)
    assert loader.read_saved_model(model).meta_graphs
    os.truncate(real, 2**31 + 1)
    with pytest.raises(ServingOptError, match=r"is 2147483649 bytes, over protobuf"):
        loader.read_saved_model(model)


def test_saved_model_pb_fifo_is_refused_without_hanging(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    pb = os.path.join(model, "saved_model.pb")
    os.remove(pb)
    os.mkfifo(pb)
    line = _read_in_a_fresh_process(model)
    assert line.startswith(f"{pb} is a named pipe (FIFO), not a regular file"), line


def test_oversize_saved_model_pb_is_refused_without_reading_it(classifier_dir, model_copy):
    model = model_copy(classifier_dir)
    pb = os.path.join(model, "saved_model.pb")
    os.truncate(pb, 2**31 + 1)  # sparse: no disk, but 2 GiB to read
    line = _read_in_a_fresh_process(model)
    assert line.startswith(f"{pb} is 2147483649 bytes, over protobuf's 2 GiB limit"), line


def test_special_files_anywhere_in_the_model_are_refused(classifier_dir, model_copy,
                                                         tmp_path):
    from serving_opt.savedmodel import model_files

    model = model_copy(classifier_dir)
    data = os.path.join(model, "variables", "variables.data-00000-of-00001")
    os.remove(data)
    os.mkfifo(data)  # TensorFlow's restore would block on it forever
    with pytest.raises(ServingOptError) as info:
        model_files.check_model_files(model)
    assert str(info.value).startswith(f"{data} is a named pipe (FIFO), not a regular file")
    os.remove(data)
    os.symlink("variables.index", data)  # a link inside the model: resolved, fine
    model_files.check_model_files(model)
    os.remove(data)
    os.symlink("../assets/fifo", data)
    os.mkfifo(os.path.join(model, "assets", "fifo"))
    with pytest.raises(ServingOptError, match="named pipe"):
        model_files.check_model_files(model)


def _cli(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving_opt.cli", *args],
                          capture_output=True, text=True, env=_env(), cwd=REPO,
                          timeout=timeout)


# ------------------------------------------------- issue 18: versions as TF Serving reads them


def test_version_names_tf_serving_reads_count_as_those_versions(classifier_dir, tmp_path):
    base = str(tmp_path / "out")
    os.makedirs(os.path.join(base, "02"))
    assert writer.next_version(base) == 3
    with pytest.raises(ServingOptError, match=r"02 already exists .*version 2") as info:
        writer.check_target(base, 2)
    assert "next free: 3" in str(info.value)
    with pytest.raises(ServingOptError, match="already exists"):
        plan(classifier_dir, base, OptimizeOptions(output=OutputOptions(version=2)))
    os.makedirs(os.path.join(base, " 7"))  # safe_strto64 skips spaces: version 7
    assert writer.next_version(base) == 8
    assert writer.version_dirs(base) == {2: ["02"], 7: [" 7"]}
    os.makedirs(os.path.join(base, "-4"))  # a version (negative), never the next one
    assert writer.next_version(base) == 8
    assert writer.served_version("+3") is None  # no '+' in safe_strto64
    assert writer.served_version("٣") is None


def test_overwrite_replaces_every_directory_tf_serving_reads_as_the_version(tmp_path):
    base = str(tmp_path / "out")
    for name in ("02", "002"):
        os.makedirs(os.path.join(base, name))
        with open(os.path.join(base, name, "marker"), "w") as f:
            f.write(name)
    staging = writer.make_staging_dir(base, 2)
    with open(os.path.join(staging, "marker"), "w") as f:
        f.write("new")
    assert writer.publish(staging, base, 2, overwrite=True) == os.path.join(base, "2")
    names = [n for n in os.listdir(base) if not n.startswith(".")]
    assert names == ["2"]
    with open(os.path.join(base, "2", "marker")) as f:
        assert f.read() == "new"


@pytest.mark.parametrize("flag", ["--version=0x10", "--version=٣", "--version=1_0",
                                  "--version= 5", "--version=0o7"])
def test_cli_refuses_a_version_that_is_not_ascii_decimal(classifier_dir, tmp_path, flag):
    out = str(tmp_path / "out")
    result = _cli(["optimize", f"--input_dir={classifier_dir}", f"--output_base={out}",
                   flag, "--benchmark_runs=0", "--nocold_start", "--noprogress"], timeout=120)
    assert result.returncode == 2, (result.stdout[-500:], result.stderr[-2000:])
    line = _error_line(result)
    assert "--version" in line and "decimal" in line, line
    assert not os.path.exists(out)


# ------------------------------------------------------------ issue 18: lesser findings


def test_control_characters_in_names_are_escaped_in_tables():
    from serving_opt.core import rendering
    text = rendering.table(["signature", "ok"], [["pre\ndict\x1b[31m", "yes"]])
    assert len(text.splitlines()) == 3
    assert "pre\\ndict\\x1b[31m" in text


def test_inspect_table_escapes_a_signature_key_with_a_newline(classifier_dir, model_copy):
    from tensorflow.core.protobuf import saved_model_pb2

    model = model_copy(classifier_dir)
    path = os.path.join(model, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        saved_model.ParseFromString(f.read())
    signatures = saved_model.meta_graphs[0].signature_def
    signatures["evil\nkey"].CopyFrom(signatures["predict"])
    with open(path, "wb") as f:
        f.write(saved_model.SerializeToString())
    text = inspection.inspect_saved_model(model).format_table()
    assert "evil\\nkey" in text
    assert not any(line.strip() == "key" or line.startswith("key") for line in text.splitlines())


def test_a_full_disk_is_one_line_in_the_cli(monkeypatch, capsys):
    import errno

    from serving_opt.cli import main as cli_main
    from serving_opt.cli.commands import inspect as inspect_command
    from serving_opt.savedmodel import staging

    def full(fv):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/models/clf/.staging/x.pb")

    monkeypatch.setattr(inspect_command, "main", full)
    monkeypatch.setattr(staging, "published", [])  # what earlier tests published
    code = cli_main.main(["serving-opt", "inspect", "--saved_model_dir=/nonexistent"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("serving-opt inspect: error: the disk is full at "
                              "/models/clf/.staging/x.pb ("), err
    assert "internal error" not in err[-1] and "nothing was published" in err[-1]


@contextlib.contextmanager
def _full_filesystem(path: str, free_bytes: int = 24 * 1024):
    """A 1 MiB tmpfs at ``path`` with about ``free_bytes`` left (root only)."""
    os.makedirs(path)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", path],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()})")
    try:
        stat = os.statvfs(path)
        with open(os.path.join(path, "filler"), "wb") as f:
            f.write(b"\0" * (stat.f_bavail * stat.f_frsize - free_bytes))
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)


def test_a_full_disk_is_one_line_and_publishes_nothing(classifier_dir, tmp_path):
    with _full_filesystem(str(tmp_path / "full")) as full:
        base = os.path.join(full, "base")
        message = _refused(classifier_dir, base)
        assert message.startswith(f"the disk is full at {base} (No space left"), message
        assert "nothing was published" in message and "--output_base" in message
        assert os.listdir(base) == []
        result = _cli(["optimize", f"--input_dir={classifier_dir}", f"--output_base={base}",
                       "--benchmark_runs=0", "--nocold_start", "--noprogress"])
        assert result.returncode == 1, result.stderr[-2000:]
        line = _error_line(result)
        assert line.startswith(f"serving-opt optimize: error: the disk is full at {base} ("), \
            line
        assert os.listdir(base) == []
