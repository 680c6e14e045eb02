# The prefix cache across sequences (issue 15, docs/PREFIX_CACHE.md): the bookkeeping alone and through the
# engine on checkpoints written by the built `moeq gen-model` (tiny, tiny-mtp).
if(TARGET moeq_engine)
  moeq_add_test(NAME test_prefix_cache SOURCES test_prefix_cache.c LIBS moeq_engine LABELS unit TIMEOUT 300)
  target_include_directories(test_prefix_cache PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  if(TARGET moeq)
    add_dependencies(test_prefix_cache moeq)
  endif()
endif()
