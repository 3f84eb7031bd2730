/* test.h: the counting checks of the core's C unit tests (no framework).
 * CHECK counts a pass or prints the failed condition with its place;
 * TEST_SUMMARY prints "N passed, N failed" (read by .ci/run) and gives the
 * exit code.  Include once, from the test program's single .c file. */
#ifndef LECHO_TEST_H
#define LECHO_TEST_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond)                                                                    \
            passed++;                                                                \
        else {                                                                       \
            failed++;                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define TEST_SUMMARY() (printf("%d passed, %d failed\n", passed, failed), failed ? 1 : 0)

#endif
