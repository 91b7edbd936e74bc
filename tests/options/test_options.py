"""The options tree: one place per value, one spelling per option (a flat name is an error
naming its group), checked once, and the command-line flags made from it (names,
defaults, the model directory convention)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from absl import flags

from serving_opt import options as options_lib
from serving_opt.cli import main as cli
from serving_opt.cli import option_flags
from serving_opt.errors import UsageError
from serving_opt.options import (
    BuildOptions,
    InputOptions,
    MeasureOptions,
    OptimizeOptions,
    OutputOptions,
    ServingCheck,
    TargetOptions,
    Tolerance,
    TrustOptions,
    ValidateOptions,
)
from serving_opt.tune.options import WorkloadOptions

# Every keyword OptimizeOptions and ValidateOptions took flat before the groups, with a
# value that is not the default: each is refused now, naming the group that holds it.
OLD_OPTIMIZE_KEYWORDS = dict(
    transforms="fold_constants", grappler="constfold", grappler_rounds=3,
    signatures=("predict",), saved_model_tags="serve,gpu", version=7, overwrite=True,
    freeze="never", examples="x.jsonl", atol=1e-3, rtol=1e-3, parity_batch_size=4,
    parity_batches=3, benchmark_runs=5, benchmark_batch_sizes=(2,), seed=9,
    freeze_max_bytes=1024, max_constant_bytes=None, cold_start=False, cold_start_rounds=2,
    regression_tolerance=1.5, allow_regression=True, allow_file_ops=True, quantize="int8",
    quantize_min_elements=10, min_top1_agreement=0.9, max_probability_error=0.1,
    compare_examples="shards-*", serving_version="2.15.1", serving_runtime_python="/py",
    allow_unsandboxed=True, sandbox_memory_bytes=1 << 30)
OLD_VALIDATE_KEYWORDS = dict(
    model_name="m", version=2, reference_dir="ref", server="local", image="img:1",
    examples="x.jsonl", saved_model_tags="serve,gpu", concurrency=2, duration=0.5,
    load_deadline=10.0, atol=1e-3, rtol=1e-3, batch_size=4, request_timeout=5.0,
    write_warmup=True, seed=3, allow_file_ops=True, protocols=("rest",),
    serving_version="2.15.1", serving_runtime_python="/py", require_server="tf_serving",
    allow_unsandboxed=True)


def _nested(tree, flat: dict):
    """``flat`` spelled in ``tree``'s groups (read here from the dataclasses, apart from the
    tree's own error messages)."""
    own = {f.name for f in dataclasses.fields(tree)}
    groups: dict = {}
    for name, value in flat.items():
        if name in own:
            groups[name] = value
            continue
        group = next(g for g, kind in tree.GROUPS.items()
                     if name in {f.name for f in dataclasses.fields(kind)})
        groups.setdefault(group, {})[name] = value
    return tree(**{g: tree.GROUPS[g](**v) if g in tree.GROUPS else v
                   for g, v in groups.items()})


@pytest.mark.parametrize("tree, old", [(OptimizeOptions, OLD_OPTIMIZE_KEYWORDS),
                                       (ValidateOptions, OLD_VALIDATE_KEYWORDS)])
def test_a_flat_name_is_an_error_naming_its_group(tree, old):
    own = {f.name for f in dataclasses.fields(tree)}
    refused = 0
    for name, value in old.items():
        if name in own:
            continue  # the tree's own field (ValidateOptions.version)
        group, kind = next((g, k) for g, k in tree.GROUPS.items()
                           if name in {f.name for f in dataclasses.fields(k)})
        expected = (f"{name} is an option of {tree.__name__}.{group}: "
                    f"{tree.__name__}({group}={kind.__name__}({name}=...))")
        with pytest.raises(TypeError) as keyword:
            tree(**{name: value})
        with pytest.raises(TypeError) as replaced:
            dataclasses.replace(tree(), **{name: value})
        with pytest.raises(AttributeError) as read:
            getattr(tree(), name)
        assert str(keyword.value) == str(replaced.value) == str(read.value) == expected
        refused += 1
    assert refused == len(set(old) - own) >= 20
    # Control: the same values in their groups are taken and read back there.
    nested = _nested(tree, old)
    for name, value in old.items():
        holder = nested if name in own else next(
            getattr(nested, g) for g, k in tree.GROUPS.items()
            if name in {f.name for f in dataclasses.fields(k)})
        assert getattr(holder, name) == value, name


