"""kvsim.plot: Figures from results in memory or on disk, their data checked against sums done
here independently (pandas group-bys, numpy softmax)."""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import kvsim
import kvsim.plot as kp

BINARY = os.environ.get("KVSIM_BINARY", "kvsim")


class Plot(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.trace = os.path.join(cls.dir, "t.h5")
        subprocess.run([BINARY, "synth", "--out", cls.trace, "--layers", "3", "--heads", "4",
                        "--kv-heads", "2", "--head-dim", "16", "--media-tokens", "48",
                        "--user-tokens", "8", "--gen", "12"], check=True, capture_output=True)

    def test_recall_by_layer_is_the_mean_per_policy_and_layer(self):
        res = kvsim.replay(self.trace, ["h2o", "snapkv"], budget="25%")
        df = pd.DataFrame(res)
        expected = df.groupby(["policy", "layer"])["mass_recall"].mean()
        for source in (res, df):
            fig = kp.recall_by_layer(source)
            self.assertIsInstance(fig, Figure)
            lines = {l.get_label(): l for l in fig.axes[0].lines}
            self.assertEqual(set(lines), {"h2o", "snapkv"})
            for label, line in lines.items():
                np.testing.assert_allclose(line.get_ydata(), expected[label].to_numpy(), rtol=1e-6)
                self.assertEqual(list(line.get_xdata()), [0, 1, 2])

    def test_seeds_are_one_line_and_self_sizing_policies_a_panel_apart(self):
        from kvsim.report import figures

        steps = os.path.join(self.dir, "seeded.csv")
        subprocess.run([BINARY, "replay", self.trace, "-p", "full,random,h2o,st3", "--budget",
                        "25%", "--seeds", "3", "--equal-memory", "-o", steps], check=True,
                       capture_output=True)
        fig = figures.recall_by_layer_figure(figures.ReplayMeans(steps), "seeded")
        budgeted, apart = fig.axes[0], fig.axes[1]
        self.assertEqual({l.get_label() for l in budgeted.lines},
                         {"full", "random (3 seeds); shaded: their range", "h2o"})
        self.assertEqual({l.get_label() for l in apart.lines}, {"st3"})
        self.assertIn("sizing their caches themselves", apart.get_title())
        df = pd.read_csv(steps)
        per_run = df[df["policy"].str.startswith("random")].groupby(["policy", "layer"])[
            "mass_recall"].mean().unstack()
        line = next(l for l in budgeted.lines if l.get_label().startswith("random"))
        np.testing.assert_allclose(line.get_ydata(), per_run.mean().to_numpy(), rtol=1e-6)
        band = budgeted.collections[0].get_paths()[0].vertices[:, 1]  # the range over seeds
        self.assertAlmostEqual(band.min(), per_run.min().min(), places=6)
        self.assertAlmostEqual(band.max(), per_run.max().max(), places=6)

    def test_a_summary_is_drawn_with_its_intervals_at_equal_memory(self):
        from kvsim.report import figures

        trace, summary = os.path.join(self.dir, "four.h5"), os.path.join(self.dir, "summary.csv")
        subprocess.run([BINARY, "synth", "--out", trace, "--samples", "4", "--layers", "2",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--media-tokens",
                        "48", "--user-tokens", "8", "--gen", "8"], check=True, capture_output=True)
        subprocess.run([BINARY, "replay", trace, "-p", "full,random,h2o,st3", "--budget",
                        "25%", "--seeds", "3", "--equal-memory", "--summary", summary],
                       check=True, capture_output=True)
        fig = figures.summary_figure(summary)
        overall = pd.read_csv(summary, dtype={"layer": str}).query("sample == 'all'")
        overall = overall.set_index("policy")
        recall = fig.axes[0]
        self.assertEqual([t.get_text() for t in recall.get_yticklabels()],
                         ["random (3 seeds)", "h2o"])  # budgeted, the seeds pooled
        for container, policy in zip(recall.containers, ["random", "h2o"]):
            low, high = overall.loc[policy, ["mass_recall_ci_low", "mass_recall_ci_high"]]
            segment = container.lines[2][0].get_segments()[0]  # the interval drawn
            np.testing.assert_allclose(sorted(segment[:, 0]), [low, high], rtol=1e-6)
        memory = fig.axes[2]
        self.assertEqual(len(memory.containers), 4)  # full, random, h2o and st3 by memory held
        out = os.path.join(self.dir, "figs_summary")
        r = subprocess.run([BINARY, "figures", summary, "--out", out], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "summary_at_equal_memory.png")))

    def test_stats_across_samples_are_their_mean_with_an_interval(self):
        import h5py
        from kvsim.report import figures

        trace, stats = os.path.join(self.dir, "three.h5"), os.path.join(self.dir, "three_stats.h5")
        subprocess.run([BINARY, "synth", "--out", trace, "--samples", "3", "--layers", "3",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--media-tokens",
                        "48", "--gen", "6"], check=True, capture_output=True)
        subprocess.run([BINARY, "stats", trace, "-o", stats], check=True, capture_output=True)
        with h5py.File(stats, "r") as f:
            fig = figures.stats_across_samples_figure(f, "three")
            entropy = np.array([g["entropy"][()] for g in f["samples"].values()])
        ax = fig.axes[1]
        line = next(l for l in ax.lines if l.get_label() == "attention entropy")
        np.testing.assert_allclose(line.get_ydata(), entropy.mean(axis=0), rtol=1e-9)
        band = ax.collections[0].get_paths()[0].vertices[:, 1]
        self.assertTrue(np.all(np.isfinite(band)))  # an interval over the three samples
        self.assertGreaterEqual(band.min(), entropy.min() - 1e-9)
        self.assertLessEqual(band.max(), entropy.max() + 1e-9)

    def test_every_preset_has_its_own_colour_in_its_policys_hue(self):
        import colorsys

        import matplotlib.colors as mc
        from kvsim.report.figure_style import policy_colour

        by_policy = {}
        for p in kvsim.presets():
            by_policy.setdefault(p["policy"], [p["policy"]]).append(p["name"])
        for policy, labels in by_policy.items():
            colours = [mc.to_hex(policy_colour(label)) for label in labels]
            self.assertEqual(len(set(colours)), len(labels), f"{policy}: {colours}")
            rgb = 255 * np.array([mc.to_rgb(c) for c in colours])
            closest = min(np.linalg.norm(rgb[i] - rgb[j]) for i in range(len(rgb))
                          for j in range(i))
            self.assertGreater(closest, 35, f"{policy}: two of {colours} look alike")
            hue = colorsys.rgb_to_hsv(*mc.to_rgb(colours[0]))[0]
            for colour in colours[1:]:
                apart = abs(colorsys.rgb_to_hsv(*mc.to_rgb(colour))[0] - hue)
                self.assertLess(min(apart, 1 - apart), 0.01, f"{policy}: {colours}")  # a circle
        self.assertEqual(policy_colour("tova, tova:kvpress"), policy_colour("tova"))

    def test_budget_curves_put_each_budget_at_the_entries_held(self):
        runs = {b: kvsim.replay(self.trace, ["h2o", "streamingllm"], budget=b)
                for b in ("10%", "20%", "40%")}
        fig = kp.budget_curves(runs)
        error_axes = fig.axes[0]
        lines = {l.get_label(): l for l in error_axes.lines}
        self.assertEqual(set(lines), {"h2o", "streamingllm"})
        for label, line in lines.items():
            held = sorted(pd.DataFrame(r).groupby("policy")["cache_size"].mean()[label]
                          for r in runs.values())
            np.testing.assert_allclose(line.get_xdata(), held, rtol=1e-9)
        with self.assertRaises(ValueError):
            kp.budget_curves({"10%": runs["10%"]})

    def per_sample_means(self, frame, column):
        """{label: per-sample means of column} of replay or sweep rows (a seeded policy's runs
        pooled on each sample, as the tables do)."""
        frame = frame.assign(label=frame["policy"].str.replace(r"@seed\d+$", "", regex=True))
        return frame.groupby(["label", "sample"])[column].mean().groupby(level=0)

    def assert_bars_hold_their_points(self, ax, lines, per_sample):
        """Every line of ax has one interval bar per point, around the point, inside the range
        of its per-sample means ({line label: [(min, max) per point]})."""
        bars = ax.collections
        self.assertEqual(len(bars), len(lines), "one set of interval bars per line")
        for line, bar in zip(lines, bars):
            segments = bar.get_segments()
            self.assertEqual(len(segments), len(line.get_xdata()), line.get_label())
            for (x, y), segment, (low, high) in zip(line.get_xydata(), segments,
                                                    per_sample[line.get_label()]):
                np.testing.assert_allclose(segment[:, 0], [x, x])
                lo, hi = sorted(segment[:, 1])
                self.assertLess(lo, hi)
                self.assertLessEqual(lo, y + 1e-12)
                self.assertGreaterEqual(hi, y - 1e-12)
                self.assertGreaterEqual(lo, low - 1e-12)
                self.assertLessEqual(hi, high + 1e-12)

    def four_samples(self):
        trace = os.path.join(self.dir, "curves4.h5")
        if not os.path.exists(trace):
            subprocess.run([BINARY, "synth", "--out", trace, "--samples", "4", "--layers", "2",
                            "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                            "--media-tokens", "48", "--user-tokens", "8", "--gen", "8"],
                           check=True, capture_output=True)
        return trace

    def test_budget_curves_draw_intervals_over_samples_with_seeds_pooled(self):
        trace = self.four_samples()
        budgets = ("10%", "20%", "40%")
        runs = {b: kvsim.replay(trace, ["h2o", "random"], budget=b, seeds=3) for b in budgets}
        fig = kp.budget_curves(runs)
        for ax, column in zip(fig.axes[:2], ("output_rel_error", "mass_recall")):
            lines = sorted(ax.lines, key=lambda l: l.get_label())
            self.assertEqual([l.get_label() for l in lines], ["h2o", "random"])
            self.assertIn("bars: 95% intervals over samples; seeds pooled", ax.get_title())
            spans = {}
            for label in ("h2o", "random"):  # points in the order of the entries they held
                frames = {b: pd.DataFrame(runs[b]) for b in budgets}
                held = {b: f[f["policy"].str.startswith(label)]["cache_size"].mean()
                        for b, f in frames.items()}
                spans[label] = [self.per_sample_means(pd.DataFrame(runs[b]), column)
                                .agg(["min", "max"]).loc[label].to_numpy()
                                for b in sorted(budgets, key=held.get)]
            self.assert_bars_hold_their_points(ax, lines, spans)
        one = {b: kvsim.replay(self.trace, ["h2o"], budget=b) for b in budgets}
        fig = kp.budget_curves(one)
        self.assertEqual(len(fig.axes[0].collections), 0)  # one sample: no interval to draw
        self.assertIn("one sample: no intervals", fig.axes[0].get_title())

    def test_sweep_figures_draw_the_tables_intervals(self):
        out = os.path.join(self.dir, "sweep_intervals")
        res = kvsim.sweep(self.four_samples(), ["h2o", "random"], out, seeds=2,
                          grid={"h2o.budget": ["10%", "40%"], "random.budget": ["10%", "40%"]})
        figs = kp.sweep(res)
        df = pd.DataFrame(res)
        table = {r["label"]: r for r in kp._sweep_report.summarise(kp._sweep_report.read_results(
            os.path.join(out, "results.csv")))}
        held = figs["held_vs_error"]
        for ax, column in zip(held.axes[:2], ("mean_mass_recall", "mean_output_rel_error")):
            self.assertIn("bars: 95% intervals over samples", ax.get_title())
            lines = sorted(ax.lines, key=lambda l: l.get_label())
            self.assertEqual([l.get_label() for l in lines], ["h2o", "random"])
            frame = df.assign(policy=df["label"].str.replace(r"@seed\d+", "", regex=True)
                              .str.replace(r"\[.*", "", regex=True))
            spans = {label: [frame[frame["label"].str.contains(f"budget={b}") &
                                   (frame["policy"] == label)].groupby("sample")[column].mean()
                             .agg(["min", "max"]).to_numpy() for b in ("10%", "40%")]
                     for label in ("h2o", "random")}
            self.assert_bars_hold_their_points(ax, lines, spans)
        # a single configuration's bar is its table row's interval
        recall_bars = figs["h2o_budget"].axes[0].collections[0].get_segments()
        for segment, budget in zip(recall_bars, ("10%", "40%")):
            row = table[f"h2o[budget={budget}]"]
            np.testing.assert_allclose(sorted(segment[:, 1]),
                                       [row["recall_ci_low"], row["recall_ci_high"]])
        self.assertEqual(len(figs["pareto"].axes[0].collections), 2 + 2)  # points and bars

    def test_sweep_figures_from_the_dict_the_frame_and_the_file(self):
        out = os.path.join(self.dir, "sweep")
        res = kvsim.sweep(self.trace, ["h2o"], out, grid={"h2o.budget": ["10%", "20%", "40%"]})
        for source in (res, pd.DataFrame(res), os.path.join(out, "results.csv")):
            figs = kp.sweep(source)
            self.assertEqual(sorted(figs), ["h2o_budget", "held_vs_error", "pareto"])
            fig = kp.budget_curves(source)
            (line,) = fig.axes[0].lines
            df = pd.DataFrame(res)
            held = sorted(df.groupby("label")["mean_cache_size"].mean())
            np.testing.assert_allclose(line.get_xdata(), held, rtol=1e-9)

    def test_sweep_figures_draw_a_line_per_setting_of_the_other_axes(self):
        # h2o over two budgets x two recent windows: held_vs_error has one curve per recent value
        # (not one zig-zag line), each point at the entries its configuration held and labelled
        # with its budget; h2o_recent has one line per budget, its axis in % of the budget.
        out = os.path.join(self.dir, "sweep_axes")
        res = kvsim.sweep(self.trace, ["h2o"], out,
                          grid={"h2o.budget": ["10%", "40%"], "h2o.recent": ["25%", "75%"]})
        df = pd.DataFrame(res)
        held = df.groupby("label")["mean_cache_size"].mean()
        figs = kp.sweep(res)
        recall_axes = figs["held_vs_error"].axes[0]
        lines = {l.get_label(): l for l in recall_axes.lines}
        self.assertEqual(set(lines), {"h2o (recent=25%)", "h2o (recent=75%)"})
        for recent in ("25%", "75%"):
            expected = sorted(held[f"h2o[budget={b},recent={recent}]"] for b in ("10%", "40%"))
            np.testing.assert_allclose(lines[f"h2o (recent={recent})"].get_xdata(), expected)
        self.assertEqual(sorted(t.get_text() for t in recall_axes.texts),
                         ["10%", "10%", "40%", "40%"])
        self.assertNotIn("averaged", recall_axes.get_title())
        recent_axes = figs["h2o_recent"].axes[0]
        by_budget = {l.get_label(): l for l in recent_axes.lines}
        self.assertEqual(set(by_budget), {"budget=10%", "budget=40%"})
        recall = df.groupby("label")["mean_mass_recall"].mean()
        np.testing.assert_allclose(by_budget["budget=10%"].get_ydata(),
                                   [recall["h2o[budget=10%,recent=25%]"],
                                    recall["h2o[budget=10%,recent=75%]"]], rtol=1e-9)
        np.testing.assert_allclose(by_budget["budget=10%"].get_xdata(), [25, 75])
        self.assertEqual(recent_axes.get_xlabel(), "recent (% of the budget)")

    def test_every_policy_has_its_own_colour_and_marker(self):
        from kvsim.report import figure_style as fs

        names = [p["name"] for p in kvsim.policies()]
        self.assertEqual(sorted(set(names) - set(fs.POLICY_COLOURS)), [])
        self.assertEqual(sorted(set(names) - set(fs.POLICY_MARKERS)), [])
        self.assertEqual(len(set(fs.POLICY_COLOURS[n] for n in names)), len(names))
        self.assertEqual(len(set(fs.POLICY_MARKERS[n] for n in names)), len(names))
        # tagged runs, sweep configurations and curves take their policy's colour and marker
        # (presets its marker, and its hue: the test below)
        for label in ("snapkv:kvpress", "random@seed2", "h2o[budget=10%]", "h2o (recent=25%)"):
            base = label.split(":")[0].split("@")[0].split("[")[0].split(" (")[0]
            if ":" not in label:
                self.assertEqual(fs.policy_style(label)["color"], fs.POLICY_COLOURS[base])
            self.assertEqual(fs.policy_style(label)["marker"], fs.POLICY_MARKERS[base])

    def test_attention_map_is_the_causal_softmax_of_one_head(self):
        t = kvsim.Trace(self.trace)
        s = t.sample(t.samples()[0])
        fig = kp.attention(t, s.name, layer=1, head=3, gamma=1.0)
        shown = np.asarray(fig.axes[0].images[0].get_array(), dtype=np.float64)
        q = s.layer(1)["q"][:, 3, :].astype(np.float64)
        k = s.layer(1)["k"][:, 3 // 2, :].astype(np.float64)  # 4 query heads on 2 KV heads
        T = q.shape[0]
        expected = np.zeros((T, T))
        for i in range(T):
            logits = k[: i + 1] @ q[i] * t.scale
            w = np.exp(logits - logits.max())
            expected[i, : i + 1] = w / w.sum()
        np.testing.assert_allclose(shown, expected, atol=1e-9)

    def test_modality_shares_stack_to_one_per_head(self):
        t = kvsim.Trace(self.trace)
        fig = kp.modality_shares(t, t.samples()[0], layer=2)
        bars = fig.axes[0].patches
        heights = np.array([b.get_height() for b in bars]).reshape(4, t.num_heads)
        np.testing.assert_allclose(heights.sum(axis=0), 1.0, atol=1e-9)

    def test_live_accuracy_against_budget_and_memory(self):
        # two `live evaluate --summary` files, one per budget, with answer scores
        rows = []
        for budget, held in (("20%", 0.25), ("60%", 0.65)):
            for policy, right in (("h2o", [1, 0, 0]), ("tova", [1, 1, 0])):
                for i, r in enumerate(right):
                    rows.append({"policy": policy, "sample": f"s{i}", "budget": budget,
                                 "mean_kl": 0.1, "top1_agreement": 0.9, "answer_overlap": 0.9,
                                 "kv_fraction": held + 0.01 * i, "answer_contains": r,
                                 "full_answer_contains": 1, "ref_tokens": "", "ref_nll": ""})
        df = pd.DataFrame(rows)
        paths = []
        for budget, part in df.groupby("budget"):
            paths.append(os.path.join(self.dir, f"live_{budget[:-1]}.csv"))
            part.to_csv(paths[-1], index=False)
        figs = kp.live(summary=paths)
        self.assertIn("live_accuracy", figs)
        by_budget, by_memory = figs["live_accuracy"].axes[:2]
        expected = df.groupby(["policy", "budget"])[["answer_contains", "kv_fraction"]].mean()
        for ax, column in ((by_budget, None), (by_memory, "kv_fraction")):
            lines = {l.get_label(): l for l in ax.lines if not l.get_label().startswith("full")}
            self.assertEqual(set(lines), {"h2o", "tova"})
            for policy, line in lines.items():
                e = expected.loc[policy]
                np.testing.assert_allclose(line.get_ydata(), e["answer_contains"].to_numpy())
                x = [20, 60] if column is None else e[column].to_numpy()
                np.testing.assert_allclose(line.get_xdata(), x)

    def test_bad_input_is_a_clear_error(self):
        with self.assertRaises(TypeError):
            kp.recall_by_layer(42)
        with self.assertRaises(ValueError):
            kp.recall_by_layer({"policy": ["h2o"]})


if __name__ == "__main__":
    unittest.main()
