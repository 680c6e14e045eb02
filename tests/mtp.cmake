# MTP speculative decoding tests (issue 7): engine/mtp*.c on checkpoints
# written by the built `moeq gen-model` (tiny, tiny-mtp, small, tiny-v2).
if(TARGET moeq_engine)
  moeq_add_test(NAME test_mtp SOURCES test_mtp.c LIBS moeq_engine LABELS unit TIMEOUT 600)
  target_include_directories(test_mtp PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  if(TARGET moeq)
    add_dependencies(test_mtp moeq)
  endif()
endif()
