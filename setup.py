"""Builds the C++ half of the `kvsim` package with the project's CMake, for the interpreter
running pip: the pybind11 module kvsim._kvsim, the `kvsim` command (installed inside the package
and run by the `kvsim` entry point).

Environment: KVSIM_BUILD_DIR, the CMake build directory to use (default: the checkout's build/
when it is a Release build with the module for this interpreter, as the README's set-up makes it,
else build/pip-<python tag>; an existing configured build is used as it is, so nothing is compiled
twice);
KVSIM_CMAKE_ARGS, more -D options for CMake. Needs what install-deps.sh installs.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def progress(text):
    """A stage of the build where the user sees it: pip keeps a build's own output to itself
    unless run with -v, so without a terminal on stderr the line goes to the terminal itself
    (when there is one), and to stderr for `pip -v` and logs."""
    line = f"kvsim: {text}"
    print(line, file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(line + "\n")
    except OSError:
        pass


def cache_entry(build, key):
    """The value of `key` (e.g. CMAKE_HOME_DIRECTORY:INTERNAL) in a build directory's CMake
    cache, or None."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith(key + "="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        return None
    return None


def cache_source(build):
    """The source directory a build directory's CMake cache was made for, or None."""
    return cache_entry(build, "CMAKE_HOME_DIRECTORY:INTERNAL")


def why_not_reuse(build):
    """Why the checkout's own build/ (the README's set-up) cannot make this package: "" when it
    can (this checkout, Release, the Python module on, this interpreter)."""
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        return "it has not been configured"
    checks = (("CMAKE_HOME_DIRECTORY:INTERNAL", ROOT, True, "was configured for another checkout"),
              ("CMAKE_BUILD_TYPE:STRING", "Release", False, "is not a Release build"),
              ("KVSIM_PYTHON:BOOL", "ON", False, "was configured without the Python module"),
              ("_Python3_EXECUTABLE:INTERNAL", sys.executable, True,
               "was configured for another interpreter"))
    for key, want, is_path, why in checks:
        got = cache_entry(build, key)
        if got is None or not (same_path(got, want) if is_path else got == want):
            return f"it {why} ({got or 'unset'}; here {want})"
    return ""


def require_debian_python():
    """pip runs this file with the interpreter that will import the module: one without wheel
    or numpy (a pyenv or conda python3 first on PATH) fails later with setuptools' own words
    ("invalid command 'bdist_wheel'"). Named here instead, with the command that works."""
    missing = []
    for name in ("wheel", "numpy"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        sys.exit(f"kvsim: this interpreter ({sys.executable}) lacks {' and '.join(missing)}, "
                 f"which building and using the kvsim module need; install with Debian's "
                 f"python instead: /usr/bin/python3 -m pip install --no-build-isolation .")


def same_path(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def run_build(command):
    """`cmake --build`, its lines passed on (for pip -v) and its percentage shown as it goes."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shown = None
    for line in proc.stdout:
        sys.stderr.write(line)
        if line.startswith("[") and "%]" in line[:7]:
            percent = line[1:line.index("%]")].strip()
            if percent != shown and int(percent) % 10 == 0:
                progress(f"[2/3] compiling: {percent}%")
                shown = percent
    if proc.wait() != 0:
        sys.exit(f"kvsim: the build failed (cmake exited with {proc.returncode}); its output is "
                 f"above (pip install -v shows it in full)")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tag = sys.implementation.cache_tag
        build = os.path.abspath(os.environ.get("KVSIM_BUILD_DIR") or
                                os.path.join(ROOT, "build", f"pip-{tag}"))
        reuse = bool(os.environ.get("KVSIM_BUILD_DIR"))
        # The README's set-up builds build/: when it fits, only what changed is compiled again.
        checkout_build = os.path.join(ROOT, "build")
        if not reuse:
            why = why_not_reuse(checkout_build)
            if not why:
                build, reuse = checkout_build, True
                progress(f"reusing {build} (Release, this interpreter): only what changed since "
                         f"its last build is compiled")
            else:
                progress(f"not reusing {checkout_build}: {why}; building in {build}")
        # A CMake cache made for another checkout (a moved or copied tree) cannot be reused:
        # ours is started afresh, a given one is named with the fix.
        made_for = cache_source(build)
        if made_for and not same_path(made_for, ROOT):
            if reuse:
                sys.exit(f"kvsim: KVSIM_BUILD_DIR={build} holds a CMake cache made for {made_for}, "
                         f"not this checkout ({ROOT}): remove that directory or point "
                         f"KVSIM_BUILD_DIR elsewhere")
            progress(f"{build} was configured for {made_for}; starting it afresh")
            shutil.rmtree(build)
        configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", "-DKVSIM_PYTHON=ON"]
        # A fresh build makes only what the package needs; a given build directory is used as
        # it is configured (its interpreter must be this one: checked below).
        configure += ["-DKVSIM_TESTS=OFF", "-DKVSIM_BENCH=OFF", "-DKVSIM_CUDA=OFF",
                      "-DKVSIM_MPI=OFF"] + shlex.split(os.environ.get("KVSIM_CMAKE_ARGS", ""))
        if not reuse or not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            progress(f"[1/3] configuring with CMake in {build}")
            result = subprocess.run(configure, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            sys.stderr.write(result.stdout)
            if result.returncode != 0:
                sys.exit(f"kvsim: CMake could not configure the build (exit {result.returncode}); "
                         f"its output is above. Missing packages: run ./install-deps.sh")
        progress("[2/3] compiling the module and the kvsim command (a few minutes on 2 cores; "
                 "pip install -v shows the compiler's lines)")
        run_build(["cmake", "--build", build, "-j", str(os.cpu_count() or 1), "--target",
                   "_kvsim", "kvsim"])
        progress("[3/3] copying the module and the kvsim command in place")
        package = os.path.join(build, "python", "kvsim")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        module = os.path.join(package, "_kvsim" + suffix)
        if not os.path.exists(module):
            sys.exit(f"setup.py: CMake built no {module}: was it configured for another "
                     f"interpreter than {sys.executable}? (KVSIM_BUILD_DIR={build})")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(module, target)
        out = os.path.dirname(target)
        os.makedirs(os.path.join(out, "bin"), exist_ok=True)
        shutil.copy2(os.path.join(build, "kvsim"), os.path.join(out, "bin", "kvsim"))


require_debian_python()
setup(
    packages=["kvsim", "kvsim.capture", "kvsim.models", "kvsim.report", "kvsim.vlm"],
    package_dir={"kvsim": "python/kvsim", "kvsim.capture": "python/kvsim/capture",
                 "kvsim.models": "python/kvsim/models", "kvsim.report": "python/kvsim/report",
                 "kvsim.vlm": "python/kvsim/vlm"},
    package_data={"kvsim": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("kvsim._kvsim", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": os.path.join("build", "setuptools")},
             "egg_info": {"egg_base": os.path.join("build", "setuptools")}},
    zip_safe=False,
)
