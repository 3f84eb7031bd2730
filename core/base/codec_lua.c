/* codec_lua.c: the Lua side of the lecho value format: encode a Lua value
 * into a lei_msg (pinning big strings instead of copying them) and decode
 * bytes back into a Lua value. The only codec file that knows Lua; the format
 * checks themselves are in codec.c (lei_reader), shared with the validator.
 *
 * Neither direction calls luaL_error or runs Lua code (raw access only,
 * metatables are ignored): failures come back as -1 and a message. The only
 * raises left are Lua's own memory errors from the API calls we make.
 */
#include "codec.h"
#include "errors.h"
#include "array.h"

#include <lua.h>
#include <lauxlib.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_BUF 200   /* longest location path kept in encoder messages */
#define DEC_ESTACK 100 /* local to this file: lua_checkstack failed */

/* ---- encoder --------------------------------------------------------- */

typedef struct enc_state {
    lua_State *L;
    lei_wbuf *b;
    lei_msg *m;
    size_t max_string;
    unsigned max_depth;
    size_t pin;    /* pin strings of at least this length; 0 = never */
    size_t size;      /* decoded size so far, charged as the reader will */
    size_t max_value; /* max_value_bytes */
    char msg[160]; /* error message without location */
    int code;      /* LEI_E_* of that error, set where it happens */
    int why;       /* LEI_ESIZE (codec.h) when max_value_bytes stopped it, else 0 */
    int want_path; /* the message takes an " at ev..." location */
    int ptrunc;    /* path lost its outer segments */
    size_t pstart; /* the path is path[pstart .. PATH_BUF) */
    char path[PATH_BUF + 1];
    const void *stack[LEI_MAX_DEPTH_CEIL]; /* tables on the current path */
} enc_state;

static int enc_value(enc_state *st, int idx, unsigned depth);

