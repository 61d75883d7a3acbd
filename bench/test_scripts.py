#!/usr/bin/env python3
"""Unit tests of the benchmark's Python scripts that need no GPU (CI runs them): the one list
of baselines, the figures' styles, the tables' order and rendering, the benchmark
schedule's A/A check, its FP32 shapes and its deterministic backward rows (bwd_det), and the
comparison of two runs. Run: python3 -m unittest bench/test_scripts.py (with matplotlib)."""
import csv
import math
import os
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import clock_samples  # noqa: E402
import compare_runs  # noqa: E402
import driver  # noqa: E402
import plots  # noqa: E402
import ring_table  # noqa: E402
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


class FakeImplementation:
    def __init__(self, name, passes, dtype_name="bf16"):
        self.name, self.passes, self.dtype_name = name, passes, dtype_name


class ScheduleGroups(unittest.TestCase):
    """Each element type takes its turns in a group of its own, BF16's first; heavy members alone."""

    def test_one_group_per_element_type_then_the_heavy_members(self):
        stage = FakeImplementation("12_persistent", ["fwd"])
        cudnn = FakeImplementation("torch_cudnn", ["fwd", "bwd"])
        tiled = FakeImplementation("02_tiled", ["fwd"], "fp32")
        naive = FakeImplementation("00_naive", ["fwd"], "fp32")
        members = [(naive, "fwd"), (tiled, "fwd"), (stage, "fwd"), (cudnn, "fwd")]
        groups = driver.schedule_groups(members, {driver.member_key(naive, "fwd")})
        names = [[impl.name for impl, _ in group] for group in groups]
        self.assertEqual(names, [["12_persistent", "torch_cudnn"], ["02_tiled"], ["00_naive"]])

    def test_no_member_is_dropped(self):
        odd = FakeImplementation("fp16_stage", ["fwd"], "fp16")
        groups = driver.schedule_groups([(odd, "fwd")], set())
        self.assertEqual(groups, [[(odd, "fwd")]])


