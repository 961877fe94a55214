"""experiments/reproduce.sh real_model: --from-results regenerates the single-image and eight-box
sections' reports, tests, cards and figures from the results committed in experiments/results/
(no model) and finds every region of the page reproduced; --quick runs one seed (here of the small setting,
against its committed per-seed rows, python/tests/data) and the stories, and says how the seed's
rows compare. Skipped (77) without the models."""
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from real_models import BINARY, MODELS, REPO, ctest_names, main_or_skip, own_tests

SCRIPT = os.path.join(REPO, "experiments", "reproduce.sh")


def build_dir():
    return os.path.dirname(BINARY) if os.path.isabs(BINARY) else os.path.join(REPO, "build")


# The kernel set python/tests/data/vlm_multi_small_by_seed.csv was made with (a 2-core AVX2
# machine; the single-image small rows are real_models.COMMITTED_KERNELS'), as a run's
# builds.json records it.
MULTI_SMALL_KERNELS = "avx2"


class Reproduce(unittest.TestCase):
    def run_script(self, *args, **env):
        return subprocess.run([SCRIPT, "real_model", *args], capture_output=True, text=True,
                              env=dict(os.environ, KVSIM_MODELS=MODELS, KVSIM_BUILD=build_dir(),
                                       **env))

    def test_the_page_from_the_committed_results(self):
        out = tempfile.mkdtemp()
        r = self.run_script("--from-results", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("expected time: about 5 minutes on 2 cores", r.stdout)
        self.assertIn("(vlm_eval:vlm_eval.md | held-out images, | until=): equal", r.stdout)
        self.assertIn("(vlm_eval:card/card.md | **Prediction card: | until=): equal", r.stdout)
        for region in ("compress/vlm_eval.md | **Accuracy at equal memory**",
                       "append/vlm_eval.md | **Accuracy at equal memory**",
                       "vlm_orders.md | **The question before or after compression**",
                       "vlm_orders.md | **Which image stays** | rows=10%",
                       "vlm_orders.md | **Several questions on one compressed context**",
                       "compress/vlm_eval.md | **Against the floors.** | "
                       "until=**Which differences hold up.**",
                       "append/card/card.md | Out of sample:"):
            self.assertIn(f"(vlm_multi:{region}): equal", r.stdout)
        for region in ("vlm_factorial.md | **One change at a time** | until=",
                       "tailq/vlm_eval.md | **Against the floors.** | "
                       "until=**Which differences hold up.**"):
            self.assertIn(f"(factorial:{region}): equal", r.stdout)
        self.assertIn("(image_factorial:vlm_factorial.md | **One change at a time** | until=): "
                      "equal", r.stdout)
        self.assertIn("(transfer:transfer.md | **Prediction across tasks** | until=): equal",
                      r.stdout)
        self.assertNotIn("not checked", r.stdout)
        self.assertIn("every checked region of", r.stdout)
        # The factorial's orders are read by the factorial only: their reports draw no figures.
        figure = "vlm_accuracy_vs_memory.png"
        self.assertTrue(os.path.exists(os.path.join(out, "vlm_eval", figure)))
        for order in ("compress", "tail1", "tailq"):
            for factorial in ("vlm_eval/factorial", "vlm_multi/factorial"):
                self.assertTrue(os.path.exists(os.path.join(out, factorial, order, "vlm_eval.md")))
                self.assertFalse(os.path.exists(os.path.join(out, factorial, order, figure)))

    def test_quick_on_the_small_setting(self):
        out, results = tempfile.mkdtemp(), tempfile.mkdtemp()
        data = os.path.join(REPO, "python", "tests", "data")
        for source, kept in (("vlm_eval_small_by_seed.csv", "vlm_eval/vlm_eval_by_seed.csv.gz"),
                             ("vlm_multi_small_by_seed.csv", "vlm_multi/compress_by_seed.csv.gz")):
            os.makedirs(os.path.dirname(os.path.join(results, kept)), exist_ok=True)
            with open(os.path.join(data, source), "rb") as src, \
                    gzip.open(os.path.join(results, kept), "wb") as dst:
                shutil.copyfileobj(src, dst)
        # The kernels the small rows were made with, as a run's builds.json records them.
        os.makedirs(os.path.join(results, "vlm_multi", "compress"))
        with open(os.path.join(results, "vlm_multi", "compress", "builds.json"), "w") as f:
            json.dump({"settings": {"machine": {"kvsim_simd": MULTI_SMALL_KERNELS}}}, f)
        r = self.run_script("--quick", out, REPRODUCE_RESULTS=results, VLM_EVAL_SMALL="1",
                            VLM_MULTI_SMALL="1", KVSIM_CACHE=os.path.join(out, "cache"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("expected time: about 10 minutes", r.stdout)
        self.assertIn("vlm_eval_by_seed.csv.gz: equal", r.stdout)  # equal, or within tolerance
        from kvsim import _kvsim
        if _kvsim.simd() == MULTI_SMALL_KERNELS:
            self.assertIn("compress_by_seed.csv.gz: equal", r.stdout)
        else:  # another kernel set: shown, and required only where it was made
            self.assertRegex(r.stdout, r"compress_by_seed.csv.gz: (equal|different)")
            if "compress_by_seed.csv.gz: different" in r.stdout:
                self.assertIn("shown, not required", r.stdout)
        self.assertIn("vlm_eval [", r.stderr)  # the experiment's progress
        self.assertTrue(os.path.exists(os.path.join(out, "stories", "by_image.csv")))


class CtestRunsEveryTest(unittest.TestCase):
    def test_the_ctest_entries_name_every_test(self):
        # ctest runs this file as two entries, each naming classes or Class.method: a test added
        # here and named in neither would never run.
        named = ctest_names("test_reproduce.py")
        tests = {f"{c}.{m}" for c, methods in own_tests(__name__).items() for m in methods}
        self.assertEqual({t for t in tests if t in named or t.split(".")[0] in named}, tests)
        self.assertLessEqual(named, tests | {t.split(".")[0] for t in tests})


if __name__ == "__main__":
    main_or_skip(["stories260K/config.json", "mobilenet_v2/graph.json"], "the real models")
