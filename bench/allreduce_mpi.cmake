# allreduce_mpi: OpenMPI's MPI_Allreduce, the same sizes as `allreduce_bench
# allreduce`, run by bench/allreduce_bench.sh with mpirun (included by
# bench/CMakeLists.txt; tests/install/bench_mpi_optional_test.sh configures it
# alone with a wrapper that has no headers). Built only where MPI's C wrapper
# compiles `#include <mpi.h>` (scripts/install-deps.sh --bench); otherwise one
# configure line says why and nothing else changes. The wrapper is tried
# before FindMPI: openmpi-bin alone brings mpicc without mpi.h
# (libopenmpi-dev), and FindMPI then fails the whole configure on the
# wrapper's include directory that does not exist.
if(MPI_C_COMPILER)
  set(_ddprun_mpicc ${MPI_C_COMPILER})
else()
  find_program(DDPRUN_MPICC NAMES mpicc)
  set(_ddprun_mpicc ${DDPRUN_MPICC})
endif()
if(NOT _ddprun_mpicc)
  message(STATUS "allreduce_mpi (bench/) not built: no mpicc; "
    "scripts/install-deps.sh --bench installs OpenMPI")
else()
  set(_probe ${CMAKE_CURRENT_BINARY_DIR}/mpi_h_probe.c)
  file(WRITE ${_probe} "#include <mpi.h>\nint main(void) { return MPI_SUCCESS; }\n")
  execute_process(COMMAND ${_ddprun_mpicc} -E ${_probe}
    RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT _probe_rc EQUAL 0)
    message(STATUS "allreduce_mpi (bench/) not built: ${_ddprun_mpicc} cannot compile "
      "#include <mpi.h> (MPI's headers are missing); "
      "scripts/install-deps.sh --bench installs libopenmpi-dev")
  else()
    set(MPI_C_COMPILER ${_ddprun_mpicc} CACHE FILEPATH "MPI's C compiler wrapper")
    find_package(MPI QUIET COMPONENTS C)
    if(MPI_C_FOUND)
      add_executable(allreduce_mpi ${CMAKE_CURRENT_LIST_DIR}/allreduce_mpi.c)
      target_link_libraries(allreduce_mpi PRIVATE MPI::MPI_C)
    else()
      message(STATUS "allreduce_mpi (bench/) not built: CMake's FindMPI found no usable MPI "
        "for C with ${_ddprun_mpicc}")
    endif()
  endif()
endif()
