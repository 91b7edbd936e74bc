"""Small but realistic SavedModels to try the tool on (and to test it with).

They mimic what Estimators export (TF1 graphs, tf.Example parsing receivers,
vocabulary-file tables, classify/regress/predict signatures) but are built with
``tf.compat.v1`` so they exist on TF 2.16+ where ``tf.estimator`` is gone. Each
builder takes seconds and is deterministic for a given seed.

One module per kind (``classifier``, ``regressor``, ``convnet``, ``keras_models``,
``text_classifier``, ``wide_deep``), their shared TF1 layers in ``tf1``, the registry
of kinds in ``kinds`` and the command line in ``cli``.

Usage:
    python -m serving_opt.samples --kind=classifier --output_dir=build/sample/1
    python -m serving_opt.samples --kind=text_classifier --output_dir=build/big/1 \\
        --vocab_size=1000000 --embedding_dim=256   # ~2 GB, see build_text_classifier
    python -m serving_opt.samples --kind=wide_deep --output_dir=build/wide_deep/1
"""

from serving_opt.samples.classifier import CLASS_NAMES, build_classifier, build_multihead
from serving_opt.samples.cli import main
from serving_opt.samples.convnet import build_convnet
from serving_opt.samples.features import VOCABULARY, sample_examples
from serving_opt.samples.keras_models import (
    KERAS_APPLICATIONS,
    build_keras,
    build_keras_application,
)
from serving_opt.samples.kinds import KINDS, SampleKind, build
from serving_opt.samples.regressor import build_regressor
from serving_opt.samples.text_classifier import (
    TEXT_CLASS_NAMES,
    TEXT_OOV_BUCKETS,
    build_text_classifier,
    text_examples,
    text_vocabulary,
    topic_texts,
    word_topics,
)
from serving_opt.samples.tf1 import ADAGRAD_INITIAL_ACCUMULATOR
from serving_opt.samples.wide_deep import (
    WIDE_DEEP_COUNTRIES,
    WIDE_DEEP_DEVICES,
    WIDE_DEEP_OOV_BUCKETS,
    WIDE_DEEP_USER_BUCKETS,
    build_wide_deep,
    wide_deep_examples,
    wide_deep_vocabulary,
)

__all__ = [
    "ADAGRAD_INITIAL_ACCUMULATOR",
    "CLASS_NAMES",
    "KERAS_APPLICATIONS",
    "KINDS",
    "SampleKind",
    "TEXT_CLASS_NAMES",
    "TEXT_OOV_BUCKETS",
    "VOCABULARY",
    "WIDE_DEEP_COUNTRIES",
    "WIDE_DEEP_DEVICES",
    "WIDE_DEEP_OOV_BUCKETS",
    "WIDE_DEEP_USER_BUCKETS",
    "build",
    "build_classifier",
    "build_convnet",
    "build_keras",
    "build_keras_application",
    "build_multihead",
    "build_regressor",
    "build_text_classifier",
    "build_wide_deep",
    "main",
    "sample_examples",
    "text_examples",
    "text_vocabulary",
    "topic_texts",
    "word_topics",
    "wide_deep_examples",
    "wide_deep_vocabulary",
]