class DeterministicRows(unittest.TestCase):
    """bwd_det: the deterministic backward of the stages that have one, at the target shapes."""

    headline = driver.Shape(*schema.read_sweeps()["bf16-headline"][0])
    long_seqlen = driver.Shape(1, 32, 16384, 16384, 128, 0)

    def test_timed_in_the_backward_group_at_the_target_shapes_only(self):
        sweeps = schema.read_sweeps()
        deterministic = FakeImplementation("11_hopper_backward", ["fwd", "bwd", "bwd_det"])
        default_only = FakeImplementation("07_backward", ["fwd", "bwd"])
        flash = FakeImplementation("torch_flash", ["fwd", "bwd"])
        implementations = [deterministic, default_only, flash]
        keys = driver.deterministic_shapes(sweeps, ["fp32-headline", "bf16-headline", "seqlen",
                                                    "extra"])
        self.assertEqual(keys, {driver.Shape(*fields).key() for name in driver.DETERMINISTIC_SWEEPS
                                for fields in sweeps[name]})
        self.assertIn(self.headline.key(), keys)
        self.assertNotIn(self.long_seqlen.key(), keys)
        members = driver.group_members(implementations, self.headline, "bwd", keys)
        self.assertEqual([(impl.name, pass_name) for impl, pass_name in members],
                         [("11_hopper_backward", "bwd"), ("11_hopper_backward", "bwd_det"),
                          ("07_backward", "bwd"), ("torch_flash", "bwd")])
        for shape, step_pass in ((self.headline, "fwd"), (self.long_seqlen, "bwd")):
            members = driver.group_members(implementations, shape, step_pass, keys)
            self.assertNotIn("bwd_det", [pass_name for _, pass_name in members])
        # A run without those sweeps (smoke, say) times no bwd_det at all.
        self.assertEqual(driver.deterministic_shapes(sweeps, ["seqlen", "smoke"]), set())

    def test_the_shape_asks_for_the_mode_and_counts_backward_flops(self):
        self.assertTrue(driver.StageImplementation.c_shape(self.headline, "bwd_det").deterministic)
        self.assertFalse(driver.StageImplementation.c_shape(self.headline, "bwd").deterministic)
        self.assertEqual(self.headline.flops("bwd_det"), self.headline.flops("bwd"))
        row = plots.Row("Test GPU", "11_hopper_backward", "bf16", *self.headline.key(), "bwd_det",
                        1.0, 1.0, None, None, 0, "test", "ok")
        self.assertEqual(plots.flops(row), self.headline.flops("bwd"))

    def summary(self, ratio, shapes=None):
        stage = FakeImplementation("11_hopper_backward", ["fwd", "bwd", "bwd_det"])
        results = {("11_hopper_backward", "bf16", self.headline.key(), "bwd"): {"median_ms": 2.0},
                   ("11_hopper_backward", "bf16", self.headline.key(), "bwd_det"):
                       {"median_ms": 2.0 * ratio}}
        extra = driver.Shape(4, 8, 4096, 4096, 64, 0)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "deterministic-check.txt")
            with open(os.devnull, "w") as quiet:
                stdout, sys.stdout = sys.stdout, quiet
                try:
                    driver.deterministic_check(results, [stage], shapes or [self.headline, extra],
                                               self.headline, path)
                finally:
                    sys.stdout = stdout
            with open(path) as summary_file:
                return summary_file.read()

    def test_the_summary_gives_the_ratio_per_shape_and_the_verdict_at_the_headline(self):
        text = self.summary(1.07)
        self.assertIn("11_hopper_backward deterministic backward / default: "
                      "1x8x4096x8192x128x0 1.070\n", text)
        self.assertIn("11_hopper_backward deterministic backward / default: 4x8x4096x4096x64x0 "
                      "not timed", text)
        self.assertIn("11_hopper_backward at the BF16 headline: within the target of 1.15", text)
        self.assertIn("BEYOND the target", self.summary(1.2))

    def test_tables_and_figures_keep_bwd_det_out_of_the_backward(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "results.csv")
            write_results(path, [("11_hopper_backward", "bf16", self.headline.key(), "bwd", 2.0),
                                 ("11_hopper_backward", "bf16", self.headline.key(), "bwd_det",
                                  2.2),
                                 ("11_hopper_backward", "bf16", self.headline.key(), "fwd", 1.0)])
            book = tables.Tables(path, os.path.join(HERE, "sweeps.txt"))
            lines = book.shape_table(self.headline.key(), book.implementations({}), {})
            self.assertEqual([line.split(" | ")[2] for line in lines[4:]], ["fwd", "bwd"])
            self.assertEqual(book.value("11_hopper_backward bf16-headline bwd_det median_ms"),
                             "2.20")
            results = plots.load(folder)
        self.assertEqual([(step.group, step.row.pass_) for step in plots.ladder(results)],
                         [("BF16 forward", "fwd"), ("BF16 backward", "bwd")])


class CompareRuns(unittest.TestCase):
    def compare(self, second_stage_ms, shape=(1, 8, 4096, 8192, 128, False)):
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

    def test_a_shape_no_page_quotes_is_listed_but_does_not_fail(self):
        self.assertEqual(self.compare(0.21, shape=(3, 5, 333, 777, 64, True)), 0)


class Quoted(unittest.TestCase):
    """compare_runs.py's quoted (shape, pass) pairs, read from the pages' markers by tables.py."""

    SWEEPS = {"bf16-headline": [(1, 8, 4096, 8192, 128, 0)],
              "fp32-headline": [(8, 12, 4096, 4096, 64, 0)],
              "seqlen": [(4, 8, 256, 256, 64, 0), (4, 8, 256, 256, 64, 1)]}

    def quoted(self, page):
        return tables.quoted_shapes([page], self.SWEEPS)

    def test_a_value_quotes_its_shape_and_pass(self):
        page = "x <!-- value:12_persistent 1x32x4096x4096x128x0 fwd speedup=torch_cudnn/bf16 " \
               "-->1.0<!-- /value --> and <!-- value:ceiling bf16_gemm -->1<!-- /value -->"
        self.assertEqual(self.quoted(page), {((1, 32, 4096, 4096, 128, 0), "fwd")})

    def test_a_one_shape_value_names_its_sweep(self):
        page = "<!-- value:10_pingpong bf16-headline bwd tflops -->1<!-- /value -->"
        self.assertEqual(self.quoted(page), {((1, 8, 4096, 8192, 128, 0), "bwd")})

    def test_a_sweep_table_quotes_its_pass_and_filtered_shapes(self):
        page = "<!-- results:seqlen pass=bwd causal=1 -->\n|t|\n<!-- /results:seqlen -->"
        self.assertEqual(self.quoted(page), {((4, 8, 256, 256, 64, 1), "bwd")})
        page = "<!-- results:seqlen stages=a,b -->\n|t|\n<!-- /results:seqlen -->"
        self.assertEqual({p for _, p in self.quoted(page)}, {"fwd"})

    def test_a_stage_table_quotes_both_headlines_both_passes(self):
        page = "<!-- results:10_pingpong -->\n|t|\n<!-- /results:10_pingpong -->"
        self.assertEqual(len(self.quoted(page)), 4)


