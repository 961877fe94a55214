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
        with self.assertRaisesRegex(FileNotFoundError, "missing.h5"):
            kvsim.Trace(os.path.join(self.dir.name, "missing.h5"))
        t = kvsim.Trace(self.trace)
        with self.assertRaisesRegex(KeyError, "nope"):
            t.sample("nope")
        with self.assertRaisesRegex(IndexError, "layer 3 out of range"):
            t.sample("000000").layer(3)


class WriteTest(Fixture):
    def test_round_trip_through_the_cpp_writer(self):
        t = kvsim.Trace(self.trace)
        samples = {}
        for name in t.samples():
            s = t.sample(name)
            samples[name] = {"prompt_len": s.prompt_len, "modality": s.modality,
                             "segment": s.segment, "media_id": s.media_id,
                             "token_ids": s.token_ids, "task": "copy", "question_len": 3,
                             "layers": [s.layer(l) for l in range(t.num_layers)]}
        out = os.path.join(self.dir.name, "copy.h5")
        kvsim.write_trace(out, samples, model="copied", scale=0.25, dtype="float32",
                          rope_theta=500.0)
        c = kvsim.Trace(out)
        self.assertEqual((t.rope_theta, c.rope_theta), (10000.0, 500.0))
        self.assertEqual((t.sample(t.samples()[0]).question_len,
                          c.sample(t.samples()[0]).question_len), (29, 3))
        self.assertEqual((c.model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim),
                         ("copied", 3, 4, 2, 16))
        for name in t.samples():
            a, b = t.sample(name), c.sample(name)
            self.assertEqual((b.prompt_len, b.gen_len, b.task, b.dtype),
                             (a.prompt_len, a.gen_len, "copy", "float32"))
            np.testing.assert_array_equal(a.media_id, b.media_id)
            for l in range(3):
                for key, value in a.layer(l).items():
                    np.testing.assert_array_equal(value, b.layer(l)[key])
        # the copy replays exactly like the original
        r1 = kvsim.replay(self.trace, {"h2o": {"budget": "10"}})
        r2 = kvsim.replay(out, {"h2o": {"budget": "10"}})
        np.testing.assert_array_equal(r1["mass_recall"], r2["mass_recall"])

    def test_bad_arrays_are_named_and_leave_no_file(self):
        T, P = 6, 4
        ok = {"q": np.zeros((T, 2, 8), np.float32), "k": np.zeros((T, 1, 8), np.float32)}
        base = {"prompt_len": P, "modality": np.zeros(T), "segment": [1, 1, 1, 1, 2, 2]}
        out = os.path.join(self.dir.name, "bad.h5")
        with self.assertRaisesRegex(ValueError, "sample 'b', layer 1, k: expected shape"):
            kvsim.write_trace(out, {"a": dict(base, layers=[ok, ok]),
                                    "b": dict(base, layers=[ok, {"q": ok["q"],
                                                                 "k": np.zeros((T, 2, 8))}])})
        self.assertFalse(os.path.exists(out) or os.path.exists(out + ".partial"))
        with self.assertRaisesRegex(ValueError, "sample 'a', segment"):
            kvsim.write_trace(out, {"a": dict(base, segment=[1, 1], layers=[ok])})
        nan = dict(ok, q=np.full((T, 2, 8), np.nan, np.float32))
        with self.assertRaisesRegex(RuntimeError, "NaN"):
            kvsim.write_trace(out, {"a": dict(base, layers=[nan])})
        self.assertFalse(os.path.exists(out) or os.path.exists(out + ".partial"))


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


def same(a, b):
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


