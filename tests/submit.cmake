# `moeq submit`'s decision code (submit/): the moeq and OpenAI Batch dialects, the summary and exit codes.
# The end-to-end runs against the broker are test_submit (worker.cmake: it runs a worker).
moeq_add_test(NAME test_submit_dialect SOURCES test_submit_dialect.c LIBS moeq_submit PkgConfig::CJSON LABELS unit)
