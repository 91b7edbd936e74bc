"""The optimize pipeline's stages, one module per job (see docs/architecture.md).

freeze (``freeze``), inline and Grappler (``grappler``), the Graph Transform Tool
(``transforms``), the project's own rewrites (``rewrites``), quantize (``quantize``),
prove (``parity``, ``tf2_load``), measure (``coldstart``, ``benchmark``) and the
regression gate (``regression``). No stage imports another: what they share lives
below them, in ``serving_opt.savedmodel`` (the SavedModel library), ``serving_opt.core.gates``
(the parity and lossy rules), ``serving_opt.core.measuring`` (the measuring process),
``savedmodel.batch_norm_folding`` and ``savedmodel.conv_channels`` (graph rewrites),
and ``serving_opt.savedmodel.graph``.
"""
