/*
 * test_worker_affinity.c — the affinity decisions (worker/affinity.c): which
 * peer a fresh batch with a prefix key goes to, and when it stays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "affinity.h"

static moeq_affinity *with_peers(void) {
    moeq_affinity *a = NULL;
    assert_int_equal(moeq_affinity_new(3, 4, &a), MOEQ_OK);
    const char *p1 = "{\"id\":\"w1\",\"room\":8,\"prefix_keys\":[\"00000000000000aa\",\"00000000000000bb\"]}";
    const char *p2 = "{\"id\":\"w2\",\"free_slots\":4,\"pending\":3,\"prefix_keys\":[\"00000000000000cc\"]}";
    const char *own = "{\"id\":\"me\",\"room\":8,\"prefix_keys\":[\"00000000000000dd\"]}";
    assert_int_equal(moeq_affinity_peer_json(a, "me", p1, strlen(p1)), 1);
    assert_int_equal(moeq_affinity_peer_json(a, "me", p2, strlen(p2)), 1);
    assert_int_equal(moeq_affinity_peer_json(a, "me", own, strlen(own)), 0); /* our own heartbeat */
    return a;
}

static void a_fresh_batch_goes_to_the_peer_that_advertises_its_key_and_has_room(void **state) {
    (void)state;
    moeq_affinity *a = with_peers();
    assert_string_equal(moeq_affinity_route(a, 0xaa, 4, 0, 0), "w1");
    assert_string_equal(moeq_affinity_route(a, 0xbb, 8, 0, 0), "w1");
    assert_null(moeq_affinity_route(a, 0xbb, 9, 0, 0));  /* no room for 9 */
    assert_null(moeq_affinity_route(a, 0xcc, 2, 0, 0));  /* w2: 4 free, 3 waiting */
    assert_null(moeq_affinity_route(a, 0xee, 1, 0, 0));  /* nobody holds it */
    assert_null(moeq_affinity_route(a, 0, 1, 0, 0));     /* no key */
    moeq_affinity_handed(a, "w1", 6);                 /* its room until the next refresh: 2 */
    assert_null(moeq_affinity_route(a, 0xaa, 4, 0, 0));
    moeq_affinity_destroy(a);
}

static void a_reclaimed_or_handed_batch_or_a_key_held_here_is_never_handed_on(void **state) {
    (void)state;
    moeq_affinity *a = with_peers();
    assert_null(moeq_affinity_route(a, 0xaa, 1, 1, 0)); /* at most one hand-off a batch: no ping-pong */
    assert_null(moeq_affinity_route(a, 0xaa, 1, 0, 1)); /* our own cache holds its prefix */
    moeq_affinity_peers_clear(a);
    assert_null(moeq_affinity_route(a, 0xbb, 1, 0, 0)); /* peers forgotten until the next refresh */
    moeq_affinity_destroy(a);
}

/* A fake cache: holds prefixes starting with an even token. */
static int even_cached(void *ctx, const int32_t *prefix, int n) {
    (void)ctx;
    return n > 0 && prefix[0] % 2 == 0;
}

static void own_keys_are_advertised_most_recent_first_while_the_cache_still_holds_them(void **state) {
    (void)state;
    moeq_affinity *a = NULL;
    assert_int_equal(moeq_affinity_new(3, 1, &a), MOEQ_OK);
    char buf[256];
    moeq_affinity_hint_json(a, NULL, NULL, buf, sizeof buf);
    assert_string_equal(buf, "[]");
    int32_t tok[4][16];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 16; i++) tok[k][i] = k + 1 + 2 * i;
    for (int k = 0; k < 4; k++) moeq_affinity_note(a, (uint64_t)k + 1, tok[k], 16, k);
    moeq_affinity_note(a, 3, tok[2], 16, 9); /* again: to the front; key 1, the oldest, went when 4 came */
    moeq_affinity_hint_json(a, NULL, NULL, buf, sizeof buf);
    assert_string_equal(buf, "[\"0000000000000003\",\"0000000000000004\",\"0000000000000002\"]");
    assert_false(moeq_affinity_holds(a, 1));
    /* keys whose prefix was evicted (odd first token here) are no longer advertised, nor held */
    moeq_affinity_hint_json(a, even_cached, NULL, buf, sizeof buf);
    assert_string_equal(buf, "[\"0000000000000004\",\"0000000000000002\"]");
    assert_false(moeq_affinity_holds(a, 3));
    moeq_affinity_destroy(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_fresh_batch_goes_to_the_peer_that_advertises_its_key_and_has_room),
        cmocka_unit_test(a_reclaimed_or_handed_batch_or_a_key_held_here_is_never_handed_on),
        cmocka_unit_test(own_keys_are_advertised_most_recent_first_while_the_cache_still_holds_them),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