class RunGpu(unittest.TestCase):
    """compare_runs.py names the GPU of each run from its system.txt's nvidia-smi table."""

    TABLE = ("nvidia-smi:\n"
             "  index, name, uuid, pci.bus_id, driver_version\n"
             "  0, NVIDIA H100 80GB HBM3, {uuid}, 00000000:00:06.0, 580.159.04\n"
             "cuda driver: CUDA Version: 13.0\n")

    def line(self, first_uuid, second_uuid):
        with tempfile.TemporaryDirectory() as folder:
            runs = []
            for name, uuid in (("first", first_uuid), ("second", second_uuid)):
                os.mkdir(os.path.join(folder, name))
                if uuid is not None:
                    with open(os.path.join(folder, name, "system.txt"), "w") as out:
                        out.write("date: now\n" + self.TABLE.format(uuid=uuid))
                runs.append(os.path.join(folder, name, "results.csv"))
            return compare_runs.same_gpu_line(*runs)

    def test_the_same_gpu(self):
        self.assertEqual(self.line("GPU-a", "GPU-a"), "GPU: the same in both runs (GPU-a)")

    def test_different_gpus(self):
        self.assertIn("DIFFERENT (first GPU-a; second GPU-b)", self.line("GPU-a", "GPU-b"))

    def test_a_run_without_system_txt(self):
        self.assertIn("not recorded", self.line("GPU-a", None))

    def test_runs_on_two_gpus_do_not_pass(self):
        with tempfile.TemporaryDirectory() as folder:
            runs = []
            for name, uuid in (("first", "GPU-a"), ("second", "GPU-b")):
                os.mkdir(os.path.join(folder, name))
                with open(os.path.join(folder, name, "system.txt"), "w") as out:
                    out.write(self.TABLE.format(uuid=uuid))
                runs.append(os.path.join(folder, name))
            self.assertTrue(compare_runs.different_gpus(*runs))
            self.assertFalse(compare_runs.different_gpus(runs[0], runs[0]))


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


class RingValue(unittest.TestCase):
    """<!-- value:ring CSV [KEY=VALUE ...] FIELD --> over a ring CSV (bench/tables.py)."""

    COLUMNS = ["gpu", "gpus", "sharding", "batch", "heads", "len", "head_dim", "causal", "pass",
               "median_ms", "min_ms", "tflops_per_gpu", "baseline_len", "baseline_ms",
               "baseline_tflops", "efficiency", "nccl", "status"]

    def value(self, conditions):
        rows = [("zigzag", 65536, 1, "fwd", 10.0, 0.90), ("zigzag", 131072, 1, "fwd", 40.0, 0.95),
                ("contiguous", 131072, 0, "fwd", 80.0, 0.97), ("torch_cp_allgather", 65536, 1, "fwd", 9.0, ""),
                ("torch_cp_allgather", 131072, 1, "fwd", 44.0, ""), ("torch_cp_allgather", 131072, 0, "fwd", 84.0, "")]
        with tempfile.TemporaryDirectory(dir=tables.ROOT) as folder:
            path = os.path.join(folder, "ring-x2.csv")
            with open(path, "w", newline="") as out:
                writer = csv.writer(out, lineterminator="\n")
                writer.writerow(self.COLUMNS)
                for sharding, length, causal, pass_name, ms, efficiency in rows:
                    writer.writerow(["Test GPU", 2, sharding, 1, 32, length, 128, causal, pass_name, ms, ms,
                                     "1", "", "", "", efficiency, "2.28", "ok"])
            return tables.ring_value(f"ring {os.path.relpath(path, tables.ROOT)} {conditions}")

    def test_a_range_over_the_matching_rows(self):
        self.assertEqual(self.value("efficiency"), "0.90–0.97")
        self.assertEqual(self.value("per_gpu_min=65536 efficiency"), "0.95–0.97")
        self.assertEqual(self.value("per_gpu_max=32768 sharding=zigzag efficiency:3"), "0.900")

    def test_against_pytorch_at_the_same_point(self):
        self.assertEqual(self.value("sharding=zigzag vs_torch"), "0.90–1.10×")
        self.assertEqual(self.value("causal=0 vs_torch"), "1.05×")

    def test_times_and_the_aa_check(self):
        self.assertEqual(self.value("len=131072 causal=1 sharding=zigzag median_ms:1"), "40.0")
        self.assertEqual(self.value("sharding=zigzag tflops_per_gpu:0"), "1")
        with self.assertRaises(SystemExit):  # this CSV predates the A/A column
            self.value("sharding=zigzag aa")

    def test_no_matching_row_is_an_error(self):
        with self.assertRaises(SystemExit):
            self.value("sharding=striped efficiency")


