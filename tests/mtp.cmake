# MTP speculative decoding tests (issue 7): engine/mtp*.c on checkpoints
# written by the built `moeq gen-model` (tiny, tiny-mtp, small, tiny-v2).
if(TARGET moeq_engine)
  moeq_add_test(NAME test_mtp SOURCES test_mtp.c LIBS moeq_engine LABELS unit TIMEOUT 600)
  target_include_directories(test_mtp PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  if(TARGET moeq)
    add_dependencies(test_mtp moeq)
  endif()
endif()

# The engine's MTP-layer logits match the float64 reference's mtp_forward
# (tests/reference/compare_mtp.py; needs python3 with numpy, else skipped).
if(TARGET moeq AND DEFINED MOEQ_REFERENCE_RUN)
  add_test(NAME engine_mtp_logits_match_the_float64_reference
    COMMAND ${MOEQ_REFERENCE_RUN} ${CMAKE_CURRENT_SOURCE_DIR}/reference/compare_mtp.py
      --moeq $<TARGET_FILE:moeq> --work ${CMAKE_BINARY_DIR}/reference-mtp-work)
  set_tests_properties(engine_mtp_logits_match_the_float64_reference PROPERTIES
    LABELS unit SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 300 REQUIRED_FILES $<TARGET_FILE:moeq>)
endif()
