"""The optimize pipeline, in the order a run goes through it.

1. ``plan``: every usage error, before any work (options, specs, paths, version).
2. ``optimizer.read``: the SavedModel or frozen ``.pb``, every signature, checked as
   untrusted code before anything of it runs.
3. ``building``: one candidate's stages: freeze, inline, transform, grappler, rewrite,
   quantize, write; ``attempts`` decides which candidates are tried and why each was left.
4. ``worker``: the stages run in a sandboxed process; ``candidate_check`` loads what was
   written in a fresh one.
5. ``proving``: parity and lossy gates, then the measurements; ``pinning`` keeps a pinned
   input shape only when it is faster.
6. ``optimizer.publish``: the version directory appears atomically; ``run`` and ``report``
   are the run's record and how people and pipelines read it.
"""
