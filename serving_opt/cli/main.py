"""`serving-opt`: a thin absl-flags command line over the Python API.

    serving-opt <command> --flag=value ...

Each command lives in ``serving_opt/cli/commands/<name>.py`` and provides ``SUMMARY``
(one line), ``define_flags(flag_values)`` and ``main(flag_values) -> int``. Flags
follow TF's own tools: ``--saved_model_dir=DIR``, ``--nofoo`` for booleans. An option's
flag is made from its field in ``serving_opt.options`` (``option_flags``); a model
directory is ``--saved_model_dir`` (``--<role>_saved_model_dir`` for one of two) and a
model base ``--model_base_path`` in every command (``define_model_dir``).
Failures print one line on stderr and exit 1 (2 for usage errors); a traceback
only with ``--verbosity=1`` or more.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from collections.abc import Sequence

from absl import flags

from serving_opt.core.rendering import printable
from serving_opt.errors import (
    EXIT_FAILURE,
    EXIT_USAGE,
    ServingOptError,
    UsageError,
    first_line,
    storage_error,
)

PROG = "serving-opt"
COMMANDS = ("inspect", "optimize", "validate", "serve", "compare", "tune")


def _command_module(name: str):
    return importlib.import_module(f"serving_opt.cli.commands.{name}")


def _top_usage() -> str:
    lines = [f"usage: {PROG} <command> [--flags]", "", "commands:"]
    for name in COMMANDS:
        try:
            summary = _command_module(name).SUMMARY
        except ImportError:
            continue
        lines.append(f"  {name:<10} {summary}")
    lines += ["", f"Run `{PROG} <command> --help` for the flags of one command."]
    return "\n".join(lines)


def _command_usage(name: str, fv: flags.FlagValues) -> str:
    module = _command_module(name)
    doc = (module.__doc__ or module.SUMMARY).strip()
    body = fv.get_help(include_special_flags=False).replace(f"{module.__name__}:\n", "")
    return f"usage: {PROG} {name} [--flags]\n\n{doc}\n\nflags:\n{body}"


def _quiet_tensorflow(verbosity: int, import_now: bool = True) -> None:
    # TF's C++ and Python loggers bury the one line that matters; keep them quiet by default.
    # `optimize` and `validate` import nothing of TensorFlow before their usage errors
    # (optimize's sandboxed worker imports it; unsandboxed, its read stage imports it
    # quietly; validate once the model base is found), so a usage error costs no import.
    if verbosity <= 0:
        # 3: TF's C++ errors too (cuInit on GPU-less machines, ignored transform errors);
        # real failures still reach us as Python exceptions.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import logging

        logging.getLogger("tensorflow").setLevel(logging.ERROR)
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
        # TF 2.19+ prints CUDA/CPU-feature lines from C++ at import, before logging is set up.
        if import_now:
            from serving_opt.savedmodel import tf_process

            tf_process.quiet_tensorflow_import()


def _terminate_like_interrupt() -> None:
    """SIGTERM (a cancelled pipeline step, `docker stop`) unwinds like Ctrl-C, so the
    `finally` blocks run: servers we started are stopped, staging dirs removed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def run(argv: Sequence[str] | None = None, default_command: str | None = None) -> int:
    """Parses ``argv`` (default ``sys.argv``) and runs one command; exits the process."""
    sys.exit(main(argv, default_command))


def main(argv: Sequence[str] | None = None, default_command: str | None = None) -> int:
    """Like :func:`run` but returns the exit code instead of exiting.

    Ctrl-C (or SIGTERM) at any point, TensorFlow's import included, ends with one line
    saying what was published, and exit code 130.
    """
    argv = list(sys.argv if argv is None else argv)
    try:
        return _main(argv, default_command)
    except KeyboardInterrupt:
        args = argv[1:]
        command = args[0] if args and not args[0].startswith("-") else default_command
        print(interrupted_message(command), file=sys.stderr, flush=True)
        return 130


# An integer flag's text: ASCII decimal digits, an optional leading '-'. absl's own
# IntegerParser takes whatever int() takes: "0x10" (16), "0o7", "1_0" (10), " 5", and
# non-ASCII digits ("٣" is 3).
_DECIMAL = re.compile(r"-?[0-9]+")
_NOT_A_VERSION = "not a version: TF Serving names versions by decimal ASCII digits only"


