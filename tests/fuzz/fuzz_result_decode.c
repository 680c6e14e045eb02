/*
 * fuzz_result_decode.c — libFuzzer target for moeq_result_decode (what
 * `moeq submit` reads back from the results topic).
 *
 * Beyond "no crash, no leak, no unbounded allocation": an accepted result
 * re-encodes in both formats (metadata transcoding may refuse msgpack-only
 * values with MOEQ_ERR_FORMAT) and decodes again to the same id and status.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/result.h"

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz_result_decode: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moeq_result res;
    char errstr[256];
    moeq_err err = moeq_result_decode(data, size, NULL, 1 << 20, &res, errstr, sizeof errstr);
    if (err != MOEQ_OK) {
        CHECK(res.id == NULL && errstr[0]);
        return 0;
    }
    for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
        moeq_buf buf = {0};
        err = moeq_result_encode(&res, (moeq_wire_format)f, &buf, errstr, sizeof errstr);
        if (err != MOEQ_OK) fprintf(stderr, "encode (%s): %s\n", f == MOEQ_WIRE_JSON ? "json" : "msgpack", errstr);
        CHECK(err == MOEQ_OK || (err == MOEQ_ERR_FORMAT && res.metadata && res.metadata_format != (moeq_wire_format)f));
        if (err == MOEQ_OK) {
            moeq_result back;
            err = moeq_result_decode(buf.data, buf.len, NULL, 0, &back, errstr, sizeof errstr);
            if (err != MOEQ_OK) fprintf(stderr, "re-decode: %s\n", errstr);
            CHECK(err == MOEQ_OK);
            CHECK(back.status == res.status && back.finish_reason == res.finish_reason && back.n_tokens == res.n_tokens);
            moeq_result_free(&back);
        }
        moeq_buf_free(&buf);
    }
    moeq_result_free(&res);
    return 0;
}
