# Every build rule of a stage. A stage's Makefile sets a few variables, then includes this:
#   DTYPE       fp32 | bf16                 (element type of q, k, v, o)
#   BACKWARD    1 when the stage defines attention_backward
#   HOPPER      1 when the stage's kernels use sm_90a instructions (wgmma, setmaxnreg): its
#               attention.cu is built for sm_90a alone, and any ptxas warning (or ptxas's
#               "Potential Performance Loss" note, C7520: serialized wgmma) fails the build
#               (a serialized wgmma or an ignored setmaxnreg would silently cost the speed)
#   NVCC_EXTRA  extra nvcc flags of the stage (optional)
#   SOURCE      the launcher's file (default: attention.cu beside the Makefile)
#   STAGE       the name in reports (default: the folder's name)
# Outputs go to build/<STAGE>/ at the repository root: test_<STAGE>, bench_<STAGE>, build.log.

ROOT      := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)
COMMON    := $(ROOT)/common
STAGE_DIR := $(CURDIR)
STAGE     ?= $(notdir $(STAGE_DIR))
SOURCE    ?= $(STAGE_DIR)/attention.cu
DTYPE     ?= fp32
BUILD     ?= $(ROOT)/build/$(STAGE)
NVCC      ?= nvcc

include $(COMMON)/arch.mk

# The stage's own file: the Hopper stages have code for sm_90a only (wgmma and setmaxnreg exist
# in no other target); the shared harness keeps ARCH_FLAGS, so it runs on any GPU.
ifeq ($(HOPPER),1)
  STAGE_ARCH_FLAGS := -gencode arch=compute_90a,code=sm_90a
else
  STAGE_ARCH_FLAGS := $(ARCH_FLAGS)
endif

DEFINES := -DATTENTION_STAGE_NAME='"$(STAGE)"'
ifeq ($(DTYPE),bf16)
  DEFINES += -DATTENTION_DTYPE_BF16
endif
ifeq ($(BACKWARD),1)
  DEFINES += -DATTENTION_HAS_BACKWARD
endif

DOCTEST_DIR := $(firstword $(wildcard $(DOCTEST_INCLUDE) /usr/include $(ROOT)/.deps))
DOCTEST_H   := $(wildcard $(DOCTEST_DIR)/doctest/doctest.h)

BASE_FLAGS := -std=c++17 -O3 -lineinfo -I$(COMMON) $(DEFINES) \
              -Xcompiler -Wall,-Wextra -Xcudafe --display_error_number $(NVCC_EXTRA)
NVCCFLAGS  := $(BASE_FLAGS) $(ARCH_FLAGS)
LDLIBS    := -lcublas

COMMON_SOURCES := $(COMMON)/shape.cpp $(COMMON)/validate.cpp $(COMMON)/harness.cpp $(COMMON)/reference.cpp \
                  $(wildcard $(COMMON)/reference_backward.cpp) $(COMMON)/cuda_check.cpp \
                  $(COMMON)/workspace.cpp
TEST_SOURCES   := $(COMMON)/test_main.cpp $(COMMON)/test_host.cpp $(COMMON)/test_forward.cpp \
                  $(if $(filter 1,$(BACKWARD)),$(COMMON)/test_backward.cpp) \
                  $(wildcard $(STAGE_DIR)/test_*.cu)
BENCH_SOURCES  := $(COMMON)/bench.cpp $(COMMON)/ceilings.cu

obj = $(BUILD)/obj/$(basename $(notdir $(1))).o
COMMON_OBJECTS := $(foreach s,$(COMMON_SOURCES),$(call obj,$(s)))
TEST_OBJECTS   := $(foreach s,$(TEST_SOURCES),$(call obj,$(s)))
BENCH_OBJECTS  := $(foreach s,$(BENCH_SOURCES),$(call obj,$(s)))
STAGE_OBJECT   := $(BUILD)/obj/attention.o

TEST_BIN  := $(BUILD)/test_$(STAGE)
BENCH_BIN := $(BUILD)/bench_$(STAGE)

.PHONY: all test bench sanitize profile clean check-nvcc check-doctest
.DEFAULT_GOAL := all

all: $(TEST_BIN) $(BENCH_BIN)

check-nvcc:
	@command -v $(NVCC) >/dev/null || { echo "error: nvcc not found. Install the CUDA Toolkit (https://developer.nvidia.com/cuda-downloads) and put its bin/ on PATH." >&2; exit 1; }

check-doctest:
	@test -n "$(DOCTEST_H)" || { echo "error: Doctest not found. Install it with: sudo apt-get install doctest-dev   (or set DOCTEST_INCLUDE=/path/with/doctest/)" >&2; exit 1; }

