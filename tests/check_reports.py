#!/usr/bin/env python3
"""The statistics of the experiment reports (experiments/reports/), against worked examples:
Kendall's W (vlm_eval_report.py), the prediction card's isotonic map, its left-out error, its
families and its rank correlations (kvsim.report.prediction_card), the transfer test
(prediction_transfer.py), the order factorial's effects (vlm_factorial.py) and the joining of
results folders, on constructed data worked out by hand; and the at-chance rule (a full cache not
above chance gets no card); the builds' own measurement as a table, and the docs' hand-written
numbers checked against their generated regions (docs_tables.py); the reports' CSV writer
(kvsim.report.csv_table) against the text worked out by hand and pandas' own."""
import json
import os
import sys
import tempfile
import unittest

import numpy as np
import pandas as pd

import kvsim.report.prediction_card as card
from kvsim.report.csv_table import write_csv
from kvsim.report.figure_style import seed_group

# The experiments' reports (kvsim on the path: the build's, as ctest sets it).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments",
                                "reports"))
import docs_tables  # noqa: E402
import prediction_transfer  # noqa: E402
import vlm_eval_report  # noqa: E402
import vlm_factorial  # noqa: E402
import vlm_orders  # noqa: E402
from vlm_eval_report import kendall_w, stability  # noqa: E402


class KendallW(unittest.TestCase):
    def test_worked_examples(self):
        # Three raters, four items: rank sums 4, 6, 8, 12 (mean 7.5), S = 35,
        # W = 12 · 35 / (3² (4³ − 4)) = 420 / 540.
        m = np.array([[1, 2, 3, 4], [2, 1, 3, 4], [1, 3, 2, 4]], float)
        self.assertAlmostEqual(kendall_w(m), 420 / 540)
        self.assertAlmostEqual(kendall_w(np.array([[1, 2, 3], [1, 2, 3]], float)), 1.0)
        self.assertAlmostEqual(kendall_w(np.array([[1, 2, 3], [3, 2, 1]], float)), 0.0)
        # Ties: rater 1 gives (1, 1, 2) -> ranks 1.5, 1.5, 3; rater 2 ranks 1, 2, 3. Rank sums
        # 2.5, 3.5, 6 (mean 4), S = 6.5; one tie of 2 (T = 6):
        # W = 12 · 6.5 / (4 · 24 − 2 · 6) = 78 / 84.
        self.assertAlmostEqual(kendall_w(np.array([[1, 1, 2], [1, 2, 3]], float)), 78 / 84)


    def test_stability_leaves_the_floors_out(self):
        # Three seeds rank a, b, c, d (random and text_only below all, last for every seed).
        # Ranks (low to high): seed 0 d c b a, seed 1 c d a b, seed 2 d b c a; rank sums a 11,
        # b 9, c 6, d 4 (mean 7.5), S = 29, W = 12 · 29 / (9 · 60) = 348 / 540. The top half by
        # mean, a and b: sums 5 and 4, S = 0.5, W = 12 · 0.5 / (9 · 6) = 6 / 54.
        accuracy = {"a": [0.9, 0.8, 0.9], "b": [0.8, 0.9, 0.7], "c": [0.7, 0.6, 0.8],
                    "d": [0.6, 0.7, 0.6], "random": [0.0] * 3, "text_only": [0.05] * 3}
        live = pd.DataFrame([{"seed": s, "budget": "10", "policy": p, "sample": "x",
                              "contains": v[s]} for p, v in accuracy.items() for s in range(3)])
        w_all, w_top, n_all, n_top = stability(live, ["10"])["10"]
        self.assertAlmostEqual(w_all, 348 / 540)
        self.assertAlmostEqual(w_top, 6 / 54)
        self.assertEqual((n_all, n_top), (4, 2))


class CsvTable(unittest.TestCase):
    def test_floats_in_the_format_and_the_rest_as_pandas_writes_them(self):
        table = pd.DataFrame({"policy": ["a, b", "c", "d"], "x": [0.1234567, -0.0, 1.234e-7],
                              "y": [np.nan, np.inf, 2.0], "n": [3, 4, 5],
                              "h": np.array([0.5, 0.25, 1 / 3], np.float32)})
        out = tempfile.mkdtemp()
        write_csv(table, os.path.join(out, "a.csv"))
        with open(os.path.join(out, "a.csv"), encoding="utf-8") as f:
            text = f.read()
        # The float32 third: 0.3333333432674408 as a double, 0.333333 at six digits.
        self.assertEqual(text, 'policy,x,y,n,h\n"a, b",0.123457,,3,0.5\nc,-0,inf,4,0.25\n'
                               'd,1.234e-07,2,5,0.333333\n')
        table.to_csv(os.path.join(out, "b.csv"), index=False, float_format="%.6g")
        with open(os.path.join(out, "b.csv"), encoding="utf-8") as f:
            self.assertEqual(text, f.read())
        # Every digit, and a name repeated: in place, in order.
        repeated = pd.DataFrame([[0.1, 0.2, "z"]], columns=["v", "v", "w"])
        write_csv(repeated, os.path.join(out, "c.csv"), float_format="%.17g")
        with open(os.path.join(out, "c.csv"), encoding="utf-8") as f:
            self.assertEqual(f.read(), "v,v,w\n0.10000000000000001,0.20000000000000001,z\n")


