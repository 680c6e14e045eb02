# Worker tests: the pure scheduler and params (unit); the pipeline against a
# real Kafka + Redis and the tiny model (integration, fixture `services`).
moeq_add_test(NAME test_worker_scheduler SOURCES test_worker_scheduler.c LIBS moeq_worker LABELS unit)
moeq_add_test(NAME test_worker_params SOURCES test_worker_params.c LIBS moeq_worker LABELS unit)