static int enc_fail(enc_state *st, int code, int want_path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The receiver's reader charges the same (codec.h, LEI_DEC_*): a value it
 * would refuse is refused here, at the submit. */
static int enc_charge(enc_state *st, size_t cost) {
    if (cost > st->max_value - st->size) {
        st->why = LEI_ESIZE;
        return enc_fail(st, LEI_E_LIMIT, 0, "value decodes to more than %zu bytes", st->max_value);
    }
    st->size += cost;
    return 0;
}

/* Records why the encoding fails: code (LEI_E_*) and the message. -1. */
static int enc_fail(enc_state *st, int code, int want_path, const char *fmt, ...) {
    va_list ap;
    st->code = code;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->want_path = want_path;
    return -1;
}

/* Prepend one path segment while unwinding (error path only). */
static void path_prepend(enc_state *st, const char *seg, int n) {
    if (!st->want_path || st->ptrunc || n <= 0) return;
    if ((size_t)n > st->pstart) {
        st->ptrunc = 1;
        return;
    }
    st->pstart -= (size_t)n;
    memcpy(st->path + st->pstart, seg, (size_t)n);
}

static int is_ident(const char *s, size_t l) {
    size_t i;
    if (l == 0 || (s[0] >= '0' && s[0] <= '9')) return 0;
    for (i = 0; i < l; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return 0;
    }
    return 1;
}

/* Describe the key at kidx as a path segment: .name, ["str"], [3], [1.5] */
static void path_key(enc_state *st, int kidx) {
    lua_State *L = st->L;
    char seg[96];
    int n = 0;

    if (!st->want_path) return;
    switch (lua_type(L, kidx)) {
    case LUA_TSTRING: {
        size_t l, i;
        const char *s = lua_tolstring(L, kidx, &l);
        if (is_ident(s, l) && l <= 48) {
            n = snprintf(seg, sizeof seg, ".%s", s);
            break;
        }
        n = snprintf(seg, sizeof seg, "[\"");
        for (i = 0; i < l && i < 32; i++) {
            unsigned char c = (unsigned char)s[i];
            if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
                seg[n++] = (char)c;
            else
                n += snprintf(seg + n, sizeof seg - (size_t)n, "\\%u", c);
        }
        n += snprintf(seg + n, sizeof seg - (size_t)n, "%s\"]", i < l ? "..." : "");
        break;
    }
    case LUA_TNUMBER: {
        double x = lua_tonumber(L, kidx);
        if (x >= -LEI_INT_EXACT && x <= LEI_INT_EXACT && x == (double)(int64_t)x)
            n = snprintf(seg, sizeof seg, "[%.0f]", x);
        else
            n = snprintf(seg, sizeof seg, "[%.17g]", x);
        break;
    }
    case LUA_TBOOLEAN:
        n = snprintf(seg, sizeof seg, "[%s]", lua_toboolean(L, kidx) ? "true" : "false");
        break;
    default: n = snprintf(seg, sizeof seg, "[<%s>]", lua_typename(L, lua_type(L, kidx))); break;
    }
    path_prepend(st, seg, n < (int)sizeof seg ? n : (int)sizeof seg - 1);
}

static int enc_string(enc_state *st, int idx) {
    lua_State *L = st->L;
    lei_wbuf *b = st->b;
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);

    if (len > st->max_string)
        return enc_fail(st, LEI_E_LIMIT, 1, "string too long (%zu bytes, limit %zu)", len, st->max_string);
    if (enc_charge(st, LEI_DEC_STRING + len)) return -1;
    if (st->pin && len >= st->pin) {
        int ref;
        if (lei_wbuf_reserve(b, 1 + LEI_VARINT_MAX)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
        b->data[b->len++] = LEI_T_STRING;
        b->len += lei_varint_encode((uint8_t *)b->data + b->len, len);
        lua_pushvalue(L, idx);
        ref = luaL_ref(L, LUA_REGISTRYINDEX);
        if (lei_msg_add_ext(st->m, s, len, ref)) {
            luaL_unref(L, LUA_REGISTRYINDEX, ref);
            return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
        }
        return 0;
    }
    if (lei_enc_string(b, s, len)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
    return 0;
}

/* ---- arrays: a userdata holding a lei_array (array.h) --------------- */

/* The metatable every array of this state shares (made on first use, with
 * the registry name LEI_ARRAY_MT); lua/lecho/array.lua adds its methods. */
static void push_array_mt(lua_State *L) {
    if (luaL_newmetatable(L, LEI_ARRAY_MT)) {
        lua_pushliteral(L, "lecho.array");
        lua_setfield(L, -2, "__name");
    }
}

lei_array *lei_codec_lua_array_check(lua_State *L, int idx) {
    lei_array *a = lua_touserdata(L, idx);
    int same;
    if (!a || lua_islightuserdata(L, idx) || !lua_getmetatable(L, idx)) return NULL;
    push_array_mt(L);
    same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same ? a : NULL;
}

/* A new array userdata on the stack with extra bytes after its header
 * (zeroed when zero is set); data points at them (or NULL if extra is 0).
 * Its environment is a fresh table: [1] = what keeps data alive, .kids =
 * views made from it. May raise (memory). */
lei_array *lei_codec_lua_array_push(lua_State *L, int dtype, int ndim, const int64_t *shape, size_t extra,
                          int zero) {
    lei_array hdr;
    if (lei_array_init(&hdr, dtype, ndim, shape)) luaL_error(L, "bad array dtype or shape");
    size_t hsz = (sizeof(lei_array) + 15) & ~(size_t)15;
    /* LuaJIT sizes a userdata with 32 bits: past its limit the size would
     * wrap around */
    if (extra > LEI_ARRAY_UD_MAX - hsz) luaL_error(L, "array of %zu bytes: more than one Lua object holds", extra);
    lei_array *a = lua_newuserdata(L, hsz + extra);
    *a = hdr;
    a->data = extra ? (uint8_t *)a + hsz : NULL;
    if (zero && extra) memset(a->data, 0, extra);
    push_array_mt(L);
    lua_setmetatable(L, -2);
    lua_createtable(L, 1, 1);
    lua_setfenv(L, -2);
    return a;
}

static int enc_array(enc_state *st, int idx, lei_array *a) {
    lua_State *L = st->L;
    lei_wbuf *b = st->b;
    size_t bytes = (size_t)a->count * (size_t)a->itemsize;

    if (a->flags & LEI_AF_ENDED)
        return enc_fail(st, LEI_E_INVALID, 1, "cannot encode an array view whose handler returned (keep it with a:copy())");
    if (enc_charge(st, LEI_DEC_ARRAY + bytes)) return -1;
    if (lei_enc_array_header(b, a->dtype, a->ndim, a->shape)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
    /* borrowed memory (lecho_set_array without a free function) is read
     * during the submit only: copied, never pinned */
    if (st->pin && bytes >= st->pin && !(a->flags & LEI_AF_BORROWED) && lei_array_contiguous(a)) {
        int ref;
        lua_pushvalue(L, idx); /* the array keeps its owner (its environment) */
        ref = luaL_ref(L, LUA_REGISTRYINDEX);
        if (lei_msg_add_ext(st->m, (const char *)a->data, bytes, ref)) {
            luaL_unref(L, LUA_REGISTRYINDEX, ref);
            return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
        }
        return 0;
    }
    if (lei_wbuf_reserve(b, bytes)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
    lei_array_gather(a, (uint8_t *)b->data + b->len, NULL);
    b->len += bytes;
    return 0;
}

/* Is the key at kidx one of the integers 1..narr? */
static inline int is_arr_key(lua_State *L, int kidx, size_t narr) {
    double k;
    if (lua_type(L, kidx) != LUA_TNUMBER) return 0;
    k = lua_tonumber(L, kidx);
    return k >= 1 && k <= (double)narr && k == (double)(int64_t)k;
}

static int enc_table(enc_state *st, int idx, unsigned depth) {
    lua_State *L = st->L;
    const void *self = lua_topointer(L, idx);
    size_t len, narr, nkeys = 0, nin = 0, nhash, i;
    unsigned d;

    for (d = 0; d < depth; d++)
        if (st->stack[d] == self) return enc_fail(st, LEI_E_INVALID, 1, "cannot encode a cycle");
    if (depth >= st->max_depth)
        return enc_fail(st, LEI_E_LIMIT, 0, "nesting too deep (limit %u)", st->max_depth);
    if (!lua_checkstack(L, 4)) return enc_fail(st, LEI_E_LIMIT, 0, "Lua stack overflow");
    /* luaL_ref writes the registry: never iterate it while pinning */
    if (st->pin && lua_rawequal(L, idx, LUA_REGISTRYINDEX))
        return enc_fail(st, LEI_E_INVALID, 1, "cannot encode the registry");
    st->stack[depth] = self;

    /* narr = consecutive non-nil t[1], t[2], ... bounded by objlen. One
	 * lua_next pass counts all keys and those among 1..len: when all len of
	 * them are present narr = len without probing; else probe for the first
	 * nil. The hash part is everything else. */
    len = lua_objlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        nkeys++;
        nin += is_arr_key(L, -2, len);
        lua_pop(L, 1);
    }
    if (nin == len) {
        narr = len;
    } else {
        for (narr = 0; narr < len; narr++) {
            int nil;
            lua_rawgeti(L, idx, (int)(narr + 1));
            nil = lua_isnil(L, -1);
            lua_pop(L, 1);
            if (nil) break;
        }
    }
    nhash = nkeys - narr;
    if (enc_charge(st, LEI_DEC_TABLE + LEI_DEC_SLOT * (narr + 2 * nhash))) return -1;
    if (lei_enc_table_header(st->b, narr, nhash)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");

    for (i = 1; i <= narr; i++) {
        lua_rawgeti(L, idx, (int)i);
        if (enc_value(st, lua_gettop(L), depth + 1)) {
            char seg[32];
            path_prepend(st, seg, snprintf(seg, sizeof seg, "[%zu]", i));
            return -1; /* lei_encode_lua restores the stack */
        }
        lua_pop(L, 1);
    }
    if (nhash == 0) return 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int top = lua_gettop(L);
        if (is_arr_key(L, top - 1, narr)) {
            lua_pop(L, 1);
            continue;
        }
        if (enc_value(st, top - 1, depth + 1)) {
            char seg[48];
            path_prepend(
                st, seg,
                snprintf(seg, sizeof seg, "[<%s key>]", lua_typename(L, lua_type(L, top - 1))));
            return -1;
        }
        if (enc_value(st, top, depth + 1)) {
            path_key(st, top - 1);
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

/* lei_enc_number with the small-integer case inline (the common one) */
static inline int enc_number(enc_state *st, double x) {
    lei_wbuf *b = st->b;
    if (x >= -63 && x <= 63 && x == (double)(int)x && !(x == 0 && 1 / x < 0) &&
        b->cap - b->len >= 2) {
        b->data[b->len] = LEI_T_INT;
        b->data[b->len + 1] = (char)lei_zigzag_encode((int64_t)x);
        b->len += 2;
        return 0;
    }
    if (lei_enc_number(b, x)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
    return 0;
}

/* idx is absolute; depth = number of tables enclosing this value */
static int enc_value(enc_state *st, int idx, unsigned depth) {
    lua_State *L = st->L;
    int t = lua_type(L, idx);

    switch (t) {
    case LUA_TNIL:
        if (lei_enc_nil(st->b)) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
        return 0;
    case LUA_TBOOLEAN:
        if (lei_enc_bool(st->b, lua_toboolean(L, idx))) return enc_fail(st, LEI_E_NOMEM, 0, "out of memory");
        return 0;
    case LUA_TNUMBER: return enc_number(st, lua_tonumber(L, idx));
    case LUA_TSTRING: return enc_string(st, idx);
    case LUA_TTABLE: return enc_table(st, idx, depth);
    case LUA_TUSERDATA: {
        lei_array *a = lei_codec_lua_array_check(L, idx);
        if (a) return enc_array(st, idx, a);
    } /* fall through */
    default: return enc_fail(st, LEI_E_INVALID, 1, "cannot encode a %s", lua_typename(L, t));
    }
}

static void unpin_ref(void *ud, int ref) { luaL_unref((lua_State *)ud, LUA_REGISTRYINDEX, ref); }

/* Encode the value at idx, appending to m. Strings of at least pin_threshold
 * bytes (0 = never) are not copied: m gets a lei_ext holding a registry
 * reference to the string, which the owner of m gives back with
 * lei_msg_release(m, fn calling luaL_unref, ...). lim may be NULL.
 * Returns 0, or the negative of a LEI_E_* code (the kind of failure, set
 * where it happened: NOMEM, LIMIT or INVALID) with a message in err: m is then restored to what it was on
 * entry (own.len, ext) and nothing new stays pinned. The Lua stack is left as
 * it was. Does not raise, except Lua memory errors from luaL_ref. */
int lei_encode_lua(lua_State *L, int idx, lei_msg *m, const lei_codec_limits *lim,
                   size_t pin_threshold, char *err, size_t errlen) {
    return lei_codec_lua_encode(L, idx, m, lim, pin_threshold, err, errlen, NULL);
}

/* lei_encode_lua, and on a failure *why (why may be NULL) says which limit
 * stopped it, set where it was met: LEI_ESIZE (max_value_bytes), else 0. */
int lei_codec_lua_encode(lua_State *L, int idx, lei_msg *m, const lei_codec_limits *lim,
                         size_t pin_threshold, char *err, size_t errlen, int *why) {
    enc_state st;
    lei_codec_limits d;
    int top = lua_gettop(L), ext0 = m->next, rc, i;
    size_t own0 = m->own.len;

    if (!lim) {
        lei_codec_limits_default(&d);
        lim = &d;
    }
    st.L = L;
    st.b = &m->own;
    st.m = m;
    st.max_string = lim->max_string;
    st.max_depth = lim->max_depth > LEI_MAX_DEPTH_CEIL ? LEI_MAX_DEPTH_CEIL : lim->max_depth;
    st.pin = pin_threshold;
    st.size = 0;
    st.max_value = lim->max_value_bytes;
    st.want_path = 0;
    st.code = LEI_E_INVALID;
    st.why = 0;
    st.ptrunc = 0;
    st.pstart = PATH_BUF;
    st.path[PATH_BUF] = '\0';

    if (!lua_checkstack(L, 2)) {
        rc = enc_fail(&st, LEI_E_LIMIT, 0, "Lua stack overflow");
    } else {
        lua_pushvalue(L, idx); /* absolute index, pseudo-indices too */
        rc = enc_value(&st, top + 1, 0);
    }
    lua_settop(L, top);
    if (rc) {
        for (i = ext0; i < m->next; i++) unpin_ref(L, m->ext[i].ref);
        m->next = ext0;
        m->own.len = own0;
        lei_msg_sync(m);
        if (err && errlen) {
            if (st.want_path)
                snprintf(err, errlen, "%s at ev%s%s", st.msg, st.ptrunc ? "..." : "",
                         st.path + st.pstart);
            else
                snprintf(err, errlen, "%s", st.msg);
        }
        if (why) *why = st.why;
        return -st.code;
    }
    lei_msg_sync(m);
    return 0;
}

/* ---- decoder --------------------------------------------------------- */

#define DEC_ARR_HINT (1 << 24) /* createtable hints stay below LuaJIT's caps */
#define DEC_HASH_HINT (1 << 22)

static int dec_table(lua_State *L, lei_reader *r, const lei_item *it, unsigned depth);

/* A decode's state: the reader first (dec_* take the reader and find this
 * around it).  view_min > 0: arrays of at least that many bytes are pushed
 * as views pointing into the input (LEI_AF_VIEW) and listed in the table at
 * stack index vtab (made at the first one). */
typedef struct dec_state {
    lei_reader r;
    size_t view_min;
    int vtab;
} dec_state;

static int dec_array(lua_State *L, lei_reader *r, const lei_item *it) {
    dec_state *ds = (dec_state *)(void *)r;
    lei_array *a;
    if (ds->view_min && it->len >= ds->view_min) {
        a = lei_codec_lua_array_push(L, it->dtype, it->ndim, it->shape, 0, 0);
        a->data = (uint8_t *)it->str;
        a->flags = LEI_AF_VIEW;
        if (lua_isnil(L, ds->vtab)) {
            lua_createtable(L, 1, 0);
            lua_replace(L, ds->vtab);
        }
        lua_pushvalue(L, -1);
        lua_rawseti(L, ds->vtab, (int)lua_objlen(L, ds->vtab) + 1);
        return 0;
    }
    a = lei_codec_lua_array_push(L, it->dtype, it->ndim, it->shape, it->len, 0);
    if (it->len) memcpy(a->data, it->str, it->len);
    return 0;
}

/* Pushes the item just read (a table: decodes its contents too); depth =
 * number of tables enclosing it.  Scalars inline: no call per element. */
static inline int dec_item(lua_State *L, lei_reader *r, const lei_item *it, unsigned depth) {
    switch (it->tag) {
    case LEI_T_NIL: lua_pushnil(L); return 0;
    case LEI_T_FALSE:
    case LEI_T_TRUE: lua_pushboolean(L, it->tag == LEI_T_TRUE); return 0;
    case LEI_T_INT:
    case LEI_T_DOUBLE: lua_pushnumber(L, it->num); return 0;
    case LEI_T_STRING: lua_pushlstring(L, (const char *)it->str, it->len); return 0;
    case LEI_T_ARRAY: return dec_array(L, r, it);
    default: /* LEI_T_TABLE: lei_codec_read_item knows no other tag */ return dec_table(L, r, it, depth);
    }
}

static int dec_table(lua_State *L, lei_reader *r, const lei_item *it, unsigned depth) {
    lei_item e;
    uint64_t i;
    int rc;

    if (depth >= r->max_depth) return LEI_EDEPTH;
    if (!lua_checkstack(L, 4)) return DEC_ESTACK;
    /* counts were checked against the input by lei_codec_read_item.  Presized
     * for at most one slot per four bytes left: nil and booleans take one
     * byte, so 4 MB of nils announced as an array of 4 million made us
     * zero 64 MiB per event (136 ms); a nil never needs its slot, and a
     * table of 1-byte values that outgrows the hint doubles once. */
    size_t left = (r->n - r->pos) / 4 + 1;
    size_t narr = it->narr < left ? (size_t)it->narr : left;
    size_t nhash = it->nhash < left ? (size_t)it->nhash : left;
    lua_createtable(L, narr > DEC_ARR_HINT ? DEC_ARR_HINT : (int)narr,
                    nhash > DEC_HASH_HINT ? DEC_HASH_HINT : (int)nhash);
    /* a nil (array slot or pair value) is read and checked, never pushed */
    for (i = 1; i <= it->narr; i++) {
        if ((rc = lei_codec_read_item(r, &e))) return rc;
        if (e.tag == LEI_T_NIL) continue;
        if ((rc = dec_item(L, r, &e, depth + 1))) return rc;
        if (i <= INT32_MAX)
            lua_rawseti(L, -2, (int)i);
        else {
            lua_pushnumber(L, (double)i);
            lua_insert(L, -2);
            lua_rawset(L, -3);
        }
    }
    for (i = 0; i < it->nhash; i++) {
        if ((rc = lei_codec_read_item(r, &e))) return rc;
        if (lei_codec_bad_key(&e)) return LEI_EKEY;
        if ((rc = dec_item(L, r, &e, depth + 1))) return rc;
        if ((rc = lei_codec_read_item(r, &e))) return rc;
        if (e.tag == LEI_T_NIL) {
            lua_pop(L, 1);
            continue;
        }
        if ((rc = dec_item(L, r, &e, depth + 1))) return rc;
        lua_rawset(L, -3);
    }
    return 0;
}

/* The top value: depth 0, not a key. */
static int dec_value(lua_State *L, lei_reader *r) {
    lei_item it;
    int rc;

    if ((rc = lei_codec_read_item(r, &it))) return rc;
    return dec_item(L, r, &it, 0);
}

/* Decode exactly one value from p[0..n) and push it: 0. On any malformed
 * input push nothing and return the negative of a LEI_E_* code (dec_code:
 * LIMIT, NOMEM or INVALID) with a message in err ("truncated input",
 * "trailing garbage after value (K bytes)", "unknown tag 0x%02x at byte N",
 * "invalid varint", "string too long (N bytes, limit M)", "nesting too deep
 * (limit N)", "table count exceeds input", "nil or NaN table key", "value
 * decodes to more than N bytes": checked before each table is presized or
 * string made, so nothing past max_value_bytes is allocated). lim may be
 * NULL. Later duplicate keys overwrite earlier ones; nil values are skipped.
 * Does not raise, except Lua memory errors (nothing of ours is then held). */
/* The LEI_E_* code of a reader's error (codec.h), decided here where the
 * kind of failure is known, never from the message: past a limit of lim
 * (max_string, max_depth, max_value_bytes) or of the Lua stack: LIMIT; out
 * of memory: NOMEM; bytes that are not a value: INVALID. */
static int dec_code(int rc) {
    switch (rc) {
    case LEI_ESTRLEN:
    case LEI_EDEPTH:
    case LEI_ESIZE:
    case DEC_ESTACK: return LEI_E_LIMIT;
    case LEI_ENOMEM: return LEI_E_NOMEM;
    default: return LEI_E_INVALID;
    }
}

int lei_decode_lua(lua_State *L, const uint8_t *p, size_t n, const lei_codec_limits *lim, char *err,
                   size_t errlen) {
    return lei_decode_lua_views(L, p, n, lim, 0, err, errlen);
}

int lei_decode_lua_views(lua_State *L, const uint8_t *p, size_t n, const lei_codec_limits *lim,
                         size_t view_min, char *err, size_t errlen) {
    dec_state ds;
    lei_reader *rp = &ds.r;
    int top = lua_gettop(L), rc;

    lei_reader_init(rp, p, n, lim);
    ds.view_min = view_min;
    ds.vtab = 0;
    if (!lua_checkstack(L, 5))
        rc = DEC_ESTACK;
    else {
        if (view_min) {
            lua_pushnil(L); /* the views, made at the first one */
            ds.vtab = lua_gettop(L);
        }
        if (!(rc = dec_value(L, rp))) rc = lei_reader_finish(rp);
        if (!rc && view_min) lua_insert(L, -2); /* value, views */
    }
    if (rc) {
        lua_settop(L, top);
        if (err && errlen) {
            if (rc == DEC_ESTACK)
                snprintf(err, errlen, "Lua stack overflow");
            else
                lei_reader_strerror(rp, rc, err, errlen);
        }
        return -dec_code(rc);
    }
    return 0;
}

/* ---- standalone module (tests and benches) --------------------------- */

#define MSGBOX "lecho.codec.msg"

/* opts.views (decode) and opts.count_only (encode): see l_decode, l_encode */
static int opt_flag(lua_State *L, int arg, const char *name) {
    int on;
    if (!lua_istable(L, arg)) return 0;
    lua_getfield(L, arg, name);
    on = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return on;
}

static void opt_limits(lua_State *L, int arg, lei_codec_limits *lim, size_t *pin) {
    static const char *const names[] = {"max_string", "max_depth", "pin_threshold",
                                        "max_value_bytes"};
    int i;

    lei_codec_limits_default(lim);
    if (pin) *pin = 0;
    if (lua_isnoneornil(L, arg)) return;
    luaL_checktype(L, arg, LUA_TTABLE);
    for (i = 0; i < 4; i++) {
        double v;
        lua_getfield(L, arg, names[i]);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : -1;
        if (!(v >= 0)) luaL_error(L, "bad option '%s' (non-negative number expected)", names[i]);
        lua_pop(L, 1);
        if (i == 0)
            lim->max_string = v >= 1.8e19 ? SIZE_MAX : (size_t)v;
        else if (i == 1)
            lim->max_depth = v > LEI_MAX_DEPTH_CEIL ? LEI_MAX_DEPTH_CEIL : (unsigned)v;
        else if (i == 2) {
            if (pin) *pin = v >= 1.8e19 ? SIZE_MAX : (size_t)v;
        } else
            lim->max_value_bytes = v >= 1.8e19 ? SIZE_MAX : (size_t)v;
    }
}

/* The module keeps one lei_msg in a userdata upvalue and reuses it; anything
 * left pinned by an interrupted call is released at the next call or at __gc. */
static void box_reset(lua_State *L, lei_msg *m) {
    int i;
    for (i = 0; i < m->next; i++) unpin_ref(L, m->ext[i].ref);
    m->next = 0;
    m->own.len = 0;
    if (m->own.cap > (1u << 20)) lei_wbuf_free(&m->own);
    lei_msg_sync(m);
}

static int box_gc(lua_State *L) {
    lei_msg **box = luaL_checkudata(L, 1, MSGBOX);
    if (*box) lei_msg_release(*box, unpin_ref, L);
    *box = NULL;
    return 0;
}

/* The name of code (errors.h's list, expanded here: the codec's module
 * links without errors.c). */
/* encode(v [, opts]) -> string | nil, err, code.  opts.count_only: the encoded
 * size instead (what a submit does: pinned slices are not copied). */
static int l_encode(lua_State *L) {
    lei_msg *m = *(lei_msg **)lua_touserdata(L, lua_upvalueindex(1));
    lei_codec_limits lim;
    size_t pin;
    char err[256];

    opt_limits(L, 2, &lim, &pin);
    box_reset(L, m);
    int rc = lei_encode_lua(L, 1, m, &lim, pin, err, sizeof err);
    if (rc) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        lua_pushstring(L, lei_err_name(rc));
        return 3;
    }
    if (opt_flag(L, 2, "count_only")) { /* the event path's work: no flat copy */
        lua_pushnumber(L, (lua_Number)m->total);
        box_reset(L, m);
        return 1;
    }
    if (m->next == 0) {
        lua_pushlstring(L, m->own.data, m->own.len);
    } else {
        luaL_Buffer lb;
        struct iovec iov[16];
        size_t off = 0, cov;
        int cnt, i;
        luaL_buffinit(L, &lb);
        while ((cnt = lei_msg_iov(m, off, iov, 16, &cov)) > 0) {
            for (i = 0; i < cnt; i++) luaL_addlstring(&lb, iov[i].iov_base, iov[i].iov_len);
            off += cov;
        }
        luaL_pushresult(&lb);
    }
    box_reset(L, m);
    return 1;
}

/* decode(s [, opts]) -> true, value | nil, err, code (errors.h's name:
 * "invalid", "limit", "nomem", set where the decoder failed).  opts.views:
 * arrays point into s instead of holding a copy (read-only, each keeps s alive). */
static int l_decode(lua_State *L) {
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    lei_codec_limits lim;
    char err[256];

    opt_limits(L, 2, &lim, NULL);
    int views = opt_flag(L, 2, "views");
    lua_pushboolean(L, 1);
    int rc = lei_decode_lua_views(L, (const uint8_t *)s, n, &lim, views ? 1 : 0, err, sizeof err);
    if (rc) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        lua_pushstring(L, lei_err_name(rc));
        return 3;
    }
    if (views) {
        /* arrays point into s, which each keeps alive; read-only (a Lua
         * string must not change) */
        int vt = lua_gettop(L), i;
        if (lua_istable(L, vt))
            for (i = 1; i <= (int)lua_objlen(L, vt); i++) {
                lua_rawgeti(L, vt, i);
                lei_array *a = lua_touserdata(L, -1);
                a->flags = LEI_AF_READONLY;
                lua_getfenv(L, -1);
                lua_pushvalue(L, 1);
                lua_rawseti(L, -2, 1);
                lua_pop(L, 2);
            }
        lua_pop(L, 1);
    }
    return 2;
}

/* validate(s [, opts]) -> true | nil, err */
static int l_validate(lua_State *L) {
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    lei_codec_limits lim;
    const char *err;

    opt_limits(L, 2, &lim, NULL);
    if (lei_codec_validate((const uint8_t *)s, n, &lim, &err)) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* count_keys(t, len) -> nkeys, nin: the entries of t and how many of their
 * keys are among the integers 1..len (lua/lecho/fastenc.lua, which cannot
 * compile this loop: see there). Raw, metatables ignored. */
static int l_count_keys(lua_State *L) {
    size_t nkeys = 0, nin = 0, len;
    double l;

    luaL_checktype(L, 1, LUA_TTABLE);
    l = luaL_checknumber(L, 2);
    len = l > 0 ? (l < 9e15 ? (size_t)l : (size_t)9e15) : 0;
    lua_settop(L, 2);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        nkeys++;
        nin += is_arr_key(L, -2, len);
        lua_pop(L, 1);
    }
    lua_pushnumber(L, (lua_Number)nkeys);
    lua_pushnumber(L, (lua_Number)nin);
    return 2;
}

/* ---- arrays from Lua (lua/lecho/array.lua builds its API on these) ---- */

static int check_dtype(lua_State *L, int arg) {
    size_t n;
    const char *s = luaL_checklstring(L, arg, &n);
    int dt = lei_dtype_parse(s, n);
    if (dt < 0) luaL_argerror(L, arg, "unknown dtype (<u1 <i1 <u2 <i2 <u4 <i4 <u8 <i8 <f4 <f8)");
    return dt;
}

static int check_shape(lua_State *L, int arg, int64_t *shape) {
    int nd, d;
    luaL_checktype(L, arg, LUA_TTABLE);
    nd = (int)lua_objlen(L, arg);
    if (nd > LEI_ARRAY_MAXDIM) luaL_argerror(L, arg, "more than 8 dimensions");
    for (d = 0; d < nd; d++) {
        double x;
        lua_rawgeti(L, arg, d + 1);
        x = lua_tonumber(L, -1);
        lua_pop(L, 1);
        if (!(x >= 0 && x <= 4611686018427387904.0) || x != (double)(int64_t)x)
            luaL_argerror(L, arg, "dims must be integers >= 0");
        shape[d] = (int64_t)x;
    }
    return nd;
}

static lei_array *check_array(lua_State *L, int arg) {
    lei_array *a = lei_codec_lua_array_check(L, arg);
    if (!a) luaL_typerror(L, arg, "lecho.array");
    return a;
}

/* check_array, raising on an ended view (array.lua's message) */
static lei_array *live_array(lua_State *L, int arg) {
    lei_array *a = check_array(L, arg);
    if (a->flags & LEI_AF_ENDED)
        luaL_error(L, "lecho.array: this array was a view into a received event whose handler has returned: "
                      "its bytes are gone (call a:keep() or a:copy() inside the handler to hold it longer)");
    return a;
}

/* array_new(dtype, shape) -> a zeroed array */
static int l_array_new(lua_State *L) {
    int64_t shape[LEI_ARRAY_MAXDIM];
    int dt = check_dtype(L, 1), nd = check_shape(L, 2, shape);
    uint64_t count, bytes;
    if (lei_shape_bytes(shape, nd, lei_dtype_size(dt), &count, &bytes) || bytes > ((size_t)1 << 40))
        luaL_argerror(L, 2, "shape too large");
    lei_codec_lua_array_push(L, dt, nd, shape, (size_t)bytes, 1);
    return 1;
}

/* array_wrap(owner, dtype, shape) -> an array without elements whose
 * environment keeps owner alive; the caller points data at owner's memory */
static int l_array_wrap(lua_State *L) {
    int64_t shape[LEI_ARRAY_MAXDIM];
    int dt = check_dtype(L, 2), nd = check_shape(L, 3, shape);
    luaL_checkany(L, 1);
    lei_codec_lua_array_push(L, dt, nd, shape, 0, 0);
    lua_getfenv(L, -1);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    lua_pop(L, 1);
    return 1;
}

/* Pushes a view: a new array with header *h (the elements of the array at
 * idx, or part of them) whose environment keeps the array at idx; a view
 * of a received view is listed in its parent's kids, so that it is kept or
 * ended with it.  Raises on out of memory. */
lei_array *lei_codec_lua_array_view(lua_State *L, int idx, const lei_array *h) {
    if (idx < 0) idx = lua_gettop(L) + 1 + idx;
    lei_array *v = lei_codec_lua_array_push(L, h->dtype, 0, NULL, 0, 0);
    *v = *h;
    lua_getfenv(L, -1);
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, 1);
    lua_pop(L, 1);
    if (h->flags & LEI_AF_VIEW) {
        lua_getfenv(L, idx);
        lua_getfield(L, -1, "kids");
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, -1);
            lua_setfield(L, -3, "kids");
        }
        lua_pushvalue(L, -3);
        lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
        lua_pop(L, 2);
    }
    return v;
}

/* array_view(a) -> a copy of a's header sharing its elements (the caller
 * changes shape, strides and data) */
static int l_array_view(lua_State *L) {
    lei_codec_lua_array_view(L, 1, live_array(L, 1));
    return 1;
}

/* An array that keeps no elements any more (as an ended view: a read finds
 * none, never freed memory). */
static void array_end(lei_array *a) {
    a->data = NULL;
    a->count = 0;
    for (int i = 0; i < a->ndim; i++) a->shape[i] = 0;
    a->flags = LEI_AF_ENDED;
}

/* Repoint the view at idx and its kids from [old, old+n) to nw (nw NULL:
 * end them). */
static void rebase(lua_State *L, int idx, const uint8_t *old, size_t n, uint8_t *nw, int depth) {
    lei_array *a = lua_touserdata(L, idx);
    int i, k;
    if (!(a->flags & LEI_AF_VIEW)) return;
    if (nw && a->data && a->data >= old && a->data <= old + n) {
        a->data = nw + (a->data - old);
        a->flags &= ~LEI_AF_VIEW;
    } else {
        array_end(a);
    }
    if (depth > 50 || !lua_checkstack(L, 4)) return;
    lua_getfenv(L, idx);
    lua_getfield(L, -1, "kids");
    if (lua_istable(L, -1)) {
        k = lua_gettop(L);
        for (i = 1; i <= (int)lua_objlen(L, k); i++) {
            lua_rawgeti(L, k, i);
            rebase(L, lua_gettop(L), old, n, nw, depth + 1);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 2);
}

/* array_keep(a): a received view gets its own copy of its bytes (once),
 * and so do the views made from it; array_end(a): a received view and its
 * views lose their elements (the dispatch ended and no handler kept it). */
static void lei_codec_lua_array_keep(lua_State *L, int idx) {
    lei_array *a = lua_touserdata(L, idx);
    size_t n = (size_t)a->count * (size_t)a->itemsize;
    uint8_t *old = a->data, *nw;
    if (!(a->flags & LEI_AF_VIEW) || !old) return;
    if (idx < 0) idx = lua_gettop(L) + 1 + idx;
    if (n > LEI_ARRAY_UD_MAX) luaL_error(L, "array of %zu bytes: more than one Lua object holds", n);
    nw = lua_newuserdata(L, n ? n : 1); /* may raise: a is unchanged */
    memcpy(nw, old, n);
    lua_getfenv(L, idx);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, 1);
    lua_pop(L, 2);
    rebase(L, idx, old, n, nw, 0);
}

/* An adopted read buffer (lei_rbuf_adopt): a userdata holding its
 * address and size, which gives it back when collected (give(L, -1, ...)
 * with its context's object, its environment's [1], on the stack top; or
 * free()).  Owner of the buffer: this userdata. */
#define RBUF_MT "lecho.rbuf"
typedef struct rbox {
    uint8_t *base;
    size_t cap;
    void (*give)(lua_State *L, uint8_t *base, size_t cap);
} rbox;

static int rbox_gc(lua_State *L) {
    rbox *x = lua_touserdata(L, 1);
    uint8_t *b = x->base;
    x->base = NULL;
    if (!b) return 0;
    lua_getfenv(L, 1);
    lua_rawgeti(L, -1, 1);
    if (x->give && !lua_isnil(L, -1))
        x->give(L, b, x->cap);
    else
        free(b);
    return 0;
}

/* The received view at idx kept: without a copy when adopt(ud, data, n,
 * &cap) hands over the buffer its bytes are in (lei_rbuf_adopt:
 * malloc'd, cap bytes, owned from then on by a userdata in the array's
 * environment, which gives it back through give with the object at
 * ctx_idx, the context, when it and the views made from it are collected;
 * they stop being views), else with one (lei_codec_lua_array_keep).  The owner
 * is made before the buffer is asked for, so that nothing that may raise
 * comes between the handing over and its owner.  Returns the size of the
 * buffer adopted (0: copied, or nothing to do): the caller tells the
 * collector of it (a step as for an allocation of that size) when the
 * context has no spare buffer of that size left, so that what the program
 * lets go of is given back before the next large frame needs a buffer.
 * Raises on out of memory, with the view unchanged. */
size_t lei_codec_lua_array_adopt(lua_State *L, int idx, int ctx_idx, lei_adopt_fn adopt,
                         void (*give)(lua_State *L, uint8_t *base, size_t cap), void *ud) {
    lei_array *a = lua_touserdata(L, idx);
    size_t n = (size_t)a->count * (size_t)a->itemsize, cap = 0;
    uint8_t *old = a->data;
    if (!(a->flags & LEI_AF_VIEW) || !old) return 0;
    if (idx < 0) idx = lua_gettop(L) + 1 + idx;
    if (ctx_idx < 0) ctx_idx = lua_gettop(L) + 1 + ctx_idx;
    if (!adopt || n < LEI_ARRAY_ADOPT_MIN) {
        lei_codec_lua_array_keep(L, idx);
        return 0;
    }
    rbox *box = lua_newuserdata(L, sizeof *box);
    memset(box, 0, sizeof *box);
    if (luaL_newmetatable(L, RBUF_MT)) {
        lua_pushcfunction(L, rbox_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, ctx_idx);
    lua_rawseti(L, -2, 1);
    lua_setfenv(L, -2);
    uint8_t *base = adopt(ud, old, n, &cap);
    if (!base) {
        lua_pop(L, 1);
        lei_codec_lua_array_keep(L, idx);
        return 0;
    }
    box->base = base; /* owned by box from here; box by the array (below) */
    box->cap = cap;
    box->give = give;
    lua_getfenv(L, idx);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, 1);
    lua_pop(L, 2);
    rebase(L, idx, old, n, old, 0);
    return cap;
}

static int l_array_keep(lua_State *L) {
    live_array(L, 1);
    lei_codec_lua_array_keep(L, 1);
    return 0;
}

void lei_codec_lua_array_end(lua_State *L, int idx) {
    if (idx < 0) idx = lua_gettop(L) + 1 + idx;
    rebase(L, idx, NULL, 0, NULL, 0);
}

static int l_array_end(lua_State *L) {
    check_array(L, 1);
    lei_codec_lua_array_end(L, 1);
    return 0;
}

/* The array at idx and the views listed in its kids keep no elements
 * (as an ended view: a read finds none, never freed memory). */
static void end_all(lua_State *L, int idx, int depth) {
    lei_array *a = lua_touserdata(L, idx);
    int i, k;
    array_end(a);
    if (depth > 50 || !lua_checkstack(L, 4)) return;
    lua_getfenv(L, idx);
    lua_getfield(L, -1, "kids");
    if (lua_istable(L, -1)) {
        k = lua_gettop(L);
        for (i = 1; i <= (int)lua_objlen(L, k); i++) {
            lua_rawgeti(L, k, i);
            if (lua_touserdata(L, -1)) end_all(L, lua_gettop(L), depth + 1);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 2);
}

/* array_release(a): the read buffer a took over (lei_codec_lua_array_adopt)
 * given back now instead of when a is collected, for an owner that knows
 * nothing else holds a (lecho.capi: the event of a queued consumer, the
 * only consumer of its channel, whose handle was freed: one collection of
 * the whole Lua state per event saved).  a then keeps no elements, as an
 * ended view: should anything still read it, it finds none, never the
 * buffer's next contents.  True when a buffer was given back; false, a
 * left alone, when a holds no adopted buffer. */
static int l_array_release(lua_State *L) {
    lei_array *a = check_array(L, 1);
    rbox *x;
    int is_box = 0;
    lua_settop(L, 1);
    lua_getfenv(L, 1);
    lua_rawgeti(L, 2, 1); /* 3: a's owner */
    x = lua_touserdata(L, 3);
    if (x && !lua_islightuserdata(L, 3) && lua_getmetatable(L, 3)) {
        luaL_getmetatable(L, RBUF_MT);
        is_box = lua_rawequal(L, -1, -2);
        lua_pop(L, 2);
    }
    if (!is_box || !x->base || !a->data || a->data < x->base || a->data > x->base + x->cap) {
        lua_pushboolean(L, 0);
        return 1;
    }
    end_all(L, 1, 0);
    lua_pushcfunction(L, rbox_gc); /* gives it back as the collector would, once */
    lua_pushvalue(L, 3);
    lua_call(L, 1, 0);
    lua_pushboolean(L, 1);
    return 1;
}

/* array_copy(a) -> a new contiguous array holding a's elements */
static int l_array_copy(lua_State *L) {
    lei_array *a = live_array(L, 1), *c;
    size_t n = (size_t)a->count * (size_t)a->itemsize;
    c = lei_codec_lua_array_push(L, a->dtype, a->ndim, a->shape, n, 0);
    lei_array_gather(a, c->data, NULL);
    return 1;
}

static int l_array_mt(lua_State *L) {
    push_array_mt(L);
    return 1;
}

/* Set encode, decode, validate and count_keys into the table on top of the stack; the
 * main lecho module may call this on its own table. */
void lei_codec_lua_setfuncs(lua_State *L) {
    lei_msg **box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    if (luaL_newmetatable(L, MSGBOX)) {
        lua_pushcfunction(L, box_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    if (!(*box = lei_msg_new())) luaL_error(L, "out of memory");
    lua_pushvalue(L, -1);
    lua_pushcclosure(L, l_encode, 1);
    lua_setfield(L, -3, "encode");
    lua_pop(L, 1);
    lua_pushcfunction(L, l_decode);
    lua_setfield(L, -2, "decode");
    lua_pushcfunction(L, l_validate);
    lua_setfield(L, -2, "validate");
    lua_pushcfunction(L, l_count_keys);
    lua_setfield(L, -2, "count_keys");
    static const luaL_Reg arr[] = {{"array_new", l_array_new},   {"array_wrap", l_array_wrap},
                                   {"array_view", l_array_view}, {"array_keep", l_array_keep},
                                   {"array_end", l_array_end},   {"array_copy", l_array_copy},
                                   {"array_mt", l_array_mt},     {"array_release", l_array_release},
                                   {NULL, NULL}};
    for (const luaL_Reg *f = arr; f->name; f++) {
        lua_pushcfunction(L, f->func);
        lua_setfield(L, -2, f->name);
    }
}

__attribute__((visibility("default"))) int luaopen_lecho_codec(lua_State *L) {
    lua_newtable(L);
    lei_codec_lua_setfuncs(L);
    return 1;
}