class Factorial(unittest.TestCase):
    def test_each_effect_is_one_pair_of_orders(self):
        # Two seeds, four items, one budget. `a` answers every item at 1 with the whole prompt
        # compressed, 0.75 with the last token fed after, 0.25 with the question fed after: free
        # first token +0.25, scorer sees the question +0.5, question after compression -0.75, the
        # same in every cell (an interval of one point, p the smallest the two-sided bootstrap
        # gives, 2/10001, x 2 after Holm over the two policies). `b` is the same in every order:
        # 0, p 1.
        accuracy = {"a": {"compress": 1.0, "tail1": 0.75, "tailq": 0.25},
                    "b": {"compress": 0.5, "tail1": 0.5, "tailq": 0.5}}
        by_image = {o: pd.DataFrame([{"seed": s, "budget": "10", "policy": p, "sample": f"i{i}",
                                      "contains": accuracy[p][o]}
                                     for p in accuracy for s in range(2) for i in range(4)])
                    for o in vlm_factorial.ORDERS}
        e = vlm_factorial.effects(by_image).set_index(["effect", "policy"])
        expected = {"free first token": 0.25, "scorer sees the question": 0.5,
                    "question after compression": -0.75}
        for name, value in expected.items():
            a, b = e.loc[(name, "a")], e.loc[(name, "b")]
            self.assertAlmostEqual(a["mean"], value)
            self.assertAlmostEqual(a["ci_low"], value)
            self.assertAlmostEqual(a["ci_high"], value)
            self.assertAlmostEqual(a["p_holm"], 2 * 2 / 10001)
            self.assertEqual(a["verdict"], "better" if value > 0 else "worse")
            self.assertEqual((a["n"], b["n"]), (4, 4))
            self.assertAlmostEqual(b["mean"], 0.0)
            self.assertEqual(b["verdict"], "no difference shown")
        # The lists read as counts: `a` shown above 0 in the first two effects and below 0 in the
        # third, `b` in none, at the one budget.
        self.assertEqual(
            vlm_factorial.reading(vlm_factorial.effects(by_image), ["10"]),
            "**Read from the lists** (of 2 budgeted policies at 10%): *free first token* shown "
            "above 0 for 1 (`a` at 10%), below 0 for none; *scorer sees the question* shown above "
            "0 for 1 (`a` at 10%), below 0 for none; *question after compression* shown above 0 "
            "for none, below 0 for 1 (`a` at 10%).")
        self.assertEqual(vlm_factorial.count_words([15, 15, 13]), "15, 15 and 13")
        self.assertEqual(vlm_factorial.count_words([0, 0, 0]), "none")

    def test_policies_alike_in_every_order_are_one_row(self):
        # `a` and its preset `a:kv` answer alike everywhere: one policy "a, a:kv". `c` equals
        # `a` in compress and tail1 only: kept apart. Holm's family at the budget is then three
        # (with `b` and `c`), not four: the smallest p, 2/10001, times 3.
        accuracy = {"a": {"compress": 1.0, "tail1": 0.75, "tailq": 0.25},
                    "a:kv": {"compress": 1.0, "tail1": 0.75, "tailq": 0.25},
                    "b": {"compress": 0.5, "tail1": 0.5, "tailq": 0.5},
                    "c": {"compress": 1.0, "tail1": 0.75, "tailq": 0.5}}
        by_image = {o: pd.DataFrame([{"seed": s, "budget": "10", "policy": p, "sample": f"i{i}",
                                      "contains": accuracy[p][o], "exact": 0.0, "dnll": 0.1}
                                     for p in accuracy for s in range(2) for i in range(4)])
                    for o in vlm_factorial.ORDERS}
        tables = {o: pd.DataFrame({"budget": "10", "policy": list(accuracy)})
                  for o in vlm_factorial.ORDERS}
        merged, merged_tables, policies, _ = vlm_factorial.merge_identical(by_image, tables,
                                                                           set(accuracy))
        self.assertEqual(policies, {"a, a:kv", "b", "c"})
        for o in vlm_factorial.ORDERS:
            self.assertEqual(sorted(merged_tables[o]["policy"]), ["a, a:kv", "b", "c"])
            self.assertEqual(len(merged[o]), 3 * 8)
        e = vlm_factorial.effects(merged).set_index(["effect", "policy"])
        self.assertAlmostEqual(e.loc[("free first token", "a, a:kv"), "p_holm"], 2 * 3 / 10001)

    def test_the_orders_compared_join_policies_alike_in_both(self):
        # compress against append: `a` and its preset `a:kv` alike in both (one name, the preset
        # last); `c` alike with them in compress only, `d` in append only: kept apart.
        answers = {"a": {"compress": 1.0, "append": 0.5}, "a:kv": {"compress": 1.0, "append": 0.5},
                   "c": {"compress": 1.0, "append": 0.25}, "d": {"compress": 0.0, "append": 0.5}}
        by_image = {o: pd.DataFrame([{"seed": s, "budget": "20", "policy": p, "sample": f"i{i}",
                                      "contains": answers[p][o], "exact": 0.0, "dnll": 0.1}
                                     for p in answers for s in range(2) for i in range(3)])
                    for o in ("compress", "append")}
        rename, dropped = vlm_orders.alike_everywhere(by_image, set(answers))
        self.assertEqual(rename, {"a": "a, a:kv", "a:kv": "a, a:kv"})
        self.assertEqual(dropped, {"a:kv"})
        # One cell of the exact match apart is enough to keep two policies apart.
        by_image["append"].loc[(by_image["append"]["policy"] == "a:kv").idxmax(), "exact"] = 1.0
        self.assertEqual(vlm_orders.alike_everywhere(by_image, set(answers)), ({}, set()))

    def test_the_reports_must_be_the_orders_they_are_given_as(self):
        tmp = tempfile.mkdtemp()

        def report(name, order, unit="item"):
            os.makedirs(os.path.join(tmp, name, "results"))
            with open(os.path.join(tmp, name, "results", "builds.json"), "w") as f:
                json.dump({"settings": {"order": order, "unit": unit}, "builds": {}}, f)
            return os.path.join(tmp, name)

        dirs = {o: report(o, o) for o in vlm_factorial.ORDERS}
        self.assertEqual(vlm_factorial.task_of(dirs), ("eight-box task", "items"))
        with self.assertRaises(SystemExit) as e:  # two folders given the wrong way round
            vlm_factorial.task_of(dict(dirs, tail1=dirs["tailq"]))
        self.assertIn("--tail1 " + dirs["tailq"] + ": its report is of the tailq order",
                      str(e.exception))
        with self.assertRaises(SystemExit) as e:
            vlm_factorial.task_of(dict(dirs, tailq=report("single", "tailq", "image")))
        self.assertIn("different tasks (units image, item)", str(e.exception))
        single = {o: report(f"s{o}", o, "image") for o in vlm_factorial.ORDERS}
        self.assertEqual(vlm_factorial.task_of(single), ("single-image task", "images"))

    def test_the_sample_is_named_and_must_be_the_same_in_every_order(self):
        def table(seeds, items):
            return pd.DataFrame([{"seed": s, "sample": f"i{i}"} for s in seeds
                                 for i in range(items)])

        same = {o: table([0, 3, 4], 320) for o in vlm_factorial.ORDERS}
        self.assertEqual(vlm_factorial.sample_words(same, "items"),
                         "training seeds 0, 3 and 4, 320 items each")
        one = {o: table([2], 5) for o in vlm_factorial.ORDERS}
        self.assertEqual(vlm_factorial.sample_words(one, "images"), "projector seed 2, 5 images")
        with self.assertRaises(SystemExit) as e:  # tailq run without seed 4
            vlm_factorial.sample_words(dict(same, tailq=table([0, 3], 320)), "items")
        self.assertIn("the tailq report holds other seeds or items than the compress one "
                      "(640 against 960 seed-item pairs)", str(e.exception))


