# The float64 NumPy reference of the DeepSeek-V3/V2 architecture (issue 3),
# tests/reference/. Needs Debian's python3 with python3-numpy (not a pyenv or
# venv python: we ask for /usr/bin/python3 first). Without numpy the tests are
# still registered and exit 77 (skipped) with the reason.

find_program(MOEQ_REFERENCE_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT MOEQ_REFERENCE_PYTHON)
  find_program(MOEQ_REFERENCE_PYTHON NAMES python3)
endif()

if(MOEQ_REFERENCE_PYTHON)
  execute_process(COMMAND ${MOEQ_REFERENCE_PYTHON} -c "import numpy"
    RESULT_VARIABLE MOEQ_REFERENCE_NUMPY_RC OUTPUT_QUIET ERROR_QUIET)
endif()
if(MOEQ_REFERENCE_PYTHON AND MOEQ_REFERENCE_NUMPY_RC EQUAL 0)
  set(MOEQ_REFERENCE_RUN ${MOEQ_REFERENCE_PYTHON})
else()
  message(STATUS "moeq: reference tests skipped (no python3 with numpy; apt-get install python3-numpy)")
  set(MOEQ_REFERENCE_RUN sh -c "echo 'skipped: no python3 with numpy (apt-get install python3-numpy)'; exit 77" --)
endif()

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
