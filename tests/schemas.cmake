# Tests of the job / result codecs (schemas/). Owner: "schemas".
# The vectors test reads schemas/vectors/ under $MOEQ_SOURCE_DIR; cJSON and
# msgpack-c serve as independent decoders of what our encoders write.
moeq_add_test(NAME test_job_vectors SOURCES test_job_vectors.c
  LIBS moeq_schemas PkgConfig::CJSON LABELS unit)
moeq_add_test(NAME test_job_decode SOURCES test_job_decode.c LIBS moeq_schemas LABELS unit)
moeq_add_test(NAME test_result_codec SOURCES test_result_codec.c
  LIBS moeq_schemas PkgConfig::CJSON PkgConfig::MSGPACK LABELS unit)

if(MOEQ_FUZZ)
  # libFuzzer targets: scripts/test.sh runs every build-fuzz/tests/fuzz_* for
  # a fixed time with seeds from tests/fuzz/seeds/<name>/.
  foreach(fuzz fuzz_job_decode fuzz_result_decode)
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${fuzz}.c)
      add_executable(${fuzz} fuzz/${fuzz}.c)
      target_link_libraries(${fuzz} PRIVATE moeq_schemas_fuzz)
      target_compile_options(${fuzz} PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
      target_link_options(${fuzz} PRIVATE -fsanitize=fuzzer,address,undefined)
      set_target_properties(${fuzz} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    endif()
  endforeach()
endif()
