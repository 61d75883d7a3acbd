# Top level: every stage and the cuBLAS baselines. Each folder also builds on its own
# (make -C 03_online_softmax test). See README.md.

STAGES    := 00_naive 01_fused_rowwise 02_tiled 03_online_softmax 04_warp_shuffle 05_mma_swizzle \
             06_pipelined 07_backward 08_wgmma_tma 09_warp_specialized \
             10_pingpong 11_hopper_backward 12_persistent
# Beyond one GPU: not a stage of the single-GPU contract (it calls stage 11's launchers across
# GPUs on NCCL), so not in STAGES, which the benchmark, the tables and make sanitize read; built
# and tested with the rest, after the single-GPU stages (docs/lab-notes/13_ring_attention.md).
RING      := 13_ring_attention
BASELINES := bench/cublas_fp32 bench/cublas_bf16
SUITES    := $(STAGES) $(RING) $(BASELINES)
JOBS      ?= $(shell nproc)
# The Python that runs the PyTorch package's tests (python/test_flashcourse.py) in make test.
PYTHON_TEST ?= python3

ROOT      := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))

.DEFAULT_GOAL := all
.PHONY: all common-objects test bench bench-ring sass-check plots notebook docs docs-check diagrams sanitize profile diff clean distclean help $(SUITES)

# make profile STAGE=04 | STAGE=4 | STAGE=04_warp_shuffle: the stage's folder, or a usage line.
ifneq ($(filter profile,$(MAKECMDGOALS)),)
  PROFILE_STAGE := $(if $(filter 0 1 2 3 4 5 6 7 8 9,$(STAGE)),0$(STAGE),$(STAGE))
  PROFILE_DIR := $(patsubst %/,%,$(firstword $(if $(strip $(STAGE)),$(wildcard $(PROFILE_STAGE)_*/) $(wildcard $(PROFILE_STAGE)/))))
  ifeq ($(filter $(STAGES),$(PROFILE_DIR)),)
    $(error usage: make profile STAGE=04 (or STAGE=04_warp_shuffle; the stages are $(STAGES)))
  endif
endif

ifneq ($(filter diff,$(MAKECMDGOALS)),)
  DIFF_PROBLEM := $(shell bash common/diff_stages.sh --check "$(A)" "$(B)")
  $(if $(DIFF_PROBLEM),$(error $(DIFF_PROBLEM)))
endif

