# Coordinator tests: pure policy modules (unit) and, when the adapters exist,
# the coordinator against the real broker and server (integration).
moeq_add_test(NAME test_coordinator_batcher SOURCES test_coordinator_batcher.c
  LIBS moeq_coordinator LABELS unit)
moeq_add_test(NAME test_coordinator_offsets SOURCES test_coordinator_offsets.c
  LIBS moeq_coordinator LABELS unit)
moeq_add_test(NAME test_coordinator_params SOURCES test_coordinator_params.c
  LIBS moeq_coordinator LABELS unit)
moeq_add_test(NAME test_coordinator_intake SOURCES test_coordinator_intake.c
  LIBS moeq_coordinator LABELS unit)
moeq_add_test(NAME test_coordinator_instance SOURCES test_coordinator_instance.c
  LIBS moeq_coordinator LABELS unit)
# Against the real broker and server; they run the `moeq` binary as a child process.
moeq_add_test(NAME test_coordinator_e2e SOURCES test_coordinator_e2e.c
  LIBS moeq_coordinator LABELS integration FIXTURES services TIMEOUT 240)
add_dependencies(test_coordinator_e2e moeq)
moeq_add_test(NAME test_coordinator_crash SOURCES test_coordinator_crash.c
  LIBS moeq_coordinator LABELS integration FIXTURES services TIMEOUT 180)
add_dependencies(test_coordinator_crash moeq)
moeq_add_test(NAME test_coordinator_redis_restart SOURCES test_coordinator_redis_restart.c
  LIBS moeq_coordinator LABELS integration FIXTURES services TIMEOUT 180)
add_dependencies(test_coordinator_redis_restart moeq)
moeq_add_test(NAME test_coordinator_broker_restart SOURCES test_coordinator_broker_restart.c
  LIBS moeq_coordinator LABELS integration slow FIXTURES services TIMEOUT 300)
add_dependencies(test_coordinator_broker_restart moeq)
# The backlog behind max_pending_batches when workers delete what they acknowledge (XINFO's lag nil).
moeq_add_test(NAME test_coordinator_backlog SOURCES test_coordinator_backlog.c
  LIBS moeq_coordinator LABELS integration FIXTURES services TIMEOUT 60)
# The Kafka adapter against librdkafka's in-process mock cluster (moeq_kafka_mock; consumer lag,
# injected request errors, a broker outage); needs no service. Registered here
# with the coordinator's mock-fault test that relies on the same adapter calls.
moeq_add_test(NAME test_kafka_mock SOURCES test_kafka_mock.c LIBS moeq_io moeq_kafka_mock
  LABELS integration TIMEOUT 60)
# Injected Kafka request errors and a broker outage through librdkafka's mock
# cluster (in the test process; the `moeq` child reaches it over loopback), in
# addition to the real broker restart above; Redis from the `services` fixture.
moeq_add_test(NAME test_coordinator_mock_faults SOURCES test_coordinator_mock_faults.c
  LIBS moeq_coordinator moeq_kafka_mock LABELS integration FIXTURES services TIMEOUT 180)
add_dependencies(test_coordinator_mock_faults moeq)
# One id, one job: duplicates inside a batch and across batches, redeliveries.
moeq_add_test(NAME test_coordinator_dedupe SOURCES test_coordinator_dedupe.c
  LIBS moeq_coordinator LABELS integration FIXTURES services TIMEOUT 180)
add_dependencies(test_coordinator_dedupe moeq)
