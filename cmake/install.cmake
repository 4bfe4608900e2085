# What `cmake --install BUILD --prefix P` puts in P, all in the component "kiln":
#   include/kiln/*.h                       the public headers
#   lib/libkiln.so                         the library
#   lib/cmake/kiln/kilnConfig.cmake ...    find_package(kiln) -> target kiln::kiln
#   lib/pkgconfig/kiln.pc                  pkg-config --cflags --libs kiln
#   bin/onnx-run, kiln-generate, kiln-bench
# libkiln is a shared library, so its private dependencies (protobuf, the ONNX schema) stay
# inside it; only oneTBB and Threads are in its public link interface, and kilnConfig finds
# them again with find_dependency. The tree is relocatable: nothing in it names the prefix.
include(CMakePackageConfigHelpers)

set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

install(TARGETS kiln EXPORT kilnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kiln)
install(DIRECTORY engine/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT kiln
        FILES_MATCHING PATTERN "*.h")

if(KILN_BUILD_TOOLS)
  set(KILN_INSTALLED_TOOLS onnx-run kiln-generate kiln-transcribe kiln-bench)
  # Installed tools find the installed libkiln beside them, wherever the tree is moved.
  file(RELATIVE_PATH KILN_BIN_TO_LIB /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})
  set_target_properties(${KILN_INSTALLED_TOOLS} PROPERTIES INSTALL_RPATH "$ORIGIN/${KILN_BIN_TO_LIB}")
  install(TARGETS ${KILN_INSTALLED_TOOLS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kiln)
endif()

install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR} COMPONENT kiln)
configure_package_config_file(cmake/kilnConfig.cmake.in ${PROJECT_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# 0.x releases: a new minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR} COMPONENT kiln)

# kiln.pc finds the prefix from its own place (${pcfiledir}), so the tree can be moved.
file(RELATIVE_PATH KILN_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" KILN_PC_TO_PREFIX "${KILN_PC_TO_PREFIX}")
configure_file(cmake/kiln.pc.in ${PROJECT_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT kiln)