def test_unknown_keywords_and_wrong_groups_are_type_errors():
    with pytest.raises(TypeError, match="OptimizeOptions has no option 'frobnicate'"):
        OptimizeOptions(frobnicate=1)
    with pytest.raises(TypeError, match=r"server is an option of OptimizeOptions.validate: "
                                        r"OptimizeOptions\(validate=ServingCheck\(server=\.\.\.\)\)"):
        OptimizeOptions(server="local")  # validate's own: only in its group
    with pytest.raises(TypeError, match="build must be a BuildOptions"):
        OptimizeOptions(build=Tolerance())
    with pytest.raises(AttributeError, match="has no attribute 'frobnicate'"):
        OptimizeOptions().frobnicate  # noqa: B018


def test_replace_takes_groups():
    options = OptimizeOptions(
        build=BuildOptions(quantize="int8"), measure=MeasureOptions(benchmark_runs=0))
    nested = dataclasses.replace(options, measure=MeasureOptions(cold_start=False),
                                 output=OutputOptions(version=3))
    assert nested.measure.benchmark_runs is None and nested.build.quantize == "int8"
    assert nested.output.version == 3
    validate = dataclasses.replace(ValidateOptions(serving=ServingCheck(server="local")),
                                   version=2)
    assert (validate.serving.server, validate.version) == ("local", 2)


def test_options_pickle_compare_and_hash():
    # The sandboxed worker receives them pickled.
    for options in (_nested(OptimizeOptions, OLD_OPTIMIZE_KEYWORDS),
                    OptimizeOptions(validate=ServingCheck(server="local")),
                    _nested(ValidateOptions, OLD_VALIDATE_KEYWORDS)):
        again = pickle.loads(pickle.dumps(options))
        assert again == options and hash(again) == hash(options)
        assert again.tolerance.atol == options.tolerance.atol


def test_validate_options_are_built_from_the_optimize_tree():
    options = OptimizeOptions(
        validate=ServingCheck(server="local"), tolerance=Tolerance(atol=1e-3),
        inputs=InputOptions(examples="e.jsonl"), target=TargetOptions(serving_version="2.15.1"),
        trust=TrustOptions(allow_file_ops=True))
    built = options.validate_options()
    # One place: the very groups of the optimize tree, not copies merged afterwards.
    for group in ("inputs", "tolerance", "target", "trust"):
        assert getattr(built, group) is getattr(options, group)
    assert built.serving is options.validate
    assert OptimizeOptions().validate_options() is None


def test_a_validate_options_given_to_optimize_contributes_its_own_group_only():
    options = OptimizeOptions(
        validate=ValidateOptions(
            serving=ServingCheck(server="local", concurrency=3), tolerance=Tolerance(atol=1e-3)),
        tolerance=Tolerance(atol=1e-3))
    assert options.validate == ServingCheck(server="local", concurrency=3)
    with pytest.raises(UsageError, match="ValidateOptions.tolerance.rtol=0.5 disagrees"):
        OptimizeOptions(validate=ValidateOptions(tolerance=Tolerance(rtol=0.5)))
    with pytest.raises(UsageError, match="set trust.allow_file_ops once, on OptimizeOptions"):
        OptimizeOptions(validate=ValidateOptions(trust=TrustOptions(allow_file_ops=True)))
    with pytest.raises(UsageError, match="version"):
        OptimizeOptions(validate=ValidateOptions(version=2), output=OutputOptions(version=1))


@pytest.mark.parametrize("options, message", [
    (OptimizeOptions(
        build=BuildOptions(freeze="sometimes")), "--freeze=sometimes is not one of auto"),
    (OptimizeOptions(tolerance=Tolerance(rtol=2.0)), "rtol at most 1"),
    (OptimizeOptions(output=OutputOptions(version=-1)), "--version=-1 is not a version"),
    (OptimizeOptions(
        measure=MeasureOptions(cold_start_rounds=0)), "--cold_start_rounds must be >= 1"),
    (OptimizeOptions(
        build=BuildOptions(transforms="fold_batchnorm")), "unknown transform 'fold_batchnorm'"),
    (OptimizeOptions(validate=ServingCheck(protocols=("http",))), "--protocols=http"),
    (OptimizeOptions(validate={"server": "local"}), "not a ServingCheck"),
    (ValidateOptions(tolerance=Tolerance(rtol=2.0),  # validate: no bound
                     serving=ServingCheck(server="local", concurrency=0)), None),
    (ValidateOptions(
        serving=ServingCheck(server="local", require_server="tf_serving")), "contradicts"),
    (ValidateOptions(serving=ServingCheck(load_deadline=0)), "load_deadline=0 must be a positive"),
])
def test_every_check_is_in_the_tree(options, message):
    if message is None:
        options.check()
        return
    with pytest.raises(UsageError, match=message):
        options_lib.check_options(options)


