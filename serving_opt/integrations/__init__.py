"""Where serving_opt plugs into other tools: Estimator exporters, Keras, Bazel.

Public paths: ``serving_opt.estimator`` and ``serving_opt.keras`` (aliases of the
modules here) and the Bazel rule in ``//serving_opt:defs.bzl``.
"""
