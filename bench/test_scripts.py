#!/usr/bin/env python3
"""Unit tests of the benchmark's Python scripts that need no GPU (CI runs them): the one list
of baselines, the figures' styles, the tables' order and rendering, the benchmark
schedule's A/A check and its FP32 shapes, and the comparison of two runs. Run: python3 -m unittest bench/test_scripts.py (with matplotlib)."""
import csv
import math
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_runs  # noqa: E402
import driver  # noqa: E402
import plots  # noqa: E402
import schema  # noqa: E402
import tables  # noqa: E402


def write_results(path, rows):
    """A results CSV with the driver's columns; rows are (stage, dtype, shape, pass, median_ms)."""
    with open(path, "w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(schema.CSV_COLUMNS + schema.CSV_EXTRA_COLUMNS)
        for stage, dtype, shape, pass_name, median_ms in rows:
            writer.writerow(["Test GPU", stage, dtype, *shape[:5], int(shape[5]), pass_name,
                             median_ms, median_ms, "1", "", "0", "test", "ok", 3, median_ms,
                             median_ms, 30, "", ""])


class OneListOfBaselines(unittest.TestCase):
    def test_every_baseline_the_benchmark_writes_is_listed(self):
        written = {f"torch_{backend}" for backends in driver.TORCH_BACKENDS.values()
                   for backend in backends}
        written |= {"cublas_fp32", "cublas_bf16"}
        self.assertEqual(written, set(schema.BASELINES))

    def test_every_baseline_has_a_style_of_its_own(self):
        fallback = plots.impl_style(("not_a_baseline", "bf16"))
        styles = {}
        for baseline in schema.BASELINES:
            style = plots.impl_style((baseline, "bf16"))
            self.assertNotEqual(style, fallback, baseline)
            styles[baseline] = (style["color"], style["marker"], str(style["linestyle"]))
        # Two baselines may share a colour only if their markers tell them apart.
        self.assertEqual(len(set(styles.values())), len(styles))

    def test_every_stage_has_its_colour(self):
        fallback = plots.impl_style(("99_unknown", "bf16"))["color"]
        for stage in schema.STAGES:
            self.assertNotEqual(plots.impl_style((stage, "bf16"))["color"], fallback, stage)

    def test_tables_and_figures_order_implementations_alike(self):
        names = ["torch_sdpa", "11_hopper_backward", "cublas_bf16", "00_naive", "torch_flash",
                 "cublas_fp32", "torch_eager", "05_mma_swizzle"]
        by_tables = sorted(names, key=tables.implementation_order)
        by_figures = sorted(names, key=lambda name: plots.impl_order((name, "bf16")))
        self.assertEqual(by_tables, by_figures)
        self.assertEqual(by_tables[:3], ["00_naive", "05_mma_swizzle", "11_hopper_backward"])
        self.assertEqual(by_tables[3:], [b for b in schema.BASELINES if b in names])


class Tables(unittest.TestCase):
    def test_a_results_table_lists_what_ran_in_order(self):
        headline = (1, 8, 4096, 8192, 128, False)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "results.csv")
            write_results(path, [("torch_flash", "bf16", headline, "fwd", 0.4),
                                 ("10_pingpong", "bf16", headline, "fwd", 0.2),
                                 ("00_naive", "fp32", headline, "fwd", 100.0)])
            book = tables.Tables(path, os.path.join(HERE, "sweeps.txt"))
            present = book.implementations({})
        self.assertEqual([stage for stage, _ in present], ["00_naive", "10_pingpong", "torch_flash"])


class AACheck(unittest.TestCase):
    def check(self, ratio):
        shape = driver.Shape(1, 8, 4096, 8192, 128, 0)
        results = {}
        for copy, original in driver.AA_PAIRS:
            results[(original, "bf16", shape.key(), "fwd")] = {"median_ms": 1.0}
            results[(copy, "bf16", shape.key(), "fwd")] = {"median_ms": ratio}
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "aa-check.txt")
            driver.aa_check(results, [shape], path)
            with open(path) as aa_file:
                return aa_file.read()

    def test_copies_within_the_tolerance_agree(self):
        text = self.check(1.01)
        self.assertEqual(text.count(": agree"), len(driver.AA_PAIRS))

    def test_copies_beyond_the_tolerance_disagree(self):
        text = self.check(1.03)
        self.assertEqual(text.count("DISAGREE at 1x8x4096x8192x128x0"), len(driver.AA_PAIRS))


