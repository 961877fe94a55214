#!/usr/bin/env python3
"""`pip install .` as a Python user would run it: into a fresh virtual environment (seeing
Debian's numpy, h5py, pandas and matplotlib; no package index), with Debian's setuptools
(--no-build-isolation), reusing this CMake build. Then, from outside the checkout: import kvsim,
replay a trace, kvsim.plot, the `kvsim` command and `python -m kvsim`. Also checks that
pyproject.toml's version is CMakeLists.txt's.

Usage: check_packaging.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def main():
    source, build = map(os.path.abspath, sys.argv[1:3])
    cmake_version = re.search(r"project\(kvsim VERSION ([\d.]+)",
                              open(os.path.join(source, "CMakeLists.txt")).read()).group(1)
    py_version = re.search(r'^version = "([\d.]+)"', open(os.path.join(source, "pyproject.toml")).read(),
                           re.M).group(1)
    if cmake_version != py_version:
        sys.exit(f"pyproject.toml says {py_version}, CMakeLists.txt says {cmake_version}")
    with tempfile.TemporaryDirectory() as work:
        venv = os.path.join(work, "venv")
        run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        python, pip = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "pip")
        env = dict(os.environ, KVSIM_BUILD_DIR=build, PIP_NO_INDEX="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("PYTHONPATH", None)
        run([pip, "install", "--no-build-isolation", source], env=env)
        env = dict(os.environ, MPLBACKEND="Agg")
        env.pop("PYTHONPATH", None)
        env.pop("KVSIM_BINARY", None)
        kvsim_cmd = os.path.join(venv, "bin", "kvsim")
        run([kvsim_cmd, "synth", "--out", "t.h5", "--layers", "2", "--heads", "4", "--kv-heads",
             "2", "--head-dim", "16", "--media-tokens", "32", "--gen", "8"], cwd=work, env=env)
        out = run([python, "-c", """
