# `cmake --install`: bin/refit, lib/librefit.so*, lib/refit/plugins/*.so (installed by
# refit_add_plugin), the public headers, the static kernels, and the CMake package
# lib/cmake/refit/ that third-party plugins use:
#
#   find_package(refit REQUIRED)
#   refit_add_external_plugin(my_plugin SOURCES my_plugin.cc)
#   refit_add_conformance_tests(TARGET my_plugin KIND encoding)
include(CMakePackageConfigHelpers)

set(REFIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/refit")

# Exported as refit::refit, refit::headers, refit::kernels (the names the build tree aliases).
set_target_properties(refit PROPERTIES EXPORT_NAME refit)
set_target_properties(refit_headers PROPERTIES EXPORT_NAME headers)
set_target_properties(refit_kernels PROPERTIES EXPORT_NAME kernels)

# The installed CLI finds the installed librefit wherever the prefix is moved to; librefit itself
# finds its plugins next to itself (DefaultPluginDir()).
foreach(cli refit_cli refit_serve)
  if(TARGET ${cli})
    set_target_properties(${cli} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  endif()
endforeach()

install(TARGETS refit refit_headers refit_kernels
        EXPORT refitTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Public headers only: *_internal.h and the framework/src headers never leave the tree.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/framework/include/refit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN "*_internal.h" EXCLUDE)
# The C API, included as <refit.h> (the C++ umbrella is refit/refit.h).
install(FILES ${PROJECT_SOURCE_DIR}/framework/include/refit.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/kernels/include/refit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN "*.cuh" PATTERN "*_internal.h" EXCLUDE)

# The conformance suites, so a third-party plugin runs the checks the shipped ones pass: the
# suites' headers next to the public ones, the source that instantiates one suite for one plugin
# under share/ (refit_add_conformance_tests in the package config builds it).
set(REFIT_INSTALL_CONFORMANCEDIR "${CMAKE_INSTALL_DATADIR}/refit/conformance")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tests/conformance/include/refit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_SOURCE_DIR}/tests/conformance/installed/conformance_main.cc
        DESTINATION ${REFIT_INSTALL_CONFORMANCEDIR})

install(EXPORT refitTargets NAMESPACE refit:: DESTINATION ${REFIT_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/refitConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/refitConfig.cmake
                              INSTALL_DESTINATION ${REFIT_INSTALL_CMAKEDIR}
                              PATH_VARS CMAKE_INSTALL_LIBDIR REFIT_INSTALL_CONFORMANCEDIR)
# 0.x: the plugin ABI, not the package version, decides plugin compatibility (checked at load).
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/refitConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/refitConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/refitConfigVersion.cmake
        DESTINATION ${REFIT_INSTALL_CMAKEDIR})