class DecisionsTest(Fixture):
    def test_decisions_equal_the_dump(self):
        dump = os.path.join(self.dir.name, "d.h5")
        run("replay", "-t", self.trace, "-p", "h2o", "-p", "meda", "--budget", "10",
            "--dump-decisions", dump)
        _, d = kvsim.replay(self.trace, ["h2o", "meda"], budget="10", decisions=True)
        with h5py.File(dump, "r") as f:
            for label, kind in (("h2o", "evicted"), ("meda", "merged")):
                for sample in ("000000", "000001"):
                    for layer in range(3):
                        for g in range(2):
                            rows = (d["policy"] == label) & (d["sample"] == sample) & \
                                   (d["layer"] == layer) & (d["kv_head"] == g)
                            if kind == "merged":
                                rows &= d["into_position"] >= 0
                            got = np.stack([d["step"][rows], d["position"][rows]], axis=1)
                            if kind == "merged":
                                got = np.column_stack([got, d["into_position"][rows]])
                            path = f"{label}/samples/{sample}/layers/{layer}/heads/{g}/{kind}"
                            want = f[path][()] if path in f else np.zeros((0, got.shape[1]))
                            np.testing.assert_array_equal(got, want.reshape(got.shape), path)


class PythonPolicyTest(Fixture):
    def test_python_twins_see_no_future(self):
        # The first sample with its generation cut to 3 tokens: every decision and measurement up
        # to the cut must be what the whole trace gives.
        from kvsim.python_policies import H2O, StreamingLLM
        t = kvsim.Trace(self.trace)
        s = t.sample("000000")
        T = s.prompt_len + 3
        cut = os.path.join(self.dir.name, "cut.h5")
        kvsim.write_trace(cut, {"000000": {
            "prompt_len": s.prompt_len, "modality": s.modality[:T], "segment": s.segment[:T],
            "media_id": s.media_id[:T],
            "layers": [{k: v[:T] for k, v in s.layer(l).items()} for l in range(t.num_layers)]}},
            dtype="float32")
        for twin in (StreamingLLM(budget="12", sinks=2), H2O(budget="12", recent="25%")):
            a, da = kvsim.replay(self.trace, {"twin": twin}, samples=["000000"], decisions=True)
            b, db = kvsim.replay(cut, {"twin": twin}, decisions=True)
            early = a["step"] < 3
            np.testing.assert_allclose(a["mass_recall"][early], b["mass_recall"], rtol=1e-6)
            np.testing.assert_array_equal(a["cache_size"][early], b["cache_size"])
            before = da["step"] < 3
            for col in ("layer", "kv_head", "step", "position"):
                np.testing.assert_array_equal(da[col][before], db[col], (type(twin), col))

    def test_python_twins_make_the_same_decisions(self):
        from kvsim.python_policies import H2O, StreamingLLM
        for name, twin in (("streamingllm", StreamingLLM(budget="12", sinks=2)),
                           ("h2o", H2O(budget="12", recent="25%"))):
            params = {"budget": "12", "sinks": 2} if name == "streamingllm" else \
                {"budget": "12", "recent": "25%"}
            a, da = kvsim.replay(self.trace, {name: params, "twin": twin}, decisions=True,
                                 threads=2)
            mine, other = a["policy"] == name, a["policy"] == "twin"
            for col, values in a.items():
                if col != "policy":
                    self.assertTrue(same(values[mine], values[other]), (name, col))
            dm, do = da["policy"] == name, da["policy"] == "twin"
            self.assertGreater(dm.sum(), 0)
            for col, values in da.items():
                if col != "policy":
                    np.testing.assert_array_equal(values[dm], values[do], (name, col))

    def test_every_kind_of_need_is_declared_by_name(self):
        class Declares(kvsim.Policy):
            needs = {"prefill_column_sums": True, "sample_window_sums": [4, 2],
                     "sparsity_epsilon": 0.001, "sample_entropies": True,
                     "prefill_column_sums_rounded": False}

            def on_prefill(self, view, cache):
                pass

        res = kvsim.replay(self.trace, {"declares": Declares()}, samples=["000000"])
        self.assertGreater(len(res["policy"]), 0)

        class Misspelt(kvsim.Policy):
            needs = {"prefil_window": 4}

            def on_prefill(self, view, cache):
                pass

        with self.assertRaises(ValueError) as e:
            kvsim.replay(self.trace, {"misspelt": Misspelt()}, samples=["000000"])
        self.assertIn("Python policy 'misspelt': unknown need 'prefil_window' (did you mean "
                      "'prefill_window'?) (known: prefill_column_sums, prefill_window, "
                      "window_group_sums, last_row_head_mean, text_query_layers, "
                      "sample_entropies, sample_window_sums, sparsity_epsilon, key_ranking, prefill_column_sums_rounded, "
                      "prompt_queries)", str(e.exception))

        class Negative(kvsim.Policy):
            needs = {"prefill_window": -1}

            def on_prefill(self, view, cache):
                pass

        with self.assertRaisesRegex(ValueError, "need 'prefill_window' takes a count >= 0, "
                                    "not '-1'"):
            kvsim.replay(self.trace, {"negative": Negative()}, samples=["000000"])

    def test_views_and_statistics(self):
        seen = {}

        class Probe(kvsim.Policy):
            needs = {"prefill_column_sums": True, "prefill_window": 2, "window_group_sums": [2],
                     "last_row_head_mean": True}

            def start(self, sample):
                seen.setdefault("samples", []).append(sample["name"])

            def on_prefill(self, view, cache):
                if view.layer == 1:
                    seen["view"] = view
                    seen["sums"] = view.prefill_column_sums(0).copy()
                    seen["window"] = view.prefill_window(0).copy()
                    seen["windows"] = [view.prefill_window(h).copy()
                                       for h in range(view.num_kv_heads * view.group_size)]
                    seen["group_sums"] = view.window_group_sums(1, 2)
                    seen["head_mean"] = view.last_row_head_mean()
                    seen["keys"] = view.keys(1).copy()
                    seen["positions"] = cache.positions(0).copy()

            def on_decode(self, view, att, cache):
                if view.layer == 1 and att.step == 2:
                    seen["step_keys"] = view.keys(1).copy()
                    seen["step_values"] = view.values(0).copy()
                if view.layer == 0 and att.step == 0:
                    seen["probs"] = att.probs(1).copy()
                    seen["sizes"] = [cache.size(g) for g in range(cache.kv_heads)]

        kvsim.replay(self.trace, {"probe": Probe()}, samples=["000000"])
        self.assertEqual(seen["samples"], ["000000"])
        s = kvsim.Trace(self.trace).sample("000000")
        P = s.prompt_len
        layer = s.layer(1)
        # The last prompt row of query head 0, computed here from q and k (scale 1/4).
        logits = (layer["k"][:P, 0] @ layer["q"][P - 1, 0]) * 0.25
        p = np.exp(logits - logits.max())
        p /= p.sum()
        np.testing.assert_allclose(seen["window"][1], p, rtol=1e-4, atol=1e-6)
        self.assertAlmostEqual(seen["sums"].sum(), P, places=2)  # each row sums to 1
        # The window statistics, added as their definitions say: KV head 1's query heads 2 and 3
        # (outer) and their last two rows (inner), in float64 from 0; the last row over every
        # head, each term p / H in float32.
        group_sums, head_mean = np.zeros(P), np.zeros(P)
        for h in (2, 3):
            for row in seen["windows"][h][-2:]:
                group_sums += row.astype(np.float64)
        for window in seen["windows"]:
            head_mean += (window[-1] / np.float32(len(seen["windows"]))).astype(np.float64)
        np.testing.assert_array_equal(seen["group_sums"], group_sums)
        np.testing.assert_array_equal(seen["head_mean"], head_mean)
        # A policy reads only the tokens that exist: the prompt at the prefill, P + t + 1 rows at
        # decode step t.
        np.testing.assert_array_equal(seen["keys"], layer["k"][:P, 1])
        np.testing.assert_array_equal(seen["step_keys"], layer["k"][:P + 3, 1])
        np.testing.assert_array_equal(seen["step_values"], layer["v"][:P + 3, 0])
        np.testing.assert_array_equal(seen["positions"], np.arange(P))
        self.assertEqual(seen["probs"].shape, (2, P + 1))  # group 2, P prompt entries + step 0
        np.testing.assert_allclose(seen["probs"].sum(axis=1), 1, rtol=1e-5)
        self.assertEqual(seen["sizes"], [P + 1, P + 1])
        with self.assertRaisesRegex(RuntimeError, "after its hook returned"):
            seen["view"].layer

    def test_a_failing_policy_is_named(self):
        class Broken(kvsim.Policy):
            def on_prefill(self, view, cache):
                raise ValueError("deliberate")

        # the policy's own exception, as itself, with a note naming the policy
        with self.assertRaisesRegex(ValueError, "deliberate") as raised:
            kvsim.replay(self.trace, {"broken": Broken()})
        self.assertIn("in Python policy 'broken'", raised.exception.__notes__)

        class Greedy(kvsim.Policy):
            def capacity(self, layer, g):
                return 3  # but never evicts: the engine's invariant check names the policy

        with self.assertRaisesRegex(Exception, "greedy"):
            kvsim.replay(self.trace, {"greedy": Greedy()})

        class OutOfRange(kvsim.Policy):
            def on_prefill(self, view, cache):
                view.prefill_column_sums(99)

        with self.assertRaisesRegex(IndexError, "query head 99 out of range"):
            kvsim.replay(self.trace, {"oor": OutOfRange()})
        with self.assertRaisesRegex(TypeError, "kvsim.Policy"):
            kvsim.replay(self.trace, {"x": 3})


