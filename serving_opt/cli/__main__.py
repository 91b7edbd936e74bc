"""``python -m serving_opt.cli``: the same as the ``serving-opt`` script."""

from serving_opt.cli.main import run

run()
