# The whole product for `cmake --install` and the Debian package (`make deb`,
# CPack; docs/install.md). Included last by the top CMakeLists.txt. The SDK's
# own rules (library, headers, CMake package, ddprun.pc, Python modules) are
# in worker_sdk/CMakeLists.txt; these add the commands and what a system
# install carries around them.
include(GNUInstallDirs)

# bin/ddprun finds the gRPC module at ../lib/libddprun_grpc.so (agent/src/
# grpc_module.cc), so it goes to lib/ itself, not the multiarch LIBDIR.
install(TARGETS ddprun ddprund RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ddprun_grpc LIBRARY DESTINATION lib)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/worker_sdk/python/ddprun
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/ddprun/python FILES_MATCHING PATTERN "*.py")

# Generated from the commands themselves: man pages (help2man, from --help and
# --version) and shell completion (`ddprun completion bash|zsh`).
set(_gen ${CMAKE_BINARY_DIR}/packaging)
set(_gen_files ${_gen}/ddprun.bash ${_gen}/_ddprun)
add_custom_command(OUTPUT ${_gen}/ddprun.bash ${_gen}/_ddprun
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_gen}
  COMMAND $<TARGET_FILE:ddprun> completion bash > ${_gen}/ddprun.bash
  COMMAND $<TARGET_FILE:ddprun> completion zsh > ${_gen}/_ddprun
  DEPENDS ddprun COMMENT "ddprun completion bash|zsh")
find_program(DDPRUN_HELP2MAN help2man)
if(DDPRUN_HELP2MAN)
  add_custom_command(OUTPUT ${_gen}/ddprun.1 ${_gen}/ddprund.1
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_gen}
    COMMAND ${DDPRUN_HELP2MAN} --no-info --no-discard-stderr
            --name "elastic torchrun-style launcher" -o ${_gen}/ddprun.1 $<TARGET_FILE:ddprun>
    COMMAND ${DDPRUN_HELP2MAN} --no-info --no-discard-stderr
            --name "ddprun rendezvous daemon" -o ${_gen}/ddprund.1 $<TARGET_FILE:ddprund>
    DEPENDS ddprun ddprund ddprun_grpc COMMENT "help2man ddprun ddprund")
  list(APPEND _gen_files ${_gen}/ddprun.1 ${_gen}/ddprund.1)
  install(FILES ${_gen}/ddprun.1 ${_gen}/ddprund.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "help2man not found: no man pages (scripts/install-deps.sh installs it)")
endif()
add_custom_target(ddprun_package_files ALL DEPENDS ${_gen_files})
install(FILES ${_gen}/ddprun.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME ddprun)
install(FILES ${_gen}/_ddprun DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions)
install(FILES ${CMAKE_SOURCE_DIR}/docs/install.md ${CMAKE_SOURCE_DIR}/docs/cli.md
        ${CMAKE_SOURCE_DIR}/docs/config.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# ddprund as a service: only for a system install (prefix /usr), where the
# unit's /usr/bin/ddprund is right.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  install(FILES ${CMAKE_SOURCE_DIR}/scripts/packaging/ddprund.service
          DESTINATION /lib/systemd/system)
  install(FILES ${CMAKE_SOURCE_DIR}/configs/ddprund.yaml DESTINATION /etc/ddprun)
endif()

# CPack: `cpack -G DEB` in the build tree (make deb) -> ddprun_<version>_amd64.deb.
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${DDPRUN_VERSION_STRING})
set(CPACK_PACKAGE_VENDOR "ddprun")
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "elastic torchrun-style launcher, rendezvous daemon and worker SDK")
# The install rules run under DESTDIR with the configured prefix (make deb
# configures /usr), so that /etc/ddprun and the unit land where they say.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
# Depends: what dpkg-shlibdeps finds the ELFs need at run time (libgrpc++,
# libprotobuf, ...), nothing of the build (no -dev, no compiler); python3 for
# Python workers is a recommendation.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The package carries stripped ELFs (the build tree keeps its debug info).
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_SOURCE_DIR}/scripts/packaging/conffiles)
include(CPack)