class JoinedResults(unittest.TestCase):
    def test_seeded_labels_and_a_floor_added_later(self):
        self.assertEqual(seed_group("random@seed3"), "random")
        self.assertEqual(seed_group("random@window-seed2"), "random@window")
        self.assertEqual(seed_group("random@window"), "random@window")
        self.assertEqual(seed_group("h2o"), "h2o")
        live = pd.DataFrame({"seed": [0, 0], "budget": ["10", "10"], "label": ["h2o", "tova"],
                             "sample": ["x", "x"], "contains": [1.0, float("nan")],
                             "dnll": [0.5, 0.25]})
        more = pd.DataFrame({"seed": [0], "budget": ["10"], "label": ["random@window-seed0"],
                             "sample": ["x"], "contains": [0.0], "dnll": [1.0]})
        key = vlm_eval_report.RESULT_KEYS[0]
        self.assertEqual(len(vlm_eval_report.joined(live, more, "live", key, "B")), 3)
        # A cell measured again, the same row (a missing value included): kept once.
        again = vlm_eval_report.joined(live, pd.concat([live.iloc[1:], more]), "live", key, "B")
        self.assertEqual(len(again), 3)
        self.assertEqual(sorted(again["label"]), ["h2o", "random@window-seed0", "tova"])
        with self.assertRaises(SystemExit) as e:  # measured again, another value: refused
            vlm_eval_report.joined(live, live.iloc[:1].assign(dnll=0.5000001), "live", key, "B")
        self.assertIn("B: its live results differ from an earlier folder's for one cell (seed 0, "
                      "budget 10, label h2o, sample x: dnll)", str(e.exception))
        controls = pd.DataFrame({"seed": [0], "control": ["noimage"], "sample": ["x"],
                                 "contains": [1.0]})
        key = vlm_eval_report.RESULT_KEYS[3]
        self.assertEqual(len(vlm_eval_report.joined(controls, controls, "controls", key, "B")), 1)
        with self.assertRaises(SystemExit):
            vlm_eval_report.joined(controls, controls.assign(contains=0.0), "controls", key, "B")


    def test_folders_of_other_budgets_on_one_build(self):
        # Seed 0 at 10% in one folder, at 60% in another (the same build, found again: only its
        # time differs); the floor's control both hold, equal. Joined: both budgets.
        def folder(budget, seconds, accuracy=0.8):
            live = pd.DataFrame({"seed": [0], "budget": [budget], "label": ["h2o"],
                                 "policy": ["h2o"], "sample": ["x"], "contains": [1.0]})
            replay = pd.DataFrame({"seed": [0], "budget": [budget], "policy": ["h2o"]})
            by_image = replay.assign(sample="x")
            controls = pd.DataFrame({"seed": [0], "control": ["noimage"], "sample": ["x"],
                                     "contains": [0.0]})
            build = {"full": {"accuracy": accuracy}, "seconds": {"total": seconds}}
            settings = {"budgets": [budget], "seeds": [0], "unit": "image", "order": "tail1"}
            return [live, replay, by_image, controls], {0: build}, settings

        tables, builds, settings = vlm_eval_report.merge_results(
            [folder("60", 270.0), folder("10", 179.0)], ["A", "B"])
        self.assertEqual(settings["budgets"], ["10", "60"])
        self.assertEqual(sorted(tables[0]["budget"]), ["10", "60"])
        self.assertEqual(len(tables[3]), 1)
        self.assertEqual(builds[0]["seconds"], {"total": 270.0})  # the first folder's
        with self.assertRaises(SystemExit) as e:  # another trained model
            vlm_eval_report.merge_results([folder("60", 270.0), folder("10", 179.0, 0.7)],
                                          ["A", "B"])
        self.assertIn("B: seed 0's build differs from an earlier folder's", str(e.exception))
        # A policy on one seed of two at a budget: refused (averaged over other models).
        tables, builds, settings = folder("10", 179.0)
        live = tables[0]
        tables[0] = pd.concat([live, live.assign(seed=1, label="tova", policy="tova")])
        two = (tables, {0: builds[0], 1: builds[0]}, dict(settings, seeds=[0, 1]))
        with self.assertRaises(SystemExit) as e:
            vlm_eval_report.merge_results([folder("60", 270.0), two], ["A", "B"])
        self.assertIn("budget 10%: `h2o` has no results for seed(s) 1: every policy joined",
                      str(e.exception))


