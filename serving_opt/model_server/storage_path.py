"""Which version directories of a model base path should be served (the "aspired" versions).

Mirrors file_system_storage_path_source.cc: children of the base path whose names parse as
integers (``ParseVersionNumber`` = ``strings::safe_strto64``: C whitespace around, an
optional ``-`` but no ``+``, ASCII digits, within int64) are versions, anything else is
ignored; ``02`` and ``2`` are both version 2 and the later name in sorted order is served,
with upstream's warning. The version policy picks the latest N (default 1), all, or
specific versions. A missing base path is an error for the whole poll, as in C++.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from serving_opt.model_server.status import invalid_argument
from serving_opt.savedmodel.writer import served_version

log = logging.getLogger("serving_opt.model_server")


@dataclass(frozen=True, order=True)
class AspiredVersion:
    """A version the source wants loaded, and the directory to load it from."""

    version: int
    path: str


def parse_version(name: str) -> int | None:
    """A child directory name as a version number, or None if it is not one.

    The optimizer's writer counts versions with the same function, so the version it
    publishes is the one this server (and TF Serving) serves.
    """
    return served_version(name)


def _children_by_version(base_path: str) -> dict[int, str]:
    by_version: dict[int, str] = {}
    # Sorted like the C++ std::set, so the same duplicate ("1" vs "01") wins.
    for child in sorted(os.listdir(base_path)):
        version = parse_version(child)
        if version is None:
            continue
        if version in by_version:
            log.warning(
                "Duplicate version directories detected. Version %d will be loaded from %s, "
                "%s will be ignored.", version, child, by_version[version],
            )
        by_version[version] = child
    return by_version


def aspired_versions(name: str, base_path: str, policy) -> list[AspiredVersion]:
    """Polls ``base_path`` once; ``policy`` is a ``ServableVersionPolicy`` proto.

    Raises ServingStatusError INVALID_ARGUMENT if the base path does not exist.
    """
    if not os.path.exists(base_path):
        raise invalid_argument(
            f"Could not find base path {base_path} for servable {name} with error NOT_FOUND: "
            f"{base_path} not found"
        )
    kind = policy.WhichOneof("policy_choice")
    if kind == "specific":
        wanted = list(policy.specific.versions)
        if not wanted:
            log.warning("No specific versions requested for servable %s.", name)
            return []
        # C++ fast path: every requested version present under its canonical name.
        canonical = [os.path.join(base_path, str(v)) for v in wanted]
        if all(os.path.exists(p) for p in canonical):
            return [AspiredVersion(v, p) for v, p in zip(wanted, canonical)]
    by_version = _children_by_version(base_path)
    if kind == "all":
        chosen = sorted(by_version)
    elif kind == "specific":
        chosen = sorted(v for v in by_version if v in set(policy.specific.versions))
        for version in sorted(set(policy.specific.versions) - set(chosen)):
            log.warning(
                "Version %d of servable %s, which was requested to be served as a 'specific' "
                "version in the servable's version policy, was not found in the file system",
                version, name,
            )
    else:  # "latest" or unset: the default policy serves the single highest version
        count = max(policy.latest.num_versions, 1) if kind == "latest" else 1
        chosen = sorted(by_version)[-count:]
    if not chosen:
        log.warning(
            "No versions of servable %s found under base path %s. Did you forget to name your "
            "leaf directory as a number (eg. '/1/')?", name, base_path,
        )
    return [AspiredVersion(v, os.path.join(base_path, by_version[v])) for v in chosen]
