# Worker tests: the pure scheduler and params (unit); the pipeline against a
# real Kafka + Redis and the tiny model (integration, fixture `services`).
moeq_add_test(NAME test_worker_scheduler SOURCES test_worker_scheduler.c LIBS moeq_worker LABELS unit)
moeq_add_test(NAME test_worker_params SOURCES test_worker_params.c LIBS moeq_worker LABELS unit)

get_target_property(_moeq_worker_defs moeq_worker INTERFACE_COMPILE_DEFINITIONS)
if(_moeq_worker_defs AND "MOEQ_WORKER_SHELL=1" IN_LIST _moeq_worker_defs)
  # Runs `moeq worker` processes (build the moeq target first) against the private services.
  moeq_add_test(NAME test_worker_pipeline SOURCES test_worker_pipeline.c LIBS moeq_worker
    LABELS integration FIXTURES services TIMEOUT 240)
endif()
