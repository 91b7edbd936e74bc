"""``make corpus``: every model of the real-export corpus (tests/corpus) through
``serving-opt inspect`` and ``optimize`` with defaults (measuring off), then the
independent parity check; one line per model and the tally.

A model passes when it publishes with parity, or when the manifest expects a refusal
(``"expect": "refuse"``, with the words the one-line reason must contain) and the tool
refuses it with that reason. Exit 1 otherwise.

    .venv/bin/python tools/corpus_report.py [--only=SUBSTRING] [--extra_dir=DIR]
        [--json=build/corpus/report.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import corpus_check  # noqa: E402


def expected(entry: dict, result: corpus_check.Result) -> bool:
    """Whether ``result`` is what the manifest says is right for the model."""
    if result.inspect_exit != (1 if entry["id"] in corpus_check.EXPECTED_INSPECT_ERRORS else 0):
        return False
    if entry.get("expect") == "refuse":
        return result.verdict == "refused" and \
            entry.get("refuse_reason", "") in result.reason
    return result.verdict == "published" and "no independent input" not in result.reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only models whose id contains this")
    parser.add_argument("--json", default="build/corpus/report.json")
    parser.add_argument("--extra_dir", default=os.environ.get("CORPUS_EXTRA") or None,
                        help="also every SavedModel under this directory (models that "
                             "cannot be committed, e.g. TF Serving's testdata)")
    args = parser.parse_args()
    entries = [e for e in corpus_check.corpus_entries(args.extra_dir) if args.only in e["id"]]
    results, good = [], 0
    with tempfile.TemporaryDirectory(prefix="corpus-") as workdir:
        for n, entry in enumerate(entries, 1):
            print(f"[{n}/{len(entries)}] {entry['id']} ...", file=sys.stderr, flush=True)
            result = corpus_check.check_model(entry, workdir)
            ok = expected(entry, result)
            good += ok
            print(("ok   " if ok else "FAIL ") + result.line(), flush=True)
            results.append({**dataclasses.asdict(result), "as_expected": ok})
    published = sum(r["verdict"] == "published" for r in results)
    refused = sum(r["verdict"] == "refused" for r in results)
    print(f"\n{len(results)} models: {published} published with parity, {refused} refused, "
          f"{len(results) - published - refused} failed the independent parity check; "
          f"{good} of {len(results)} as expected")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if good == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