def test_the_defaults_are_the_stages_own():
    from serving_opt.core import gates
    from serving_opt.savedmodel import checkpoint, loader
    from serving_opt.stages import freeze, grappler, quantize, regression

    options = OptimizeOptions()
    assert (options.tolerance.atol, options.tolerance.rtol) \
        == (gates.DEFAULT_ATOL, gates.DEFAULT_RTOL)
    assert options.gate.min_top1_agreement == gates.DEFAULT_MIN_TOP1_AGREEMENT
    assert options.gate.max_probability_error == gates.DEFAULT_MAX_PROBABILITY_ERROR
    assert options.build.grappler_rounds == grappler.DEFAULT_ROUNDS
    assert options.build.freeze_max_bytes == freeze.DEFAULT_FREEZE_MAX_BYTES
    assert options.build.max_constant_bytes == checkpoint.DEFAULT_MAX_CONSTANT_BYTES
    assert options.build.quantize_min_elements == quantize.DEFAULT_MIN_ELEMENTS
    assert options_lib.QUANTIZE_MODES == quantize.MODES
    assert options.gate.regression_tolerance == regression.DEFAULT_TOLERANCE
    assert options.inputs.saved_model_tags == loader.SERVE_TAG


# --- the flags ---------------------------------------------------------------------------

def _parsed(command: str, *args: str) -> flags.FlagValues:
    fv = flags.FlagValues()
    cli._command_module(command).define_flags(fv)
    fv([f"serving-opt {command}", *args])
    return fv


def test_flag_defaults_are_the_options_defaults():
    from serving_opt.cli.commands import optimize, validate

    fv = _parsed("optimize", "--saved_model_dir=m", "--model_base_path=b")
    assert optimize.options_from_flags(fv) == OptimizeOptions()
    fv = _parsed("optimize", "--saved_model_dir=m", "--model_base_path=b", "--validate")
    assert optimize.options_from_flags(fv) == OptimizeOptions(validate=ServingCheck())
    fv = _parsed("validate", "--model_base_path=b")
    assert validate.options_from_flags(fv) == ValidateOptions()


def test_flags_set_the_options_they_name():
    from serving_opt.cli.commands import optimize, validate

    fv = _parsed("optimize", "--saved_model_dir=m", "--model_base_path=b", "--atol=0.001",
                 "--max_constant_bytes=-1", "--transforms=default", "--quantize=int8",
                 "--signatures=a,b", "--nocold_start", "--validate", "--protocols=rest",
                 "--serving_version=2.15.1", "--sandbox_memory_bytes=536870912")
    options = optimize.options_from_flags(fv)
    assert options.tolerance.atol == 0.001 and options.build.max_constant_bytes is None
    assert options.build.transforms is None and options.build.quantize == "int8"
    assert options.build.signatures == ("a", "b") and options.measure.cold_start is False
    assert options.validate.protocols == ("rest",)
    assert options.target.serving_version == "2.15.1"
    assert options.trust.sandbox_memory_bytes == 1 << 29
    fv = _parsed("validate", "--model_base_path=b", "--reference_saved_model_dir=r",
                 "--version=3", "--server=local", "--rtol=0.01")
    assert validate.options_from_flags(fv) == ValidateOptions(
        reference_dir="r", version=3, serving=ServingCheck(server="local"),
        tolerance=Tolerance(rtol=0.01))


def test_optimize_and_validate_share_the_validate_flags():
    # optimize --validate takes every flag of validate's own group, meaning the same.
    optimize_fv, validate_fv = _parsed("optimize"), _parsed("validate")
    for f in option_flags.flag_fields(ServingCheck):
        assert optimize_fv[f.name].default == validate_fv[f.name].default, f.name
        assert optimize_fv[f.name].help.replace("With --validate: ", "").lower() \
            == validate_fv[f.name].help.lower(), f.name


