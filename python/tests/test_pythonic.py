"""The Python face as Python people expect it: mapping-like traces, Python's exceptions, the
user's own exception raised as itself, DataFrames with proper dtypes, progress, policy objects
in lists, warnings for misspelt hooks, and kvsim.ScorerPolicy checked against numpy and against
the built-in policies it re-states."""
import inspect
import os
import subprocess
import sys
import tempfile
import unittest
import warnings

import numpy as np
import pandas as pd

import kvsim

BINARY = os.environ.get("KVSIM_BINARY", "kvsim")


def knorm_scores(view):
    """kvpress's KnormPress: score = -||k|| (kvpress/presses/knorm_press.py)."""
    return -np.linalg.norm([view.keys(g) for g in range(view.num_kv_heads)], axis=-1)


def small_trace(*extra):
    """A 2-layer GQA trace (4 query heads on 2 KV heads) in a fresh directory: (dir, path)."""
    where = tempfile.mkdtemp()
    path = os.path.join(where, "t.h5")
    subprocess.run([BINARY, "synth", "--out", path, "--layers", "2", "--heads", "4",
                    "--kv-heads", "2", "--head-dim", "16", "--media-tokens", "40",
                    "--user-tokens", "8", "--gen", "10", *extra], check=True, capture_output=True)
    return where, path


class KnormPress(kvsim.ScorerPolicy):
    def score(self, view, cache):
        return knorm_scores(view)


