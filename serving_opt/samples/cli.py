"""Small but realistic SavedModels to try the tool on (and to test it with).

Usage:
    python -m serving_opt.samples --kind=classifier --output_dir=build/sample/1
    python -m serving_opt.samples --kind=text_classifier --output_dir=build/big/1 \\
        --vocab_size=1000000 --embedding_dim=256   # ~2 GB, see build_text_classifier
    python -m serving_opt.samples --kind=wide_deep --output_dir=build/wide_deep/1

A build option flag applies only to the kinds whose entry in serving_opt.samples.kinds
takes it; given to another kind it is a usage error. An output directory that already
holds a SavedModel is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from serving_opt.samples.kinds import KINDS

# Build option -> the flag that sets it (``--no<option>`` sets a boolean option False).
_FLAGS = {
    "vocab_size": "--vocab_size",
    "embedding_dim": "--embedding_dim",
    "optimizer_slots": "--nooptimizer_slots",
    "train_examples": "--train_examples",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m serving_opt.samples``: builds one sample; 0 on success."""
    import argparse

    # Named explicitly: argparse would call the package's entry point "__main__.py".
    parser = argparse.ArgumentParser(prog="python -m serving_opt.samples",
                                     description=__doc__.splitlines()[0])
    # The samples use deprecated-but-real TF1 APIs on purpose (that is what Estimators
    # exported); their deprecation warnings and TF's C++ start-up lines are noise here.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from serving_opt.savedmodel import tf_process

    tf_process.quiet_tensorflow_import()
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    parser.add_argument("--kind", choices=tuple(KINDS), default="classifier")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="text_classifier and wide_deep: words (items) in vocab.txt "
                             "(default 20000, wide_deep 100000)")
    parser.add_argument("--embedding_dim", type=int, default=None,
                        help="text_classifier and wide_deep: embedding width "
                             "(default 64, wide_deep 32)")
    parser.add_argument("--nooptimizer_slots", dest="optimizer_slots", action="store_false",
                        help="text_classifier only: no Adagrad slot for the embedding "
                             "(halves the export at full size)")
    parser.add_argument("--train_examples", type=int, default=0,
                        help="text_classifier only: train on this many texts first "
                             "(a real trained table; 1000000 for the 1M vocabulary)")
    args = parser.parse_args(argv)
    for name, least in (("vocab_size", 1), ("embedding_dim", 1), ("train_examples", 0)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            parser.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    options = _build_options(parser, args)
    if os.path.exists(os.path.join(args.output_dir, "saved_model.pb")):
        print(f"{args.output_dir} already holds a SavedModel; leaving it as it is")
        return 0
    KINDS[args.kind].build(args.output_dir, args.seed, **options)
    print(f"wrote {args.kind} SavedModel to {args.output_dir}")
    return 0


def _build_options(parser, args) -> dict:
    """The build options the flags set; a usage error for one the kind does not take."""
    given = {name: getattr(args, name) for name in _FLAGS
             if getattr(args, name) != parser.get_default(name)}
    takes = KINDS[args.kind].options
    if given and not takes:
        kinds = [kind for kind, entry in KINDS.items() if entry.options]
        parser.error(f"{_listed(list(_FLAGS.values()))} apply to --kind={_listed(kinds)} only")
    for name in given:
        if name not in takes:
            kinds = [kind for kind, entry in KINDS.items() if name in entry.options]
            parser.error(f"{_FLAGS[name]} applies to --kind={_listed(kinds)} only")
    return given


def _listed(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))
