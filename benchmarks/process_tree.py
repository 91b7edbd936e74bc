"""A process and its descendants as the host's /proc shows them (for the benchmarks that
measure a sandboxed run, whose worker is a grandchild a whole-process timer misses).

    stats = tree_stats(process.pid)     # {pid: /proc/<pid>/stat fields after the name}
"""

from __future__ import annotations

import os


def tree_stats(root: int) -> dict[int, list[str]]:
    """``/proc/<pid>/stat`` of ``root`` and its live descendants, each as its fields after
    the command name (index 1 is the parent, 11-14 the processor times, 21 the RSS in
    pages), keyed by pid.

    Example:
        >>> sorted(tree_stats(os.getpid()))[:1] == [os.getpid()]
        True
    """
    fields: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields[int(name)] = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, stat in fields.items():
            if child not in tree and len(stat) > 1 and stat[1] == str(pid):
                tree.add(child)
                frontier.append(child)
    return {pid: fields[pid] for pid in tree if pid in fields}