class Pythonic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir, cls.trace = small_trace("--samples", "3")

    def test_a_trace_is_a_mapping_of_samples(self):
        with kvsim.Trace(self.trace) as t:
            self.assertEqual(len(t), 3)
            self.assertEqual([s.name for s in t], t.samples())
            self.assertIn("000001", t)
            self.assertNotIn("nosuch", t)
            self.assertEqual(t["000002"].name, "000002")
            with self.assertRaises(KeyError) as e:
                t["nosuch"]
            self.assertIn("'000000', '000001', '000002'", str(e.exception))

    def test_python_exceptions(self):
        with self.assertRaises(FileNotFoundError):
            kvsim.Trace(os.path.join(self.dir, "nosuch.h5"))
        with self.assertRaises(FileNotFoundError):
            kvsim.replay(os.path.join(self.dir, "nosuch.h5"), "h2o")
        with self.assertRaises(KeyError):
            kvsim.replay(self.trace, "h2o", samples=["nosuch"])
        with self.assertRaises(ValueError):
            kvsim.replay(self.trace, {"h2o": {"budget": "abc"}})
        with self.assertRaises(ValueError):
            kvsim.resolve_budget("abc", 10)

    def test_a_prompt_tail_is_fed_after_compression(self):
        # The last prompt token (then the question) becomes the first decode step of every
        # policy, a Python one included: one more step per head, at the prompt's last position.
        plain = pd.DataFrame(kvsim.replay(self.trace, ["h2o", KnormPress("20%")], budget="20%",
                                          samples=["000000"]))
        with kvsim.Trace(self.trace) as t:
            P = t["000000"].prompt_len
        for tail, fed in ((1, 1), ("question", 8)):
            tailed = pd.DataFrame(kvsim.replay(self.trace, ["h2o", KnormPress("20%")], budget="20%",
                                               samples=["000000"], prompt_tail=tail))
            self.assertEqual(len(tailed), len(plain) + fed * len(plain) // 10)
            for policy in ("h2o", "KnormPress"):
                rows = tailed[(tailed["policy"] == policy) & (tailed["step"] == 0)]
                self.assertEqual(set(rows["position"]), {P - fed})
        with self.assertRaises(ValueError):
            kvsim.replay(self.trace, "h2o", budget="20%", prompt_tail="first")
        with self.assertRaises(TypeError):
            kvsim.replay(self.trace, "h2o", budget="20%", prompt_tail=1.5)
        with self.assertRaises(ValueError):  # its own order, refused beside a tail
            kvsim.replay(self.trace, "snapkv:kvpress", budget="20%", prompt_tail=1)

    def test_crossed_bootstrap_resamples_seeds_and_items(self):
        # The worked example of tests/test_statistics.cpp: 16 equally likely resamples, three of
        # them at or below 0 (p = 0.375), the interval their extremes.
        b = kvsim.crossed_bootstrap([[1, -3], [2, 4]], resamples=40000, seed=3)
        self.assertEqual((b["seeds"], b["items"]), (2, 2))
        self.assertEqual((b["mean"], b["ci_low"], b["ci_high"]), (1.0, -3.0, 4.0))
        self.assertAlmostEqual(b["p_value"], 0.375, delta=0.01)
        with self.assertRaises(ValueError):
            kvsim.crossed_bootstrap([1.0, 2.0])
        with self.assertRaises(ValueError):
            kvsim.crossed_bootstrap([[1.0, float("nan")], [2.0, 3.0]])

    def test_compare_seeds_takes_a_long_table_of_seeds_and_samples(self):
        # tests/test_statistics.cpp's worked family: `a` differs from the reference by
        # [[1, -3], [2, 4]] (p 0.375), `b` by 0.5 everywhere (shown); the reference lacks sample
        # i2 under seed 0, so both use two samples. Two draws of one cell are averaged.
        import pandas as pd

        cells = {"ref": [[0, 1, float("nan")], [1, 0, 2]], "a": [[1, -2, 5], [3, 4, 5]],
                 "b": [[0.5, 1.5, 0], [1.5, 0.5, 0]]}
        rows = [{"seed": s, "policy": p, "sample": f"i{i}", "v": m[s][i]}
                for p, m in cells.items() for s in range(2) for i in range(3)]
        rows += [{"seed": 0, "policy": "b", "sample": "i0", "v": 0.5 + d} for d in (-0.25, 0.25)]
        table = pd.DataFrame(rows)
        c = kvsim.compare_seeds(table, "v", "ref", higher_is_better=True, resamples=40000)
        a, b = c.iloc[0], c.iloc[1]
        self.assertEqual((a["policy"], a["n"], a["seeds"], a["test"]), ("a", 2, 2, "crossed_bootstrap"))
        self.assertEqual((a["difference"], a["ci_low"], a["ci_high"]), (1.0, -3.0, 4.0))
        self.assertAlmostEqual(a["p_value"], 0.375, delta=0.01)
        self.assertEqual((b["difference"], b["verdict"]), (0.5, "better"))
        self.assertEqual(b["p_holm"], 2 * b["p_value"])
        self.assertAlmostEqual(a["detectable"], (2.241403 + 0.841621) * (43 / 16) ** 0.5, delta=0.05)
        with self.assertRaises(ValueError):
            kvsim.compare_seeds(table.assign(budget=[10, 20] * (len(rows) // 2)), "v", "ref",
                                higher_is_better=True)
        with self.assertRaises(ValueError):
            kvsim.compare_seeds(table, "v", "nobody", higher_is_better=True)
        with self.assertRaises(ValueError):
            kvsim.compare_seeds(table.drop(columns="seed"), "v", "ref", higher_is_better=True)

    def test_the_users_exception_is_raised_as_itself(self):
        class Boom(kvsim.Policy):
            def on_prefill(self, view, cache):
                raise ZeroDivisionError("in my policy")

        try:  # not assertRaises, which drops the traceback
            kvsim.replay(self.trace, [Boom(), "h2o"])
            self.fail("no exception")
        except ZeroDivisionError as e:
            self.assertIn("in Python policy 'Boom'", getattr(e, "__notes__", []))
            frames = [f.name for f in __import__("traceback").extract_tb(e.__traceback__)]
            self.assertEqual(frames[-1], "on_prefill", "the traceback reaches into the policy")

    def test_resolve_budget_is_the_engines_rule(self):
        self.assertEqual(kvsim.resolve_budget("20%", 640), 128)  # ceil(0.2 * 640)
        self.assertEqual(kvsim.resolve_budget("20%", 641), 129)  # rounds up
        self.assertEqual(kvsim.resolve_budget("96", 640), 96)
        self.assertEqual(kvsim.resolve_budget("compression_ratio:0.8", 640), 127)  # kvpress int()
        # A repository's rounding (a policy's budget_rounding): Python's int(640 * (1 - 0.8)),
        # round(5 * 0.5) (half to even) and int(0.29 * 100).
        self.assertEqual(kvsim.resolve_budget("20%", 640, "kvpress"), 127)
        self.assertEqual(kvsim.resolve_budget("50%", 5, "round"), 2)
        self.assertEqual(kvsim.resolve_budget("29%", 100, "floor"), 28)

    def test_optional_metrics_by_name(self):
        metrics = {m["name"]: m for m in kvsim.step_metrics()}
        self.assertFalse(metrics["diagnostics"]["always"])
        self.assertTrue(metrics["regret"]["always"])
        self.assertEqual(metrics["diagnostics"]["counts"], ["misses_top10"])
        named = kvsim.replay(self.trace, ["h2o"], budget="30%", metrics=["diagnostics"])
        flagged = kvsim.replay(self.trace, ["h2o"], budget="30%", diagnostics=True)
        plain = kvsim.replay(self.trace, ["h2o"], budget="30%")
        self.assertEqual(list(named), list(plain))
        columns = [c for m in metrics.values() for c in m["columns"]]
        self.assertEqual(list(named)[-len(columns):], columns)
        for column in named:
            np.testing.assert_array_equal(named[column], flagged[column])
        self.assertFalse(np.isnan(named["hit_rate_top10"]).any())
        self.assertTrue(np.isnan(plain["hit_rate_top10"]).all())
        with self.assertRaisesRegex(ValueError, "unknown metric 'hits'.*diagnostics"):
            kvsim.replay(self.trace, ["h2o"], budget="30%", metrics=["hits"])

    def test_frames_have_proper_dtypes(self):
        res = kvsim.replay(self.trace, ["h2o", "snapkv"], budget="30%")
        df = kvsim.replay(self.trace, ["h2o", "snapkv"], budget="30%", as_frame=True)
        self.assertIsInstance(df, pd.DataFrame)
        self.assertEqual(list(df.columns), list(res))
        self.assertEqual(df["mass_recall"].dtype, np.float32)
        self.assertEqual(df["layer"].dtype, np.int64)
        self.assertEqual(str(df["misses_top10"].dtype), "Int64")
        self.assertEqual(str(df["policy"].dtype), "string")
        np.testing.assert_array_equal(df["mass_recall"].to_numpy(), res["mass_recall"])
        stats = kvsim.stats(self.trace, samples=["000000"], as_frame=True)
        self.assertEqual(list(stats["layer"]), [0, 1])
        sweep = kvsim.sweep(self.trace, "h2o", os.path.join(self.dir, "sw"),
                            grid={"h2o.budget": ["20%", "40%"]}, as_frame=True)
        self.assertEqual(sorted(sweep["label"].unique()),
                         ["h2o[budget=20%]", "h2o[budget=40%]"])

    def test_progress_callback_counts_every_layer(self):
        seen = []
        kvsim.replay(self.trace, "h2o", progress=lambda done, total: seen.append((done, total)))
        self.assertEqual(seen, [(i, 6) for i in range(1, 7)])  # 3 samples x 2 layers
        kvsim.replay(self.trace, "h2o", progress=True)  # a tqdm bar; must not fail
        seen.clear()
        kvsim.sweep(self.trace, "h2o", os.path.join(self.dir, "sw_progress"),
                    grid={"h2o.budget": ["20%", "40%"]}, progress=lambda d, t: seen.append((d, t)))
        self.assertEqual(seen[-1], (6, 6), seen)  # 3 samples x 2 layers, both configurations at once

    def test_signatures_are_visible(self):
        params = inspect.signature(kvsim.replay).parameters
        self.assertIn("as_frame", params)
        self.assertIn("progress", params)

    def test_policy_objects_in_a_list_are_labelled_by_class(self):
        res = kvsim.replay(self.trace, [KnormPress(budget="30%"), KnormPress(budget="50%"), "h2o"],
                           budget="30%")
        self.assertEqual(list(dict.fromkeys(res["policy"])), ["KnormPress", "KnormPress@2", "h2o"])

    def test_misspelt_hooks_and_no_hooks_warn(self):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")

            class Typo(kvsim.Policy):
                def on_prefil(self, view, cache):
                    pass

        messages = [str(x.message) for x in w]
        self.assertTrue(any("did you mean on_prefill" in m for m in messages), messages)
        self.assertTrue(any("overrides no hook" in m for m in messages), messages)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")

            class Fine(kvsim.ScorerPolicy):
                def score(self, view, cache):
                    return knorm_scores(view)

        self.assertEqual(w, [])


class Scorer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir, cls.trace = small_trace()

    def kept_after_prefill(self, policy):
        """Positions each (layer, head) keeps at the prefill, from the decisions log."""
        res, dec = kvsim.replay(self.trace, {"p": policy}, decisions=True)
        P = kvsim.Trace(self.trace)[kvsim.Trace(self.trace).samples()[0]].prompt_len
        out = {}
        for layer in range(2):
            for g in range(2):
                sel = ((dec["layer"] == layer) & (dec["kv_head"] == g) & (dec["step"] == -1))
                out[(layer, g)] = sorted(set(range(P)) - set(dec["position"][sel].tolist()))
        return out

    def test_knorm_press_keeps_the_smallest_key_norms(self):
        t = kvsim.Trace(self.trace)
        s = t[t.samples()[0]]
        P, keep = s.prompt_len, kvsim.resolve_budget("30%", s.prompt_len)
        kept = self.kept_after_prefill(KnormPress(budget="30%"))
        for layer in range(2):
            k = s.layer(layer)["k"][:P]
            for g in range(2):
                norms = np.linalg.norm(k[:, g, :].astype(np.float64), axis=-1)
                # numpy reference: the keep smallest norms, ties to the newer position
                order = sorted(range(P), key=lambda j: (norms[j], -j))
                self.assertEqual(kept[(layer, g)], sorted(order[:keep]), (layer, g))

    def test_knorm_press_equals_the_built_in_knorm(self):
        res = kvsim.replay(self.trace, {"knorm": {"budget": "30%"}, "py": KnormPress("30%")},
                           as_frame=True)
        a = res[res.policy == "knorm"].drop(columns="policy").reset_index(drop=True)
        b = res[res.policy == "py"].drop(columns="policy").reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)

    def test_window_and_sinks_are_kept(self):
        kept = self.kept_after_prefill(KnormPress(budget="30%", window=8, sinks=2))
        P = kvsim.Trace(self.trace)[kvsim.Trace(self.trace).samples()[0]].prompt_len
        keep = kvsim.resolve_budget("30%", P)
        for positions in kept.values():
            self.assertEqual(len(positions), keep)
            self.assertTrue({0, 1} <= set(positions))
            self.assertTrue(set(range(P - 8, P)) <= set(positions))

    def test_adaptive_selection_keeps_heads_times_budget_with_a_floor(self):
        kept = self.kept_after_prefill(KnormPress(budget="30%", selection="adaptive", alpha=0.5))
        P = kvsim.Trace(self.trace)[kvsim.Trace(self.trace).samples()[0]].prompt_len
        keep = kvsim.resolve_budget("30%", P)
        t = kvsim.Trace(self.trace)
        s = t[t.samples()[0]]
        for layer in range(2):
            sizes = [len(kept[(layer, g)]) for g in range(2)]
            self.assertEqual(sum(sizes), 2 * keep)
            self.assertTrue(all(n >= int(0.5 * keep) for n in sizes), sizes)
            # the joint part: every kept entry beyond a head's floor outscores every dropped one
            k = s.layer(layer)["k"][:P].astype(np.float64)
            scores = -np.linalg.norm(k, axis=-1)  # [P, Hkv]
            dropped = max(scores[j, g] for g in range(2) for j in range(P)
                          if j not in kept[(layer, g)])
            floor_n = int(0.5 * keep)
            for g in range(2):
                mine = sorted((scores[j, g] for j in kept[(layer, g)]), reverse=True)
                self.assertTrue(all(x >= dropped for x in mine[floor_n:]), (layer, g))

    def test_decode_selection_holds_the_budget(self):
        res = kvsim.replay(self.trace, {"p": KnormPress(budget="30%", decode=True)}, as_frame=True)
        P = kvsim.Trace(self.trace)[kvsim.Trace(self.trace).samples()[0]].prompt_len
        keep = kvsim.resolve_budget("30%", P)
        # after each step's append and selection, at most `keep` entries stay
        self.assertLessEqual(res["cache_size"].max(), keep + 1)  # the step attends keep + 1

    def test_bad_scores_and_parameters(self):
        class Wrong(kvsim.ScorerPolicy):
            def score(self, view, cache):
                return np.zeros(3)

        with self.assertRaises(ValueError):
            kvsim.replay(self.trace, [Wrong(budget="30%")])
        with self.assertRaises(ValueError):
            KnormPress(budget="30%", selection="global")
        with self.assertRaises(ValueError):
            KnormPress(budget="lots")
        # No default budget: a press states what it keeps, as kvpress's compression_ratio.
        self.assertIs(inspect.signature(kvsim.ScorerPolicy).parameters["budget"].default,
                      inspect.Parameter.empty)
        with self.assertRaises(TypeError):
            KnormPress()

    def test_an_interpreter_without_numpy_is_told_what_to_use(self):
        # numpy hidden from a fresh interpreter (as under a python3 that is not Debian's): kvsim
        # imports, and each use names what is missing and which interpreter has it.
        code = ("import sys; sys.modules['numpy'] = None\n"
                "import kvsim\n"
                "for use in (lambda: kvsim.replay(%r, 'h2o'), lambda: kvsim.Trace(%r),\n"
                "            lambda: __import__('kvsim.plot')):\n"
                "    try:\n"
                "        use()\n"
                "    except ImportError as e:\n"
                "        print(e)\n" % (self.trace, self.trace))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        self.assertEqual(len(out), 3, out)
        self.assertTrue(out[0].startswith("kvsim.replay is unavailable: kvsim needs numpy, "
                                          f"which this interpreter ({sys.executable}) lacks"),
                        out[0])
        self.assertTrue(out[1].startswith("kvsim.Trace is unavailable: kvsim needs numpy"), out[1])
        self.assertTrue(out[2].startswith("kvsim.plot needs numpy and matplotlib; this "
                                          f"interpreter ({sys.executable}) lacks numpy"), out[2])
        for line in out:
            self.assertIn("/usr/bin/python3", line)

    def test_replay_warns_as_the_command_line_does(self):
        # A budget a self-sizing policy does not take, and a window clamped to a small budget:
        # Python warnings, in the words `kvsim replay` prints, attributed to the caller.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kvsim.replay(self.trace, ["h2o", "st3"], budget="20%", samples=["000000"])
        texts = [str(w.message) for w in caught]
        self.assertTrue(any(t.startswith("the budget 20% does not apply to st3") for t in texts),
                        texts)
        self.assertTrue(all(w.category is UserWarning for w in caught))
        self.assertTrue(all(w.filename == __file__ for w in caught), [w.filename for w in caught])
        cli = subprocess.run([BINARY, "replay", self.trace, "-p", "snapkv", "--set",
                              "snapkv.budget=3", "-s", "000000"], capture_output=True, text=True)
        cli_warnings = [line[len("kvsim: warning: "):] for line in cli.stderr.splitlines()
                        if line.startswith("kvsim: warning: ")]
        self.assertTrue(cli_warnings, cli.stderr)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kvsim.replay(self.trace, {"snapkv": {"budget": 3}}, samples=["000000"])
        self.assertEqual([str(w.message) for w in caught], cli_warnings)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with self.assertRaises(UserWarning):
                kvsim.replay(self.trace, {"snapkv": {"budget": 3}}, samples=["000000"])



class Comparisons(unittest.TestCase):
    """kvsim.summarize and kvsim.compare: the same numbers as `kvsim compare` and the replay
    summary, seeds pooled, equal memory held."""

    @classmethod
    def setUpClass(cls):
        cls.where, cls.trace = small_trace("--samples", "4")
        cls.summary = os.path.join(cls.where, "summary.csv")
        subprocess.run([BINARY, "replay", cls.trace, "-p", "full,h2o,random,snapkv", "--budget",
                        "20%", "--seeds", "3", "--equal-memory", "--summary", cls.summary],
                       check=True, capture_output=True)

    def test_summarize_equals_the_replay_summary(self):
        got = kvsim.summarize(self.summary, "mean_mass_recall").set_index("policy")
        table = pd.read_csv(self.summary)
        overall = table[table["sample"] == "all"].set_index("policy")
        for policy in ("h2o", "random"):
            self.assertEqual(got.loc[policy, "n"], 4)
            self.assertAlmostEqual(got.loc[policy, "mean"], overall.loc[policy, "mean_mass_recall"],
                                   places=6)
            self.assertAlmostEqual(got.loc[policy, "ci_low"],
                                   overall.loc[policy, "mass_recall_ci_low"], places=6)
        self.assertEqual(got.loc["random", "seeds"], 3)
        self.assertAlmostEqual(got.loc["random", "seed_sd"],
                               overall.loc["random", "mass_recall_seed_sd"], places=6)

    def test_compare_equals_the_command(self):
        out = os.path.join(self.where, "compare.csv")
        subprocess.run([BINARY, "compare", self.summary, "-m", "mean_output_rel_error", "-r",
                        "random", "-o", out], check=True, capture_output=True)
        cli = pd.read_csv(out)
        py = kvsim.compare(self.summary, "mean_output_rel_error", reference="random")
        self.assertEqual(list(py["policy"]), list(cli["policy"]))
        for column in ("difference", "ci_low", "ci_high", "p_value", "p_holm"):
            np.testing.assert_allclose(py[column].to_numpy(float), cli[column].to_numpy(float),
                                       rtol=1e-7)
        self.assertEqual(list(py["verdict"]), list(cli["verdict"]))
        with self.assertRaises(KeyError):
            kvsim.compare(self.summary, "mean_output_rel_error", reference="nobody")
        with self.assertRaises(ValueError):
            kvsim.compare(self.summary, "rows", reference="full")

    def test_replay_seeds_and_equal_memory(self):
        res = kvsim.replay(self.trace, ["random", "snapkv"], budget="20%", seeds=2,
                           equal_memory=True, as_frame=True)
        self.assertEqual(sorted(set(res["policy"])), ["random@seed0", "random@seed1", "snapkv"])
        # Entries held at each step (stored minus the step's own token), summed over the 2
        # layers and 2 KV heads, never above the budget of each.
        held = (res["cache_size"] - 1).groupby([res["policy"], res["sample"], res["step"]]).sum()
        with kvsim.Trace(self.trace) as t:
            prompt = t.sample(t.samples()[0]).prompt_len
        self.assertLessEqual(held.max(), kvsim.resolve_budget("20%", prompt) * 2 * 2)
        self.assertEqual(held.max(), kvsim.resolve_budget("20%", prompt) * 2 * 2)


    def test_compare_holds_memory_equal_unless_asked(self):
        py = kvsim.compare(self.summary, "mean_output_rel_error", reference="random")
        self.assertEqual(sorted(py["policy"]), ["h2o", "snapkv"])
        self.assertEqual(py.attrs["skipped"], ["full (keeps everything)"])
        self.assertEqual(set(py["family_size"]), {2})
        with self.assertRaisesRegex(KeyError, "did not hold the memory"):
            kvsim.compare(self.summary, "mean_output_rel_error", reference="random",
                          policies="full")
        every = kvsim.compare(self.summary, "mean_output_rel_error", reference="random",
                              any_memory=True)
        self.assertEqual(list(every["memory"]),
                         ["keeps everything"] + [every["memory"].iloc[1]] * 2)
        # 4 samples: the smallest p is 2 / 2^4, so no figure of a detectable difference.
        self.assertTrue(np.allclose(every["smallest_p"], 0.125))
        self.assertTrue(every["detectable"].isna().all())


class SafeOutputs(unittest.TestCase):
    """Python writes as the command line does: never over an input, a trace or a prompt file
    replaced only when forced, and the old file untouched by a refusal."""

    def setUp(self):
        self.where, self.trace = small_trace()
        with open(self.trace, "rb") as f:
            self.bytes = f.read()

    def untouched(self):
        with open(self.trace, "rb") as f:
            self.assertEqual(f.read(), self.bytes)

    def copy_samples(self):
        with kvsim.Trace(self.trace) as t:
            s = t.sample(t.samples()[0])
            return {"a": {"prompt_len": s.prompt_len, "modality": s.modality,
                          "segment": s.segment, "layers": [s.layer(l) for l in range(2)]}}

    def test_traces_are_replaced_only_when_forced(self):
        with self.assertRaisesRegex(FileExistsError, "an existing kvtrace file is there; kvsim "
                                                     "replaces it only when told to"):
            kvsim.write_trace(self.trace, self.copy_samples())
        self.untouched()
        with self.assertRaisesRegex(FileExistsError, "is the input trace"):
            kvsim.compact_trace(self.trace, self.trace)
        self.untouched()
        from kvsim import prompts

        with self.assertRaisesRegex(FileExistsError, "this output is not one"):
            prompts.write(self.trace, {"x": {"token_ids": [1, 2]}}, force=True)
        self.untouched()
        from kvsim._kvsim import check_outputs

        with self.assertRaisesRegex(FileExistsError, "out .*: is the input trace"):
            check_outputs([(self.trace, "out", "result")], [(self.trace, "trace")])
        kvsim.write_trace(self.trace, self.copy_samples(), force=True)
        self.assertEqual(kvsim.Trace(self.trace).samples(), ["a"])

    def test_prompt_files_too(self):
        from kvsim import prompts

        path = os.path.join(self.where, "p.h5")
        prompts.write(path, {"x": {"token_ids": [1, 2]}})
        with self.assertRaisesRegex(FileExistsError, "existing kvprompt file"):
            prompts.write(path, {"y": {"token_ids": [1, 3]}})
        prompts.write(path, {"y": {"token_ids": [1, 3]}}, force=True)
        r = subprocess.run([sys.executable, "-m", "kvsim.prompts", "--ids", "1,4", "-o", path],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("replaces it only when told to", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_a_sweep_never_writes_its_results_over_a_trace(self):
        out = os.path.join(self.where, "sweep")
        os.makedirs(out)
        inside = os.path.join(out, "results.csv")
        os.replace(self.trace, inside)  # a trace where the results file would go
        with self.assertRaisesRegex(FileExistsError, "is the input trace"):
            kvsim.sweep([inside], ["h2o"], out, budget="20%")
        with open(inside, "rb") as f:
            self.assertEqual(f.read(), self.bytes)


class Documented(unittest.TestCase):
    def test_every_public_name_is_in_the_reference_and_has_a_docstring(self):
        here = os.path.dirname(os.path.abspath(__file__))
        reference = open(os.path.join(here, "..", "..", "docs", "python.md"), encoding="utf-8").read()
        import kvsim.plot

        missing_doc, missing_ref = [], []
        for module, names in ((kvsim, kvsim.__all__), (kvsim.plot, kvsim.plot.__all__)):
            for name in names:
                if name.startswith("__"):
                    continue
                qualified = f"{module.__name__}.{name}"
                obj = getattr(module, name)
                if not (getattr(obj, "__doc__", None) or "").strip():
                    missing_doc.append(qualified)
                # the reference names it as kvsim.X, kvsim.plot.X, or (classes) `X`
                if qualified not in reference and f"`{name}" not in reference:
                    missing_ref.append(qualified)
        self.assertEqual(missing_doc, [], "public names without a docstring")
        self.assertEqual(missing_ref, [], "public names missing from docs/python.md")


class Prompts(unittest.TestCase):
    def test_write_checks_everything_first_and_kvsim_reads_it(self):
        import h5py
        from kvsim import prompts

        where = tempfile.mkdtemp()
        path = prompts.write(os.path.join(where, "p.h5"), {
            "a": {"token_ids": [1, 5, 6, 7], "modality": [0, 1, 1, 0], "reference_ids": [9, 2],
                  "task": "t", "question_len": 1},
            "b": {"token_ids": [1, 8]}})
        with h5py.File(path) as f:
            self.assertEqual(f.attrs["kvprompt_version"], 1)
            self.assertEqual(f["samples/a/token_ids"].dtype, np.int32)
            self.assertEqual(list(f["samples/a/modality"][()]), [0, 1, 1, 0])
            self.assertEqual(list(f["samples/a/reference_ids"][()]), [9, 2])
            self.assertEqual(f["samples/a"].attrs["question_len"], 1)
        for bad, what in (({"x": {"token_ids": []}}, "sample 'x'"),
                          ({"x": {"token_ids": [1, 2], "modality": [0]}}, "modality has 1"),
                          ({"x": {"tokens": [1]}}, "token_ids is required")):
            with self.assertRaisesRegex(ValueError, what):
                prompts.write(os.path.join(where, "bad.h5"), bad)
            self.assertFalse(os.path.exists(os.path.join(where, "bad.h5")))

    def test_from_texts_puts_the_start_token_first_once(self):
        from kvsim import prompts

        def tokenize(text):  # one id per word, as a stand-in tokenizer
            return [10 + len(w) for w in text.split()]

        s = prompts.from_texts(tokenize, ["a bb ccc"], references=["dd"], bos=1)["000000"]
        self.assertEqual(s["token_ids"], [1, 11, 12, 13])
        self.assertEqual(s["reference_ids"], [12])
        self.assertEqual(prompts.from_texts(lambda t: [1, 7], ["x"], bos=1)["000000"]["token_ids"],
                         [1, 7])  # a tokenizer that adds it already
        self.assertEqual(prompts.from_texts(tokenize, ["a"], bos=None)["000000"]["token_ids"], [11])

    def test_the_command_line(self):
        import h5py

        where = tempfile.mkdtemp()
        out = os.path.join(where, "ids.h5")
        r = subprocess.run([sys.executable, "-m", "kvsim.prompts", "--ids", "1,4,5", "--ids", "1,6",
                            "-o", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(out) as f:
            self.assertEqual(sorted(f["samples"]), ["000000", "000001"])
            self.assertEqual(list(f["samples/000001/token_ids"][()]), [1, 6])


if __name__ == "__main__":
    unittest.main()