class Builds(unittest.TestCase):
    def test_the_builds_measurement_as_a_table(self):
        # Two seeds, worked by hand: accuracies 0.8 and 0.9 -> mean 0.850, SD
        # sqrt(((0.05)^2 + (0.05)^2) / 1) = 0.0707; the swapped control's own key read.
        def build(full, swapped, named):
            return {"test_images": 4, "full": {"accuracy": full, "answers_a_class_word": 1.0},
                    "no_image": {"accuracy": 0.0, "answers_a_class_word": 0.5},
                    "swapped": {"accuracy": swapped, "answers_a_class_word": 1.0,
                                "names_the_swapped_in_class": named}}
        text = vlm_eval_report.builds_report({1: build(0.9, 0.0, 0.75), 0: build(0.8, 0.25, 0.5)})
        self.assertIn("on the 4 held-out images, as each build measured them (2 projector seeds: "
                      "0, 1;", text)
        rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
        self.assertEqual(rows[1:], [
            "| the image | 0.850 ± 0.071 (0.800, 0.900) | 1.000 ± 0.000 | – |",
            "| no image tokens | 0.000 ± 0.000 (0.000, 0.000) | 0.500 ± 0.000 | – |",
            "| another image's tokens (a fixed derangement) | 0.125 ± 0.177 (0.250, 0.000) | "
            "1.000 ± 0.000 | 0.625 ± 0.177 |"])
        # The eight-box builds: the rows a build holds, one seed's values alone.
        multi = dict(build(0.5, 0.25, 0.5), test_items=3, shared={
            "accuracy": 0.75, "answers_a_class_word": 1.0})
        del multi["swapped"]["names_the_swapped_in_class"]
        multi["swapped"]["names_the_class_now_in_the_box"] = 0.25
        rows = vlm_eval_report.builds_report({2: multi}, "item").splitlines()
        self.assertIn("on the 3 held-out items, as each build measured them (training seed 2):",
                      rows[0])
        self.assertEqual(rows[4:], [
            "| the images | 0.500 | 1.000 | – |",
            "| several questions on one context (each asked every box) | 0.750 | 1.000 | – |",
            "| no image tokens | 0.000 | 0.500 | – |",
            "| the asked box's image swapped for one of another class | 0.250 | 1.000 | 0.250 |"])


