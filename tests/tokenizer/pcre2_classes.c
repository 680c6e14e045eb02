/* Prints PCRE2's (UTF + UCP) members of \p{L,M,N,P,S} and \s as JSON code point
 * ranges. Used by gen_unicode.js only; not part of the build. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    const char *names[] = {"L", "M", "N", "P", "S", "s"};
    const char *pats[] = {"\\p{L}", "\\p{M}", "\\p{N}", "\\p{P}", "\\p{S}", "\\s"};
    printf("{");
    for (int k = 0; k < 6; k++) {
        int rc; PCRE2_SIZE at;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pats[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &rc, &at, NULL);
        pcre2_match_data *md = pcre2_match_data_create(1, NULL);
        printf("%s\"%s\":[", k ? "," : "", names[k]);
        int start = -1, first = 1;
        for (int c = 0; c <= 0x110000; c++) {
            int m = 0;
            if (c < 0x110000 && !(c >= 0xD800 && c <= 0xDFFF)) {
                unsigned char b[4]; int n;
                if (c < 0x80) b[0] = c, n = 1;
                else if (c < 0x800) b[0] = 0xC0 | (c >> 6), b[1] = 0x80 | (c & 0x3F), n = 2;
                else if (c < 0x10000) b[0] = 0xE0 | (c >> 12), b[1] = 0x80 | ((c >> 6) & 0x3F), b[2] = 0x80 | (c & 0x3F), n = 3;
                else b[0] = 0xF0 | (c >> 18), b[1] = 0x80 | ((c >> 12) & 0x3F), b[2] = 0x80 | ((c >> 6) & 0x3F), b[3] = 0x80 | (c & 0x3F), n = 4;
                m = pcre2_match(re, b, n, 0, PCRE2_ANCHORED, md, NULL) >= 0;
            }
            if (m && start < 0) start = c;
            if (!m && start >= 0) { printf("%s[%d,%d]", first ? "" : ",", start, c - 1); first = 0; start = -1; }
        }
        printf("]");
    }
    printf("}\n");
}
