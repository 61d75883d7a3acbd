# What a make command needs, checked (and where possible set up) before anything is built.
# Included by the top-level Makefile and by common/stage.mk once ROOT is set; the includer lists
# its goals that need each thing:
#   DOCTEST_GOALS  Doctest's header: from DOCTEST_INCLUDE, else the system's, else fetched into
#                  .deps/doctest/include by common/fetch_doctest.sh (DOCTEST_URL, DOCTEST_APT)
#   GPU_GOALS      an NVIDIA GPU (common/require.sh gpu)
#   NCU_GOALS, SANITIZER_GOALS   ncu, compute-sanitizer
#   NVCC_GOALS     nvcc (the CUDA Toolkit), and an ARCH of compute capability 8.0 or newer
#                  (common/require.sh arch: native checks the visible GPU)
#   bench          SWEEP and BENCH_SWEEPS name sweeps of bench/sweeps.txt
#   PYTHON_GOALS   a Python with bench/requirements.txt (for the notebook; the figures need only
#                  matplotlib and numpy): PYTHON_ENV (common/python_env.sh makes .deps/venv on first use)
# A goal whose need cannot be met stops make at once with one line: what is missing, what to do.

DEPS_DIR               ?= $(ROOT)/.deps
DOCTEST_SYSTEM_INCLUDE ?= /usr/include
DOCTEST_DEPS_INCLUDE   := $(DEPS_DIR)/doctest/include
# A relative DOCTEST_INCLUDE is taken from the repository root, whichever folder make runs in.
DOCTEST_INCLUDE_DIR := $(if $(DOCTEST_INCLUDE),$(if $(filter /%,$(DOCTEST_INCLUDE)),$(DOCTEST_INCLUDE),$(abspath $(ROOT)/$(DOCTEST_INCLUDE))))
DOCTEST_DIR := $(or $(DOCTEST_INCLUDE_DIR),$(if $(wildcard $(DOCTEST_SYSTEM_INCLUDE)/doctest/doctest.h),$(DOCTEST_SYSTEM_INCLUDE),$(DOCTEST_DEPS_INCLUDE)))
NCU               ?= ncu
COMPUTE_SANITIZER ?= compute-sanitizer
NVIDIA_SMI        ?= nvidia-smi
NVCC              ?= nvcc

DEPS_GOALS := $(or $(MAKECMDGOALS),all)
comma := ,
deps_wanted = $(filter $(1),$(DEPS_GOALS))
deps_goal   = make $(firstword $(call deps_wanted,$(1)))
# A variable set on make's command line reaches $(shell) only when passed on by hand.
deps_env    = NVIDIA_SMI='$(NVIDIA_SMI)' DEPS_DIR='$(DEPS_DIR)' PYTHON='$(PYTHON)' \
              DOCTEST_URL='$(DOCTEST_URL)' DOCTEST_SHA256='$(DOCTEST_SHA256)' DOCTEST_APT='$(DOCTEST_APT)'

# make bench SWEEP=a,b (or BENCH_SWEEPS=a,b): every name must be a sweep of bench/sweeps.txt.
ifneq ($(call deps_wanted,bench),)
  deps_sweeps  := $(shell awk '!/^\#/ && NF && !seen[$$1]++ { print $$1 }' $(ROOT)/bench/sweeps.txt)
  deps_unknown := $(filter-out $(deps_sweeps),$(subst $(comma), ,$(SWEEP) $(BENCH_SWEEPS)))
  $(if $(deps_unknown),$(error make bench: no sweep named $(firstword $(deps_unknown)) in bench/sweeps.txt; the sweeps are: $(deps_sweeps) (SWEEP=name, or several: SWEEP=name,name)))
endif
ifneq ($(call deps_wanted,$(GPU_GOALS)),)
  deps_problem := $(shell $(deps_env) bash $(ROOT)/common/require.sh gpu "$(call deps_goal,$(GPU_GOALS))")
  $(if $(deps_problem),$(error $(deps_problem)))
endif
# deps_require_tool GOALS_VARIABLE,TOOL: stop with require.sh's line when a goal needs TOOL.
define deps_require_tool
ifneq ($$(call deps_wanted,$$($(1))),)
  deps_problem := $$(shell bash $$(ROOT)/common/require.sh tool "$$(call deps_goal,$$($(1)))" '$(2)')
  $$(if $$(deps_problem),$$(error $$(deps_problem)))
endif
endef
$(eval $(call deps_require_tool,SANITIZER_GOALS,$(COMPUTE_SANITIZER)))
$(eval $(call deps_require_tool,NCU_GOALS,$(NCU)))
$(eval $(call deps_require_tool,NVCC_GOALS,$(NVCC)))
ifneq ($(call deps_wanted,$(NVCC_GOALS)),)
  deps_problem := $(shell $(deps_env) bash $(ROOT)/common/require.sh arch "$(call deps_goal,$(NVCC_GOALS))" '$(ARCH)')
  $(if $(deps_problem),$(error $(deps_problem)))
endif
ifneq ($(call deps_wanted,$(DOCTEST_GOALS)),)
  deps_problem := $(shell $(deps_env) bash $(ROOT)/common/fetch_doctest.sh '$(DOCTEST_DIR)' '$(DOCTEST_DEPS_INCLUDE)')
  $(if $(filter-out 0,$(.SHELLSTATUS)),$(error $(deps_problem)))
endif
ifneq ($(call deps_wanted,$(PYTHON_GOALS)),)
  PYTHON_ENV := $(shell $(deps_env) bash $(ROOT)/common/python_env.sh $(if $(call deps_wanted,notebook),all,plots))
  $(if $(filter-out 0,$(.SHELLSTATUS)),$(error $(PYTHON_ENV)))
endif
