/*
 * test_coordinator_instance.c — the static member ids of instance.h: two
 * live coordinators on one host never share an id (the broker would fence
 * one), and a restarted one gets its old id back (so its partitions too).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "instance.h"

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/moeq-instance-test-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void two_live_coordinators_on_one_host_get_different_ids_and_a_restart_gets_its_own_back(void **state) {
    (void)state;
    char err[256];
    moeq_instance *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(moeq_instance_claim(dir, "coordinator", "grp", "host-1", &a, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_instance_claim(dir, "coordinator", "grp", "host-1", &b, err, sizeof err), MOEQ_OK);
    assert_string_equal(moeq_instance_id(a), "host-1.0");
    assert_string_equal(moeq_instance_id(b), "host-1.1");
    moeq_instance_destroy(a); /* "killed": the kernel drops the lock */
    assert_int_equal(moeq_instance_claim(dir, "coordinator", "grp", "host-1", &c, err, sizeof err), MOEQ_OK);
    assert_string_equal(moeq_instance_id(c), "host-1.0");
    moeq_instance_destroy(b);
    moeq_instance_destroy(c);
}

static void other_groups_have_their_own_slots_and_odd_characters_are_replaced(void **state) {
    (void)state;
    char err[256];
    moeq_instance *a = NULL, *b = NULL;
    assert_int_equal(moeq_instance_claim(dir, "coordinator", "g/1", "h:1 x", &a, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_instance_claim(dir, "coordinator", "g/2", "h:1 x", &b, err, sizeof err), MOEQ_OK);
    assert_string_equal(moeq_instance_id(a), "h_1_x.0");
    assert_string_equal(moeq_instance_id(b), "h_1_x.0");
    moeq_instance_destroy(a);
    moeq_instance_destroy(b);
    moeq_instance_destroy(NULL);
}

static void an_unwritable_lock_directory_is_an_error_naming_it(void **state) {
    (void)state;
    char err[256];
    moeq_instance *a = NULL;
    assert_int_equal(moeq_instance_claim("/nonexistent/moeq", "coordinator", "grp", NULL, &a, err, sizeof err),
                     MOEQ_ERR_IO);
    assert_null(a);
    assert_non_null(strstr(err, "/nonexistent/moeq"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_live_coordinators_on_one_host_get_different_ids_and_a_restart_gets_its_own_back),
        cmocka_unit_test(other_groups_have_their_own_slots_and_odd_characters_are_replaced),
        cmocka_unit_test(an_unwritable_lock_directory_is_an_error_naming_it),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
