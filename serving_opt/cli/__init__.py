"""The ``serving-opt`` command line: a thin absl layer over the Python API.

``main.py`` dispatches to one module per command in ``commands/``;
``python -m serving_opt.cli`` runs it.
"""