class ClockSamples(unittest.TestCase):
    """bench/clock_samples.py: only busy samples count, and each reason the driver held a clock
    down is named with its share."""

    LINES = ["0, 100, 1980, 650.5, 60, 0x0000000000000000",
             "1, 100, 1755, 699.0, 71, 0x0000000000000004",
             "0, 100, 1980, 640.0, 61, 0x0000000000000000",
             "1, 98, 1605, 700.0, 75, 0x0000000000000024",
             "0, 0, 1410, 80.0, 50, 0x0000000000000001",   # idle: left out
             "1, [N/A], 1410, 80.0, 50, 0x0000000000000001",
             "garbage line"]

    def test_a_line_per_gpu_over_its_busy_samples(self):
        lines = clock_samples.summary(clock_samples.read_samples(self.LINES))
        self.assertEqual(len(lines), 3)
        self.assertIn("GPU 0: 2 of 3 samples busy; SM clock median 1980, lowest 1980 MHz", lines[1])
        self.assertIn("clock never held down", lines[1])
        self.assertIn("SM clock median 1680, lowest 1605 MHz", lines[2])
        self.assertIn("power cap 100%, software thermal 50%", lines[2])

    def test_no_samples_says_so(self):
        self.assertIn("no samples", clock_samples.summary({})[0])
        never = clock_samples.summary(clock_samples.read_samples(["0, 3, 1410, 70, 40, 0x1"]))
        self.assertIn("GPU 0: never busy in 1 samples", never[1])


