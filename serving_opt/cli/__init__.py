"""The ``serving-opt`` command line: a thin absl layer over the Python API.

``main.py`` dispatches to one module per command in ``commands/``;
``python -m serving_opt.cli`` runs it.
"""

from serving_opt.cli.main import run  # noqa: E402,F401 - entry points installed before 0.2
