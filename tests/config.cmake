# One configuration vocabulary (tests/test_config.c runs the moeq binary with --print-config:
# nothing is contacted) and the generated docs/CONFIGURATION.md.
if(TARGET moeq)
  moeq_add_test(NAME test_config SOURCES test_config.c LIBS moeq_coordinator moeq_worker LABELS unit TIMEOUT 120)
  add_dependencies(test_config moeq)
  # Stale docs/CONFIGURATION.md: regenerate with `cmake --build build --target configuration-md`.
  add_test(NAME configuration_md_is_current
           COMMAND sh -c "'$<TARGET_FILE:moeq>' config-docs | diff -u '${CMAKE_SOURCE_DIR}/docs/CONFIGURATION.md' - && echo current || { echo 'docs/CONFIGURATION.md is stale: cmake --build build --target configuration-md'; exit 1; }")
  set_tests_properties(configuration_md_is_current PROPERTIES LABELS unit)
endif()
# Truthful health: /readyz with the broker (librdkafka's mock, in the test) and a private Redis
# stopped and restarted, a wrong broker address; both roles run as `moeq` child processes.
if(TARGET moeq AND TARGET moeq_coordinator)
  moeq_add_test(NAME test_health SOURCES test_health.c LIBS moeq_coordinator moeq_kafka_mock
    LABELS integration FIXTURES services TIMEOUT 420)
  add_dependencies(test_health moeq)
endif()
# The worker decodes a coordinator-written entry with the limits of the shared keys (Redis from the fixture).
get_target_property(_moeq_cfg_worker_defs moeq_worker INTERFACE_COMPILE_DEFINITIONS)
if(_moeq_cfg_worker_defs AND "MOEQ_WORKER_SHELL=1" IN_LIST _moeq_cfg_worker_defs)
  moeq_add_test(NAME test_config_roles SOURCES test_config_roles.c LIBS moeq_worker moeq_coordinator
    LABELS integration FIXTURES services TIMEOUT 60)
endif()
