"""The optimize pipeline's stages, one module per job (see docs/architecture.md).

freeze (``freeze``), inline and Grappler (``grappler``), the Graph Transform Tool
(``transforms``), the project's own rewrites (``rewrites``), quantize (``quantize``),
prove (``parity``, ``tf2_load``), measure (``coldstart``, ``benchmark``) and the
regression gate (``regression``). What they share lives in ``serving_opt.savedmodel``.
"""
