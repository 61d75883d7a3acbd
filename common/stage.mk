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
# Outputs go to build/<STAGE>/ at the repository root: test_<STAGE>, bench_<STAGE>,
# libattention_<STAGE>.so (the C ABI of common/attention_c.h), build.log, obj/attention.o; the
# objects the suites share go to build/common/<ARCH>/.

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

# The stage's own defines. ATTENTION_STAGE_NAME reaches the shared objects only through the tiny
# per-suite stage_name.o (common/stage_name.h).
VARIANT_DEFINES = $(if $(findstring bf16,$(1)),-DATTENTION_DTYPE_BF16) $(if $(findstring backward,$(1)),-DATTENTION_HAS_BACKWARD)
DTYPE_VARIANT := $(DTYPE)
FULL_VARIANT  := $(DTYPE)$(if $(filter 1,$(BACKWARD)),-backward)
DEFINES := -DATTENTION_STAGE_NAME='"$(STAGE)"' $(call VARIANT_DEFINES,$(FULL_VARIANT))

# Checked before anything is built (common/deps.mk): a goal stops at once, in one line, when
# what it needs is missing; Doctest is fetched into .deps/ when the system has none.
DOCTEST_GOALS   := all test sanitize common-objects
GPU_GOALS       := bench sanitize profile
SANITIZER_GOALS := sanitize
NCU_GOALS       := profile
NVCC_GOALS      := all test bench sanitize profile common-objects common-bench-objects
include $(COMMON)/deps.mk

# Every object is position independent: the test and benchmark binaries and the shared library
# link the same objects, so that no stage's attention.cu is compiled twice.
PIC_FLAGS  := -Xcompiler -fPIC
BASE_FLAGS := -std=c++17 -O3 -lineinfo -I$(COMMON) $(PIC_FLAGS) \
              -Xcompiler -Wall,-Wextra -Xcudafe --display_error_number $(NVCC_EXTRA)
NVCCFLAGS  := $(BASE_FLAGS) $(DEFINES) $(ARCH_FLAGS)
LDLIBS    := -lcublas