class ProseNumbers(unittest.TestCase):
    def test_a_hand_number_must_read_a_region_number(self):
        doc = "\n".join([
            "The best is `h2o` at 0.81 (0.8125 in the table), 0.031 apart, ρ = +0.88.",
            "<!-- generated: run:report.md | **Table** -->",
            "| `h2o` | 0.8125 | -0.0314 | +0.884 | 0.4449 |",
            "<!-- end generated -->",
            "Stale: 0.45 and 0.446; versions 0.3.21 and `0.999` and 1.5 are not numbers checked.",
        ])
        # 0.8125 -> 0.81; -0.0314 -> 0.031 (sign aside); +0.884 -> +0.88;
        # 0.4449 -> 0.44 and 0.445, neither 0.45 nor 0.446; 1.5 has one decimal.
        self.assertEqual(docs_tables.loose_numbers(doc), [(5, "0.45"), (5, "0.446")])
        # Half up or half even: 0.125 printed to two digits reads 0.13 or 0.12.
        self.assertEqual(docs_tables.loose_numbers(
            "0.13 and 0.12\n<!-- generated: r:f | h -->\n0.125\n<!-- end generated -->"), [])


class Card(unittest.TestCase):
    def test_isotonic_pools_violators(self):
        x, y = card.isotonic([1, 2, 3, 4], [1, 3, 2, 4])
        np.testing.assert_allclose(y, [1, 2.5, 2.5, 4])
        x, y = card.isotonic([1, 2, 3, 4], [4, 2, 3, 1], increasing=False)
        np.testing.assert_allclose(y, [4, 2.5, 2.5, 1])
        np.testing.assert_allclose(card.predict((x, y), [0, 1.5, 5]), [4, 3.25, 1])

    def test_family_left_out_error_by_hand(self):
        # Four families, one point each, accuracy falling with the error:
        #   A (0.1, 0.9), B (0.2, 0.8), C (0.3, 0.5), D (0.4, 0.4).
        # Without A the map is B-C-D: 0.8 at 0.1 (constant beyond the end): residual −0.1.
        # Without B: A to C at 0.2 is 0.7: −0.1. Without C: B to D at 0.3 is 0.6: +0.1.
        # Without D: 0.5 beyond C: +0.1. The mean absolute error is 0.1.
        points = pd.DataFrame({"family": list("ABCD"), "x": [0.1, 0.2, 0.3, 0.4],
                               "y": [0.9, 0.8, 0.5, 0.4]})
        mae, residual = card.left_out_error(points, "family", "x", increasing=False)
        self.assertAlmostEqual(mae, 0.1)
        np.testing.assert_allclose(residual.to_numpy(), [-0.1, -0.1, 0.1, 0.1], atol=1e-12)

    def test_families_group_presets_seeds_and_one_mechanism(self):
        for policy, family in (("snapkv:kvpress", "snapkv"), ("pyramidkv", "snapkv"),
                               ("adakv:kvpress, pyramidkv:kvpress, snapkv:kvpress", "snapkv"),
                               ("lookm:released", "lookm"), ("tova, tova:kvpress", "tova"),
                               ("h2o@seed1", "h2o"), ("madakv", "madakv")):
            self.assertEqual(card.family_of(policy), family, policy)

    def test_a_twin_left_in_the_fit_flatters_the_error(self):
        # snapkv and its twin pyramidkv (0.1, 0.9) both, h2o (0.3, 0.5), tova (0.5, 0.4).
        # By mechanism (three families): without snapkv's the map is h2o-tova, 0.5 at 0.1:
        # residuals −0.4 and −0.4; without h2o, 0.9 to 0.4 at 0.3 is 0.65: +0.15; without tova,
        # 0.5 beyond h2o: +0.1. MAE (0.4 + 0.4 + 0.15 + 0.1) / 4 = 0.2625. By name (four
        # families) the twin predicts the left-out one exactly: (0 + 0 + 0.15 + 0.1) / 4.
        policies = ["snapkv", "pyramidkv", "h2o", "tova"]
        points = pd.DataFrame({"policy": policies, "x": [0.1, 0.1, 0.3, 0.5],
                               "y": [0.9, 0.9, 0.5, 0.4]})
        points["family"] = points["policy"].map(card.family_of)
        mae, _ = card.left_out_error(points, "family", "x", increasing=False)
        self.assertAlmostEqual(mae, 0.2625)
        mae, _ = card.left_out_error(points, "policy", "x", increasing=False)
        self.assertAlmostEqual(mae, 0.0625)

    def test_skill_interval_draws_the_groups_left_out(self):
        # Two families: A's residuals sum to 0.1 against the memory map's 0.2, B's 0.3 against
        # 0.3. Drawn twice each: AA 1 − 0.2 / 0.4 = 0.5 (1/4), BB 0 (1/4), AB 1 − 0.4 / 0.5 = 0.2
        # (1/2): the 2.5% and 97.5% percentiles are 0 and 0.5.
        groups = pd.Series(["A", "A", "B"])
        res = pd.Series([0.05, -0.05, 0.3])
        base = pd.Series([0.1, 0.1, -0.3])
        low, high = card.skill_interval(groups, res, base, np.random.default_rng(1), 4000)
        self.assertAlmostEqual(low, 0.0)
        self.assertAlmostEqual(high, 0.5)

    def test_card_on_a_constructed_monotone_case(self):
        # Six policies of three families at two budgets on 40 images; replay's error falls with
        # the budget and a policy's accuracy is exactly 1 − error on every image: the map is
        # exact wherever a held-out point lies inside the fitted range (constant beyond it), and
        # replay's pick is the live best.
        rows = []
        errors = {"a": 0.1, "a:x": 0.2, "b": 0.3, "b:x": 0.4, "c": 0.5, "c:x": 0.6}
        for budget, shift in (("20", 0.2), ("60", 0.0)):
            for policy, e in errors.items():
                for i in range(40):
                    err = e + shift
                    rows.append({"seed": 0, "budget": budget, "policy": policy,
                                 "sample": f"s{i:02d}", "contains": 1 - err, "full": 1.0,
                                 "replay_output_rel_error": err, "kv_fraction": 0.2 if budget ==
                                 "20" else 0.6, "mean_kl": err})
        c, points = card.make_card(pd.DataFrame(rows), "replay_output_rel_error", "contains",
                                   "constructed", [0.05, 0.8, 0.02], resamples=50)
        self.assertAlmostEqual(c["within_budget"]["20"]["spearman"], 1.0)
        self.assertAlmostEqual(c["within_budget"]["60"]["kendall"], 1.0)
        self.assertEqual(c["top"]["20"]["pick"], "a")
        self.assertEqual(c["top"]["20"]["regret"], 0.0)
        self.assertAlmostEqual(c["top"]["60"]["top3_overlap"], 1.0)
        self.assertAlmostEqual(c["left_out"]["samples not in the fit"]["mae"], 0.0, places=12)
        self.assertTrue(c["targets"]["top1_regret"]["met"])
        # Budget 60% left out: the fit on 20% spans errors 0.3-0.8, so 0.1 and 0.2 get its end,
        # 0.7 (measured 0.9 and 0.8: 0.2 and 0.1 off); 20% left out: 0.7 and 0.8 get 0.4
        # (measured 0.3 and 0.2: 0.1 and 0.2 off). 0.6 over 12 points.
        self.assertAlmostEqual(c["left_out"]["budget"]["mae"], 0.6 / 12, places=12)
        # Family a left out: the fit on b and c spans 0.3-0.8, a's 0.1 and 0.2 are 0.2 and 0.1
        # off; family c left out: its 0.7 and 0.8 are 0.1 and 0.2 off; b lies inside. 0.6 / 12.
        self.assertAlmostEqual(c["left_out"]["policy family"]["mae"], 0.6 / 12, places=12)