class CompareRuns(unittest.TestCase):
    def compare(self, second_stage_ms):
        shape = (1, 8, 4096, 8192, 128, False)
        with tempfile.TemporaryDirectory() as folder:
            runs = []
            for name, stage_ms in (("first", 0.20), ("second", second_stage_ms)):
                os.mkdir(os.path.join(folder, name))
                write_results(os.path.join(folder, name, "results.csv"),
                              [("10_pingpong", "bf16", shape, "fwd", stage_ms),
                               ("torch_cudnn", "bf16", shape, "fwd", 0.21),
                               ("torch_flash", "bf16", shape, "fwd", 0.40)])
                runs.append(os.path.join(folder, name))
            argv, sys.argv = sys.argv, ["compare_runs.py"] + runs
            try:
                with open(os.devnull, "w") as quiet:
                    stdout, sys.stdout = sys.stdout, quiet
                    try:
                        return compare_runs.main()
                    finally:
                        sys.stdout = stdout
            finally:
                sys.argv = argv

    def test_ratios_within_the_tolerance_pass(self):
        self.assertEqual(self.compare(0.204), 0)

    def test_a_ratio_beyond_the_tolerance_fails(self):
        self.assertEqual(self.compare(0.21), 1)


class LeftOut(unittest.TestCase):
    def test_fp32_is_left_out_at_d128_n16384_only(self):
        long128 = driver.Shape(1, 32, 16384, 16384, 128, 0)
        long64 = driver.Shape(4, 8, 16384, 16384, 64, 0)
        self.assertIn("not timed", driver.fp32_left_out("fp32", long128))
        self.assertEqual(driver.fp32_left_out("bf16", long128), "")
        self.assertEqual(driver.fp32_left_out("fp32", long64), "")


class ShownFile(unittest.TestCase):
    """A <!-- file:PATH --> region shows a committed file verbatim (bench/tables.py)."""

    def test_the_region_holds_the_file_in_a_fenced_block(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "summary.txt")
            with open(path, "w") as out:
                out.write("first line\nsecond line\n\n")
            name = os.path.relpath(path, tables.ROOT)
            page = f"<!-- file:{name} -->\nold\n<!-- /file:{name} -->\n"
            match = tables.FILE.search(page)
            self.assertEqual(match["name"], name)
            self.assertEqual(tables.shown_file(name, "page.md"),
                             "```text\nfirst line\nsecond line\n```\n")

    def test_a_missing_file_is_an_error(self):
        with self.assertRaises(SystemExit):
            tables.shown_file("no/such/file.txt", "page.md")


class TimedWindow(unittest.TestCase):
    """When an implementation has been timed enough (Resident.done)."""

    def resident(self, call_ms, calls):
        resident = driver.Resident(None, {}, None, "fwd")
        resident.gpu_ms, resident.times = call_ms, [call_ms] * calls
        return resident

    def test_short_calls_need_min_calls_beyond_the_window(self):
        calls = math.ceil(driver.TIMED_SECONDS * 1e3 / 5.0)  # 0.15 s of 5 ms calls
        self.assertLess(calls, driver.MIN_CALLS)
        self.assertFalse(self.resident(5.0, calls).done())
        self.assertTrue(self.resident(5.0, driver.MIN_CALLS).done())

    def test_min_calls_stop_at_the_longest_window(self):
        calls = math.ceil(driver.MAX_TIMED_SECONDS * 1e3 / 22.0)
        self.assertLess(calls, driver.MIN_CALLS)
        self.assertFalse(self.resident(22.0, calls - 1).done())
        self.assertTrue(self.resident(22.0, calls).done())

    def test_long_calls_stop_sooner(self):
        long_ms = driver.LONG_CALL_MS
        self.assertFalse(self.resident(long_ms, driver.LONG_MIN_CALLS - 1).done())
        self.assertTrue(self.resident(long_ms, driver.LONG_MIN_CALLS).done())
        window = math.ceil(driver.LONG_MAX_TIMED_SECONDS * 1e3 / 300.0)
        self.assertFalse(self.resident(300.0, window - 1).done())
        self.assertTrue(self.resident(300.0, window).done())


if __name__ == "__main__":
    unittest.main()