class TimedWindow(unittest.TestCase):
    """When an implementation has been timed enough (Resident.done)."""

    def resident(self, call_ms, calls, name="torch_efficient"):
        resident = driver.Resident(types.SimpleNamespace(name=name), {}, None, "fwd")
        resident.gpu_ms, resident.times = call_ms, [call_ms] * calls
        return resident

    def test_short_calls_fill_the_window(self):
        calls = math.ceil(driver.TIMED_SECONDS * 1e3 / 1.0)  # 0.15 s of 1 ms calls
        self.assertGreater(calls, driver.MIN_CALLS)
        self.assertFalse(self.resident(1.0, calls - 1).done())
        self.assertTrue(self.resident(1.0, calls).done())

    def test_calls_at_the_power_limit_fill_a_longer_window(self):
        self.assertGreaterEqual(5.0, driver.POWER_CALL_MS)
        calls = math.ceil(driver.POWER_TIMED_SECONDS * 1e3 / 5.0)  # 0.6 s of 5 ms calls
        self.assertGreater(calls, driver.MIN_CALLS)
        self.assertFalse(self.resident(5.0, driver.MIN_CALLS).done())
        self.assertFalse(self.resident(5.0, calls - 1).done())
        self.assertTrue(self.resident(5.0, calls).done())

    def test_min_calls_beyond_the_window(self):
        calls = math.ceil(driver.POWER_TIMED_SECONDS * 1e3 / 12.0)  # 0.6 s of 12 ms calls
        self.assertLess(calls, driver.MIN_CALLS)
        self.assertFalse(self.resident(12.0, calls).done())
        self.assertTrue(self.resident(12.0, driver.MIN_CALLS).done())

    def test_min_calls_stop_at_the_longest_window(self):
        calls = math.ceil(driver.MAX_TIMED_SECONDS * 1e3 / 22.0)
        self.assertLess(calls, driver.MIN_CALLS)
        self.assertFalse(self.resident(22.0, calls - 1).done())
        self.assertTrue(self.resident(22.0, calls).done())

    def credit_turns(self, call_ms, turns):
        resident = self.resident(call_ms, 10)
        return [resident.take_credit() for _ in range(turns)]

    def test_the_credit_gives_every_member_about_a_slice_a_turn(self):
        slice_ms = driver.SLICE_SECONDS * 1e3
        for call_ms in (0.9, 2.3, 4.6, 5.1, 9.2, 20.5):
            calls = self.credit_turns(call_ms, 100)
            issued = sum(calls) * call_ms
            # over 100 turns, within one call of 100 slices
            self.assertLessEqual(abs(issued - 100 * slice_ms), call_ms, call_ms)
        # 4.6 and 5.1 ms: one call a turn each (the old slice gave the first two, the second one)
        self.assertEqual(self.credit_turns(4.6, 10)[:5], [1] * 5)  # then two, once in a while
        self.assertEqual(self.credit_turns(5.1, 10), [1] * 10)
        self.assertEqual(set(self.credit_turns(9.2, 10)), {0, 1})

    def test_the_credit_of_short_and_long_calls(self):
        cap = math.ceil(driver.MAX_CALLS * driver.SLICE_SECONDS / driver.TIMED_SECONDS)
        self.assertEqual(self.credit_turns(0.01, 3), [cap] * 3)  # the surplus is not carried
        self.assertEqual(self.credit_turns(driver.LONG_CALL_MS * 2, 3), [1] * 3)

    def test_one_window_for_the_group(self):
        below, above = self.resident(1.8, 100), self.resident(3.0, 100)
        compared, window = driver.group_windows([below, above, self.resident(driver.LONG_CALL_MS, 1)])
        self.assertEqual(window, driver.POWER_TIMED_SECONDS)
        self.assertEqual(compared, window)  # no member a ratio compares
        self.assertTrue(below.done())  # 0.18 s of 1.8 ms calls: its own window is full
        below.group_window = window
        self.assertFalse(below.done())
        below.times = [1.8] * math.ceil(driver.POWER_TIMED_SECONDS * 1e3 / 1.8)
        self.assertTrue(below.done())

    def test_the_compared_members_wait_for_each_others_calls(self):
        # 1x32x16384^2 causal backward: stage 07 and FlashAttention-2 at 18 ms a call, stage 11
        # and cuDNN at 9.5; PyTorch's memory-efficient backend at 20 ms is compared with nothing.
        members = {name: self.resident(ms, 64, name) for name, ms in
                   (("07_backward", 18.0), ("torch_flash", 18.0), ("11_hopper_backward", 9.5),
                    ("torch_cudnn", 9.5), ("torch_efficient", 20.5))}
        compared, plain = driver.group_windows(list(members.values()))
        self.assertAlmostEqual(compared, driver.MIN_CALLS * 18.0 / 1e3)  # 60 calls of 18 ms
        self.assertEqual(plain, driver.POWER_TIMED_SECONDS)
        for name, resident in members.items():
            resident.group_window = compared if driver.compared_in_ratios(name) else plain
        self.assertFalse(members["torch_cudnn"].done())  # 64 calls of 9.5 ms: 0.61 s, not 1.08
        self.assertTrue(members["07_backward"].done())
        self.assertTrue(members["torch_efficient"].done())
        self.assertTrue(driver.compared_in_ratios("12_persistent"))
        self.assertFalse(driver.compared_in_ratios("cublas_bf16"))

    def test_long_calls_stop_sooner(self):
        long_ms = driver.LONG_CALL_MS
        self.assertFalse(self.resident(long_ms, driver.LONG_MIN_CALLS - 1).done())
        self.assertTrue(self.resident(long_ms, driver.LONG_MIN_CALLS).done())
        window = math.ceil(driver.LONG_MAX_TIMED_SECONDS * 1e3 / 300.0)
        self.assertFalse(self.resident(300.0, window - 1).done())
        self.assertTrue(self.resident(300.0, window).done())


