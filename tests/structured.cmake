# Structured output (owner: structured): the grammar library, decoding controls, and the corpus of JSON
# Schemas run on the test checkpoints and validated with Python's jsonschema (Debian python3-jsonschema).
if(TARGET moeq_grammar)
  moeq_add_test(NAME test_grammar SOURCES test_grammar.c LIBS moeq_grammar LABELS unit)
  # Random schemas from every supported keyword and their awkward combinations, each output validated by
  # Python's jsonschema (tests/grammar_fuzz.py; the walks by tests/grammar_walk.c over a byte vocabulary).
  add_executable(grammar_walk grammar_walk.c)
  target_link_libraries(grammar_walk PRIVATE moeq_grammar)
  find_program(MOEQ_GRAMMAR_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(MOEQ_GRAMMAR_PYTHON)
    add_test(NAME every_random_schemas_output_validates_or_the_schema_is_refused
      COMMAND ${MOEQ_GRAMMAR_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/grammar_fuzz.py --walk $<TARGET_FILE:grammar_walk>)
    set_tests_properties(every_random_schemas_output_validates_or_the_schema_is_refused PROPERTIES
      LABELS "unit;python" SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} TIMEOUT 600)
  endif()
endif()

# The corpus driver (tests/structured_run.c) and the checks around it (tests/structured_corpus.py):
# every output of >= 100 JSON Schemas validates with Python's jsonschema; batch-mate independence; MTP on =
# off token for token; logprobs against the float64 reference (numpy). Debian's python3 first, as
# reference.cmake: python3-jsonschema and python3-numpy come from apt (scripts/setup.sh).
if(TARGET moeq_worker AND TARGET moeq)
  add_executable(structured_run structured_run.c)
  target_link_libraries(structured_run PRIVATE moeq_worker PkgConfig::CJSON)
  find_program(MOEQ_STRUCTURED_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT MOEQ_STRUCTURED_PYTHON)
    find_program(MOEQ_STRUCTURED_PYTHON NAMES python3)
  endif()
  foreach(check corpus batch mtp)
    if(check STREQUAL corpus)
      set(name every_output_of_the_schema_corpus_parses_and_validates)
    elseif(check STREQUAL batch)
      set(name a_constrained_jobs_output_does_not_depend_on_its_batch_mates)
    else()
      set(name mtp_on_gives_the_tokens_of_mtp_off_for_constrained_jobs)
    endif()
    add_test(NAME ${name}
      COMMAND ${MOEQ_STRUCTURED_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/structured_corpus.py
        --moeq $<TARGET_FILE:moeq> --run $<TARGET_FILE:structured_run>
        --work ${CMAKE_BINARY_DIR}/structured-work-${check} --only ${check})
    set_tests_properties(${name} PROPERTIES LABELS "unit;python" SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE}
      TIMEOUT 900)
  endforeach()
endif()

# Decoding controls below the corpus: penalties vs a reference, min_tokens, stop ids, grammar ends, logprobs.
if(TARGET moeq_worker AND TARGET moeq_grammar)
  moeq_add_test(NAME test_decode_proc SOURCES test_decode_proc.c LIBS moeq_worker moeq_engine LABELS unit)
  target_include_directories(test_decode_proc PRIVATE ${CMAKE_SOURCE_DIR}/engine) # cpu/logits_reduce.h: records
endif()

# Structured output through `moeq worker` (Redis + Kafka of the `services` fixture).
if(TARGET moeq_worker AND TARGET moeq)
  get_target_property(_moeq_st_defs moeq_worker INTERFACE_COMPILE_DEFINITIONS)
  if(_moeq_st_defs AND "MOEQ_WORKER_SHELL=1" IN_LIST _moeq_st_defs)
    moeq_add_test(NAME test_worker_structured SOURCES test_worker_structured.c LIBS moeq_worker
      LABELS integration FIXTURES services TIMEOUT 300)
    # ... with the worker on the CPU behind a GPU's contract: the grammar reads rows the engine brings back
    add_test(NAME test_worker_structured_on_the_device_contract COMMAND test_worker_structured --backend cpu-device)
    set_tests_properties(test_worker_structured_on_the_device_contract PROPERTIES LABELS integration
      SKIP_RETURN_CODE ${MOEQ_TEST_SKIP_CODE} FIXTURES_REQUIRED services TIMEOUT 300 DEPENDS test_worker_structured
      ENVIRONMENT "MOEQ_SOURCE_DIR=${CMAKE_SOURCE_DIR};MOEQ_BUILD_DIR=${CMAKE_BINARY_DIR};MOEQ_TEST_ENV_FILE=${CMAKE_BINARY_DIR}/test-services/env")
  endif()
endif()