import kvsim, kvsim.plot, kvsim.prompts, kvsim.capture, kvsim.capture.hf
assert kvsim.__file__.startswith(%r), kvsim.__file__
df = kvsim.replay("t.h5", ["h2o", "snapkv"], budget="30%%", as_frame=True)
assert set(df.policy) == {"h2o", "snapkv"}
kvsim.plot.recall_by_layer(df).savefig("r.png")
print("replayed", len(df), "rows with", kvsim.__version__)
""" % venv], cwd=work, env=env)
        assert os.path.exists(os.path.join(work, "r.png"))
        version = run([python, "-m", "kvsim", "--version"], cwd=work, env=env).strip()
        if cmake_version not in version:
            sys.exit(f"python -m kvsim --version printed {version!r}")
        run([kvsim_cmd, "replay", "t.h5", "-p", "h2o", "-o", "r.csv"], cwd=work, env=env)
        run([kvsim_cmd, "figures", "r.csv", "--out", "figs"], cwd=work, env=env)
        if not os.path.exists(os.path.join(work, "figs", "r_recall_by_layer.png")):
            sys.exit("kvsim figures from the installed package drew nothing")
        print(out.strip() + "; `kvsim` and `python -m kvsim` run from the venv")
        check_stale_caches(source, pip, work)


def check_stale_caches(source, pip, work):
    """A build directory whose CMake cache was made for another checkout: a given one
    (KVSIM_BUILD_DIR) is one line naming it and the fix; the default one, in a copy of the
    tree, is started afresh (a stub `cmake` on PATH records the call and fails the configure,
    so that nothing is compiled)."""
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)

    def stale(build):
        os.makedirs(build)
        with open(os.path.join(build, "CMakeCache.txt"), "w") as f:
            f.write("CMAKE_HOME_DIRECTORY:INTERNAL=/a/moved/checkout\n")

    given = os.path.join(work, "given-build")
    stale(given)
    r = subprocess.run([pip, "install", "--no-build-isolation", source], capture_output=True,
                       text=True, env=dict(env, KVSIM_BUILD_DIR=given))
    expected = (f"kvsim: KVSIM_BUILD_DIR={given} holds a CMake cache made for /a/moved/checkout, "
                f"not this checkout ({source}): remove that directory or point KVSIM_BUILD_DIR "
                "elsewhere")
    if r.returncode == 0 or expected not in r.stdout + r.stderr:
        sys.exit(f"a stale KVSIM_BUILD_DIR was not named:\n{r.stdout}{r.stderr}")
    copy = os.path.join(work, "copy")
    files = subprocess.run(["git", "-C", source, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if os.path.exists(os.path.join(source, name)):
            os.makedirs(os.path.dirname(os.path.join(copy, name)), exist_ok=True)
            shutil.copy2(os.path.join(source, name), os.path.join(copy, name))
    tag = subprocess.run([os.path.join(os.path.dirname(pip), "python"), "-c",
                          "import sys; print(sys.implementation.cache_tag)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    default = os.path.join(copy, "build", f"pip-{tag}")
    stale(default)
    stub = os.path.join(work, "stub-bin")
    os.makedirs(stub)
    calls = os.path.join(work, "cmake-calls")
    with open(os.path.join(stub, "cmake"), "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {calls}\necho "stub cmake: no build here"\nexit 1\n')
    os.chmod(os.path.join(stub, "cmake"), 0o755)
    r = subprocess.run([pip, "install", "-v", "--no-build-isolation", copy], capture_output=True,
                       text=True, env=dict(env, PATH=stub + os.pathsep + env["PATH"]))
    output = r.stdout + r.stderr
    for wanted in (f"kvsim: {default} was configured for /a/moved/checkout; starting it afresh",
                   f"kvsim: [1/3] configuring with CMake in {default}",
                   "kvsim: CMake could not configure the build (exit 1)"):
        if wanted not in output:
            sys.exit(f"missing {wanted!r} in the install's output:\n{output}")
    if os.path.exists(os.path.join(default, "CMakeCache.txt")):
        sys.exit("the stale CMake cache was left in place")
    called = open(calls).read()
    if f"-S {copy} -B {default}" not in called:
        sys.exit(f"cmake was not configured for the copy: {called}")
    print("stale CMake caches: a given one named with the fix, the default one started afresh")
    check_reuse(copy, pip, env, stub, calls)


def check_reuse(copy, pip, env, stub, calls):
    """The checkout's own build/ (what the README's set-up builds) is reused when it was made for
    this checkout, as Release, with the module, for this interpreter; otherwise the install says
    which of these differs."""
    python = subprocess.run([os.path.join(os.path.dirname(pip), "python"), "-c",
                             "import sys; print(sys.executable)"], capture_output=True, text=True,
                            check=True).stdout.strip()
    build = os.path.join(copy, "build")
    for interpreter, wanted in (
            (python, f"kvsim: reusing {build} (Release, this interpreter)"),
            ("/opt/other/python3", f"kvsim: not reusing {build}: it was configured for another "
                                   f"interpreter (/opt/other/python3; here ")):
        os.makedirs(build, exist_ok=True)
        with open(os.path.join(build, "CMakeCache.txt"), "w") as f:
            f.write(f"CMAKE_HOME_DIRECTORY:INTERNAL={copy}\nCMAKE_BUILD_TYPE:STRING=Release\n"
                    f"KVSIM_PYTHON:BOOL=ON\n_Python3_EXECUTABLE:INTERNAL={interpreter}\n")
        open(calls, "w").close()
        r = subprocess.run([pip, "install", "-v", "--no-build-isolation", copy],
                           capture_output=True, text=True,
                           env=dict(env, PATH=stub + os.pathsep + env["PATH"]))
        if wanted not in r.stdout + r.stderr:
            sys.exit(f"missing {wanted!r} in the install's output:\n{r.stdout}{r.stderr}")
        reused = f"--build {build} " in open(calls).read()
        if reused != (interpreter == python):
            sys.exit(f"build/ {'not ' if not reused else ''}built for {interpreter}: "
                     f"{open(calls).read()}")
    print("the checkout's build/ reused when it fits, and why not when it does not")


if __name__ == "__main__":
    main()
