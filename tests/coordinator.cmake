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
