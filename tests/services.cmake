# Services for integration tests: one private Kafka broker (KRaft, real Apache
# jars) and one redis-server per build directory, started once per ctest run
# on free ports by the `services` fixture, stopped by its cleanup. Tests read
# the addresses from MOEQ_TEST_ENV_FILE (tests/services_env.h); a watchdog
# stops the services if ctest dies before the cleanup runs.
set(MOEQ_TEST_SERVICES_DIR ${CMAKE_BINARY_DIR}/test-services)
add_test(NAME services_start
  COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-services.sh start ${MOEQ_TEST_SERVICES_DIR} --die-with-parent)
set_tests_properties(services_start PROPERTIES FIXTURES_SETUP services LABELS integration TIMEOUT 300)
add_test(NAME services_stop COMMAND ${CMAKE_SOURCE_DIR}/scripts/test-services.sh stop ${MOEQ_TEST_SERVICES_DIR})
set_tests_properties(services_stop PROPERTIES FIXTURES_CLEANUP services LABELS integration TIMEOUT 120)

# Pure parts of the adapters.
moeq_add_test(NAME test_kafka_config SOURCES test_kafka_config.c LIBS moeq_io LABELS unit)
moeq_add_test(NAME test_redis_parse SOURCES test_redis_parse.c LIBS moeq_io LABELS unit)

# Through the real broker and server.
moeq_add_test(NAME test_kafka_roundtrip SOURCES test_kafka_roundtrip.c LIBS moeq_io
  LABELS integration FIXTURES services TIMEOUT 180)
moeq_add_test(NAME test_redis_streams SOURCES test_redis_streams.c LIBS moeq_io
  LABELS integration FIXTURES services TIMEOUT 120)

# Cross-language proof: the example producers' jobs decode with the C codec.
moeq_add_test(NAME test_producers SOURCES test_producers.c LIBS moeq_io moeq_schemas
  LABELS integration FIXTURES services TIMEOUT 240)
