/* test_inmap.c: inmap.c, a connection's map of the remote's channel
 * indexes: small and large indexes (array and table, through the table's
 * growth), rebinding, the count of indexes bound, indexes past 2^32 - 1,
 * the refused names; memory per BIND (the table stays near 2 entries per
 * index bound). */
#include "ctx_int.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) { /* xorshift64: seeded, the same every run */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(void) {
    lei_conn k;
    memset(&k, 0, sizeof k);
    uint32_t v = 0;
    CHECK(lei_inmap_get(&k, 0, &v) == -1);
    CHECK(lei_inmap_get(&k, 1u << 24, &v) == -1);
    /* 20,000 indexes, half below 65536, half anywhere below 2^32 */
    enum { N = 20000 };
    static uint64_t idx[N];
    size_t distinct = 0;
    for (int i = 0; i < N; i++) {
        idx[i] = i % 2 ? next() % 65536 : 65536 + next() % (UINT32_MAX - 65536ull + 1);
        if (lei_inmap_get(&k, idx[i], &v)) distinct++;
        CHECK(lei_inmap_set(&k, idx[i], (uint32_t)i + 1) == 0);
    }
    CHECK(k.nbound == distinct);
    int ok = 1;
    for (int i = 0; i < N; i++) { /* a repeated index holds its last value */
        int last = i;
        for (int j = i + 1; j < N; j++)
            if (idx[j] == idx[i]) last = j;
        ok &= lei_inmap_get(&k, idx[i], &v) == 0 && v == (uint32_t)last + 1;
    }
    CHECK(ok);
    CHECK(k.hcap <= 4 * k.hn + 64); /* memory follows the BINDs */
    CHECK(k.ninmap <= 65536);
    /* rebinding counts once; past 2^32 - 1 refused */
    size_t nb = k.nbound;
    CHECK(lei_inmap_set(&k, idx[0], LEI_REFUSED) == 0);
    CHECK(k.nbound == nb);
    CHECK(lei_inmap_get(&k, idx[0], &v) == 0 && v == LEI_REFUSED);
    CHECK(lei_inmap_set(&k, (uint64_t)UINT32_MAX + 1, 1) == -1);
    CHECK(lei_inmap_set(&k, UINT32_MAX, 7) == 0);
    CHECK(lei_inmap_get(&k, UINT32_MAX, &v) == 0 && v == 7);
    /* refused names */
    CHECK(lei_inmap_rname(&k, 5) == NULL);
    CHECK(lei_inmap_set_rname(&k, 5, UINT32_MAX, "no channel a/b open here") == 0);
    CHECK(lei_inmap_set_rname(&k, 1u << 30, 3, "not an authorized producer of a/c") == 0);
    CHECK(lei_inmap_set_rname(&k, 5, UINT32_MAX, "no channel a/d open here") == 0);
    CHECK(strcmp(lei_inmap_rname(&k, 5)->why, "no channel a/d open here") == 0);
    CHECK(lei_inmap_rname(&k, 1u << 30)->chid == 3);
    CHECK(k.rname_bytes == strlen("no channel a/d open here") +
                           strlen("not an authorized producer of a/c"));
    CHECK(k.nrnames == 2);
    lei_inmap_drop_rname(&k, 5);
    CHECK(lei_inmap_rname(&k, 5) == NULL && k.nrnames == 1);
    lei_inmap_free(&k);
    CHECK(!k.inmap && !k.hmap && !k.rnames && k.ninmap == 0 && k.hcap == 0);
    return TEST_SUMMARY();
}
