# The llama.cpp anchor of the CPU benchmark (issue 18, bench/llamacpp,
# docs/BENCHMARKS.md): its converter makes, from the tiny preset, a GGUF that
# llama.cpp (node-llama-cpp) loads, batches and agrees with moeq on. Needs
# Debian's python3 (numpy), node, and what scripts/setup.d/50-llamacpp-anchor.sh
# installs; without them each test exits 77 (skipped) with the reason.
find_program(MOEQ_LLAMACPP_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT MOEQ_LLAMACPP_PYTHON)
  find_program(MOEQ_LLAMACPP_PYTHON NAMES python3)
endif()
if(TARGET moeq AND MOEQ_LLAMACPP_PYTHON)
  foreach(dtype bf16 f8)
    set(name llamacpp_loads_the_converted_tiny_${dtype}_checkpoint)
    add_test(NAME ${name} COMMAND ${MOEQ_LLAMACPP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/llamacpp_anchor_check.py
      ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR} ${dtype})
    set_tests_properties(${name} PROPERTIES LABELS "python;slow" SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 300)
  endforeach()
endif()
