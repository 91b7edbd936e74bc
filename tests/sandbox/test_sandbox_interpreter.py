"""--serving_runtime_python binds that interpreter's installation only: never the home
directory it is reached from, nor a prefix that is not an installation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from serving_opt import sandbox
from serving_opt.errors import UsageError

SECRET = "home-secret-51c2"
_PROBE = textwrap.dedent("""
    import json, sys
    out = {}
    for name, path in (("secret", sys.argv[1]), ("inside", sys.argv[2])):
        try:
            out[name] = open(path).read()
        except OSError as e:
            out[name] = type(e).__name__
    print(json.dumps(out))
""")


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret.txt").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    return home


def _probe(python: str, policy: sandbox.Policy, secret: str, inside: str) -> dict:
    process = sandbox.popen([python, "-c", _PROBE, secret, inside], policy,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=120)
    finally:
        sandbox.release(process)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_an_interpreter_linked_from_home_shows_its_installation_not_home(home):
    base = os.path.realpath(sys.executable)
    (home / "bin").mkdir()
    given = home / "bin" / "python"
    given.symlink_to(base)
    inside = os.path.join(os.path.dirname(os.__file__), "os.py")  # the stdlib, a prefix's
    seen = _probe(str(given), sandbox.Policy(read_only=tuple(sandbox.interpreter_dirs(
        str(given)))), str(home / "secret.txt"), inside)
    assert seen["secret"] == "FileNotFoundError"
    assert seen["inside"].startswith('r"""OS routines')
    # CONTROL: the same probe bound as the grandparent rule bound it reads the secret.
    old = _probe(str(given), sandbox.Policy(read_only=(str(home), base)),
                 str(home / "secret.txt"), inside)
    assert old["secret"] == SECRET


def test_a_venv_in_home_shows_its_bin_and_lib_only(home):
    base = os.path.realpath(sys.executable)
    venv = home / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "secret.txt").write_text(SECRET)
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    (site / "inside.txt").write_text("inside")
    python = str(venv / "bin" / "python")
    policy = sandbox.Policy(read_only=tuple(sandbox.interpreter_dirs(python)))
    for secret in (home / "secret.txt", venv / "secret.txt"):
        seen = _probe(python, policy, str(secret), str(site / "inside.txt"))
        assert seen == {"secret": "FileNotFoundError", "inside": "inside"}


def test_an_installation_whose_prefix_is_home_is_refused(home, tmp_path, monkeypatch):
    base = os.path.realpath(sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(home)], check=True)
    python = str(home / "bin" / "python")
    with pytest.raises(UsageError, match="--serving_runtime_python=.*home directory") as e:
        sandbox.interpreter_dirs(python)
    assert "\n" not in e.value.problem
    # CONTROL: the same installation is bound where it is not a home.
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    assert str(home / "lib") in sandbox.interpreter_dirs(python)


def _fake_interpreter(tmp_path, where: dict) -> str:
    path = tmp_path / f"python-{len(os.listdir(tmp_path))}"
    path.write_text(f"#!/bin/sh\necho '{json.dumps(where)}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("layout,why", [
    ("root", "its prefix / is /"),
    ("bare", "not an installation"),
    ("outside", "outside its installation"),
])
def test_a_prefix_that_is_not_an_installation_is_refused(tmp_path, layout, why):
    install = tmp_path / "install"
    (install / "lib" / "python3.11").mkdir(parents=True)
    bare = tmp_path / "bare"
    bare.mkdir()
    prefix = {"root": "/", "bare": str(bare), "outside": str(install)}[layout]
    paths = [str(tmp_path)] if layout == "outside" else [str(install / "lib" / "python3.11")]
    python = _fake_interpreter(tmp_path, {"prefixes": [prefix] * 4, "venv": None,
                                          "paths": paths, "executable": "/bin/sh",
                                          "version": "3.11"})
    with pytest.raises(UsageError, match=why):
        sandbox.interpreter_dirs(python)
    # CONTROL: the installation itself is accepted.
    good = _fake_interpreter(tmp_path, {"prefixes": [str(install)] * 4, "venv": None,
                                        "paths": [str(install / "lib" / "python3.11")],
                                        "executable": "/bin/sh", "version": "3.11"})
    assert str(install / "lib") in sandbox.interpreter_dirs(good)


def test_a_library_directory_linked_out_of_the_installation_is_refused(tmp_path, home):
    install = tmp_path / "install"
    install.mkdir()
    (home / "python3.11").mkdir()
    (install / "lib").symlink_to(home)  # lib/python3.11 exists: through the link, in ~
    where = {"prefixes": [str(install)] * 4, "venv": None,
             "paths": [str(install / "lib" / "python3.11")], "executable": "/bin/sh",
             "version": "3.11"}
    with pytest.raises(UsageError, match="leads out of its installation"):
        sandbox.interpreter_dirs(_fake_interpreter(tmp_path, where))
    # CONTROL: a real directory there is bound.
    (install / "lib").unlink()
    (install / "lib" / "python3.11").mkdir(parents=True)
    assert str(install / "lib") in sandbox.interpreter_dirs(_fake_interpreter(tmp_path, where))


def test_serving_opts_own_interpreter_shows_its_installation_not_its_whole_prefix():
    # The prefix of the interpreter running serving_opt holds what its owner put there
    # (a venv beside notes, a --prefix=$HOME build): only bin, lib and pyvenv.cfg count.
    probe = os.path.join(sys.prefix, f"probe-{os.getpid()}.txt")
    try:
        with open(probe, "w") as f:
            f.write(SECRET)
    except OSError:
        pytest.skip(f"{sys.prefix} is not writable here")
    try:
        inside = os.path.join(os.path.dirname(os.__file__), "os.py")
        seen = _probe(sys.executable, sandbox.Policy(), probe, inside)
        assert seen["secret"] == "FileNotFoundError"
        assert seen["inside"].startswith('r"""OS routines')  # CONTROL: its lib is there
        # CONTROL: the probe reads it where the prefix is bound.
        assert _probe(sys.executable, sandbox.Policy(read_only=(sys.prefix,)), probe,
                      inside)["secret"] == SECRET
    finally:
        os.unlink(probe)
