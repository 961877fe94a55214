"""Tests of the kvsim Python module against the kvsim command line and h5py.

Run by ctest (CMakeLists.txt) with PYTHONPATH=<build>/python and KVSIM_BINARY set."""
import csv
import os
import signal
import subprocess
import tempfile
import threading
import unittest

import h5py
import numpy as np

import kvsim

KVSIM = os.environ["KVSIM_BINARY"]


def run(*args):
    subprocess.run([KVSIM, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.trace = os.path.join(cls.dir.name, "t.h5")
        # GQA, float16, two samples.
        run("synth", "--out", cls.trace, "--layers", "3", "--heads", "4", "--kv-heads", "2",
            "--head-dim", "16", "--media-tokens", "36", "--gen-tokens", "6", "--samples", "2")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()


class TraceTest(Fixture):
    def test_attributes_metadata_and_tensors_match_h5py(self):
        t = kvsim.Trace(self.trace)
        self.assertEqual(t.samples(), ["000000", "000001"])
        self.assertEqual((t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim), (3, 4, 2, 16))
        self.assertAlmostEqual(t.scale, 0.25)
        s = t.sample("000001")
        with h5py.File(self.trace, "r") as f:
            g = f["samples/000001"]
            self.assertEqual(s.prompt_len, g.attrs["prompt_len"])
            self.assertEqual(s.gen_len, g.attrs["gen_len"])
            np.testing.assert_array_equal(s.modality, g["modality"][()])
            np.testing.assert_array_equal(s.segment, g["segment"][()])
            np.testing.assert_array_equal(s.media_id, g["media_id"][()])
            np.testing.assert_array_equal(s.token_ids, g["token_ids"][()])
            layer = s.layer(2)
            for name in ("q", "k", "v"):
                stored = g[f"layers/2/{name}"][()]
                self.assertEqual(layer[name].dtype, np.float32)
                # float16 widened to float32 exactly
                np.testing.assert_array_equal(layer[name], stored.astype(np.float32))
        self.assertEqual(s.dtype, "float16")
        self.assertEqual(s.total_len, s.prompt_len + s.gen_len)

    def test_errors_name_what_is_wrong(self):
        with self.assertRaisesRegex(RuntimeError, "missing.h5"):
            kvsim.Trace(os.path.join(self.dir.name, "missing.h5"))
        t = kvsim.Trace(self.trace)
        with self.assertRaisesRegex(Exception, "nope"):
            t.sample("nope")
        with self.assertRaisesRegex(IndexError, "layer 3 out of range"):
            t.sample("000000").layer(3)


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows


class ReplayTest(Fixture):
    def test_same_numbers_as_the_command_line_to_the_bit(self):
        out = os.path.join(self.dir.name, "r.csv")
        run("replay", "-t", self.trace, "-p", "h2o", "-p", "snapkv:original", "-p", "oracle",
            "-p", "meda", "--budget", "12", "--set", "h2o.recent=25%",
            "--set", "snapkv:original.window=8", "--diagnostics",
            "-o", out, "-j", "2")
        res = kvsim.replay(self.trace, {"h2o": {"recent": "25%"}, "snapkv:original": {"window": 8},
                                        "oracle": None, "meda": {}},
                           budget="12", diagnostics=True, threads=1)
        rows = read_csv(out)
        self.assertEqual(list(res), list(rows[0].keys()))
        self.assertEqual(len(res["policy"]), len(rows))
        for col, values in res.items():
            cells = [r[col] for r in rows]
            if values.dtype == object:
                self.assertEqual(list(values), cells, col)
            elif values.dtype == np.int64:
                np.testing.assert_array_equal(values, np.array(cells, dtype=np.int64), col)
            else:
                want = np.array([float(c) if c != "" else np.nan for c in cells], dtype=values.dtype)
                self.assertTrue(np.array_equal(values, want, equal_nan=True), col)
        self.assertFalse(np.isnan(res["regret"][res["policy"] == "h2o"]).any())

    def test_policy_arguments_and_errors(self):
        a = kvsim.replay(self.trace, "streamingllm", samples=["000000"])
        b = kvsim.replay(self.trace, ["streamingllm"], samples=["000000"])
        np.testing.assert_array_equal(a["mass_recall"], b["mass_recall"])
        self.assertEqual(set(a["sample"]), {"000000"})
        with self.assertRaisesRegex(Exception, "unknown"):
            kvsim.replay(self.trace, {"h2o": {"nope": 1}})
        with self.assertRaisesRegex(Exception, "nosuch"):
            kvsim.replay(self.trace, "nosuch")
        with self.assertRaisesRegex(ValueError, "no policy"):
            kvsim.replay(self.trace, [])


class InterruptTest(unittest.TestCase):
    def test_ctrl_c_stops_a_replay(self):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "long.h5")
            run("synth", "--out", trace, "--layers", "32", "--heads", "8", "--kv-heads", "8",
                "--head-dim", "32", "--gen-tokens", "32")
            timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
            timer.start()
            with self.assertRaises(KeyboardInterrupt):
                for _ in range(20):  # long enough for the signal to land during a replay
                    kvsim.replay(trace, ["h2o", "snapkv", "tova"], budget="20%", threads=1)
            timer.cancel()
            # the module still works afterwards
            self.assertGreater(len(kvsim.replay(trace, "full", samples=["000000"])["step"]), 0)


class PoliciesTest(unittest.TestCase):
    def test_registry_as_data(self):
        ps = {p["name"]: p for p in kvsim.policies()}
        self.assertIn("h2o", ps)
        self.assertTrue(ps["oracle"]["lookahead"])
        self.assertTrue(ps["meda"]["merges"])
        params = {p["name"]: p for p in ps["hae"]["params"]}
        self.assertEqual(params["rc_size"]["default"], "64")
        self.assertEqual(params["ddes"]["choices"], ["eq4", "mark"])
        self.assertEqual(params["r"]["min"], 0)
        presets = {p["name"]: p for p in kvsim.presets()}
        self.assertEqual(presets["snapkv:kvpress"]["policy"], "snapkv")
        self.assertEqual(presets["snapkv:kvpress"]["params"]["window"], "64")


if __name__ == "__main__":
    unittest.main()
