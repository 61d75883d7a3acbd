#!/usr/bin/env python3
"""A host-side model of stage 12's synchronization, the persistent forward (no GPU needed).

Every role of the kernel (the loader, the storer, each consumer warpgroup, the copy engine)
is a Python generator that performs the kernel's barrier operations in the kernel's order; a
random scheduler interleaves them, and the copy engine completes each TMA load or store after
a random delay. mbarriers follow the PTX rule: a wait on parity p returns once the barrier's
current phase parity differs from p; named barriers (the turns) complete when both of their
256 threads, two warpgroups, have arrived. The model checks, on every interleaving it runs:

  * no deadlock: every role finishes;
  * every mbarrier wait returns on the phase it means (never one phase early, the failure a
    parity wait allows when a barrier's users drift two phases apart);
  * no shared buffer is overwritten while it is read: a consumer's Q rows from the issue of
    an S = Q K^T to the wait that returns it, a K or V stage from its wgmma's issue to the wait
    that covers it, an O buffer from a consumer's staging until the storer's copy has read it;
  * and it catches three deliberate bugs (one o_empty barrier per buffer, the O buffer freed
    before the copy has read it, Q freed at the issue of the last S): a model that passes
    everything proves nothing.
  * every work tile's O is stored once per consumer, with that work tile's data.

It models the code of 12_persistent/attention.cu (written for the same kernel as stage 10 of
branch persistent-forward; SCHEDULE_SLOTS = 4, STAGES = 2, O_BUFFERS 1 with two consumers as the
176-key kernel, 2 and 3 as the others); warps of a warpgroup move together (one arrival per
warpgroup stands for its four warps, or for its 128 threads on o_full). The consumers' loop
nested per work tile issues the same barrier operations in the same order as the single loop
over the block's K/V tiles that it replaced, so the model stands for both.

Branch split-tail: a work item may be a part of a split work tile (work = (id, kv_tiles,
True)): its consumers write O to the workspace, not to an O buffer, and the storer reads its
schedule slot and skips it; the O phases are still counted by round on both sides, which holds
because parts come after every whole tile of a block. The runs mix whole tiles then parts, and
a fourth deliberate bug puts a part before a whole tile: the model must catch it.

usage: persistent_protocol_model.py [--runs N] [--seed S]
"""
import argparse
import random


def is_part(work):
    return work is not None and len(work) > 2 and work[2]


class Deadlock(Exception):
    pass


class Barrier:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.completed = name, count, 0, 0

    def arrive(self):
        self.pending += 1
        assert self.pending <= self.count, f"{self.name}: more arrivals than its count in a phase"
        if self.pending == self.count:
            self.pending = 0
            self.completed += 1

    def ready(self, parity):
        return self.completed % 2 != parity


