# The TCPStore load generator (bench/store_load.h): a library used by
# store_bootstrap_bench and by the integration tests, so it is defined by
# whichever of bench/ and tests/ is configured first.
if(NOT TARGET ddprun_store_load)
  add_library(ddprun_store_load STATIC ${CMAKE_CURRENT_LIST_DIR}/store_load.cc)
  target_include_directories(ddprun_store_load PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(ddprun_store_load PUBLIC ddprun_c10d_wire absl::statusor absl::strings)
endif()
