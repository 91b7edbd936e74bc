"""Entry point of `bazel run //serving_opt:optimize`: the `optimize` command of the CLI."""
from serving_opt.cli import main as cli

if __name__ == "__main__":
    cli.run(default_command="optimize")
