# The chaos run (bench/chaos/chaos.py, docs/chaos.md) in its CI form, label
# `chaos` (in `make test`, which runs every label; alone: ctest -L chaos).
# About 2.5 minutes on 2 busy cores. Included from tests/CMakeLists.txt: it
# needs ddprun, ddprund, the gRPC module and the SDK trainer fixture.
if(NOT TARGET ddprun_worker_sdk)
  return()
endif()
add_executable(chaos_sdk_trainer ${CMAKE_SOURCE_DIR}/tests/fixtures/chaos_sdk_trainer.cc)
target_link_libraries(chaos_sdk_trainer PRIVATE ddprun_worker_sdk)

find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(_chaos ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/chaos.py --build ${CMAKE_BINARY_DIR})

# A custom target so that building the tests builds what the chaos tests run.
add_custom_target(chaos_deps ALL DEPENDS ddprun ddprund ddprun_grpc chaos_sdk_trainer)

# Worker and agent kills (5 each, seeded) on the SDK trainer: every step
# survives and the final weights equal a run without faults.
add_test(NAME chaos_sdk COMMAND ${_chaos} --trainer sdk --seed 29 --faults 10
  --kinds worker,agent --spare 0 --duration 8 --step_ms 50 --stall_timeout 60)
# The PyTorch DDP trainer: one worker and one agent kill.
add_test(NAME chaos_torch COMMAND ${_chaos} --trainer torch --seed 29 --faults 2
  --kinds worker,agent --spare 0 --duration 8 --step_ms 50 --stall_timeout 90)
# The same under --restart_policy=inplace: the survivors re-form in their
# processes (chaos_ddp.py runs its training function in ddprun.inprocess.run).
add_test(NAME chaos_torch_inplace COMMAND ${_chaos} --trainer torch --seed 29 --faults 2
  --kinds worker,agent --spare 0 --duration 8 --step_ms 50 --stall_timeout 90
  --restart_policy inplace)
# Under inplace with a hot spare: the node that becomes the spare stops the
# survivors it kept (they have no seat); the tool fails a run in which a rank
# runs in two processes once the job trains again (docs/chaos.md, Findings).
add_test(NAME chaos_torch_inplace_spare COMMAND ${_chaos} --trainer torch --seed 29 --faults 1
  --kinds worker --spare 1 --duration 20 --step_ms 50 --stall_timeout 90
  --restart_policy inplace)
# The tool fails when the parameters differ: one corrupted step in the run
# with faults must exit 1 and name the tensor.
add_test(NAME chaos_detects_a_difference COMMAND sh -c
  "\"$0\" \"$@\"; echo \"chaos exit status $?\"" ${_chaos} --trainer sdk --seed 29
  --faults 1 --kinds worker --spare 0 --duration 4 --step_ms 50 --corrupt_step 40
  --stall_timeout 60)
set_tests_properties(chaos_detects_a_difference PROPERTIES PASS_REGULAR_EXPRESSION
  "final parameters: DIFFER: rank 0 tensor 'weights' \\(float32 \\[4096\\]\\) differs at element 0(.|\n)*chaos exit status 1")
set_tests_properties(chaos_sdk chaos_torch chaos_torch_inplace chaos_torch_inplace_spare
  chaos_detects_a_difference
  PROPERTIES
  LABELS chaos TIMEOUT 300 RUN_SERIAL TRUE)

# With HA: 3 ddprund replicas on a 3-member etcd; 2 replica kills among 6
# faults. Registered only where etcd is installed (scripts/install-deps.sh).
find_program(_chaos_etcd etcd PATHS /usr/bin)
if(_chaos_etcd)
  add_test(NAME chaos_sdk_ha COMMAND ${_chaos} --trainer sdk --seed 29 --faults 6 --ha
    --kinds worker,agent,replica --spare 0 --duration 8 --step_ms 50 --stall_timeout 60)
  set_tests_properties(chaos_sdk_ha PROPERTIES LABELS chaos TIMEOUT 300 RUN_SERIAL TRUE)
endif()

# With a hot spare (a defect found by this run, fixed): a node whose worker
# failed becomes the spare and keeps its old snapshots; promoted back into its
# former seat later, its agent restores the seat's newer peer replica
# (agent/src/replica_exchange.cc) instead of resuming from that stale memory,
# which lost 735 steps before the fix (docs/chaos.md, "Findings").
add_test(NAME chaos_sdk_spare COMMAND ${_chaos} --trainer sdk --seed 5 --faults 16
  --kinds worker,agent --spare 1 --duration 20 --step_ms 50 --stall_timeout 60)
set_tests_properties(chaos_sdk_spare PROPERTIES LABELS chaos TIMEOUT 300 RUN_SERIAL TRUE)

# The tool's own logic without processes: seeded schedule, steps lost vs the
# replica's lag, the first differing tensor named.
add_test(NAME chaos_selftest COMMAND ${Python3_EXECUTABLE}
  ${CMAKE_CURRENT_LIST_DIR}/chaos_selftest.py)
set_tests_properties(chaos_selftest PROPERTIES LABELS unit TIMEOUT 60)
