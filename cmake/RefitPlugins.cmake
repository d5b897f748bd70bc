# refit_add_plugin(NAME <name> SOURCES <files...> [LIBRARIES <targets...>])
#
# Called from plugins/<kind>/<name>/CMakeLists.txt. If "<kind>/<name>" is in REFIT_BUILTIN_PLUGINS
# the plugin becomes an OBJECT library linked into librefit with a unique entry symbol
# (refit_builtin_entry_<name>); otherwise a MODULE (.so) exporting refit_plugin_entry_v1,
# installed under lib/refit/plugins. Either way the source is identical.
function(refit_add_plugin)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBRARIES" ${ARGN})
  file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}/plugins" "${CMAKE_CURRENT_SOURCE_DIR}")
  set(target refit_plugin_${ARG_NAME})
  if(rel IN_LIST REFIT_BUILTIN_PLUGINS)
    add_library(${target} OBJECT ${ARG_SOURCES})
    target_compile_definitions(${target} PRIVATE REFIT_BUILTIN_ENTRY=refit_builtin_entry_${ARG_NAME})
    set_property(GLOBAL APPEND PROPERTY REFIT_BUILTIN_ENTRIES refit_builtin_entry_${ARG_NAME})
    set_property(GLOBAL APPEND PROPERTY REFIT_BUILTIN_TARGETS ${target})
  else()
    add_library(${target} MODULE ${ARG_SOURCES})
    set_target_properties(${target} PROPERTIES PREFIX "lib" OUTPUT_NAME "refit-${ARG_NAME}"
                          LIBRARY_OUTPUT_DIRECTORY "${REFIT_BUILD_PLUGIN_DIR}")
    install(TARGETS ${target} LIBRARY DESTINATION "${REFIT_PLUGIN_INSTALL_DIR}")
  endif()
  target_link_libraries(${target} PRIVATE refit_headers ${ARG_LIBRARIES})
  refit_set_warnings(${target})
endfunction()