# The shared harness, test and benchmark sources are compiled once per variant they depend on,
# into build/common/<ARCH>/ (element type and backward: <dtype>[-backward]/), and linked by
# every suite of that variant. The top-level Makefile builds them suite by suite before the
# suites build side by side, so no two makes ever write the same object. With NVCC_EXTRA the
# flags are the stage's own, and so are the objects (in its build folder).
empty :=
ARCH_TAG     := $(subst $(empty) $(empty),-,$(strip $(ARCH)))
COMMON_BUILD := $(if $(strip $(NVCC_EXTRA)),$(BUILD)/obj/common,$(ROOT)/build/common/$(ARCH_TAG))
COMMON_HEADERS := $(wildcard $(COMMON)/*.h)
# Every object also depends on the rules that build it, so that a change of flags (such as the
# -fPIC the C ABI library needs) rebuilds what an older build/ holds.
RULES := $(COMMON)/stage.mk $(COMMON)/arch.mk

# Depend on nothing the stage defines (the architecture only).
HARNESS_OBJECTS := $(addprefix $(COMMON_BUILD)/,shape.o validate.o harness.o reference.o \
                   $(if $(wildcard $(COMMON)/reference_backward.cpp),reference_backward.o) cuda_check.o workspace.o)
# Depend on the element type; on the element type and the backward pass.
TEST_OBJECTS  := $(addprefix $(COMMON_BUILD)/$(DTYPE_VARIANT)/,test_main.o test_forward.o) \
                 $(addprefix $(COMMON_BUILD)/$(FULL_VARIANT)/,test_host.o $(if $(filter 1,$(BACKWARD)),test_backward.o)) \
                 $(patsubst $(STAGE_DIR)/%.cu,$(BUILD)/obj/%.o,$(wildcard $(STAGE_DIR)/test_*.cu))
BENCH_OBJECTS := $(COMMON_BUILD)/$(FULL_VARIANT)/bench.o $(COMMON_BUILD)/ceilings.o
STAGE_OBJECT  := $(BUILD)/obj/attention.o
NAME_OBJECT   := $(BUILD)/obj/stage_name.o
# The C ABI (common/attention_c.h) depends on the element type and the backward pass.
C_API_OBJECT  := $(COMMON_BUILD)/$(FULL_VARIANT)/c_api.o
# The library needs the launcher and what it calls, not the FP64 reference.
LIB_OBJECTS   := $(STAGE_OBJECT) $(NAME_OBJECT) $(C_API_OBJECT) \
                 $(filter-out %/reference.o %/reference_backward.o,$(HARNESS_OBJECTS))

TEST_BIN  := $(BUILD)/test_$(STAGE)
BENCH_BIN := $(BUILD)/bench_$(STAGE)
LIB       := $(BUILD)/libattention_$(STAGE).so

.PHONY: all test bench sanitize profile clean check-nvcc common-objects common-bench-objects
.DEFAULT_GOAL := all

all: $(TEST_BIN) $(BENCH_BIN) $(LIB)

# What the suite shares with the other suites of its variant (built first by the top level).
common-objects: $(HARNESS_OBJECTS) $(TEST_OBJECTS) $(BENCH_OBJECTS) $(C_API_OBJECT)
common-bench-objects: $(HARNESS_OBJECTS) $(BENCH_OBJECTS) $(C_API_OBJECT)

check-nvcc:
	@command -v $(NVCC) >/dev/null || { echo "error: nvcc not found. Install the CUDA Toolkit (https://developer.nvidia.com/cuda-downloads) and put its bin/ on PATH." >&2; exit 1; }

# The stage's kernels: keep the -Xptxas -v register/spill report in build.log.
$(STAGE_OBJECT): $(SOURCE) $(wildcard $(COMMON)/*.h $(COMMON)/*.cuh) $(RULES) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<) -> $@ (ptxas report in $(BUILD)/build.log)"
	@$(NVCC) $(BASE_FLAGS) $(DEFINES) $(STAGE_ARCH_FLAGS) -Xptxas -v -c $< -o $@ > $(BUILD)/build.log 2>&1; status=$$?; \
	  grep -E "error|warning|Performance Loss" $(BUILD)/build.log | grep -v "^ptxas info *: Used\|^ptxas info *: Compil\|^ptxas info *: Function" >&2; \
	  if [ $$status -ne 0 ]; then cat $(BUILD)/build.log >&2; exit $$status; fi; \
	  if [ "$(HOPPER)" = 1 ] && grep -qE "warning|Performance Loss" $(BUILD)/build.log; then rm -f $@; \
	    echo "error: $(STAGE): a warning in the Hopper build (see above; a serialized wgmma or an ignored setmaxnreg makes the kernel slow)" >&2; exit 1; fi

# Host code only: the suite's name for the shared objects.
$(NAME_OBJECT): $(COMMON)/stage_name.cpp $(COMMON)/stage_name.h $(RULES) | check-nvcc
	@mkdir -p $(dir $@)
	@$(NVCC) -std=c++17 -I$(COMMON) $(PIC_FLAGS) -DATTENTION_STAGE_NAME='"$(STAGE)"' -c $< -o $@

$(BUILD)/obj/test_%.o: $(STAGE_DIR)/test_%.cu $(COMMON_HEADERS) $(RULES) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<)"
	@$(NVCC) $(NVCCFLAGS) -I$(DOCTEST_DIR) -c $< -o $@

$(COMMON_BUILD)/%.o: $(COMMON)/%.cpp $(COMMON_HEADERS) $(RULES) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<) -> $(subst $(ROOT)/,,$@)"
	@$(NVCC) $(BASE_FLAGS) $(ARCH_FLAGS) -x cu -c $< -o $@

$(COMMON_BUILD)/%.o: $(COMMON)/%.cu $(COMMON_HEADERS) $(wildcard $(COMMON)/*.cuh) $(RULES) | check-nvcc
	@mkdir -p $(dir $@)
	@echo "nvcc $(notdir $<) -> $(subst $(ROOT)/,,$@)"
	@$(NVCC) $(BASE_FLAGS) $(ARCH_FLAGS) -c $< -o $@

# One rule per variant folder: the same sources, with the variant's defines.
define VARIANT_RULE
$(COMMON_BUILD)/$(1)/%.o: $(COMMON)/%.cpp $(COMMON_HEADERS) $(RULES) | check-nvcc
	@mkdir -p $$(dir $$@)
	@echo "nvcc $$(notdir $$<) -> $$(subst $(ROOT)/,,$$@)"
	@$(NVCC) $(BASE_FLAGS) $(call VARIANT_DEFINES,$(1)) $(ARCH_FLAGS) -I$(DOCTEST_DIR) -x cu -c $$< -o $$@
endef
$(foreach variant,$(sort $(DTYPE_VARIANT) $(FULL_VARIANT)),$(eval $(call VARIANT_RULE,$(variant))))

$(TEST_BIN): $(TEST_OBJECTS) $(C_API_OBJECT) $(STAGE_OBJECT) $(NAME_OBJECT) $(HARNESS_OBJECTS)
	@$(NVCC) $(NVCCFLAGS) $^ -o $@ $(LDLIBS)

$(BENCH_BIN): $(BENCH_OBJECTS) $(STAGE_OBJECT) $(NAME_OBJECT) $(HARNESS_OBJECTS)
	@$(NVCC) $(NVCCFLAGS) $^ -o $@ $(LDLIBS)

# The stage's C ABI, for ctypes (common/stage_abi.py), the PyTorch package and the benchmark
# driver, which load several stages' libraries into one process. Every stage defines the same
# C++ and C names, so the version script exports the attention_c_* functions alone and keeps
# everything else local (-Bsymbolic binds even those to the library's own definitions): each
# library calls its own code whatever else is loaded. The CUDA runtime is linked statically
# (nvcc's default): the library loads without a libcudart on the loader's path and beside a
# framework's own runtime of another version; device memory and streams belong to the driver
# and are shared. cuBLAS stays a shared library, needed only by the suites that call it.
# --no-undefined: a missing object fails here, not at the first dlopen.
LIB_LDFLAGS := -shared -Xlinker --version-script=$(COMMON)/attention_c.map -Xlinker -Bsymbolic \
               -Xlinker --no-undefined -Xlinker --as-needed
$(LIB): $(LIB_OBJECTS) $(COMMON)/attention_c.map
	@echo "nvcc -shared -> $(subst $(ROOT)/,,$@)"
	@$(NVCC) $(NVCCFLAGS) $(LIB_LDFLAGS) $(LIB_OBJECTS) -o $@ $(LDLIBS)

# Runs the suite; its listener writes the one-line summary that the top-level `make test` sums.
test: $(TEST_BIN)
	@rm -f $(BUILD)/test-summary.txt
	@TEST_SUMMARY_FILE=$(BUILD)/test-summary.txt $(TEST_BIN) $(TEST_ARGS)

# One shape or a named sweep: make bench SWEEP=seqlen, or BENCH_ARGS="--shape 1,8,4096,8192,128".
SWEEP ?= $(if $(filter bf16,$(DTYPE)),bf16-headline,fp32-headline)
bench: $(BENCH_BIN)
	@$(BENCH_BIN) --sweep $(SWEEP) $(BENCH_ARGS)

# compute-sanitizer over the GPU cases tagged for it: the `sanitize:` cases, small shapes that
# reach every code path (docs/sanitizers.md). Each tool runs the Doctest filter
# SANITIZE_CASES_<tool> with SANITIZE_FLAGS_<tool>; a stage narrows a tool's cases where the tool
# cannot see what its kernels write, saying why in its Makefile. common/sanitize.sh runs every
# tool (even after one fails) with --error-exitcode 1, keeps each one's output in
# build/<STAGE>/sanitize-<tool>.log and prints one line per tool, also written to
# build/<STAGE>/sanitize-summary.txt for the top-level make sanitize.
SANITIZE_TOOLS ?= memcheck racecheck synccheck initcheck
SANITIZE_CASES ?= sanitize:*
SANITIZE_CASES_memcheck  ?= $(SANITIZE_CASES)
SANITIZE_CASES_racecheck ?= $(SANITIZE_CASES)
SANITIZE_CASES_synccheck ?= $(SANITIZE_CASES)
SANITIZE_CASES_initcheck ?= $(SANITIZE_CASES)
SANITIZE_FLAGS_memcheck  ?= --leak-check full
sanitize: $(TEST_BIN)
	@COMPUTE_SANITIZER=$(COMPUTE_SANITIZER) bash $(COMMON)/sanitize.sh $(STAGE) $(TEST_BIN) $(BUILD) \
	  $(foreach tool,$(SANITIZE_TOOLS),"$(tool)|$(SANITIZE_FLAGS_$(tool))|$(SANITIZE_CASES_$(tool))")

# Nsight Compute over the first NCU_COUNT kernels of the headline shape (or BENCH_ARGS);
# KERNEL=regex narrows it to one kernel. The report lands in build/<STAGE>/profile.ncu-rep.
NCU_ARGS  ?= --set full --clock-control none --import-source yes
NCU_COUNT ?= 4
profile: $(BENCH_BIN)
	$(NCU) $(NCU_ARGS) $(if $(KERNEL),-k regex:$(KERNEL)) -c $(NCU_COUNT) -f -o $(BUILD)/profile \
	  $(BENCH_BIN) $(if $(BENCH_ARGS),$(BENCH_ARGS),--sweep $(SWEEP)) --profile

clean:
	rm -rf $(BUILD)