class RingTable(unittest.TestCase):
    """bench/ring_table.py: PyTorch's row sits beside the ring's at the same point only, and
    --check fails on a table the CSV does not give."""

    HEADER = ("gpu,gpus,sharding,batch,heads,len,head_dim,causal,pass,median_ms,min_ms,tflops_per_gpu,"
              "baseline_len,baseline_ms,baseline_tflops,efficiency,nccl,status")

    def write(self, folder, lines):
        path = os.path.join(folder, "ring.csv")
        with open(path, "w") as out:
            out.write("\n".join([self.HEADER] + lines) + "\n")
        return path

    def test_pytorch_beside_its_point(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.write(folder, [
                "H,4,zigzag,1,32,262144,128,1,fwd,200.0,199.0,600.0,131072,100.0,650.0,0.923,n,ok",
                "H,4,contiguous,1,32,262144,128,0,fwd,400.0,399.0,600.0,131072,100.0,650.0,0.923,n,ok",
                "H,4,torch_cp_allgather,1,32,262144,128,1,fwd,220.0,219.0,545.0,,,,,n,ok",
                "H,4,torch_cp_allgather,1,32,262144,128,1,bwd,1.0,1.0,1.0,,,,,n,skipped: no api"])
            lines = ring_table.table(path).splitlines()
            zigzag = [line for line in lines if " zigzag " in line][0]
            contiguous = [line for line in lines if " contiguous " in line][0]
            self.assertIn("220.0", zigzag)
            self.assertTrue(zigzag.endswith("1.100x"))
            self.assertFalse(contiguous.rstrip().endswith("x"))
            self.assertEqual([line for line in lines if "skipped" in line],
                             ["not timed: 4 GPUs, 262144 tokens, torch_cp_allgather, causal 1, bwd: skipped: no api"])
            table_path = os.path.join(folder, "table.txt")
            with open(table_path, "w") as out:
                out.write("stale\n")
            argv = sys.argv
            try:
                sys.argv = ["ring_table.py", path, "--out", table_path, "--check"]
                self.assertEqual(ring_table.main(), 1)
                sys.argv = ["ring_table.py", path, "--out", table_path]
                self.assertEqual(ring_table.main(), 0)
                sys.argv = ["ring_table.py", path, "--out", table_path, "--check"]
                self.assertEqual(ring_table.main(), 0)
            finally:
                sys.argv = argv

    def test_rounds_and_the_aa_column(self):
        """PyTorch timed in two rounds is one row at the median of the two, with their spread
        under the table; the ring's A/A column is its second call's median over its first's."""
        header = self.HEADER.replace("efficiency,nccl", "efficiency,aa_median_ms,nccl")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "ring.csv")
            with open(path, "w") as out:
                out.write("\n".join([
                    header,
                    "H,2,torch_cp_allgather,1,32,65536,128,1,fwd,30.0,29.0,580.0,,,,,,n,ok",
                    "H,2,zigzag,1,32,65536,128,1,fwd,29.0,28.9,600.0,32768,12.0,650.0,0.923,29.29,n,ok",
                    "H,2,torch_cp_allgather,1,32,65536,128,1,fwd,32.0,31.0,540.0,,,,,,n,ok"]) + "\n")
            rows = ring_table.collapse_rounds(ring_table.read_rows([path]))
            torch = [r for r in rows if r["sharding"].startswith(ring_table.TORCH)]
            self.assertEqual(len(torch), 1)
            self.assertEqual((float(torch[0]["median_ms"]), torch[0]["rounds"]), (31.0, 2))
            lines = ring_table.table(path).splitlines()
            zigzag = [line for line in lines if " zigzag " in line][0]
            self.assertIn(" 1.010 ", zigzag)                 # A/A: 29.29 / 29.0
            self.assertTrue(zigzag.endswith("1.069x"))       # 31.0 / 29.0
            self.assertTrue(any("A/A" in line and "1 within 2%" in line for line in lines))
            self.assertTrue(any("2 rounds" in line and "1.067" in line for line in lines))  # 32 / 30
            self.assertEqual(ring_table.aa_ratio({"median_ms": "10", "aa_median_ms": ""}), None)


if __name__ == "__main__":
    unittest.main()
