"""What a sandbox binds for another Python interpreter (``--serving_runtime_python``).

The interpreter is asked where it lives, once, outside any model (``-I -S``: no site
code, no user site, no environment): its prefixes, its library paths and its real
executable. Of each prefix only what an installation is made of is bound, read-only:
``bin``, ``lib``, ``lib64`` and a venv's ``pyvenv.cfg``. A prefix that is ``/``, a
home directory (or holds one), or is not an installation (no ``lib/pythonX.Y``) is
refused: binding it would show a model whatever else lies there.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

from serving_opt.errors import UsageError

# -S: site would set a venv's prefix (Python < 3.12) but also runs its .pth files, so
# the venv is found here as site finds it, from pyvenv.cfg beside or above the executable.
_WHERE_SCRIPT = r"""
import json, os, sys, sysconfig
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
venv = next((d for d in (exe_dir, os.path.dirname(exe_dir))
             if os.path.isfile(os.path.join(d, "pyvenv.cfg"))), None)
paths = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
if venv:
    paths += [sysconfig.get_paths(vars={"base": venv, "platbase": venv})[k]
              for k in ("purelib", "platlib")]
print(json.dumps({"prefixes": [sys.prefix, sys.base_prefix, sys.exec_prefix,
                               sys.base_exec_prefix], "venv": venv, "paths": paths,
                  "executable": os.path.realpath(sys.executable),
                  "version": "%d.%d" % sys.version_info[:2]}))
"""
_FLAG = "--serving_runtime_python"
_SYSTEM = ("/usr",)  # bound for every sandbox already


def interpreter_dirs(python: str | None) -> list[str]:
    """What to bind read-only for ``python``; UsageError for an interpreter whose
    installation cannot be told apart from what surrounds it."""
    if not python:
        return []
    return list(_resolve(os.path.abspath(python)))


def _resolve(python: str) -> tuple[str, ...]:
    where = _ask(python)
    venv = where["venv"]
    prefixes = dict.fromkeys(os.path.realpath(p) for p in [*where["prefixes"],
                                                          *([venv] if venv else [])])
    lib = os.path.join("lib", f"python{where['version']}")
    binds = [python, where["executable"]]
    for prefix in prefixes:
        _check_prefix(python, prefix, lib)
        if prefix in _SYSTEM:
            continue
        for name in ("bin", "lib", "lib64", "pyvenv.cfg"):
            path = os.path.join(prefix, name)
            if not os.path.lexists(path):
                continue
            # Bound at its real path: a link out of the installation (lib -> ~) is not it.
            if not any(_within(os.path.realpath(path), p) for p in prefixes):
                raise UsageError(f"{_FLAG}={python}: {path} leads out of its installation "
                                 f"(to {os.path.realpath(path)}); nothing was run",
                                 "point it at a venv or an installation of its own")
            binds.append(path)
    for path in where["paths"]:
        real = os.path.realpath(path)
        if os.path.exists(real) and not any(_within(real, p) for p in prefixes):
            raise UsageError(f"{_FLAG}={python}: its library directory {real} is outside "
                             f"its installation ({', '.join(prefixes)}); nothing was run",
                             "point it at a venv's or an installation's bin/python")
    return tuple(dict.fromkeys(binds))


@functools.lru_cache(maxsize=8)
def _ask(python: str) -> dict:
    try:
        done = subprocess.run([python, "-I", "-S", "-c", _WHERE_SCRIPT], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        where = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        where = None
    if not isinstance(where, dict):
        raise UsageError(f"{_FLAG}={python} does not run as a Python interpreter; nothing "
                         "was run", "point it at a Python interpreter with TensorFlow")
    return where


def _check_prefix(python: str, prefix: str, lib: str) -> None:
    why = None
    if prefix == "/":
        why = "is /"
    elif any(_within(home, prefix) for home in _homes()):
        why = "is or holds a home directory"
    elif not os.path.isdir(os.path.join(prefix, lib)):
        why = f"has no {lib} (not an installation)"
    if why:
        raise UsageError(f"{_FLAG}={python}: its prefix {prefix} {why}, and a sandbox "
                         "binding it would show the model everything there; nothing was run",
                         "point it at a venv or an installation of its own (e.g. "
                         "python3 -m venv ~/.venvs/tf215)")


def _homes() -> set[str]:
    """Home directories: this user's and every regular user's (uid 1000 and up)."""
    import pwd

    homes = {os.environ.get("HOME", ""), *(e.pw_dir for e in pwd.getpwall()
                                           if e.pw_uid >= 1000 and e.pw_uid != 65534)}
    try:
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    return {os.path.realpath(h) for h in homes if h and h != "/"}


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")
