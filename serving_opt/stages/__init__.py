"""The optimize pipeline's stages, one module per job (see docs/architecture.md).

read (``loader``), freeze (``freeze``), inline and Grappler (``grappler``), the Graph
Transform Tool (``transforms``), the project's own rewrites (``rewrites``), write
(``writer``), prove (``parity``, with ``inputs``), measure (``benchmark``).
"""
