"""Builds the C++ half of the `kvsim` package with the project's CMake, for the interpreter
running pip: the pybind11 module kvsim._kvsim, the `kvsim` command (installed inside the package
and run by the `kvsim` entry point), and the figures code from analysis/.

Environment: KVSIM_BUILD_DIR, the CMake build directory to use (default build/pip-<python tag>;
an existing configured build for the same interpreter is used as it is, so nothing is compiled
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


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tag = sys.implementation.cache_tag
        build = os.path.abspath(os.environ.get("KVSIM_BUILD_DIR") or
                                os.path.join(ROOT, "build", f"pip-{tag}"))
        reuse = bool(os.environ.get("KVSIM_BUILD_DIR"))
        configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", "-DKVSIM_PYTHON=ON"]
        # A fresh build makes only what the package needs; a given build directory is used as
        # it is configured (its interpreter must be this one: checked below).
        configure += ["-DKVSIM_TESTS=OFF", "-DKVSIM_BENCH=OFF", "-DKVSIM_CUDA=OFF",
                      "-DKVSIM_MPI=OFF"] + shlex.split(os.environ.get("KVSIM_CMAKE_ARGS", ""))
        if not reuse or not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 1), "--target",
                        "_kvsim", "kvsim"], check=True)
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
        os.makedirs(os.path.join(out, "analysis"), exist_ok=True)
        for name in ("__init__.py", "figure_style.py", "figures.py", "sweep_report.py"):
            shutil.copyfile(os.path.join(package, "analysis", name),
                            os.path.join(out, "analysis", name))


setup(
    packages=["kvsim", "kvsim.capture", "kvsim.vlm"],
    package_dir={"kvsim": "python/kvsim", "kvsim.capture": "python/kvsim/capture",
                 "kvsim.vlm": "python/kvsim/vlm"},
    package_data={"kvsim": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("kvsim._kvsim", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": os.path.join("build", "setuptools")},
             "egg_info": {"egg_base": os.path.join("build", "setuptools")}},
    zip_safe=False,
)
