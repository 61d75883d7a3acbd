#!/usr/bin/env python3
"""Unit tests of common/check_sass.py on small SASS listings written by hand in cuobjdump's
format (CI runs them; no GPU, no cuobjdump): the exponentials of a loop between the two waits
pass, one outside fails, a first tile's softmax before the loop does not count, the
mbarrier retries placed after EXIT close no loop, and an exempt head dimension is reported
without failing.

usage: python3 common/test_check_sass.py
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_sass  # noqa: E402


def listing(*instructions, head_dim=128):
    """A function of cuobjdump -sass output, one instruction per 0x10 bytes."""
    lines = [f"\t\tFunction : _ZN4test27flash_forward_pingpong_kernelINS_6TilingILi{head_dim}ELi2E"
             "Li176ELi2EEEEEvv"]
    lines += [f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0 */"
              for i, text in enumerate(instructions)]
    return "\n".join(lines) + "\n"


WAIT_ONE = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
WAIT_ZERO = "WARPGROUP.DEPBAR.LE gsb0, 0x0"


def verdict(sass):
    code = next(iter(check_sass.functions(sass).values()))
    looped = check_sass.loop_exponentials(code)
    return len(looped & check_sass.in_windows(code)), len(looped)


class CheckSass(unittest.TestCase):
    def test_a_loop_with_its_exponentials_between_the_waits_passes(self):
        sass = listing("MUFU.EX2 R1, R1",                 # 0x00: the first tile, before the loop
                       "HGMMA.64x176x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x10: the loop's top
                       WAIT_ONE,                          # 0x20
                       "MUFU.EX2 R2, R2",                 # 0x30
                       "MUFU.EX2 R3, R3",                 # 0x40
                       WAIT_ZERO,                         # 0x50
                       "@P0 BRA 0x10",                    # 0x60: back to the loop's top
                       "EXIT")                            # 0x70
        self.assertEqual(verdict(sass), (2, 2))

    def test_an_exponential_after_the_second_wait_fails(self):
        sass = listing("HGMMA.64x176x16.F32.BF16 R24, gdesc[UR4], RZ",
                       WAIT_ONE,
                       "MUFU.EX2 R2, R2",
                       WAIT_ZERO,
                       "MUFU.EX2 R3, R3",                 # the wait moved above it
                       "@P0 BRA 0x0",
                       "EXIT")
        self.assertEqual(verdict(sass), (1, 2))

    def test_a_retry_after_exit_closes_no_loop(self):
        sass = listing("MUFU.EX2 R1, R1",                 # 0x00: the first tile's softmax
                       "@!P0 BRA 0x70",                   # 0x10: to the retry stub
                       WAIT_ONE,                          # 0x20
                       "MUFU.EX2 R2, R2",                 # 0x30
                       WAIT_ZERO,                         # 0x40
                       "@P1 BRA 0x20",                    # 0x50: the loop
                       "EXIT",                            # 0x60
                       "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0",  # 0x70: the stub
                       "@!P0 BRA 0x70",                   # 0x80
                       "BRA 0x0")                         # 0x90: back into the body
        self.assertEqual(verdict(sass), (1, 1))

    def test_a_kernel_without_a_loop_of_exponentials_has_nothing_to_check(self):
        sass = listing("MUFU.EX2 R1, R1", "EXIT")
        self.assertEqual(verdict(sass), (0, 0))

    def test_an_exempt_head_dimension_is_reported_without_failing(self):
        moved = ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", WAIT_ONE, WAIT_ZERO,
                 "MUFU.EX2 R3, R3", "@P0 BRA 0x0", "EXIT")
        d64 = check_sass.functions(listing(*moved, head_dim=64))
        lines, failed = check_sass.check(d64, exempt_head_dims=[64])
        self.assertFalse(failed)
        self.assertIn("0 of the 1 MUFU.EX2", lines[0])
        self.assertIn("not required at D = 64", lines[0])
        self.assertTrue(check_sass.check(d64)[1])
        d128 = check_sass.functions(listing(*moved))
        self.assertTrue(check_sass.check(d128, exempt_head_dims=[64])[1])

    def test_stage_12s_two_instances_of_a_tiling_are_told_apart(self):
        body = ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", WAIT_ONE, "MUFU.EX2 R3, R3", WAIT_ZERO,
                "@P0 BRA 0x0", "EXIT")
        labels = []
        for flag in ("0", "1"):
            sass = listing(*body).replace("Li176ELi2EEEEEvv", f"Li176ELi2EEELb{flag}EEEvv")
            labels.append(check_sass.check(check_sass.functions(sass))[0][0].split(":")[0])
        self.assertEqual(labels, ["Tiling<128, 2, 176, 2>, persistent", "Tiling<128, 2, 176, 2>, one tile"])


if __name__ == "__main__":
    unittest.main()