# The model directory flags of each command (cli.main's convention) and their old names.
MODEL_DIRS = {
    "inspect": {"saved_model_dir": ()},
    "optimize": {"saved_model_dir": ("input_dir",), "model_base_path": ("output_base",)},
    "validate": {"model_base_path": ("model_base",),
                 "reference_saved_model_dir": ("reference_dir",)},
    "compare": {"baseline_saved_model_dir": ("baseline",),
                "candidate_saved_model_dir": ("candidate",)},
    "serve": {"model_base_path": ()},
    "tune": {"model_base_path": ()},
}
# Directories a command writes its reports into: not model directories.
REPORT_DIRS = ("output_dir", "tune_output_dir")


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_command_names_model_directories_by_the_convention(command):
    fv = _parsed(command)
    aliases = {name for name in fv if fv[name].help.startswith("Alias for --")}
    model_dirs = {name for name in fv if name not in aliases and name not in REPORT_DIRS and (
        name.endswith(("_dir", "_base", "base_path")) or name in ("baseline", "candidate"))}
    assert model_dirs == set(MODEL_DIRS[command])
    for name in model_dirs:
        cli.check_model_dir_name(name)
    assert aliases == {old for olds in MODEL_DIRS[command].values() for old in olds}


@pytest.mark.parametrize("command", [c for c in cli.COMMANDS if c != "serve"])
def test_old_model_directory_names_still_work(command):
    names = MODEL_DIRS[command]
    args = [f"--{olds[0] if olds else name}=/models/{name}" for name, olds in names.items()]
    fv = _parsed(command, *args)
    for name in names:
        assert fv[name].value == f"/models/{name}"
        assert fv[name].present


def test_a_missing_model_directory_names_its_old_name_too(capsys):
    assert cli.main(["serving-opt", "optimize", "--input_dir=x"]) == 2
    line = capsys.readouterr().err.strip()
    assert "missing required flag(s) --model_base_path (or --output_base)" in line


def test_bazel_action_defaults_are_the_options_defaults():
    from serving_opt.integrations import bazel_build

    args = bazel_build._parser().parse_args(["--input_dir=m", "--output_dir=o"])
    assert bazel_build.options(args) == OptimizeOptions(
        output=OutputOptions(version=1), measure=MeasureOptions(benchmark_runs=0))
    args = bazel_build._parser().parse_args(["--input_dir=m", "--output_dir=o", "--atol=0.01",
                                             "--signatures=a,b", "--nocold_start"])
    assert bazel_build.options(args) == OptimizeOptions(
        output=OutputOptions(version=1),
        measure=MeasureOptions(benchmark_runs=0, cold_start=False),
        tolerance=Tolerance(atol=0.01), build=BuildOptions(signatures=("a", "b")))


# --- tune's tree ---------------------------------------------------------------------

# Every keyword TuneOptions took when it was flat, with a value that is not the default:
# each is read back from its group (calibration_seconds and prove went with
# tune's scheduler model).
OLD_TUNE_KEYWORDS = dict(
    slo_p99_ms=100.0, clients=16, rate=50.0, rows_per_request=2, model_name="m", version=3,
    signature_name="predict", saved_model_tags="serve,gpu", examples="x.jsonl",
    intra_op=(0, 1), inter_op=(2,), max_batch_size_bound=64, padding="pow2",
    max_reject_fraction=0.01, profile_seconds=0.5, duration=3.0, warmup=1.0, recheck=False,
    protocols=("grpc",), server="local", image="img:1", current_parameters_file="b.txt",
    load_deadline=10.0, request_timeout=5.0, allow_file_ops=True, allow_unsandboxed=True,
    seed=4)
# The flags of serving-opt tune before they were made from the tree.
OLD_TUNE_FLAGS = {
    "model_base_path", "output_dir", "slo_p99_ms", "clients", "rate", "rows_per_request",
    "model_name", "version", "signature_name", "saved_model_tags", "examples",
    "tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism",
    "max_batch_size_bound", "allowed_batch_sizes", "max_reject_fraction", "profile_seconds",
    "duration", "warmup", "recheck", "protocols", "server",
    "image", "current_parameters_file", "load_deadline", "allow_file_ops",
    "allow_unsandboxed", "json", "progress"}


