# Expert-parallel exchange (ep/): placement, layout and the local transport (unit); the UCX transport
# with 1-4 ranks as forked processes over tcp and shared memory, and a rank killed with -9.
if(TARGET moeq_ep)
  moeq_add_test(NAME test_ep SOURCES test_ep.c LIBS moeq_ep LABELS unit)
endif()
if(TARGET moeq_ep)
  # Forked ranks on one host: no broker, no Redis; the ranks find each other through a temporary directory.
  moeq_add_test(NAME test_ep_ucx SOURCES test_ep_ucx.c LIBS moeq_ep LABELS unit TIMEOUT 600)
endif()