def check_version_flag(text: str) -> int:
    """``--version``'s text as a version TF Serving reads: ASCII decimal digits only.

    absl would read ``--version=0x10`` as 16 and ``--version=٣`` as 3, and publish them as
    directories 16 and 3. Raises UsageError (exit code 2). Values beyond int64 pass here
    and are refused, with the int64 range in the message, by the optimizer's checks.
    """
    if not (text.isascii() and text.isdigit()):
        raise UsageError(f"--version={text!r} is {_NOT_A_VERSION}",
                         "pass --version=N, e.g. --version=3")
    return int(text)


class _DecimalIntegerParser(flags.IntegerParser):
    """absl's IntegerParser without hex, octal, underscores, spaces or non-ASCII digits."""

    def __init__(self, name: str, lower_bound=None, upper_bound=None) -> None:
        super().__init__(lower_bound, upper_bound)
        self._name = name

    def convert(self, argument):
        if isinstance(argument, str):
            if self._name == "version":
                try:
                    return check_version_flag(argument)
                except UsageError:
                    # absl prefixes "flag --version=...: "; the text need not repeat it.
                    raise ValueError(f"{_NOT_A_VERSION} (e.g. --version=3)") from None
            if not _DECIMAL.fullmatch(argument):
                raise ValueError(f"{argument!r} is not a decimal integer (ASCII digits 0-9)")
        return super().convert(argument)


def strict_integer_flags(fv: flags.FlagValues) -> None:
    """Makes every integer flag of ``fv`` accept decimal ASCII digits only (see
    :func:`check_version_flag`); a bad value is then absl's usage error (exit code 2).
    """
    for name in list(fv):
        flag = fv[name]
        parser = flag.parser
        if type(parser) is flags.IntegerParser:  # exactly: a subclass keeps its own rules
            flag.parser = _DecimalIntegerParser(name, parser.lower_bound, parser.upper_bound)


def _published_statement() -> str:
    """A true statement of what this process published (writer.publish records each)."""
    staging = sys.modules.get("serving_opt.savedmodel.staging")
    published = list(getattr(staging, "published", ()))
    if published:
        return f"{', '.join(published)} was published (complete)"
    return "nothing was published"


def interrupted_message(command: str | None) -> str:
    """The one line for an interrupted command: a true statement of what was published."""
    # Only writer.publish() publishes, and it records each version it renamed into place.
    staging = sys.modules.get("serving_opt.savedmodel.staging")
    published = list(getattr(staging, "published", ()))
    where = f"{PROG} {command}" if command in COMMANDS else PROG
    if published:
        what = f"interrupted after publishing {', '.join(published)} (complete)"
    elif command in ("optimize", "validate"):
        what = "interrupted; nothing was published"
    else:
        what = "interrupted"
    return (f"{where}: {what}; any server or staging directory it had started is stopped "
            "and removed")


