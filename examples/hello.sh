#!/bin/sh
# The smallest ddprun worker: prints what ddprun told it.
#   build/bin/ddprun --nproc_per_node=4 examples/hello.sh
echo "hello from rank ${RANK}/${WORLD_SIZE} (local rank ${LOCAL_RANK}/${LOCAL_WORLD_SIZE}," \
     "node ${GROUP_RANK}/${GROUP_WORLD_SIZE}, master ${MASTER_ADDR}:${MASTER_PORT}," \
     "restart ${TORCHELASTIC_RESTART_COUNT}, pid $$)"