class RankInterval(unittest.TestCase):
    @staticmethod
    def restated(rows, metric, outcome, budget, rng, resamples):
        """The within-budget intervals as their definition reads: per resample, the drawn
        families' rows (a family drawn twice twice, under another name) at the drawn images (an
        image drawn k times k times), pandas' means per (seed, policy) and then per policy."""
        rows = rows[rows["budget"] == budget]

        def stats(sub):
            p = card.configurations(sub, metric, outcome).groupby("policy", as_index=False).mean(
                numeric_only=True)
            x, loss = np.round(p["x"], 12), np.round(p["full"] - p["y"], 12)
            return card.spearman(x.tolist(), loss.tolist()), card.kendall(x, loss)

        images = rows["sample"].unique()
        families = rows["policy"].map(card.family_of).unique()
        draws = []
        for _ in range(resamples):
            pick_images = rng.choice(images, len(images))
            pick_families = rng.choice(families, len(families))
            parts = []
            for k, f in enumerate(pick_families):
                part = rows[rows["policy"].map(card.family_of) == f].copy()
                part["policy"] = part["policy"] + f"#{k}"
                parts.append(part)
            sub = pd.concat(parts, ignore_index=True)
            counts = pd.Series(pick_images).value_counts()
            sub = sub[sub["sample"].isin(counts.index)].reset_index(drop=True)
            sub = sub.iloc[np.repeat(np.arange(len(sub)), sub["sample"].map(counts).to_numpy())]
            draws.append(stats(sub))
        d = np.array(draws, dtype=float)
        with np.errstate(all="ignore"):
            return np.nanpercentile(d, 2.5, axis=0), np.nanpercentile(d, 97.5, axis=0)

    def test_kendall_tau_b_by_hand(self):
        # x 1 2 3 4, y 1 3 2 2: pairs 12 13 14 concordant, 23 24 discordant, 34 tied in y only:
        # (3 − 2) / √((3 + 2 + 0)(3 + 2 + 1)) = 1 / √30.
        self.assertAlmostEqual(card.kendall([1, 2, 3, 4], [1, 3, 2, 2]), 1 / np.sqrt(30))

    def test_equal_accuracies_summed_in_another_order_tie(self):
        # Three seeds of ten images: a answers 1, 2, 9 right, b 1, 9, 2 (both 0.4 over seeds:
        # (0.1 + 0.2 + 0.9) / 3 and (0.1 + 0.9 + 0.2) / 3 differ in the last bit as floats), c 5
        # each. Loss 0.6, 0.6, 0.5 against errors 0.1, 0.2, 0.3: a-b tied in the loss only, a-c
        # and b-c discordant: τ-b = −2 / √(2 · 3); Spearman of ranks (1, 2, 3) and (2.5, 2.5, 1):
        # −1.5 / √(2 · 1.5).
        rows = []
        for policy, right, error in (("a", (1, 2, 9), 0.1), ("b", (1, 9, 2), 0.2),
                                     ("c", (5, 5, 5), 0.3)):
            for seed, k in enumerate(right):
                for i in range(10):
                    rows.append({"seed": seed, "budget": "20", "policy": policy,
                                 "sample": f"s{i}", "contains": float(i < k), "full": 1.0,
                                 "err": error, "kv_fraction": 0.2})
        rho, _, tau, _ = card.rank_interval(pd.DataFrame(rows), "err", "contains", "20", True,
                                            np.random.default_rng(0), 5)
        self.assertAlmostEqual(tau, -2 / np.sqrt(6))
        self.assertAlmostEqual(rho, -1.5 / np.sqrt(3))
        # The same means as a resample's arrays sum them, seed by seed in each policy's order.
        y = [(0.1 + 0.2 + 0.9) / 3, (0.1 + 0.9 + 0.2) / 3, (0.5 + 0.5 + 0.5) / 3]
        self.assertNotEqual(y[0], y[1])
        rho, tau = card.rank_stats([0.1, 0.2, 0.3], y, [1.0] * 3, True)
        self.assertAlmostEqual(tau, -2 / np.sqrt(6))
        self.assertAlmostEqual(rho, -1.5 / np.sqrt(3))

    def test_intervals_equal_their_definition(self):
        # Five policies of three families (snapkv with its twin pyramidkv, h2o with a preset),
        # two seeds, twelve images; one seed lacks an image for one policy and one metric value
        # is missing: the arrays' weighted means give what pandas gives on the drawn rows.
        rng = np.random.default_rng(7)
        rows = []
        for policy in ("snapkv", "pyramidkv", "h2o", "h2o:kvpress", "tova"):
            for seed in (0, 1):
                for i in range(12):
                    if policy == "tova" and seed == 1 and i == 3:
                        continue
                    rows.append({"seed": seed, "budget": "10", "policy": policy,
                                 "sample": f"s{i:02d}", "contains": float(rng.random() < 0.5),
                                 "full": 1.0, "err": float(rng.random()), "kv_fraction": 0.1})
        rows = pd.DataFrame(rows)
        rows.loc[5, "err"] = np.nan
        rho, rci, tau, tci = card.rank_interval(rows, "err", "contains", "10", True,
                                                np.random.default_rng(3), 200)
        low, high = self.restated(rows, "err", "contains", "10", np.random.default_rng(3), 200)
        np.testing.assert_allclose([rci[0], tci[0]], low, rtol=0, atol=1e-12)
        np.testing.assert_allclose([rci[1], tci[1]], high, rtol=0, atol=1e-12)


