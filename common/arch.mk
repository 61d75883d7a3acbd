# ARCH and ARCH_FLAGS of every nvcc build (stage.mk, bench/experiments): native where a GPU
# is visible, else a list that covers Ampere and Hopper (override: ARCH="sm_90"). Nothing older
# than sm_80 builds: common/deps.mk stops such an ARCH (or native on an older GPU) in one line.
ifeq ($(origin ARCH),undefined)
  ARCH := $(if $(shell $(or $(NVIDIA_SMI),nvidia-smi) -L 2>/dev/null | grep -q GPU && echo yes),native,sm_80 sm_90)
endif
ifeq ($(strip $(ARCH)),native)
  ARCH_FLAGS := -arch=native
else
  ARCH_FLAGS := $(foreach a,$(ARCH),-gencode arch=compute_$(subst sm_,,$(a)),code=$(a))
endif