def test_tune_options_are_a_tree_of_small_frozen_groups_with_one_spelling():
    from serving_opt.tune.options import TuneOptions

    options = _nested(TuneOptions, OLD_TUNE_KEYWORDS)
    assert options.workload.clients == 16 and options.serving.server == "local"
    assert options.search.intra_op == (0, 1) and options.budget.seed == 4
    for group in TuneOptions.GROUPS.values():
        assert dataclasses.is_dataclass(group) and len(dataclasses.fields(group)) <= 9
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(group(), dataclasses.fields(group)[0].name, None)
    # dataclasses.replace by group, as optimize --tune does with the version.
    again = dataclasses.replace(options, model=dataclasses.replace(options.model, version=9))
    assert again.model.version == 9 and again.workload.clients == 16
    assert pickle.loads(pickle.dumps(options)) == options  # it crosses into the sandbox
    with pytest.raises(TypeError, match=r"^clients is an option of TuneOptions.workload: "
                                        r"TuneOptions\(workload=WorkloadOptions\(clients=\.\.\.\)\)$"):
        TuneOptions(clients=3)
    with pytest.raises(TypeError, match="clients is an option of TuneOptions.workload"):
        dataclasses.replace(options, clients=3)
    with pytest.raises(AttributeError, match="clients is an option of TuneOptions.workload"):
        options.clients  # noqa: B018
    with pytest.raises(TypeError, match="TuneOptions has no option 'clients_'"):
        TuneOptions(clients_=3)


def test_tune_flags_are_made_from_the_tree_and_keep_their_names_and_defaults():
    from serving_opt.cli.commands import tune as tune_cli
    from serving_opt.tune.options import TuneOptions

    fv = flags.FlagValues()
    tune_cli.define_flags(fv)
    assert set(fv) >= OLD_TUNE_FLAGS
    # New since: the interleaved proof's rounds; validate's runtime flags and Docker
    # network; the sandbox's time limit, which every sandboxed command takes.
    assert set(fv) - OLD_TUNE_FLAGS == {"rounds", "serving_version", "serving_runtime_python",
                                        "docker_network", "sandbox_timeout_seconds"}
    fv(["serving-opt", "--model_base_path=/m", "--output_dir=/o", "--slo_p99_ms=250",
        "--clients=4"])
    # No flag given: every option is the tree's default (no default written twice).
    assert tune_cli.options_from_flags(fv) == TuneOptions(
        workload=WorkloadOptions(clients=4, slo_p99_ms=250))
    assert fv["slo_p99_ms"].default is None  # required: the objective is the user's


def test_tune_flags_spelled_as_before_give_the_same_options():
    from serving_opt.cli.commands import tune as tune_cli
    from serving_opt.tune.options import TuneOptions

    fv = flags.FlagValues()
    tune_cli.define_flags(fv)
    fv(["serving-opt", "--model_base_path=/m", "--output_dir=/o", "--slo_p99_ms=100",
        "--clients=16", "--rate=50", "--rows_per_request=2", "--model_name=m", "--version=3",
        "--signature_name=predict", "--saved_model_tags=serve,gpu", "--examples=x.jsonl",
        "--tensorflow_intra_op_parallelism=0,1", "--tensorflow_inter_op_parallelism=2",
        "--max_batch_size_bound=64", "--allowed_batch_sizes=pow2",
        "--max_reject_fraction=0.01", "--profile_seconds=0.5", "--duration=3",
        "--warmup=1", "--norecheck",
        "--protocols=GRPC", "--server=local", "--image=img:1",
        "--current_parameters_file=b.txt", "--load_deadline=10", "--allow_file_ops",
        "--allow_unsandboxed"])
    expected = {k: v for k, v in OLD_TUNE_KEYWORDS.items()
                if k not in ("request_timeout", "seed")}  # never flags
    assert tune_cli.options_from_flags(fv) == _nested(TuneOptions, expected)


@pytest.mark.parametrize("flag, message", [
    ("--tensorflow_intra_op_parallelism=two", "is not 'auto' or a list of thread counts"),
    ("--allowed_batch_sizes=16,8", "--allowed_batch_sizes=16,8 must increase"),
])
def test_tune_flags_whose_text_is_parsed_are_usage_errors(flag, message):
    from serving_opt.cli.commands import tune as tune_cli

    fv = flags.FlagValues()
    tune_cli.define_flags(fv)
    fv(["serving-opt", "--model_base_path=/m", "--output_dir=/o", "--slo_p99_ms=1", flag])
    with pytest.raises(UsageError, match=message):
        tune_cli.options_from_flags(fv)