class AtChance(unittest.TestCase):
    @staticmethod
    def rows(right_by_seed):
        """by-image rows of one policy whose full cache is right on the given samples per seed."""
        return pd.DataFrame([{"seed": seed, "budget": "20", "policy": "p", "sample": f"s{i:02d}",
                              "contains": 0.0, "full_contains": float(i in right),
                              "replay_output_rel_error": 0.5, "kv_fraction": 0.2, "full": 0.0}
                             for seed, right in right_by_seed.items() for i in range(20)])

    def test_a_full_cache_at_chance_is_not_above_it(self):
        # 2 of 20 images right on both seeds: accuracy 0.1, which is chance for ten classes; a
        # percentile interval's lower end never exceeds the mean, so it reaches chance.
        r = card.full_cache_reading(self.rows({0: {3, 7}, 1: {3, 7}}), 0.1)
        self.assertAlmostEqual(r["accuracy"], 0.1)
        self.assertEqual(r["n"], 20)
        self.assertFalse(r["above_chance"])

    def test_the_seeds_are_averaged_per_image_first(self):
        # Seed 0 right on images 0-9, seed 1 on 10-19: every image 0.5, so the interval over
        # images is the single value 0.5, above chance.
        r = card.full_cache_reading(self.rows({0: set(range(10)), 1: set(range(10, 20))}), 0.1)
        self.assertAlmostEqual(r["accuracy"], 0.5)
        self.assertAlmostEqual(r["ci_low"], 0.5)
        self.assertTrue(r["above_chance"])

    def test_no_card_at_chance(self):
        out = tempfile.mkdtemp()
        by_image = os.path.join(out, "by_image.csv")
        self.rows({0: {3}, 1: set()}).to_csv(by_image, index=False)
        self.assertEqual(card.main(["--by-image", by_image, "--outcome", "contains", "--name",
                                    "m", "--targets", "0.05,0.8,0.02", "--chance", "0.1",
                                    "--out", out]), 0)
        with open(os.path.join(out, "card.md")) as f:
            text = f.read()
        self.assertIn("**No comparison can be made.** The full cache answers 0.025", text)
        self.assertNotIn("Targets", text)
        self.assertNotIn("Spearman", text)