# The stage's kernels: keep the -Xptxas -v register/spill report in build.log.
$(STAGE_OBJECT): $(SOURCE) $(wildcard $(COMMON)/*.h $(COMMON)/*.cuh) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<) -> $@ (ptxas report in $(BUILD)/build.log)"
	@$(NVCC) $(BASE_FLAGS) $(STAGE_ARCH_FLAGS) -Xptxas -v -c $< -o $@ > $(BUILD)/build.log 2>&1; status=$$?; \
	  grep -E "error|warning|Performance Loss" $(BUILD)/build.log | grep -v "^ptxas info *: Used\|^ptxas info *: Compil\|^ptxas info *: Function" >&2; \
	  if [ $$status -ne 0 ]; then cat $(BUILD)/build.log >&2; exit $$status; fi; \
	  if [ "$(HOPPER)" = 1 ] && grep -qE "warning|Performance Loss" $(BUILD)/build.log; then rm -f $@; \
	    echo "error: $(STAGE): a warning in the Hopper build (see above; a serialized wgmma or an ignored setmaxnreg makes the kernel slow)" >&2; exit 1; fi

$(BUILD)/obj/test_%.o: $(STAGE_DIR)/test_%.cu $(wildcard $(COMMON)/*.h) | check-nvcc check-doctest
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<)"
	@$(NVCC) $(NVCCFLAGS) -I$(DOCTEST_DIR) -c $< -o $@

$(BUILD)/obj/test_%.o: $(COMMON)/test_%.cpp $(wildcard $(COMMON)/*.h) | check-nvcc check-doctest
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<)"
	@$(NVCC) $(NVCCFLAGS) -I$(DOCTEST_DIR) -x cu -c $< -o $@

$(BUILD)/obj/%.o: $(COMMON)/%.cpp $(wildcard $(COMMON)/*.h) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<)"
	@$(NVCC) $(NVCCFLAGS) -x cu -c $< -o $@

$(BUILD)/obj/%.o: $(COMMON)/%.cu $(wildcard $(COMMON)/*.h) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<)"
	@$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(TEST_BIN): $(TEST_OBJECTS) $(STAGE_OBJECT) $(COMMON_OBJECTS)
	@$(NVCC) $(NVCCFLAGS) $^ -o $@ $(LDLIBS)

$(BENCH_BIN): $(BENCH_OBJECTS) $(STAGE_OBJECT) $(COMMON_OBJECTS)
	@$(NVCC) $(NVCCFLAGS) $^ -o $@ $(LDLIBS)

# Runs the suite; its listener writes the one-line summary that the top-level `make test` sums.
test: $(TEST_BIN)
	@rm -f $(BUILD)/test-summary.txt
	@TEST_SUMMARY_FILE=$(BUILD)/test-summary.txt $(TEST_BIN) $(TEST_ARGS)

# One shape or a named sweep: make bench SWEEP=seqlen, or BENCH_ARGS="--shape 1,8,4096,8192,128".
SWEEP ?= $(if $(filter bf16,$(DTYPE)),bf16-headline,fp32-headline)
bench: $(BENCH_BIN)
	@$(BENCH_BIN) --sweep $(SWEEP) $(BENCH_ARGS)

# compute-sanitizer over the GPU cases tagged for it (small edge shapes). A stage may narrow
# the cases one tool runs (SANITIZE_CASES_<tool>), saying why in its Makefile.
SANITIZE_TOOLS ?= memcheck racecheck synccheck initcheck
SANITIZE_CASES_memcheck  ?= sanitize*
SANITIZE_CASES_racecheck ?= sanitize*
SANITIZE_CASES_synccheck ?= sanitize*
SANITIZE_CASES_initcheck ?= sanitize*
sanitize: $(TEST_BIN)
	@for tool in $(SANITIZE_TOOLS); do \
	  extra=""; [ $$tool = memcheck ] && extra="--leak-check full"; \
	  case $$tool in memcheck) cases='$(SANITIZE_CASES_memcheck)';; racecheck) cases='$(SANITIZE_CASES_racecheck)';; \
	    synccheck) cases='$(SANITIZE_CASES_synccheck)';; *) cases='$(SANITIZE_CASES_initcheck)';; esac; \
	  echo "== compute-sanitizer --tool $$tool $$extra: $(STAGE) ($$cases)"; \
	  compute-sanitizer --tool $$tool $$extra --error-exitcode 1 \
	    $(TEST_BIN) --test-case="$$cases" || exit 1; \
	done

# Nsight Compute over the first NCU_COUNT kernels of the headline shape (or BENCH_ARGS);
# KERNEL=regex narrows it to one kernel. The report lands in build/<STAGE>/profile.ncu-rep.
NCU_ARGS  ?= --set full --clock-control none --import-source yes
NCU_COUNT ?= 4
profile: $(BENCH_BIN)
	ncu $(NCU_ARGS) $(if $(KERNEL),-k regex:$(KERNEL)) -c $(NCU_COUNT) -f -o $(BUILD)/profile \
	  $(BENCH_BIN) $(if $(BENCH_ARGS),$(BENCH_ARGS),--sweep $(SWEEP)) --profile

clean:
	rm -rf $(BUILD)