# make plots | notebook | docs | docs-check RESULTS=bench/results/<gpu>: a folder with a results.csv,
# or one line that lists those there are.
ifneq ($(and $(RESULTS),$(filter plots notebook docs docs-check,$(MAKECMDGOALS))),)
  RESULTS := $(patsubst %/,%,$(RESULTS))
  ifeq ($(wildcard $(RESULTS)/results.csv),)
    RESULTS_THERE := $(patsubst %/results.csv,%,$(wildcard bench/results/*/results.csv))
    $(error RESULTS=$(RESULTS) has no results.csv; $(if $(RESULTS_THERE),the results folders there are: $(RESULTS_THERE),bench/results/ holds no results yet) (make bench writes bench/results/<gpu>/))
  endif
endif

# What each goal needs, checked (Doctest fetched, .deps/venv made) before anything is built:
# see common/deps.mk.
DOCTEST_GOALS   := all common-objects test sanitize $(SUITES)
GPU_GOALS       := bench bench-ring sanitize profile
SANITIZER_GOALS := sanitize
NCU_GOALS       := profile
NVCC_GOALS      := all common-objects test bench bench-ring sanitize profile sass-check $(SUITES)
PYTHON_GOALS    := bench bench-ring plots notebook diagrams
include common/deps.mk

# The objects the suites share (common/stage.mk) are built first, suite by suite (each of them
# in parallel), so that no two makes write the same file; then the suites build side by side
# (make all, or make -j 03_online_softmax 04_warp_shuffle: the suites named).
COMMON_FOR := $(or $(filter $(SUITES),$(MAKECMDGOALS)),$(SUITES))
common-objects:
	@for suite in $(COMMON_FOR); do \
	  $(MAKE) --no-print-directory -C $$suite -j$(JOBS) common-objects || exit 1; done

all: common-objects
	@$(MAKE) --no-print-directory -j$(JOBS) $(SUITES) COMMON_OBJECTS_BUILT=1

$(SUITES): $(if $(COMMON_OBJECTS_BUILT),,common-objects)
	@$(MAKE) --no-print-directory -C $@ all

# The ring links stage 11's object: 11's make writes it, the ring's reads it.
$(RING): 11_hopper_backward

# Builds everything, runs every suite (GPU cases are skipped by name where no GPU is
# visible), then the PyTorch package's tests (python/test_flashcourse.py, with PYTHON_TEST),
# and ends with one line that sums them.
test:
	@$(MAKE) --no-print-directory -k all; \
	for suite in $(SUITES); do \
	  rm -f build/$$(basename $$suite)/test-summary.txt; \
	  $(MAKE) --no-print-directory -C $$suite test || true; \
	done; \
	rm -f build/python/test-summary.txt; \
	echo "== python/test_flashcourse.py (the PyTorch package; skipped by name without PyTorch or a GPU)"; \
	TEST_SUMMARY_FILE=build/python/test-summary.txt $(PYTHON_TEST) python/test_flashcourse.py || true; \
	bash common/sum_tests.sh $(foreach s,$(SUITES),$(notdir $(s))) python

# Reads the compiled ping-pong forward (stage 10, the copy in 11, and 12's persistent one) and
# checks that the softmax's exponentials in its main loop lie between the consumer's
# wgmma.wait_group 1 and 0, the overlap chapter 10 teaches (common/check_sass.py). D = 64 is
# reported, not required: the exponent unit bounds that loop and the overlapped form measured
# slower (lab notes 10). Needs nvcc, no GPU; cuobjdump from PATH or fetched into .deps/
# (common/fetch_cuobjdump.sh). CI runs it.
SASS_CHECKED := 10_pingpong 11_hopper_backward 12_persistent
sass-check:
	@for suite in $(SASS_CHECKED); do $(MAKE) --no-print-directory -C $$suite all || exit 1; done; \
	cuobjdump=$$(bash common/fetch_cuobjdump.sh) || { echo "error: $$cuobjdump" >&2; exit 2; }; \
	status=0; \
	for suite in $(SASS_CHECKED); do \
	  python3 common/check_sass.py build/$$suite/libattention_$$suite.so --exempt-head-dim 64 \
	    --cuobjdump "$$cuobjdump" || status=1; \
	done; exit $$status

# Needs a GPU (checked first). Builds the benchmark binaries, runs them, and writes the CSVs and
# this run's figures to bench/results/<gpu>/ (docs/img/ is redrawn only by make plots).
# SWEEP=name[,name] (or BENCH_SWEEPS) runs those sweeps of bench/sweeps.txt alone (checked first).
bench:
	@PYTHON=$(PYTHON_ENV) $(if $(SWEEP),BENCH_SWEEPS=$(SWEEP)) bash bench/run_bench.sh $(STAGES)

# Needs 2 or more GPUs (checked first): the ring's benchmark (stage 13, PyTorch's context
# parallelism beside it) on RING_GPUS of them [2 4 8], into bench/results/<gpu>/ring/
# (bench/run_ring_bench.sh). One count at a time: RING_GPUS=4 make bench-ring.
bench-ring:
	@PYTHON=$(PYTHON_ENV) bash bench/run_ring_bench.sh

# Redraws the committed figures, docs/img/ (or PLOTS_OUT=folder), from the newest
# bench/results/<gpu>/ (or RESULTS=bench/results/<gpu>); no GPU needed.
PLOTS_OUT ?= docs/img
plots:
	@$(PYTHON_ENV) bench/plots.py $(RESULTS) --out $(PLOTS_OUT)

# Runs the benchmark notebook top to bottom on the committed CSVs (or RESULTS=bench/results/<gpu>),
# into build/benchmarks.ipynb. NOTEBOOK_INPLACE=1 writes the outputs into docs/benchmarks.ipynb
# itself (the committed notebook keeps the outputs of the committed run).
notebook:
	@mkdir -p build
	@BENCH_REQUIRE_RESULTS=1 $(if $(RESULTS),BENCH_RESULTS_DIR=$(abspath $(RESULTS))) \
	  $(PYTHON_ENV) -m jupyter nbconvert --to notebook --execute docs/benchmarks.ipynb \
	  $(if $(filter 1,$(NOTEBOOK_INPLACE)),--inplace --ClearMetadataPreprocessor.enabled=True,--output-dir build --output benchmarks.ipynb)

# Regenerates what the chapters and the README do not type by hand: results tables
# (<!-- results:... -->), numbers in prose (<!-- value:... -->) and code excerpts
# (<!-- code:... -->, from the stages' // excerpt: markers). docs-check fails when one is
# stale, and when the diagrams were drawn from other kernel constants. Both need only python3.
docs:
	@python3 bench/tables.py $(if $(RESULTS),--results $(RESULTS)/results.csv)

docs-check:
	@python3 bench/tables.py --check $(if $(RESULTS),--results $(RESULTS)/results.csv)
	@python3 bench/check_forward_copy.py 06_pipelined 07_backward
	@python3 bench/check_forward_copy.py 10_pingpong 11_hopper_backward
	@python3 13_ring_attention/overlap_estimate.py --check
	@for f in lengths torch-cp; do python3 bench/ring_table.py docs/profiles/13_ring_attention/ring-x4-h200-$$f.csv --out docs/profiles/13_ring_attention/ring-x4-h200-$$f.txt --check || exit 1; done
	@for csv in $(wildcard bench/results/*/ring/ring-x*.csv); do python3 bench/ring_table.py $$csv --out $$(dirname $$csv)/table-$$(basename $$csv .csv | sed 's/^ring-//').txt --check || exit 1; done
	@python3 docs/diagrams/draw.py --check
	@python3 common/wgmma.py --check

# Redraws the chapters' diagrams (docs/diagrams/*.png) from the kernels' constants.
diagrams:
	@$(PYTHON_ENV) docs/diagrams/draw.py

# compute-sanitizer over every stage (the sanitize target of common/stage.mk; docs/sanitizers.md).
# Every stage runs even after one fails. Everything printed also goes to build/sanitize.log,
# which ends, as the terminal does, with every stage's per-tool lines and one line that sums them
# (common/sum_sanitize.sh: sanitize: 12 stages x 4 tools, 0 errors ...). Fails on any error,
# failed case, or stage that gave no result.
sanitize: all
	@mkdir -p build; start=$$(date +%s); \
	for stage in $(STAGES); do rm -f build/$$stage/sanitize-summary.txt; done; \
	{ echo "== make sanitize: commit $$(git rev-parse --short HEAD 2>/dev/null)$$(git diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes'), $$(date -u '+%Y-%m-%d %H:%M UTC')"; \
	  $(NVIDIA_SMI) -L; $(COMPUTE_SANITIZER) --version | tail -n 1; \
	  for stage in $(STAGES); do $(MAKE) --no-print-directory -C $$stage sanitize; done; } 2>&1 | tee build/sanitize.log; \
	bash common/sum_sanitize.sh $$(( $$(date +%s) - start )) $(STAGES) > build/sanitize-sum.txt; status=$$?; \
	cat build/sanitize-sum.txt; cat build/sanitize-sum.txt >> build/sanitize.log; exit $$status

# make profile STAGE=04: the report goes to build/<stage folder>/profile.ncu-rep. STAGE is
# passed on as the folder's name: the stage's own makefile names its build folder after it.
profile:
	@$(MAKE) --no-print-directory -C $(PROFILE_DIR) profile STAGE=$(PROFILE_DIR)

# make diff A=03 B=04 (or A=3 B=4, or folder names): what one stage adds to another.
diff:
	@bash common/diff_stages.sh "$(A)" "$(B)"

# Every goal of this Makefile, one line each (.ci/check_messages.sh checks that none is missing).
help:
	@echo "usage: make [GOAL] [VARIABLE=value ...]; the goals (README.md says more):"
	@echo "  make all          build every stage and baseline (the default goal; ARCH=\"sm_80 sm_90\" or native)"
	@echo "  make test         build everything, run every test suite, end with one line that sums them (no GPU needed)"
	@echo "  make bench        benchmark every stage and baseline (GPU; SWEEP=name[,name] of bench/sweeps.txt) into bench/results/<gpu>/"
	@echo "  make bench-ring   the ring (stage 13) and PyTorch's context parallelism on 2+ GPUs (RING_GPUS=\"2 4 8\") into bench/results/<gpu>/ring/"
	@echo "  make plots        redraw docs/img/ from the newest bench/results/<gpu>/ (RESULTS=folder, PLOTS_OUT=folder; no GPU)"
	@echo "  make notebook     run docs/benchmarks.ipynb on the committed CSVs into build/ (RESULTS=folder, NOTEBOOK_INPLACE=1)"
	@echo "  make docs         regenerate the results tables, numbers and code excerpts of the chapters and README (RESULTS=folder)"
	@echo "  make docs-check   fail when a generated table, number, excerpt or diagram is stale (what CI runs)"
	@echo "  make diagrams     redraw the chapters' diagrams (docs/diagrams/*.png) from the kernels' constants"
	@echo "  make sanitize     compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every stage (GPU)"
	@echo "  make profile      Nsight Compute report of one stage: make profile STAGE=04 (GPU, ncu)"
	@echo "  make sass-check   read the Hopper forward's SASS: is the softmax between its two wgmma waits? (no GPU)"
	@echo "  make diff         what one stage adds to another: make diff A=03 B=04"
	@echo "  make clean        remove build/"
	@echo "  make distclean    remove build/ and .deps/ (the fetched Doctest, NCCL and cuobjdump, the Python environment)"
	@echo "  make help         this list"
	@echo "  make common-objects   build the objects the suites share (make all does it first)"
	@echo "  make $(firstword $(SUITES)) ... $(lastword $(SUITES))   build the suites named (each folder also: make -C 03_online_softmax test); they are: $(SUITES)"

# .deps/ (the fetched Doctest, the Python environment) stays: make distclean removes it too.
clean:
	rm -rf build

distclean: clean
	rm -rf .deps