class Model:
    def __init__(self, rng, consumers, o_buffers, works, stages=2, slots=4, mutation=None):
        self.rng, self.C, self.B, self.S, self.SLOTS = rng, consumers, o_buffers, stages, slots
        self.mutation = mutation  # a deliberate bug, to show that the model catches it
        self.works = works  # the block's work tiles in order: [(tile id, kv_tiles)]
        b = Barrier
        self.schedule_full = [b(f"schedule_full[{i}]", 1) for i in range(slots)]
        self.schedule_empty = [b(f"schedule_empty[{i}]", consumers + 1) for i in range(slots)]
        self.q_full = [b(f"q_full[{c}]", 1) for c in range(consumers)]
        self.q_empty = [b(f"q_empty[{c}]", 1) for c in range(consumers)]
        self.k_full = [b(f"k_full[{s}]", 1) for s in range(stages)]
        self.v_full = [b(f"v_full[{s}]", 1) for s in range(stages)]
        self.k_empty = [b(f"k_empty[{s}]", consumers) for s in range(stages)]
        self.v_empty = [b(f"v_empty[{s}]", consumers) for s in range(stages)]
        self.o_full = [b(f"o_full[{i}]", 1) for i in range(o_buffers)]
        self.o_empty = [b(f"o_empty[{c}]", 1) for c in range(consumers)]
        self.schedule = [None] * slots
        # Buffer contents and readers, for the hazard checks.
        self.q_rows = [None] * consumers       # the work tile whose Q the rows hold
        self.q_reading = [False] * consumers
        self.k_stage = [None] * stages         # the block's K/V tile index a stage holds
        self.v_stage = [None] * stages
        self.k_reading = [set() for _ in range(stages)]
        self.v_reading = [set() for _ in range(stages)]
        self.o_buffer = [None] * o_buffers     # (work tile, consumer) staged and not yet read
        self.stored = []
        self.parts_written = []                # (round, consumer) of the parts' O, to the workspace
        self.copies = []                       # in-flight copy engine operations
        self.turn_waiting = {}                 # named barrier id -> arrivals in this generation

    # -- primitives used by the roles (generators yield while they cannot proceed) --
    def wait(self, barrier, parity, phase):
        """Wait on parity; `phase` is the completion the code means (-1: the one before the first)."""
        while not barrier.ready(parity):
            yield
        assert barrier.completed == phase + 1 or (phase == -1 and barrier.completed == 0), (
            f"{barrier.name}: wait for phase {phase} returned with {barrier.completed} completed")

    def tma(self, action):
        self.copies.append([self.rng.randint(0, 6), action])

    def turn_sync(self, wg):
        gen = self.turn_arrive_raw(wg, f"consumer {wg}")
        while self.turn_generation[wg] == gen:
            yield

    def turn_arrive_raw(self, bar, who):
        gen = self.turn_generation[bar]
        assert who not in self.turn_arrived[bar], f"turn barrier {bar}: {who} arrives twice in one generation"
        self.turn_arrived[bar].add(who)
        if len(self.turn_arrived[bar]) == 2:  # 256 threads: the waiter's 128 and the passer's 128
            self.turn_arrived[bar] = set()
            self.turn_generation[bar] += 1
        return gen

    def pass_turn(self, wg):
        self.turn_arrive_raw((wg + 1) % self.C, f"consumer {wg}")

    # -- the roles --
    def loader(self):
        load = 0
        rounds = self.works + [None]
        for rnd, work in enumerate(rounds):
            slot = rnd % self.SLOTS
            yield from self.wait(self.schedule_empty[slot], (rnd // self.SLOTS + 1) % 2,
                                 rnd // self.SLOTS - 1)
            self.schedule[slot] = (rnd, work)
            self.schedule_full[slot].arrive()
            if work is None:
                return
            kv_tiles = work[1]
            for kv in range(kv_tiles):
                stage = load % self.S
                yield from self.wait(self.k_empty[stage], (load // self.S + 1) % 2, load // self.S - 1)

                def land_k(stage=stage, load=load):
                    assert not self.k_reading[stage], f"K stage {stage} overwritten while read"
                    self.k_stage[stage] = load
                    self.k_full[stage].arrive()
                self.tma(land_k)
                if kv == 0:
                    for c in range(self.C):
                        yield from self.wait(self.q_empty[c], (rnd + 1) % 2, rnd - 1)

                        def land_q(c=c, rnd=rnd):
                            assert not self.q_reading[c], f"Q rows of consumer {c} overwritten while read"
                            self.q_rows[c] = rnd
                            self.q_full[c].arrive()
                        self.tma(land_q)
                yield from self.wait(self.v_empty[stage], (load // self.S + 1) % 2, load // self.S - 1)

                def land_v(stage=stage, load=load):
                    assert not self.v_reading[stage], f"V stage {stage} overwritten while read"
                    self.v_stage[stage] = load
                    self.v_full[stage].arrive()
                self.tma(land_v)
                load += 1
                yield

    def storer(self):
        rnd = 0
        while True:
            slot = rnd % self.SLOTS
            yield from self.wait(self.schedule_full[slot], rnd // self.SLOTS % 2, rnd // self.SLOTS)
            _, work = self.schedule[slot]
            self.schedule_empty[slot].arrive()
            if work is None:
                return
            if is_part(work):  # split-tail: a part's O leaves through the workspace
                rnd += 1
                continue
            for c in range(self.C):
                buffer = c % self.B
                use = rnd * (self.C // self.B) + c // self.B
                yield from self.wait(self.o_full[buffer], use % 2, use)
                assert self.o_buffer[buffer] == (rnd, c), f"O buffer {buffer} holds {self.o_buffer[buffer]}, not {(rnd, c)}"
                done = [False]

                def read(buffer=buffer, rnd=rnd, c=c, done=done):
                    self.stored.append((rnd, c))
                    self.o_buffer[buffer] = None  # read: free to rewrite
                    done[0] = True
                self.tma(read)
                while not done[0] and self.mutation != "free O before the copy has read it":
                    yield  # bulk_wait_read<0>
                if self.mutation == "one o_empty per buffer":
                    self.o_empty[buffer].arrive()
                else:
                    self.o_empty[(c + self.B) % self.C].arrive()
            rnd += 1

    def consumer(self, wg):
        C, S = self.C, self.S
        parity = lambda j: j // S % 2
        rnd = 0

        def next_work(rnd):
            slot = rnd % self.SLOTS
            yield from self.wait(self.schedule_full[slot], rnd // self.SLOTS % 2, rnd // self.SLOTS)
            got = self.schedule[slot]
            self.schedule_empty[slot].arrive()
            return got[1]

        def stage_o(rnd):
            buffer = wg % self.B
            user = wg // self.B
            if self.mutation == "one o_empty per buffer":  # every use waits for the use before
                use = rnd * (self.C // self.B) + user
                yield from self.wait(self.o_empty[buffer], (use + 1) % 2, use - 1)
            else:
                yield from self.wait(self.o_empty[wg], ((rnd + 1) if user == 0 else rnd) % 2,
                                     rnd - 1 if user == 0 else rnd)
            assert self.o_buffer[buffer] is None, f"O buffer {buffer} rewritten before the storer read it"
            self.o_buffer[buffer] = (rnd, wg)
            self.o_full[buffer].arrive()

        def finish_o(rnd, part):
            if part:  # split-tail: straight to the workspace, no O buffer, no o_empty
                self.parts_written.append((rnd, wg))
            else:
                yield from stage_o(rnd)

        work = yield from next_work(rnd)
        kv_tiles = work[1]
        if wg == C - 1:
            self.pass_turn(wg)
        yield from self.wait(self.q_full[wg], 0, 0)
        yield from self.wait(self.k_full[0], 0, 0)
        yield from self.turn_sync(wg)
        assert self.q_rows[wg] == rnd and self.k_stage[0] == 0
        self.q_reading[wg] = True
        self.k_reading[0].add(wg)
        self.pass_turn(wg)
        yield  # the wgmma runs
        self.q_reading[wg] = False
        self.k_reading[0].discard(wg)
        self.k_empty[0].arrive()
        if kv_tiles == 1:
            self.q_empty[wg].arrive()
        kv, read = 1, 1
        while True:
            first = kv == kv_tiles
            if first:
                rnd += 1
                finished_part = is_part(work)
                work = yield from next_work(rnd)
                if work is None:
                    break
                kv_tiles, kv = work[1], 0
                yield from self.wait(self.q_full[wg], rnd % 2, rnd)
            stage, previous = read % S, (read - 1) % S
            yield from self.wait(self.k_full[stage], parity(read), read // S)
            yield from self.wait(self.v_full[previous], parity(read - 1), (read - 1) // S)
            yield from self.turn_sync(wg)
            assert self.k_stage[stage] == read and self.v_stage[previous] == read - 1
            assert self.q_rows[wg] == rnd, f"consumer {wg} issues S with Q of {self.q_rows[wg]}, not {rnd}"
            self.q_reading[wg] = True
            self.k_reading[stage].add(wg)
            self.v_reading[previous].add(wg)
            self.pass_turn(wg)
            if self.mutation == "free Q at the issue of the last S" and kv == kv_tiles - 1:
                self.q_empty[wg].arrive()
            yield  # wait_group 1: S is done
            self.q_reading[wg] = False
            self.k_reading[stage].discard(wg)
            self.k_empty[stage].arrive()
            if kv == kv_tiles - 1 and self.mutation != "free Q at the issue of the last S":
                self.q_empty[wg].arrive()
            yield  # the softmax; wait_group 0: P V is done
            self.v_reading[previous].discard(wg)
            self.v_empty[previous].arrive()
            if first:
                yield from finish_o(rnd - 1, finished_part)
            read += 1
            kv += 1
        last = (read - 1) % S
        yield from self.wait(self.v_full[last], parity(read - 1), (read - 1) // S)
        yield from self.turn_sync(wg)
        assert self.v_stage[last] == read - 1
        self.v_reading[last].add(wg)
        if wg != C - 1:
            self.pass_turn(wg)
        yield
        self.v_reading[last].discard(wg)
        self.v_empty[last].arrive()
        yield from finish_o(rnd - 1, finished_part)

    def run(self):
        self.turn_arrived = [set() for _ in range(self.C)]
        self.turn_generation = [0] * self.C
        roles = {"loader": self.loader(), "storer": self.storer()}
        for wg in range(self.C):
            roles[f"consumer {wg}"] = self.consumer(wg)
        idle = 0
        while roles or self.copies:
            progressed = False
            # The copy engine: complete the copies whose delay has passed.
            for copy in list(self.copies):
                copy[0] -= 1
                if copy[0] < 0:
                    self.copies.remove(copy)
                    copy[1]()
                    progressed = True
            names = list(roles)
            self.rng.shuffle(names)
            for name in names[: self.rng.randint(1, len(names))]:
                try:
                    next(roles[name])
                except StopIteration:
                    del roles[name]
                progressed = True
            idle = 0 if progressed else idle + 1
            if idle > 1000:
                raise Deadlock(f"no progress; still running: {sorted(roles)}")
        expected = sorted((r, c) for r in range(len(self.works)) for c in range(self.C) if not is_part(self.works[r]))
        assert sorted(self.stored) == expected, f"stored {sorted(self.stored)}, expected {expected}"
        parts = sorted((r, c) for r in range(len(self.works)) for c in range(self.C) if is_part(self.works[r]))
        assert sorted(self.parts_written) == parts, f"parts written {sorted(self.parts_written)}, expected {parts}"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args()
    rng = random.Random(arguments.seed)
    # The model must catch these on some interleaving, else it proves nothing.
    for mutation, consumers, o_buffers in (("one o_empty per buffer", 2, 1),
                                           ("free O before the copy has read it", 2, 1),
                                           ("free Q at the issue of the last S", 2, 2)):
        caught = None
        for run in range(arguments.runs):
            works = [(i, rng.choice([1, 1, 2, 3, 5])) for i in range(rng.randint(1, 9))]
            try:
                Model(random.Random(rng.random()), consumers, o_buffers, works, mutation=mutation).run()
            except (AssertionError, Deadlock) as error:
                caught = f"{type(error).__name__}: {error}"
                break
        print(f"deliberate bug '{mutation}': " + (f"caught ({caught})" if caught else "NOT CAUGHT"))
        if not caught:
            return 1
    # split-tail: a part before a whole tile breaks the round-counted O phases; must be caught.
    caught = None
    for run in range(arguments.runs):
        works = [(0, rng.choice([1, 2, 3]), True)] + [(i, rng.choice([1, 2, 3])) for i in range(1, rng.randint(2, 5))]
        try:
            Model(random.Random(rng.random()), 2, 1, works).run()
        except (AssertionError, Deadlock) as error:
            caught = f"{type(error).__name__}: {error}"
            break
    print("deliberate bug 'a part before a whole tile': " + (f"caught ({caught})" if caught else "NOT CAUGHT"))
    if not caught:
        return 1
    configurations = [(2, 1), (2, 2), (3, 3)]  # (consumers, O buffers) of the three kernels
    for consumers, o_buffers in configurations:
        for run in range(arguments.runs):
            works = [(i, rng.choice([1, 1, 2, 3, 5])) for i in range(rng.randint(1, 9))]
            Model(random.Random(rng.random()), consumers, o_buffers, works).run()
        print(f"{consumers} consumers, {o_buffers} O buffer(s): {arguments.runs} random "
              f"interleavings, 1 to 9 work tiles of 1 to 5 K/V tiles each: no deadlock, every "
              f"wait on its phase, no buffer overwritten while read, every O stored once")
    # split-tail: whole tiles, then parts (as every block walks its items), 0 to 6 of each.
    for consumers, o_buffers in configurations:
        for run in range(arguments.runs):
            whole = rng.randint(0, 6)
            parts = rng.randint(0 if whole else 1, 6)
            works = [(i, rng.choice([1, 1, 2, 3, 5])) for i in range(whole)]
            works += [(whole + i, rng.choice([1, 2, 3, 5]), True) for i in range(parts)]
            Model(random.Random(rng.random()), consumers, o_buffers, works).run()
        print(f"{consumers} consumers, {o_buffers} O buffer(s), split-tail: {arguments.runs} random "
              f"interleavings, 0 to 6 whole work tiles then 0 to 6 parts: no deadlock, every wait on "
              f"its phase, no buffer overwritten while read, every whole O stored once, every part "
              f"written once and never through an O buffer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