class RegisterTest(Fixture):
    def test_a_registered_python_policy_is_used_by_name(self):
        from kvsim.python_policies import H2O
        kvsim.register("py_h2o", H2O, params=[
            {"name": "budget", "type": "size", "default": "20%", "doc": "entries per KV head"},
            {"name": "recent", "type": "size", "default": "50%"}],
            summary="H2O in Python", provenance="python_policies.py")
        listed = {p["name"]: p for p in kvsim.policies()}["py_h2o"]
        self.assertEqual(listed["summary"], "H2O in Python")
        self.assertEqual([p["name"] for p in listed["params"]], ["budget", "recent"])
        res = kvsim.replay(self.trace, {"h2o": {"budget": "12", "recent": "25%"},
                                        "py_h2o": {"budget": "12", "recent": "25%"}})
        a, b = res["policy"] == "h2o", res["policy"] == "py_h2o"
        for col, values in res.items():
            if col != "policy":
                self.assertTrue(same(values[a], values[b]), col)
        with self.assertRaisesRegex(Exception, "py_h2o.*budget"):
            kvsim.replay(self.trace, {"py_h2o": {"budget": "lots"}})
        out = os.path.join(self.dir.name, "sweep_py")
        sw = kvsim.sweep(self.trace, "py_h2o", out, grid={"py_h2o.budget": [8, 12]})
        self.assertEqual(sorted(set(sw["label"])),
                         ["py_h2o[budget=12]", "py_h2o[budget=8]"])  # labels name the swept axes
        kvsim.register("py_h2o", H2O, params=[{"name": "budget", "type": "size", "default": "9"},
                                              {"name": "recent", "type": "size", "default": "0"}])
        again = kvsim.replay(self.trace, "py_h2o", samples=["000000"])
        self.assertTrue(np.all(again["cache_size"] <= 10))
        with self.assertRaisesRegex(ValueError, "built-in"):
            kvsim.register("h2o", H2O)
        with self.assertRaisesRegex(Exception, "parameter 'x'.*type 'number'"):
            kvsim.register("bad", H2O, params=[{"name": "x", "type": "number", "default": 1}])

    def test_a_registered_python_policy_offers_switches(self):
        class KeepFirst(kvsim.Policy):
            """Keeps each KV head's first `keep` prompt entries; never evicts while decoding."""

            def __init__(self, keep):
                self.keep = keep

            def on_prefill(self, view, cache):
                for g in range(cache.kv_heads):
                    cache.keep_only(g, (cache.positions(g) < self.keep).astype(np.uint8))

            def on_decode(self, view, att, cache):
                pass

        # `decode` as the built-ins have it: cap holds what the prefill kept (12, and the step's
        # token while it attends), grow appends every token.
        keep = [{"name": "keep", "type": "int", "default": 12}]
        kvsim.register("py_keep_first", KeepFirst, params=keep, switches=("decode", "question"))
        listed = {p["name"]: p for p in kvsim.policies()}["py_keep_first"]
        self.assertEqual([p["name"] for p in listed["params"]], ["keep", "decode", "question"])
        capped = kvsim.replay(self.trace, {"py_keep_first": {"decode": "cap"}}, samples=["000000"])
        self.assertEqual(capped["cache_size"].max(), 13)
        grown = kvsim.replay(self.trace, {"py_keep_first": {"decode": "grow"}}, samples=["000000"])
        self.assertEqual(grown["cache_size"].max(), 12 + grown["step"].max() + 1)
        from kvsim.python_policies import H2O
        budget = [{"name": "budget", "type": "size", "default": "12"}]
        with self.assertRaisesRegex(ValueError, "declares a parameter 'question', the name of a "
                                    "switch"):
            kvsim.register("py_impostor", H2O, params=budget + [
                {"name": "question", "type": "choice", "default": "append",
                 "choices": ["compress", "append"]}])
        with self.assertRaisesRegex(ValueError, "unknown switch 'compress'"):
            kvsim.register("py_compress", H2O, params=budget, switches="compress")


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


