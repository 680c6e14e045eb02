# The float64 NumPy reference of the DeepSeek-V3/V2 architecture (issue 3),
# tests/reference/. Needs Debian's python3 with python3-numpy (not a pyenv or
# venv python: we ask for /usr/bin/python3 first). Without numpy the tests are
# still registered and exit 77 (skipped) with the reason.

include(${CMAKE_CURRENT_SOURCE_DIR}/reference_python.cmake) # MOEQ_REFERENCE_RUN: a python3 with numpy, or a skip

set(MOEQ_REFERENCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/reference)

# The reference checks itself: dtype tables, F8 block scales, YaRN, MLA naive
# vs absorbed, prefill vs token-by-token, routing edge cases, MTP, and the
# comparison harness against a float32 stand-in. No engine needed.
add_test(NAME reference_model_passes_its_float64_self_checks
  COMMAND ${MOEQ_REFERENCE_RUN} ${MOEQ_REFERENCE_DIR}/test_reference_self.py)
set_tests_properties(reference_model_passes_its_float64_self_checks PROPERTIES
  LABELS "unit;python" SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 300)

# The engine's logits (moeq gen-model + moeq logits --top 0) match the
# reference at every position: tiny (bf16, f8), tiny-v2, small. Tolerance and
# figures: tests/reference/README.md. Runs after the self-checks, so a broken
# reference is reported as such first.
if(TARGET moeq)
  add_test(NAME engine_logits_match_the_float64_reference
    COMMAND ${MOEQ_REFERENCE_RUN} ${MOEQ_REFERENCE_DIR}/compare_engine.py
      --moeq $<TARGET_FILE:moeq> --work ${CMAKE_BINARY_DIR}/reference-work)
  set_tests_properties(engine_logits_match_the_float64_reference PROPERTIES
    LABELS unit SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 600
    DEPENDS reference_model_passes_its_float64_self_checks
    REQUIRED_FILES $<TARGET_FILE:moeq>)
endif()
