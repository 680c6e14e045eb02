# Model loader tests (helper "loader"): dtype conversions, config.json
# parsing, safetensors header validation (pure, on bytes), and loading
# generated checkpoints, good and deliberately broken.
if(NOT TARGET moeq_engine)
  return()
endif()

moeq_add_test(NAME test_model_units SOURCES test_model_units.c LIBS moeq_engine LABELS unit)
target_include_directories(test_model_units PRIVATE ${CMAKE_SOURCE_DIR}/engine)
target_link_libraries(test_model_units PRIVATE PkgConfig::CJSON ${MATH_LIB})

moeq_add_test(NAME test_model_load SOURCES test_model_load.c LIBS moeq_genmodel moeq_engine LABELS unit TIMEOUT 300)
target_include_directories(test_model_load PRIVATE ${CMAKE_SOURCE_DIR}/engine)
target_link_libraries(test_model_load PRIVATE PkgConfig::CJSON ${MATH_LIB})
