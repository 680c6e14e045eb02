# Engine tests (forward helper). test_engine_ops needs no model (kernels,
# routing, cache, sampler, pool); test_engine_model writes tiny checkpoints
# with the built `moeq gen-model` into a temporary directory.
if(TARGET moeq_engine)
  moeq_add_test(NAME test_engine_ops SOURCES test_engine_ops.c LIBS moeq_engine PkgConfig::OPENBLAS
    LABELS unit)
  target_include_directories(test_engine_ops PRIVATE ${CMAKE_SOURCE_DIR}/engine ${CMAKE_SOURCE_DIR}/engine/cpu)
  moeq_add_test(NAME test_engine_model SOURCES test_engine_model.c LIBS moeq_engine moeq_ep LABELS unit
    TIMEOUT 600)
  target_include_directories(test_engine_model PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  if(TARGET moeq)
    add_dependencies(test_engine_model moeq)
  endif()
endif()

# Issue 11 through the CLI: NaN / overflowing weights (a poisoned copy of a tiny checkpoint), model-info
# --check-weights, the context bound of `moeq generate`, and text with a 0x00 byte printed whole.
if(TARGET moeq)
  add_test(NAME cli_checks_numbers_contexts_and_prints_every_byte
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_numerics_cli.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(cli_checks_numbers_contexts_and_prints_every_byte PROPERTIES LABELS unit TIMEOUT 120
    REQUIRED_FILES $<TARGET_FILE:moeq>)
  # moeq generate --response-format (a job's response_format through the worker's processor) and --mtp after a
  # prompt shorter than the verify step.
  add_test(NAME generate_cli_constrains_output_and_speculates_after_one_token
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_generate_cli.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(generate_cli_constrains_output_and_speculates_after_one_token PROPERTIES LABELS unit
    TIMEOUT 120 REQUIRED_FILES $<TARGET_FILE:moeq>)
  # model-info: the CPU kernels, and what fits on a device of a given size (--device-memory-gib).
  add_test(NAME model_info_names_the_kernels_and_sizes_a_device
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_model_info_cli.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(model_info_names_the_kernels_and_sizes_a_device PROPERTIES LABELS unit TIMEOUT 120
    REQUIRED_FILES $<TARGET_FILE:moeq>)
endif()
# bench-engine --against: two checkpoints timed in one process, alternated, ratios the medians of paired rounds.
if(TARGET moeq AND TARGET bench-engine)
  add_test(NAME bench_engine_against_pairs_two_checkpoints_round_by_round
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_engine_against.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(bench_engine_against_pairs_two_checkpoints_round_by_round PROPERTIES LABELS unit TIMEOUT 240
    REQUIRED_FILES "$<TARGET_FILE:moeq>;$<TARGET_FILE:bench-engine>")
  # bench-engine --tune: the CPU kernels' choices timed on whole steps, the keys whose other value won.
  add_test(NAME bench_engine_tune_prints_the_keys_whose_other_value_won
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_engine_tune.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(bench_engine_tune_prints_the_keys_whose_other_value_won PROPERTIES LABELS unit TIMEOUT 240
    REQUIRED_FILES "$<TARGET_FILE:moeq>;$<TARGET_FILE:bench-engine>")
endif()


# The engine as one rank of an expert-parallel group (docs/EP.md): 2 and 3 forked ranks over UCX (tcp, shared
# memory) give the single-process logits bit for bit, with empty and refused steps; a rank killed mid-run is named.
if(TARGET moeq_engine AND TARGET moeq)
  moeq_add_test(NAME test_engine_group SOURCES test_engine_group.c LIBS moeq_engine moeq_ep LABELS unit TIMEOUT 600)
  target_include_directories(test_engine_group PRIVATE ${CMAKE_SOURCE_DIR}/engine)
  add_dependencies(test_engine_group moeq)
  # (the CUDA run of the same groups, test_engine_group_cuda: tests/cuda.cmake, so that the GPU check builds it)
  # The device run's harness on every machine: the same cases on cpu-device (the CPU behind a GPU's contract:
  # rows copied out of the transport, references made in a child and read back from a file).
  add_test(NAME test_engine_group_device_contract COMMAND test_engine_group --backend cpu-device)
  set_tests_properties(test_engine_group_device_contract PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "MOEQ_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()

# The screened lm_head (engine/head_screen.h, engine key head_screen): its error bound on every exact path and
# dtype, candidates that always hold the exact argmax, and greedy records equal to the whole rows' argmax and
# value through the engine.
if(TARGET moeq_engine AND TARGET moeq)
  moeq_add_test(NAME test_head_screen SOURCES test_head_screen.c LIBS moeq_engine LABELS unit TIMEOUT 300)
  target_include_directories(test_head_screen PRIVATE ${CMAKE_SOURCE_DIR}/engine ${CMAKE_SOURCE_DIR}/engine/cpu)
  add_dependencies(test_head_screen moeq)
endif()
