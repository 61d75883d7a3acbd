# Top level: every stage and the cuBLAS baselines. Each folder also builds on its own
# (make -C 03_online_softmax test). See README.md.

STAGES    := 00_naive 01_fused_rowwise 02_tiled 03_online_softmax 04_warp_shuffle 05_mma_swizzle \
             06_pipelined 07_backward 08_wgmma_tma 09_warp_specialized \
             10_pingpong 11_hopper_backward
BASELINES := bench/cublas_fp32 bench/cublas_bf16
SUITES    := $(STAGES) $(BASELINES)
JOBS      ?= $(shell nproc)

.PHONY: all test bench plots notebook docs docs-check diagrams sanitize profile diff clean $(SUITES)

all:
	@$(MAKE) --no-print-directory -j$(JOBS) $(SUITES)

$(SUITES):
	@$(MAKE) --no-print-directory -C $@ all

# Builds everything, runs every suite (GPU cases are skipped by name where no GPU is
# visible) and ends with one line that sums them.
test:
	@$(MAKE) --no-print-directory -k all; \
	for suite in $(SUITES); do \
	  rm -f build/$$(basename $$suite)/test-summary.txt; \
	  $(MAKE) --no-print-directory -C $$suite test || true; \
	done; \
	bash common/sum_tests.sh $(foreach s,$(SUITES),$(notdir $(s)))

bench: all
	@bash bench/run_bench.sh $(STAGES)

PYTHON_PACKAGES = python3 -c "import matplotlib, numpy, nbformat, nbconvert, ipykernel" 2>/dev/null || \
  { echo "error: missing Python packages. Install them with: pip install -r bench/requirements.txt" >&2; exit 1; }

# Redraws docs/img/ from the newest bench/results/<gpu>/ (or RESULTS=bench/results/<gpu>); no GPU needed.
plots:
	@$(PYTHON_PACKAGES)
	@python3 bench/plots.py $(RESULTS) --out docs/img

# Runs the benchmark notebook top to bottom on the committed CSVs, into build/ (the committed
# notebook keeps the outputs of the committed run; its first cell says how to refresh them).
notebook:
	@$(PYTHON_PACKAGES)
	@mkdir -p build
	@BENCH_REQUIRE_RESULTS=1 python3 -m jupyter nbconvert --to notebook --execute docs/benchmarks.ipynb \
	  --output-dir build --output benchmarks.ipynb

# Regenerates what the chapters and the README do not type by hand: results tables
# (<!-- results:... -->), numbers in prose (<!-- value:... -->) and code excerpts
# (<!-- code:... -->, from the stages' // excerpt: markers). docs-check fails when one is
# stale, and when the diagrams were drawn from other kernel constants.
docs:
	@python3 bench/tables.py $(if $(RESULTS),--results $(RESULTS)/results.csv)

docs-check:
	@python3 bench/tables.py --check $(if $(RESULTS),--results $(RESULTS)/results.csv)
	@python3 bench/check_forward_copy.py 06_pipelined 07_backward
	@python3 bench/check_forward_copy.py 10_pingpong 11_hopper_backward
	@python3 docs/diagrams/draw.py --check
	@python3 common/wgmma.py --check

# Redraws the chapters' diagrams (docs/diagrams/*.png) from the kernels' constants.
diagrams:
	@$(PYTHON_PACKAGES)
	@python3 docs/diagrams/draw.py

sanitize: all
	@for stage in $(STAGES); do $(MAKE) --no-print-directory -C $$stage sanitize || exit 1; done

# make profile STAGE=04
profile:
	@test -n "$(STAGE)" || { echo "usage: make profile STAGE=04" >&2; exit 2; }
	@$(MAKE) --no-print-directory -C $(firstword $(wildcard $(STAGE)_*/) $(wildcard $(STAGE)/)) profile

# make diff A=03 B=04: what one stage adds to the previous one.
diff:
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make diff A=03 B=04" >&2; exit 2; }
	@git --no-pager diff --no-index --color=auto $(wildcard $(A)_*/attention.cu) $(wildcard $(B)_*/attention.cu) || true

clean:
	rm -rf build
