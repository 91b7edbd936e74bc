"""The sample kinds: one entry each, its builder and the build options it takes.

A new sample is a module with a builder ``build_<kind>(export_dir, seed=0, **options)``
and one entry in :data:`KINDS`; ``build()`` and the command line
(``python -m serving_opt.samples --kind=<kind>``) then know it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from serving_opt.samples.classifier import build_classifier, build_multihead
from serving_opt.samples.convnet import build_convnet
from serving_opt.samples.keras_models import build_keras, build_keras_application
from serving_opt.samples.regressor import build_regressor
from serving_opt.samples.text_classifier import build_text_classifier
from serving_opt.samples.wide_deep import build_wide_deep


@dataclass(frozen=True)
class SampleKind:
    """``build(export_dir, seed=0, **options)`` writes the SavedModel and returns its
    directory; ``options`` names the build options (``vocab_size``, ``embedding_dim``,
    ``optimizer_slots``) it takes, which the command line may then set.
    """

    build: Callable[..., str]
    options: tuple[str, ...] = ()


KINDS: dict[str, SampleKind] = {
    "classifier": SampleKind(build_classifier),
    "multihead": SampleKind(build_multihead),
    "regressor": SampleKind(build_regressor),
    "convnet": SampleKind(build_convnet),
    "keras": SampleKind(build_keras),
    "mobilenet_v2": SampleKind(functools.partial(build_keras_application, "mobilenet_v2")),
    "resnet50": SampleKind(functools.partial(build_keras_application, "resnet50")),
    "text_classifier": SampleKind(build_text_classifier,
                                  ("vocab_size", "embedding_dim", "optimizer_slots",
                                   "train_examples")),
    "wide_deep": SampleKind(build_wide_deep, ("vocab_size", "embedding_dim")),
}


def build(kind: str, export_dir: str, seed: int = 0, **options) -> str:
    """Builds the sample model ``kind`` (one of :data:`KINDS`).

    ``options`` go to the builder: ``vocab_size``, ``embedding_dim``,
    ``optimizer_slots`` and ``train_examples`` for text_classifier; ``vocab_size`` and
    ``embedding_dim`` for wide_deep.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown sample kind {kind!r}; choose one of {', '.join(KINDS)}")
    return KINDS[kind].build(export_dir, seed, **options)
