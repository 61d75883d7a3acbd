#!/bin/bash
# Final check at HEAD on two H100s: stage 13's suite (the ring over stage 11's backward object), then every stage's
# make sanitize target in four parallel groups (the top-level make sanitize runs the same targets one after another),
# summed by common/sum_sanitize.sh.
S=$SECONDS
log() { echo "[$((SECONDS-S)) s] $*" | tee -a $OUT/timeline.txt; }
nvidia-smi -L | tee -a $OUT/timeline.txt; git log --oneline -1 | tee -a $OUT/timeline.txt
export NCCL_NVLS_ENABLE=0
export NCCL_HOME=$(python3 -c "from importlib import metadata as m; print(m.distribution('nvidia-nccl-cu13').locate_file('nvidia/nccl'))")
export LD_LIBRARY_PATH=$NCCL_HOME/lib
make --no-print-directory -j32 all > $OUT/build.log 2>&1; log "make all rc $?"
timeout 120 make --no-print-directory -C 13_ring_attention test > $OUT/test-13.log 2>&1; log "13 test rc $?"; grep -E "test cases|Status" $OUT/test-13.log | tail -2
G1="02_tiled 00_naive 01_fused_rowwise 04_warp_shuffle"; G2="10_pingpong 05_mma_swizzle 06_pipelined"
G3="03_online_softmax 07_backward 08_wgmma_tma 09_warp_specialized"; G4="11_hopper_backward 12_persistent"
run_group() { for s in $2; do rm -f build/$s/sanitize-summary.txt; CUDA_VISIBLE_DEVICES=$1 timeout 240 make --no-print-directory -C $s sanitize; done; }
T=$SECONDS
run_group 0 "$G1" > $OUT/san-g1.log 2>&1 & run_group 0 "$G2" > $OUT/san-g2.log 2>&1 &
run_group 1 "$G3" > $OUT/san-g3.log 2>&1 & run_group 0,1 "$G4" > $OUT/san-g4.log 2>&1 & wait
log "sanitize groups done"
bash common/sum_sanitize.sh $((SECONDS-T)) 00_naive 01_fused_rowwise 02_tiled 03_online_softmax 04_warp_shuffle 05_mma_swizzle 06_pipelined 07_backward 08_wgmma_tma 09_warp_specialized 10_pingpong 11_hopper_backward 12_persistent > $OUT/sanitize-sum.txt; log "sum rc $?"; tail -1 $OUT/sanitize-sum.txt