class Transfer(unittest.TestCase):
    def test_the_metric_is_chosen_on_the_fit_task_and_transferred_unchanged(self):
        # Task A (one seed, one sample): (budget, policy, output error, accuracy, memory)
        # (10, h2o, 0.2, 0.8, 0.1), (10, tova, 0.4, 0.6, 0.1), (20, h2o, 0.1, 0.9, 0.2),
        # (20, tova, 0.3, 0.7, 0.2); mass recall 0.5 everywhere. Family left out, output error:
        # without h2o the map is tova's (0.7 at 0.3 and below): residuals 0.1, 0.2; without tova
        # h2o's (0.8 at 0.2 and above): 0.2, 0.1; mean 0.15. Mass recall: each side's mean,
        # 0.65 or 0.85: residuals 0.15, 0.25, 0.25, 0.15; mean 0.2. Output error is chosen.
        # Task B, knorm: (10, 0.25, 0.75, 0.1), (20, 0.15, 0.85, 0.2): the map of A gives 0.75
        # and 0.85 exactly (error 0); the memory map of A gives 0.7 and 0.8 (error 0.05): skill 1.
        tmp = tempfile.mkdtemp()
        tasks = {"A": [("10", "h2o", 0.2, 0.8, 0.1), ("10", "tova", 0.4, 0.6, 0.1),
                       ("20", "h2o", 0.1, 0.9, 0.2), ("20", "tova", 0.3, 0.7, 0.2)],
                 "B": [("10", "knorm", 0.25, 0.75, 0.1), ("20", "knorm", 0.15, 0.85, 0.2)]}
        dirs = {}
        for name, rows in tasks.items():
            dirs[name] = os.path.join(tmp, name)
            os.makedirs(dirs[name])
            pd.DataFrame([{"seed": 0, "budget": b, "policy": p, "sample": "s",
                           "replay_output_rel_error": x, "replay_mass_recall": 0.5,
                           "contains": y, "full_contains": 1.0, "kv_fraction": m}
                          for b, p, x, y, m in rows]).to_csv(
                os.path.join(dirs[name], "vlm_eval_by_image.csv"), index=False)
        declaration = {"candidates": ["replay_mass_recall", "replay_output_rel_error"],
                       "splits": [{"name": "A -> B", "fit": "A", "predict": "B"}],
                       "targets": {"skill": 0.5, "error": 0.05}}
        result = prediction_transfer.run(declaration, dirs)
        self.assertAlmostEqual(result["choice"]["replay_output_rel_error"], 0.15)
        self.assertAlmostEqual(result["choice"]["replay_mass_recall"], 0.2)
        self.assertEqual(result["metric"], "replay_output_rel_error")
        split = result["splits"][0]
        self.assertEqual((split["points"], split["families"]), (2, 1))
        self.assertAlmostEqual(split["error"], 0.0)
        self.assertAlmostEqual(split["error_memory_only"], 0.05)
        self.assertAlmostEqual(split["skill"], 1.0)
        np.testing.assert_allclose(split["skill_ci"], [1.0, 1.0], atol=1e-12)
        self.assertTrue(split["skill_met"] and split["error_met"])


if __name__ == "__main__":
    unittest.main()
