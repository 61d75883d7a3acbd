#!/bin/bash
# deferred-publish, call 5 (main at fb5936d, unchanged): a second make bench of the same commit on another H100, detached.
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > $OUT/gpu.txt
bash .deps/devscripts/benchd.sh start fb5936d 560
