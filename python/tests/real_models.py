"""Shared by the suites that run real models (test_models.py, test_stories260k.py, test_vlm.py,
test_reproduce.py): where the models are (kvsim.models.default_models(): $KVSIM_MODELS, else the
checkout's models/ folder, where `python -m kvsim.models fetch` puts them; never committed), the
kvsim binary under test, the skip (exit code 77, with the reason) when the models are absent, and
what a suite run as several ctest entries needs to check that they name every test."""
import inspect
import os
import re
import subprocess
import sys
import unittest

from kvsim.models import default_models

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

MODELS = default_models()
# kvsim's kernel set the committed numbers of python/tests/data were made with (an AVX-512
# machine): under another, their comparison is printed, not required (kvsim.report.tolerance).
COMMITTED_KERNELS = "avx512"
BINARY = os.environ.get("KVSIM_BINARY", "kvsim")


def ctest_names(script):
    """The classes and Class.method names CMakeLists.txt's ctest entries pass to `script`."""
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        cmake = f.read()
    named = set()
    for args in re.findall(re.escape(script) + r" -v\s+([A-Za-z_. \n]+?)\)", cmake):
        named.update(args.split())
    return named


def own_tests(module):
    """{class name: its test methods' names} of the TestCase classes `module` defines."""
    return {name: unittest.TestLoader().getTestCaseNames(c)
            for name, c in inspect.getmembers(sys.modules[module], inspect.isclass)
            if issubclass(c, unittest.TestCase) and c.__module__ == module}


def kvsim_cli(*args):
    """Runs the kvsim binary; its output, or an AssertionError with everything it printed."""
    r = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"kvsim {' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def main_or_skip(required, what):
    """unittest.main(), or exit 77 naming what is missing when a `required` file (relative to
    MODELS) is absent."""
    missing = [p for p in required if not os.path.exists(os.path.join(MODELS, p))]
    if missing:
        print(f"skipped: {what} not in {os.path.abspath(MODELS)} (missing {', '.join(missing)}; "
              "set KVSIM_MODELS to the folder that holds them)")
        sys.exit(77)
    unittest.main(module="__main__")
