/* noucx.c — built when UCX is not found: the "ucx" transport is absent. */
#include "ep_int.h"

const moeq_ep_transport *const moeq_ep_transport_ucx = NULL;
