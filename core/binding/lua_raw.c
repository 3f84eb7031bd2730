/* lua_raw.c: raw channels for recorders (issue 29, binding).
 *
 * ctx:raw(chid, on): the events of channel chid reach Lua as the encoded
 * bytes they came as (one Lua string, the payload checked by
 * lei_codec_validate first), not decoded: `lecho record` stores them as
 * they were on the wire, arrays included, without decoding or re-encoding.
 * Every consumer of that channel in this context gets the string, so a
 * recorder has a context of its own.  The set is a byte per channel index,
 * owned by the lb_ctx (lb_raw_free at close). */
#include <stdlib.h>
#include <string.h>

#include "lua_int.h"

int lb_raw_is(const lb_ctx *b, uint32_t chid) { return chid < b->nraw && b->raw[chid]; }

void lb_raw_free(lb_ctx *b) {
    free(b->raw);
    b->raw = NULL;
    b->nraw = 0;
}

/* Pushes the payload as a string, or returns nonzero (err set) when it is
 * not a value (the caller treats it as a bad value: that connection). */
int lb_raw_push(lua_State *L, lb_ctx *b, const uint8_t *p, size_t n, char *err, size_t errlen) {
    const char *why = NULL;
    if (lei_codec_validate(p, n, &b->lim, &why)) {
        snprintf(err, errlen, "%s", why ? why : "invalid value");
        return -1;
    }
    lua_pushlstring(L, (const char *)p, n);
    return 0;
}

/* ctx:raw(chid, on) */
static int l_raw(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    int on = lua_toboolean(L, 3);
    if (chid >= b->nraw) {
        if (!on) return 0;
        uint32_t n = b->nraw ? b->nraw : 16;
        while (n <= chid) n *= 2;
        unsigned char *r = realloc(b->raw, n); /* owned by b (lb_raw_free) */
        if (!r) return luaL_error(L, "out of memory");
        memset(r + b->nraw, 0, n - b->nraw);
        b->raw = r;
        b->nraw = n;
    }
    b->raw[chid] = (unsigned char)on;
    return 0;
}

const luaL_Reg lb_raw_methods[] = {{"raw", l_raw}, {NULL, NULL}};