class StatsTest(Fixture):
    def test_same_arrays_as_the_stats_file(self):
        out = os.path.join(self.dir.name, "s.h5")
        run("stats", self.trace, "--out", out, "--ppci", "0.5", "-j", "2")
        st = kvsim.stats(self.trace, ppci=[0.5], threads=1)
        self.assertEqual(sorted(st), ["000000", "000001"])
        with h5py.File(out, "r") as f:
            for sample, arrays in st.items():
                g = f[f"samples/{sample}"]
                self.assertEqual(sorted(arrays), sorted(g))
                for name, a in arrays.items():
                    self.assertTrue(np.array_equal(a, g[name][()], equal_nan=True), name)


class SweepTest(Fixture):
    def test_same_results_file_as_the_command_line(self):
        cli, py = os.path.join(self.dir.name, "cli"), os.path.join(self.dir.name, "py")
        run("sweep", "-t", self.trace, "-p", "h2o", "-p", "streamingllm",
            "--grid", "h2o.budget=8,12", "--grid", "h2o.recent=25%,50%",
            "--set", "streamingllm.sinks=2", "--budget", "10", "-o", cli, "-j", "2")
        res = kvsim.sweep(self.trace, ["h2o", "streamingllm"], py,
                          grid={"h2o.budget": [8, 12], "h2o.recent": ["25%", "50%"]},
                          set={"streamingllm.sinks": 2}, budget="10", threads=1)
        with open(os.path.join(cli, "results.csv"), "rb") as a, \
                open(os.path.join(py, "results.csv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual(len(set(res["label"])), 5)  # 4 h2o configurations + streamingllm
        self.assertEqual(res["mean_mass_recall"].dtype, np.float64)
        again = kvsim.sweep(self.trace, ["h2o", "streamingllm"], py, budget="10",
                            grid=["h2o.budget=8,12", "h2o.recent=25%,50%"],
                            set={"streamingllm.sinks": 2})
        np.testing.assert_array_equal(again["mean_mass_recall"], res["mean_mass_recall"])


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