def _main(argv: list[str], default_command: str | None) -> int:
    # `bazel run` starts us inside the runfiles tree; the user's paths are relative to where
    # they typed the command.
    if os.environ.get("BUILD_WORKING_DIRECTORY"):
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    args = argv[1:]
    if args and not args[0].startswith("-"):
        command, args = args[0], args[1:]
    elif default_command:
        command = default_command
    else:
        if args and args[0] in ("-h", "--help", "-help", "--helpfull"):
            print(_top_usage())
            return 0
        print(_top_usage(), file=sys.stderr)
        return EXIT_USAGE
    if command not in COMMANDS:
        print(
            f"{PROG}: unknown command {command!r}; choose one of {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE

    try:
        module = _command_module(command)
    except ImportError as e:
        print(f"{PROG} {command}: internal error: cannot import the command ({e}); "
              "reinstall with `make venv`", file=sys.stderr)
        return EXIT_FAILURE
    fv = flags.FlagValues()
    flags.DEFINE_integer(
        "verbosity", 0, "0: one-line errors; 1: tracebacks and TensorFlow logs.", flag_values=fv,
        module_name=module.__name__,
    )
    module.define_flags(fv)
    strict_integer_flags(fv)  # --version=0x10 and --version=٣ are usage errors
    if any(a in ("-h", "--help", "-help", "--helpfull") for a in args):
        print(_command_usage(command, fv))
        return 0
    try:
        leftover = fv([f"{PROG} {command}", *args])
    except flags.Error as e:
        print(f"{PROG} {command}: {e}; see `{PROG} {command} --help`", file=sys.stderr)
        return EXIT_USAGE
    # `serving-opt compare ... -- --project=p`: what follows -- is the command's own.
    passes_args = getattr(module, "PASSES_ARGS_AFTER_DASHES", False)
    if len(leftover) > 1 and not (passes_args and "--" in args):
        print(
            f"{PROG} {command}: unexpected argument(s) {' '.join(leftover[1:])}; "
            f"flags take the form --name=value, see `{PROG} {command} --help`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    missing = [f for f in fv.flags_by_module_dict().get(module.__name__, [])
               if getattr(f, "_required", False) and f.value is None]
    if missing:
        print(
            f"{PROG} {command}: missing required flag(s) "
            f"{', '.join(_spelled(f) for f in missing)}; see `{PROG} {command} --help`",
            file=sys.stderr,
        )
        return EXIT_USAGE

    verbosity = fv.verbosity
    _terminate_like_interrupt()
    configure = getattr(module, "configure_runtime", None)
    if configure is not None:
        configure()  # before TensorFlow is imported, or it is too late
    _quiet_tensorflow(verbosity, import_now=command not in ("optimize", "validate"))
    try:
        return int((module.main(fv, leftover[1:]) if passes_args else module.main(fv)) or 0)
    except ServingOptError as e:
        if verbosity > 0:
            traceback.print_exc()
        # A model's names reach error lines: escaped, none can drive the terminal.
        print(f"{PROG} {command}: error: {printable(e.one_line())}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # `serving-opt inspect ... | head`: the reader left; stop quietly like Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001 - the last line of defence for a one-line error
        if verbosity > 0:
            traceback.print_exc()
        # A full disk is not a bug to report: one line saying where, and what was published.
        full = storage_error(e, published=_published_statement())
        if full is not None:
            print(f"{PROG} {command}: error: {printable(full.one_line())}", file=sys.stderr)
            return full.exit_code
        first = first_line(e)
        print(
            f"{PROG} {command}: internal error: {type(e).__name__}: {printable(first)}; "
            "rerun with --verbosity=1 for the traceback and report it",
            file=sys.stderr,
        )
        return EXIT_FAILURE


def required(flag_name: str, fv: flags.FlagValues) -> None:
    """Marks a flag as required for the CLI's missing-flag check (exit 2).

    absl's own mark_flag_as_required registers a validator on the global FLAGS only.
    """
    fv[flag_name]._required = True


# The model directory flags, the same in every command: a SavedModel (version) directory
# is --saved_model_dir, or --<role>_saved_model_dir where a command takes two (compare's
# baseline and candidate, validate's reference); a model base (the directory of numbered
# versions) is --model_base_path, TF Serving's own name. Older names stay as aliases.
SAVED_MODEL_DIR = "saved_model_dir"
MODEL_BASE_PATH = "model_base_path"


def define_model_dir(fv: flags.FlagValues, name: str, help_text: str, *,
                     aliases: Sequence[str] = (), is_required: bool = True) -> None:
    """Defines one model directory flag (``name`` follows the convention above) and its
    old names as aliases, for the calling command.
    """
    check_model_dir_name(name)
    module_name = sys._getframe(1).f_globals["__name__"]
    flags.DEFINE_string(name, None, help_text, flag_values=fv, module_name=module_name)
    for old in aliases:
        alias(old, name, fv, module_name)
    if is_required:
        required(name, fv)


def check_model_dir_name(name: str) -> None:
    """ValueError unless ``name`` follows the model directory flag convention."""
    if name not in (SAVED_MODEL_DIR, MODEL_BASE_PATH) \
            and not name.endswith("_" + SAVED_MODEL_DIR):
        raise ValueError(f"--{name} does not follow the model directory flag convention")


def alias(old: str, name: str, fv: flags.FlagValues, module_name: str | None = None) -> None:
    """``--old`` sets ``--name``, as it did before the flag was renamed."""
    module_name = module_name or sys._getframe(1).f_globals["__name__"]
    flags.DEFINE_alias(old, name, flag_values=fv, module_name=module_name)
    fv[name]._aliases = (*getattr(fv[name], "_aliases", ()), old)


def _spelled(flag) -> str:
    """``--model_base_path (or --output_base)``: a required flag with its old names."""
    aliases = getattr(flag, "_aliases", ())
    return f"--{flag.name}" + (f" (or {', '.join('--' + a for a in aliases)})"
                               if aliases else "")


if __name__ == "__main__":
    run()
