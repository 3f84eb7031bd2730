/* test_errors.c: the public C API names its error codes as the core does.
 * lecho.h's LECHO_E* and errors.h's LEI_E_* are checked equal at compile
 * time in lecho.c; this checks at run time that lecho_strerror, called
 * through the built liblecho, gives each code the name of errors.c's table
 * (the names Lua returns as `nil, msg, code`), that every row of the list
 * maps both ways (code -> name -> code, public and core), and
 * "success"/"unknown" outside the list.  Prints "N passed, N failed" and exits nonzero on
 * failure.
 *
 *   make ctest                       (builds build/test_errors and runs it)
 */
#include "errors.h"
#include "lecho.h"

#include <string.h>

#include "test.h"

#define STREQ(a, b) ((a) != NULL && (b) != NULL && strcmp((a), (b)) == 0)

int main(void) {
    for (int code = 1; code < LEI_E_MAX; code++) {
        if (!STREQ(lecho_strerror(code), lei_err_name(code)))
            fprintf(stderr, "code %d: lecho_strerror %s, core %s\n", code, lecho_strerror(code),
                    lei_err_name(code));
        CHECK(STREQ(lecho_strerror(code), lei_err_name(code)));
    }
    /* Every row of errors.h's list both ways: its code names it, its name
     * gives back its code (the public one and the core's). */
#define ROW(code, name, text, pub)                                                             \
    CHECK((int)LECHO_##pub == (int)LEI_E_##code);                                             \
    CHECK(STREQ(lecho_strerror(LECHO_##pub), name));                                          \
    CHECK(STREQ(lei_err_name(LEI_E_##code), name) && STREQ(lei_err_name(-LEI_E_##code), name)); \
    CHECK(lei_err_code(name, strlen(name)) == (int)LEI_E_##code);                             \
    CHECK(STREQ(lei_err_text(LEI_E_##code), text));                                           \
    rows++;
    int rows = 0;
    LEI_ERRDEF(ROW)
#undef ROW
    CHECK(rows == LEI_E_MAX - 1);
    /* a name outside the list, or a prefix of one, is no code */
    CHECK(lei_err_code("timeou", 6) == 0);
    CHECK(lei_err_code("timeouts", 8) == 0);
    CHECK(lei_err_code("ok", 2) == 0);
    CHECK(STREQ(lei_err_name(LEI_E_MAX), "failed"));
    /* A few by their public names, so a renumbering that kept both lists
     * equal but moved a name is seen too. */
    CHECK(STREQ(lecho_strerror(LECHO_ETIMEOUT), "timeout"));
    CHECK(STREQ(lecho_strerror(LECHO_EINVAL), "invalid"));
    CHECK(STREQ(lecho_strerror(LECHO_EWOULDBLOCK), "wouldblock"));
    CHECK(STREQ(lecho_strerror(LECHO_EFAILED), "failed"));
    CHECK(STREQ(lecho_strerror(LECHO_OK), "success"));
    CHECK(STREQ(lecho_strerror(LEI_E_MAX), "unknown"));
    CHECK(STREQ(lecho_strerror(-1), "unknown"));
    return TEST_SUMMARY();
}
