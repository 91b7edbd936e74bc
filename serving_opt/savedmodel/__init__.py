"""The SavedModel library under the stages: reading, feeds, example readers, checkpoints,
writing, staging.

Stages, serving and compare all use it; it imports no stage (checked by the import
contracts in ``pyproject.toml``).
"""
