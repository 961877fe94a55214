#!/usr/bin/env python3
"""kvsim.report.replay_vs_live: Spearman's ρ against values worked out by hand, and the join of
replay and live summaries (perplexity over samples = exp(Σ NLL·tokens / Σ tokens))."""
import csv
import math
import os
import sys
import tempfile
import unittest

import kvsim.report.replay_vs_live as rvl


class ReplayVsLive(unittest.TestCase):
    def test_spearman_by_hand(self):
        # ranks of y with a tie: [1, 2, 3.5, 5, 3.5]; cov 8, variances 10 and 9.5
        self.assertAlmostEqual(rvl.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]), 8 / math.sqrt(95))
        self.assertAlmostEqual(rvl.spearman([1, 2, 3], [9, 4, 1]), -1.0)
        self.assertTrue(math.isnan(rvl.spearman([1, 2], [3, 4])))
        self.assertEqual(list(rvl.ranks([3, 1, 3, 2])), [3.5, 1, 3.5, 2])

    def test_join_and_perplexity(self):
        d = tempfile.mkdtemp()
        replay = os.path.join(d, "r.csv")
        with open(replay, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["policy", "sample", "layer", "rows", "mean_cache_size", "mean_attended_size",
                        "mean_mass_recall", "min_mass_recall", "mean_output_rel_error",
                        "mean_output_value_error", "mean_kv_bytes", "budget_entries"])
            w.writerow(["h2o", "s", "0", "1", "10", "10", "0.5", "0.5", "0.1", "0.1", "1", "10"])
            w.writerow(["h2o", "all", "all", "1", "12", "12", "0.8", "0.5", "0.2", "0.1", "1", "10"])
        live = os.path.join(d, "l.csv")
        with open(live, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["policy", "sample", "ref_tokens", "ref_nll", "ref_nll_full",
                        "kv_fraction", "mean_kl"])
            w.writerow(["h2o", "s", "2", "1.0", "0.5", "0.2", "0.1"])
            w.writerow(["h2o", "b", "6", "2.0", "1.5", "0.2", "0.3"])
            w.writerow(["h2o", "all", "4", "1.5", "1.0", "0.2", "0.2"])  # an overall row: left out
        out = os.path.join(d, "out")
        rvl.main(["--replay", f"20%={replay}", "--live", f"20%={live}", "--out", out])
        with open(os.path.join(out, "replay_vs_live.csv"), newline="") as f:
            (row,) = list(csv.DictReader(f))
        self.assertEqual(float(row["mean_mass_recall"]), 0.8)  # the overall row
        self.assertEqual(float(row["mean_cache_size"]), 12)
        self.assertAlmostEqual(float(row["ppl"]), math.exp((1.0 * 2 + 2.0 * 6) / 8))
        # ΔNLL per sample: 0.5 on both, so the mean and both ends of its interval are 0.5.
        self.assertEqual(int(row["n"]) if "n" in row else 2, 2)
        self.assertAlmostEqual(float(row["dnll"]), 0.5)
        self.assertAlmostEqual(float(row["dnll_ci_low"]), 0.5)
        # by_image.csv: the live sample `s` beside replay's figures on it (sample `b` has none).
        with open(os.path.join(out, "by_image.csv"), newline="") as f:
            (img,) = list(csv.DictReader(f))
        self.assertEqual((img["budget"], img["policy"], img["sample"]), ("20", "h2o", "s"))
        self.assertAlmostEqual(float(img["dnll"]), 0.5)
        self.assertAlmostEqual(float(img["replay_output_rel_error"]), 0.1)
        self.assertAlmostEqual(float(row["ppl_full"]), math.exp((0.5 * 2 + 1.5 * 6) / 8))
        self.assertTrue(os.path.exists(os.path.join(out, "perplexity_vs_budget.png")))

    def test_live_perplexity_figure(self):
        from kvsim.report import figures

        d = tempfile.mkdtemp()
        live = os.path.join(d, "live_summary.csv")
        with open(live, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["policy", "sample", "top1_agreement", "answer_overlap", "kv_fraction",
                        "mean_kl", "ref_tokens", "ref_nll", "ref_nll_full"])
            w.writerow(["h2o", "a", "1", "1", "0.5", "0", "2", "1.0", "0.5"])
            w.writerow(["h2o", "b", "1", "1", "0.5", "0", "6", "2.0", "1.5"])
        figs = {}
        figures.live_figures([], [live], [], figs, [])
        (bar,) = figs["live_perplexity"].axes[0].patches
        self.assertAlmostEqual(bar.get_height(), math.exp((1.0 * 2 + 2.0 * 6) / 8))


if __name__ == "__main__":
    unittest.main()
