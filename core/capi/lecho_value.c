/* lecho_value.c: lecho.h's values (events) in C: a handle holds one Lua
 * value of the context's private state, in a box table { v } kept in the
 * registry; setters and getters go through lua_cpcall (lecho_int.h). */
#include "lecho_int.h"
#include "array.h"
#include "codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- values ---- */

static int op_box(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lua_createtable(L, 1, 0);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

lecho_value *lei_lecho_value_from(lecho_ctx *x, lua_CFunction op, struct op *o) {
    lecho_value *v = lei_lecho_h_new(x, sizeof *v, H_VALUE);
    if (!v) return NULL;
    if (lei_lecho_protect(x, op, o) != 0) {
        lei_lecho_h_free(&v->h);
        return NULL;
    }
    v->h.ref = o->i;
    return v;
}

lecho_value *lecho_value_new(lecho_ctx *x) {
    if (!x) return NULL;
    struct op o = { 0 };
    lecho_value *v = lei_lecho_value_from(x, op_box, &o);
    /* built in C from here (struct lecho_value, cb); out of memory: the
     * Lua slot (nil) serves */
    if (v && lei_enc_nil(&v->enc) == 0) v->cb = 1;
    return v;
}

static int op_release(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    const lecho_value *v = o->a;
    lei_lecho_push_ref(L, v->h.ref);
    lua_rawgeti(L, -1, 2);
    lua_remove(L, -2);
    if (lua_istable(L, -1)) o->rc = lei_lecho_glue_call(L, o->x, "release", 1, NULL);
    return 0;
}

void lecho_value_free(lecho_value *v) {
    /* A borrowed handle (a handler's event, lecho_each's value) is not the
     * caller's: freeing it would unlink the context's list.  No-op. */
    if (!v || v->h.kind == H_BORROWED) return;
    if (v->excl && v->h.ctx && v->h.ctx->L) {
        /* its arrays' read buffers back now (see struct lecho_value); a
         * failure leaves them to the collector, as before */
        struct op o = { .a = v };
        v->excl = 0;
        (void)lei_lecho_protect(v->h.ctx, op_release, &o);
    }
    lei_wbuf_free(&v->enc);
    lei_lecho_h_free(&v->h);
}

/* Pushes the value a value built in C encodes (decoded from enc; v is
 * left as it is). */
static void push_decoded(lua_State *L, const lecho_value *v) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lecho.core");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "decode");
    lua_remove(L, -2);
    lua_pushlstring(L, v->enc.data, v->enc.len);
    lua_call(L, 1, 2); /* true, value | nil, err */
    if (!lua_toboolean(L, -2)) luaL_error(L, "lecho: %s", lua_tostring(L, -1));
    lua_remove(L, -2);
}

void lei_lecho_value_push_sent(lua_State *L, const lecho_value *v) {
    if (v->cb)
        push_decoded(L, v);
    else
        lei_lecho_value_push_slot(L, v);
}

/* In a protected function: a byte-backed v (a sink's event) decoded into
 * its slot, once; anything else is left alone.  May raise (memory). */
static void lei_lecho_value_decode(lua_State *L, const lecho_value *v) {
    if (v->cb) { /* built in C: its bytes decoded into the box, once */
        lecho_value *w = (lecho_value *)v; /* the caller's own handle */
        lei_lecho_push_ref(L, v->h.ref);
        push_decoded(L, v);
        lua_rawseti(L, -2, 1);
        lua_pop(L, 1);
        w->cb = 0;
        lei_wbuf_free(&w->enc);
        return;
    }
    if (!v->bp) return;
    lei_lecho_push_ref(L, v->h.ref); /* the consumer's slot table */
    v->src->decode(v->src, L);       /* value, views (nil: none) */
    lua_rawseti(L, -3, 2);           /* for lei_lecho_value_keep_views */
    lua_rawseti(L, -2, 1);
    lua_pop(L, 1);
    ((lecho_value *)v)->bp = NULL; /* our own handle on the sink's stack */
}

/* Pushes the slot of v, for a read that keeps nothing of it (a getter,
 * lecho_nodes): v->excl stays. */
static void push_slot_peek(lua_State *L, const lecho_value *v) {
    lei_lecho_value_decode(L, v);
    lei_lecho_push_ref(L, v->h.ref);
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
}

/* Pushes the slot of v, for any use: what it holds may be held by others
 * from now on (v->excl cleared). */
void lei_lecho_value_push_slot(lua_State *L, const lecho_value *v) {
    ((lecho_value *)v)->excl = 0;
    push_slot_peek(L, v);
}

void lei_lecho_value_push_opt(lua_State *L, const lecho_value *v) {
    if (v)
        lei_lecho_value_push_slot(L, v);
    else
        lua_pushnil(L);
}

enum { S_NIL, S_BOOL, S_NUMBER, S_STRING, S_NUMBERS, S_TABLE, S_VALUE, S_NODES };

static int build_nodes(struct op *o, lua_State *L, size_t *i, int depth);
static void bv_reader(const lecho_value *v, lei_reader *r);
static int bv_skip_children(lei_reader *r, const lei_item *it, int depth);

/* In a protected function: the arrays of the running handler's event that
 * point into the read buffer (x->views) get their own copy, once, so that
 * a handle made from the event (lecho_set_value, lecho_field) outlives
 * the handler with them.  May raise (memory). */
static void lei_lecho_value_keep_views(lua_State *L, lecho_ctx *x) {
    if (x->views == LUA_NOREF) return;
    if (x->views == LUA_REFNIL) { /* the Lua dispatch: Context:keep_values() */
        lei_lecho_push_ref(L, x->self);
        lua_getfield(L, -1, "keep_values");
        lua_insert(L, -2);
        lua_call(L, 1, 0);
        return;
    }
    lei_lecho_push_ref(L, x->views);
    lua_rawgeti(L, -1, 2);
    if (lua_istable(L, -1)) {
        int vt = lua_gettop(L), nv = (int)lua_objlen(L, vt);
        lua_getglobal(L, "require");
        lua_pushliteral(L, "lecho.core");
        lua_call(L, 1, 1);
        lua_getfield(L, -1, "array_keep");
        for (int i = 1; i <= nv; i++) {
            lua_pushvalue(L, -1);
            lua_rawgeti(L, vt, i);
            lua_call(L, 1, 0); /* a view already kept is left alone */
        }
        lua_pop(L, 2);
        lua_pushnil(L);
        lua_rawseti(L, -3, 2); /* kept: nothing left to end */
    }
    lua_pop(L, 2);
}

int lei_lecho_value_target(lua_State *L, struct op *o, const char *not_table) {
    const lecho_value *v = o->a;
    lei_lecho_value_decode(L, v);
    lei_lecho_push_ref(L, v->h.ref);
    int box = lua_gettop(L);
    if (o->key) {
        lua_rawgeti(L, box, 1);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, -1);
            lua_rawseti(L, box, 1);
        } else if (!lua_istable(L, -1)) {
            o->rc = lei_lecho_fail(o->x, LECHO_EINVAL, not_table);
            return 0;
        }
        lua_pushstring(L, o->key);
    }
    return box;
}

static int op_set(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    int box = lei_lecho_value_target(L, o, "lecho_set: the value is not a table");
    if (!box) return 0;
    switch (o->kind) {
    case S_NIL: lua_pushnil(L); break;
    case S_BOOL: lua_pushboolean(L, o->i); break;
    case S_NUMBER: lua_pushnumber(L, o->d); break;
    case S_STRING: lua_pushlstring(L, o->s ? o->s : "", o->n); break;
    case S_NUMBERS:
        lua_createtable(L, o->n > 0x7fffffff ? 0x7fffffff : (int)o->n, 0);
        for (size_t i = 0; i < o->n; i++) {
            lua_pushnumber(L, o->nums[i]);
            lua_rawseti(L, -2, (int)(i + 1));
        }
        break;
    case S_TABLE: lua_newtable(L); break;
    case S_NODES: {
        size_t i = 0;
        if ((o->rc = build_nodes(o, L, &i, 0)) != 0) return 0;
        if (i != o->n) {
            o->rc = lei_lecho_fail(o->x, LECHO_EINVAL, "lecho_set_nodes: nodes left over after the value");
            return 0;
        }
        break;
    }
    default:
        lei_lecho_value_push_slot(L, o->b);
        /* a handler's event (or part of it) stored past the handler keeps
         * its arrays received in place */
        if (((const lecho_value *)o->b)->h.kind == H_BORROWED) lei_lecho_value_keep_views(L, o->x);
        break;
    }
    if (o->key)
        lua_rawset(L, -3);
    else
        lua_rawseti(L, box, 1);
    return 0;
}

/* ---- values built in C (struct lecho_value, cb) ---- */

/* b[at, at + del) replaced by ins[0..n).  0, or -1 out of memory (b unchanged). */
static int splice(lei_wbuf *b, size_t at, size_t del, const void *ins, size_t n) {
    if (n > del && lei_wbuf_reserve(b, n - del)) return -1;
    memmove(b->data + at + n, b->data + at + del, b->len - at - del);
    if (n) memcpy(b->data + at, ins, n); /* ins may be NULL when n is 0 */
    b->len = b->len - del + n;
    return 0;
}

/* A setter on a value built in C: 1 done (*rc its result), 0 when it
 * takes the Lua path (what the encoding here does not hold: numbers
 * lists, nested values set from handles, long strings, arrays, nodes). */
static int cb_set(lecho_value *v, const char *key, const struct op *o, int *rc) {
    lei_wbuf val = { 0 };
    int e;
    *rc = 0;
    switch (o->kind) {
    case S_NIL: e = lei_enc_nil(&val); break;
    case S_BOOL: e = lei_enc_bool(&val, o->i); break;
    case S_NUMBER: e = lei_enc_number(&val, o->d); break;
    case S_STRING:
        if (o->n >= 4096) return 0; /* long: the Lua path pins it, no copy per submit */
        e = lei_enc_string(&val, o->s ? o->s : "", o->n);
        break;
    case S_TABLE: e = lei_enc_table_header(&val, 0, 0); break;
    default: return 0;
    }
    if (e) {
        lei_wbuf_free(&val);
        *rc = lei_lecho_fail(v->h.ctx, LECHO_ENOMEM, "out of memory");
        return 1;
    }
    lei_wbuf *b = &v->enc;
    if (!key) {
        b->len = 0;
        e = lei_wbuf_put(b, val.data, val.len);
        lei_wbuf_free(&val);
        if (e) *rc = lei_lecho_fail(v->h.ctx, LECHO_ENOMEM, "out of memory");
        return 1;
    }
    /* a field: the slot holds nil (a new table) or a table of pairs */
    lei_reader r;
    lei_item it;
    bv_reader(v, &r);
    if (lei_codec_read_item(&r, &it) || (it.tag != LEI_T_NIL && it.tag != LEI_T_TABLE) ||
        (it.tag == LEI_T_TABLE && it.narr != 0)) {
        lei_wbuf_free(&val);
        if (it.tag == LEI_T_TABLE) return 0;
        *rc = lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set: the value is not a table");
        return 1;
    }
    uint64_t nhash = it.tag == LEI_T_TABLE ? it.nhash : 0;
    size_t hl = it.tag == LEI_T_TABLE ? r.pos : b->len; /* the header's bytes (or the nil's) */
    size_t kl = strlen(key), found = 0, fk = 0, fv = 0, fe = 0;
    for (uint64_t i = 0; i < nhash; i++) {
        lei_item k, c;
        size_t kat = r.pos;
        if (lei_codec_read_item(&r, &k) || bv_skip_children(&r, &k, 1)) goto lua;
        size_t vat = r.pos;
        if (lei_codec_read_item(&r, &c) || bv_skip_children(&r, &c, 1)) goto lua;
        if (k.tag == LEI_T_STRING && k.len == kl && memcmp(k.str, key, kl) == 0) {
            found = 1;
            fk = kat;
            fv = vat;
            fe = r.pos;
        }
    }
    int is_nil = o->kind == S_NIL;
    if (found && is_nil) {
        e = splice(b, fk, fe - fk, NULL, 0); /* t[key] = nil: the pair goes */
        nhash--;
    } else if (found)
        e = splice(b, fv, fe - fv, val.data, val.len);
    else if (!is_nil) {
        lei_wbuf pair = { 0 };
        e = lei_enc_string(&pair, key, kl) || lei_wbuf_put(&pair, val.data, val.len) ||
            splice(b, b->len, 0, pair.data, pair.len);
        lei_wbuf_free(&pair);
        nhash++;
    } else
        e = 0;
    if (!e) {
        lei_wbuf h = { 0 };
        e = lei_enc_table_header(&h, 0, nhash) || splice(b, 0, hl, h.data, h.len);
        lei_wbuf_free(&h);
    }
    lei_wbuf_free(&val);
    /* a failed splice leaves enc as it was, or with the pair changed and
     * the old header: then the encoding is not trusted any more */
    if (e) {
        *rc = lei_lecho_fail(v->h.ctx, LECHO_ENOMEM, "out of memory");
        b->len = 0;
        lei_enc_nil(b);
    }
    return 1;
lua:
    lei_wbuf_free(&val);
    return 0;
}

/* What cb_set's encodings are (struct lecho_value, cb): no string longer
 * than the whole; tables two deep at most (a field set to an empty table);
 * decoded, by codec.h's charges, at most 64 + 24 bytes per byte: a pair of
 * n bytes (n >= 3: a key of k bytes, 2 + k, and its value) costs two slots
 * (32) and its key (24 + k), plus 24 + v for a string value (n >= 4 + k +
 * v) or 64 for an empty table (n = 5 + k), so at most 24n; the header (one
 * table, 64) takes at least 3 bytes.  32 per byte leaves a margin. */
void lei_lecho_value_bounds(const lecho_value *v, lb_bounds *bd) {
    size_t n = v->enc.len;
    bd->longest = n;
    bd->tables = n && (uint8_t)v->enc.data[0] == LEI_T_TABLE ? 2 : 0;
    bd->decoded = n <= ((size_t)-1 - 64) / 32 ? 64 + 32 * n : (size_t)-1;
}

static int set(lecho_value *v, const char *key, struct op *o) {
    if (!v) return LECHO_EINVAL;
    int rc;
    if (v->cb && cb_set(v, key, o, &rc)) return rc;
    o->a = v;
    o->key = key;
    return lei_lecho_protect(v->h.ctx, op_set, o);
}

int lecho_set_nil(lecho_value *v, const char *key) {
    struct op o = { .kind = S_NIL };
    return set(v, key, &o);
}

int lecho_set_bool(lecho_value *v, const char *key, int b) {
    struct op o = { .kind = S_BOOL, .i = b != 0 };
    return set(v, key, &o);
}

int lecho_set_number(lecho_value *v, const char *key, double d) {
    struct op o = { .kind = S_NUMBER, .d = d };
    return set(v, key, &o);
}

int lecho_set_string(lecho_value *v, const char *key, const char *s, size_t len) {
    if (!s && len > 0) return v ? lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_string: s is NULL") : LECHO_EINVAL;
    struct op o = { .kind = S_STRING, .s = s, .n = len };
    return set(v, key, &o);
}

int lecho_set_numbers(lecho_value *v, const char *key, const double *x, size_t n) {
    if (!x && n > 0) return v ? lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_numbers: x is NULL") : LECHO_EINVAL;
    if (n > 0x7fffffff) return LECHO_ELIMIT;
    struct op o = { .kind = S_NUMBERS, .nums = x, .n = n };
    return set(v, key, &o);
}

int lecho_set_table(lecho_value *v, const char *key) {
    struct op o = { .kind = S_TABLE };
    return set(v, key, &o);
}

int lecho_set_value(lecho_value *v, const char *key, const lecho_value *from) {
    if (!v || !from || from->h.ctx != v->h.ctx) return LECHO_EINVAL;
    struct op o = { .kind = S_VALUE, .b = from };
    return set(v, key, &o);
}

/* Pushes the slot of o->a, or its field o->key (nil when not a table). */
static void push_get(lua_State *L, struct op *o) {
    push_slot_peek(L, o->a);
    if (!o->key) return;
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_pushnil(L);
        return;
    }
    lua_pushstring(L, o->key);
    lua_rawget(L, -2);
    lua_remove(L, -2);
}

enum { G_TYPE, G_NUMBER, G_BOOL, G_STRING, G_LEN, G_NUMBERS };

static int op_get(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    push_get(L, o);
    int t = lua_type(L, -1);
    switch (o->kind) {
    case G_TYPE:
        o->i = t == LUA_TNIL ? LECHO_TNIL : t == LUA_TBOOLEAN ? LECHO_TBOOLEAN
             : t == LUA_TNUMBER ? LECHO_TNUMBER : t == LUA_TSTRING ? LECHO_TSTRING
             : t == LUA_TTABLE ? LECHO_TTABLE : LECHO_TOTHER;
        if (t == LUA_TUSERDATA && lua_getmetatable(L, -1)) { /* a lecho.array? */
            luaL_getmetatable(L, LEI_ARRAY_MT);
            if (lua_rawequal(L, -1, -2)) o->i = LECHO_TARRAY;
            lua_pop(L, 2);
        }
        break;
    case G_NUMBER:
        if (t == LUA_TNUMBER)
            o->d = lua_tonumber(L, -1);
        else
            o->rc = t == LUA_TNIL ? LECHO_ENOTFOUND : LECHO_EINVAL;
        break;
    case G_BOOL:
        if (t == LUA_TBOOLEAN)
            o->i = lua_toboolean(L, -1);
        else
            o->rc = t == LUA_TNIL ? LECHO_ENOTFOUND : LECHO_EINVAL;
        break;
    case G_STRING:
        /* The string stays anchored by the box or the table it is in. */
        if (t == LUA_TSTRING) o->str = lua_tolstring(L, -1, &o->n);
        break;
    case G_LEN:
        o->n = t == LUA_TTABLE ? lua_objlen(L, -1) : 0;
        break;
    default:
        o->n = t == LUA_TTABLE ? lua_objlen(L, -1) : 0;
        for (size_t i = 0; i < o->n && i < o->idx && i < 0x7fffffff; i++) {
            lua_rawgeti(L, -1, (int)(i + 1));
            o->out[i] = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : NAN;
            lua_pop(L, 1);
        }
        break;
    }
    return 0;
}

/* ---- byte-backed values (a C sink's event, read in place) ----
 * The bytes were checked against the context's limits before the handler
 * (lua_sink.c), so the reader here runs without limits of its own; any
 * reader error still only sends the getter to the Lua path (BV_LUA). */

enum { BV_FOUND = 0, BV_MISSING = 1, BV_LUA = -1 };

static void bv_reader(const lecho_value *v, lei_reader *r) {
    static const lei_codec_limits open = { (size_t)-1, LEI_MAX_DEPTH_CEIL, (size_t)-1 };
    if (v->cb)
        lei_reader_init(r, (const uint8_t *)v->enc.data, v->enc.len, &open);
    else
        lei_reader_init(r, v->bp, v->bn, &open);
}

/* Skips what follows the header item it (a table's children). */
static int bv_skip_children(lei_reader *r, const lei_item *it, int depth) {
    if (it->tag != LEI_T_TABLE) return 0;
    if (depth > (int)LEI_MAX_DEPTH_CEIL) return -1;
    uint64_t n = it->narr + 2 * it->nhash;
    for (uint64_t i = 0; i < n; i++) {
        lei_item c;
        if (lei_codec_read_item(r, &c) || bv_skip_children(r, &c, depth + 1)) return -1;
    }
    return 0;
}

/* The item of v's slot (key NULL) or of its string field key (the last
 * pair with that key, as a decode into a table keeps).  BV_FOUND with *it
 * (a table's header: *r is at its children), BV_MISSING (not a table, or
 * no such field), BV_LUA (unreadable here). */
static int bv_find(const lecho_value *v, const char *key, lei_item *it, lei_reader *r) {
    bv_reader(v, r);
    if (lei_codec_read_item(r, it)) return BV_LUA;
    if (!key) return BV_FOUND;
    if (it->tag != LEI_T_TABLE) return BV_MISSING;
    size_t kl = strlen(key);
    uint64_t narr = it->narr, nhash = it->nhash;
    for (uint64_t i = 0; i < narr; i++) {
        lei_item c;
        if (lei_codec_read_item(r, &c) || bv_skip_children(r, &c, 1)) return BV_LUA;
    }
    int found = BV_MISSING;
    lei_reader at;
    for (uint64_t i = 0; i < nhash; i++) {
        lei_item k, c;
        if (lei_codec_read_item(r, &k) || bv_skip_children(r, &k, 1)) return BV_LUA;
        int hit = k.tag == LEI_T_STRING && k.len == kl && memcmp(k.str, key, kl) == 0;
        if (lei_codec_read_item(r, &c)) return BV_LUA;
        if (hit) {
            *it = c;
            at = *r;
            found = BV_FOUND;
        }
        if (bv_skip_children(r, &c, 1)) return BV_LUA;
    }
    if (found == BV_FOUND) *r = at;
    return found;
}

/* For lecho_len and lecho_get_numbers: the table's array part as Lua's #
 * sees it, when that is plainly narr (its last element not nil, no number
 * keys among the pairs); else BV_LUA.  *r is left at the first element. */
static int bv_array_part(const lecho_value *v, const char *key, lei_reader *r, size_t *n) {
    lei_item it;
    int f = bv_find(v, key, &it, r);
    if (f == BV_MISSING || (f == BV_FOUND && it.tag != LEI_T_TABLE)) {
        *n = 0;
        return BV_MISSING;
    }
    if (f == BV_LUA) return BV_LUA;
    lei_reader start = *r;
    for (uint64_t i = 0; i < it.narr; i++) {
        lei_item c;
        if (lei_codec_read_item(r, &c) || bv_skip_children(r, &c, 1)) return BV_LUA;
        if (i + 1 == it.narr && c.tag == LEI_T_NIL) return BV_LUA;
    }
    for (uint64_t i = 0; i < it.nhash; i++) {
        lei_item k, c;
        if (lei_codec_read_item(r, &k) || k.tag == LEI_T_INT || k.tag == LEI_T_DOUBLE ||
            bv_skip_children(r, &k, 1) || lei_codec_read_item(r, &c) || bv_skip_children(r, &c, 1))
            return BV_LUA;
    }
    *r = start;
    *n = (size_t)it.narr;
    return BV_FOUND;
}

static int bv_type(int tag) {
    switch (tag) {
    case LEI_T_NIL: return LECHO_TNIL;
    case LEI_T_FALSE: case LEI_T_TRUE: return LECHO_TBOOLEAN;
    case LEI_T_INT: case LEI_T_DOUBLE: return LECHO_TNUMBER;
    case LEI_T_STRING: return LECHO_TSTRING;
    case LEI_T_TABLE: return LECHO_TTABLE;
    default: return LECHO_TARRAY;
    }
}

/* n bytes of x's scratch (8-aligned), or NULL. */
static char *scratch_alloc(lecho_ctx *x, size_t n) {
    struct lei_scratch *c = x->scratch;
    n = (n + 7) & ~(size_t)7;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 4096 ? n : 4096;
        if (!(c = malloc(sizeof *c + cap))) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = x->scratch;
        x->scratch = c; /* owned by x (struct lei_scratch) */
    }
    char *p = c->data + c->used;
    c->used += n;
    return p;
}

void lei_lecho_value_scratch_reset(lecho_ctx *x, int all) {
    struct lei_scratch *c = x->scratch, *keep = NULL;
    while (c) {
        struct lei_scratch *nx = c->next;
        if (!all && !keep && c->cap == 4096) {
            keep = c;
            keep->used = 0;
            keep->next = NULL;
        } else
            free(c);
        c = nx;
    }
    x->scratch = keep;
}

/* The getters on a byte-backed value: 1 when answered here (*o filled as
 * op_get would), 0 to take the Lua path. */
static int bv_get(const lecho_value *v, const char *key, struct op *o) {
    lei_reader r;
    lei_item it;
    if (o->kind == G_LEN || o->kind == G_NUMBERS) {
        size_t n;
        int f = bv_array_part(v, key, &r, &n);
        if (f == BV_LUA) return 0;
        o->n = n;
        for (size_t i = 0; o->kind == G_NUMBERS && i < n && i < o->idx; i++) {
            lei_item c;
            if (lei_codec_read_item(&r, &c) || bv_skip_children(&r, &c, 1)) return 0;
            o->out[i] = c.tag == LEI_T_INT || c.tag == LEI_T_DOUBLE ? c.num : NAN;
        }
        return 1;
    }
    int f = bv_find(v, key, &it, &r);
    if (f == BV_LUA) return 0;
    int tag = f == BV_MISSING ? LEI_T_NIL : it.tag;
    switch (o->kind) {
    case G_TYPE: o->i = bv_type(tag); break;
    case G_NUMBER:
        if (tag == LEI_T_INT || tag == LEI_T_DOUBLE)
            o->d = it.num;
        else
            o->rc = tag == LEI_T_NIL ? LECHO_ENOTFOUND : LECHO_EINVAL;
        break;
    case G_BOOL:
        if (tag == LEI_T_TRUE || tag == LEI_T_FALSE)
            o->i = tag == LEI_T_TRUE;
        else
            o->rc = tag == LEI_T_NIL ? LECHO_ENOTFOUND : LECHO_EINVAL;
        break;
    case G_STRING:
        if (v->cb) return 0; /* built in C: valid while v holds it, so the Lua string */
        if (tag == LEI_T_STRING) {
            /* NUL-terminated: a copy in the scratch, valid until the
             * handler returns (lecho.h: "until the handler returns") */
            char *s = scratch_alloc(v->h.ctx, it.len + 1);
            if (!s) return 0;
            memcpy(s, it.str, it.len);
            s[it.len] = '\0';
            o->str = s;
            o->n = it.len;
        }
        break;
    default: return 0;
    }
    return 1;
}

int lei_lecho_value_bytes_array(const lecho_value *v, const char *key, lecho_array_info *out) {
    lei_reader r;
    lei_item it;
    int f = bv_find(v, key, &it, &r);
    if (f == BV_LUA) return -1;
    if (f == BV_MISSING || it.tag == LEI_T_NIL) return LECHO_ENOTFOUND;
    if (it.tag != LEI_T_ARRAY) return LECHO_EINVAL;
    size_t isz = lei_dtype_size(it.dtype);
    /* at an odd offset: the Lua path moves it once into memory of its own */
    if (!isz || (it.len && (uintptr_t)it.str % isz)) return -1;
    memset(out, 0, sizeof *out);
    out->data = it.len ? it.str : NULL;
    out->dtype = lei_dtype_name(it.dtype);
    out->ndim = it.ndim;
    out->count = 1;
    for (int d = 0; d < it.ndim; d++) {
        out->shape[d] = (size_t)it.shape[d];
        out->count *= (size_t)it.shape[d];
    }
    out->itemsize = isz;
    if (!it.len) out->data = NULL;
    return 0;
}

static int get(const lecho_value *v, const char *key, struct op *o) {
    if (!v) return LECHO_EINVAL;
    if (v->bp || v->cb) {
        o->a = v;
        if (bv_get(v, key, o)) return o->rc;
        o->rc = 0;
    }
    o->a = v;
    o->key = key;
    return lei_lecho_protect(v->h.ctx, op_get, o);
}

int lecho_type(const lecho_value *v, const char *key) {
    if (v && !key && (v->bp || v->cb)) {
        /* the value itself, in bytes checked (a sink's event) or built
         * well formed: its first byte's tag says it (a read of the whole
         * item and a struct op cost ~230 instructions per event) */
        const uint8_t *p = v->bp ? v->bp : (const uint8_t *)v->enc.data;
        size_t n = v->bp ? v->bn : v->enc.len;
        if (n) return bv_type(p[0]);
    }
    struct op o = { .kind = G_TYPE };
    return get(v, key, &o) == 0 ? o.i : LECHO_TNIL;
}

int lecho_get_number(const lecho_value *v, const char *key, double *out) {
    if (!out) return LECHO_EINVAL;
    struct op o = { .kind = G_NUMBER };
    int rc = get(v, key, &o);
    if (rc == 0) *out = o.d;
    return rc;
}

int lecho_get_bool(const lecho_value *v, const char *key, int *out) {
    if (!out) return LECHO_EINVAL;
    struct op o = { .kind = G_BOOL };
    int rc = get(v, key, &o);
    if (rc == 0) *out = o.i;
    return rc;
}

const char *lecho_get_string(const lecho_value *v, const char *key, size_t *len) {
    struct op o = { .kind = G_STRING };
    if (get(v, key, &o) != 0 || !o.str) return NULL;
    if (len) *len = o.n;
    return o.str;
}

size_t lecho_len(const lecho_value *v, const char *key) {
    struct op o = { .kind = G_LEN };
    return get(v, key, &o) == 0 ? o.n : 0;
}

size_t lecho_get_numbers(const lecho_value *v, const char *key, double *out, size_t max) {
    if (!out) max = 0;   /* nothing copied: the count */
    struct op o = { .kind = G_NUMBERS, .out = out, .idx = max };
    return get(v, key, &o) == 0 ? o.n : 0;
}

static int op_field(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_value_push_slot(L, o->a);
    if (!lua_istable(L, -1)) {
        o->rc = LECHO_EINVAL;
        return 0;
    }
    /* the new handle may outlive a handler's event: its arrays kept */
    if (((const lecho_value *)o->a)->h.kind == H_BORROWED) lei_lecho_value_keep_views(L, o->x);
    lua_createtable(L, 1, 0);
    if (o->key)
        lua_getfield(L, -2, o->key);
    else
        lua_rawgeti(L, -2, (int)(o->idx + 1));
    lua_rawseti(L, -2, 1);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

lecho_value *lecho_field(const lecho_value *v, const char *key, size_t index) {
    if (!v || (!key && index >= 0x7fffffff)) return NULL;
    struct op o = { .a = v, .key = key, .idx = index };
    return lei_lecho_value_from(v->h.ctx, op_field, &o);
}

struct each_args {
    int (*fn)(const char *, const lecho_value *, void *);           /* lecho_each */
    int (*pfn)(const lecho_value *, const lecho_value *, void *);   /* lecho_pairs */
    void *ud;
};

/* A borrowed handle (on the caller's stack, not linked) on the value at idx. */
static void borrow(lua_State *L, lecho_ctx *x, int idx, lecho_value *tmp) {
    *tmp = (lecho_value){ .h = { x, LUA_NOREF, H_BORROWED, NULL, NULL } };
    lua_pushvalue(L, idx);
    lua_createtable(L, 1, 0);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    tmp->h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

static int op_each(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    const struct each_args *e = o->b;
    lei_lecho_value_push_slot(L, o->a);
    int t = lua_gettop(L);
    if (!lua_istable(L, t)) return 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (e->pfn || lua_type(L, -2) == LUA_TSTRING) {
            lecho_value key, val;
            borrow(L, o->x, -2, &key);
            borrow(L, o->x, -1, &val);
            /* As in a handler: what would run the loop or close the
             * context under this traversal is refused (in_handler). */
            o->x->in_handler++;
            int r = e->pfn ? e->pfn(&key, &val, e->ud) : e->fn(lua_tostring(L, -2), &val, e->ud);
            o->x->in_handler--;
            luaL_unref(L, LUA_REGISTRYINDEX, key.h.ref);
            luaL_unref(L, LUA_REGISTRYINDEX, val.h.ref);
            if (r) {
                o->rc = r;
                return 0;
            }
        }
        lua_pop(L, 1);
    }
    return 0;
}

int lecho_each(const lecho_value *v, int (*fn)(const char *, const lecho_value *, void *),
               void *ud) {
    if (!v || !fn) return LECHO_EINVAL;
    struct each_args e = { fn, NULL, ud };
    struct op o = { .a = v, .b = &e };
    return lei_lecho_protect(v->h.ctx, op_each, &o);
}

int lecho_pairs(const lecho_value *v, int (*fn)(const lecho_value *, const lecho_value *, void *),
                void *ud) {
    if (!v || !fn) return LECHO_EINVAL;
    struct each_args e = { NULL, fn, ud };
    struct op o = { .a = v, .b = &e };
    return lei_lecho_protect(v->h.ctx, op_each, &o);
}

static int op_show(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_value_push_slot(L, o->a);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "show", 1, &b)) != 0) return 0;
    char *s = lei_lecho_dupstr(lua_tostring(L, b));
    if (!s) {
        o->rc = LECHO_ENOMEM;
        return 0;
    }
    free(o->x->show);
    o->x->show = s;
    return 0;
}

const char *lecho_to_string(const lecho_value *v) {
    if (!v) return "(no value)";
    struct op o = { .a = v };
    if (lei_lecho_protect(v->h.ctx, op_show, &o) != 0) return "?";
    return v->h.ctx->show;
}


/* ---- a whole value as nodes (lecho_nodes, lecho_set_nodes) ---- */

/* Deeper than this is a table that holds itself, or no event: the codec's
 * max_depth is 100 by default. */
#define NODES_MAX_DEPTH 200

/* Index of a new zeroed node at the end of x->nodes (grown as needed), or
 * (size_t)-1 when out of memory.  Indices, not pointers: growing moves it. */
static size_t node_add(lecho_ctx *x, size_t *count) {
    if (*count == x->nodes_cap) {
        size_t cap = x->nodes_cap ? 2 * x->nodes_cap : 64;
        lecho_node *n = realloc(x->nodes, cap * sizeof *n);
        if (!n) return (size_t)-1;
        x->nodes = n;
        x->nodes_cap = cap;
    }
    memset(&x->nodes[*count], 0, sizeof x->nodes[0]);
    return (*count)++;
}

/* Appends the nodes of the value at absolute stack index idx. */
static int walk_nodes(lecho_ctx *x, lua_State *L, int idx, int depth, size_t *count) {
    size_t at = node_add(x, count);
    if (at == (size_t)-1) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    lecho_node *nd = &x->nodes[at];
    switch (lua_type(L, idx)) {
    case LUA_TNIL: nd->type = LECHO_TNIL; return 0;
    case LUA_TBOOLEAN:
        nd->type = LECHO_TBOOLEAN;
        nd->num = lua_toboolean(L, idx);
        return 0;
    case LUA_TNUMBER:
        nd->type = LECHO_TNUMBER;
        nd->num = lua_tonumber(L, idx);
        return 0;
    case LUA_TSTRING:
        nd->type = LECHO_TSTRING;
        nd->str = lua_tolstring(L, idx, &nd->n);
        return 0;
    case LUA_TTABLE: break;
    case LUA_TUSERDATA: {
        lecho_array_info info;
        int r = lei_lecho_array_node(x, L, idx, &info);
        if (r < 0) return LECHO_EINVAL;
        if (r == 0) break;
        if (x->narrays == x->arrays_cap) {
            size_t cap = x->arrays_cap ? 2 * x->arrays_cap : 8;
            lecho_array_info *a = realloc(x->arrays, cap * sizeof *a);
            if (!a) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
            x->arrays = a;
            x->arrays_cap = cap;
        }
        nd = &x->nodes[at];
        nd->type = LECHO_TARRAY;
        nd->str = info.data;
        nd->n = info.count * info.itemsize;
        nd->len = x->narrays; /* the index, made a pointer once the walk is done */
        x->arrays[x->narrays++] = info;
        return 0;
    }
    default: break;
    }
    if (lua_type(L, idx) != LUA_TTABLE)
        return lei_lecho_fail(x, LECHO_EINVAL, "lecho_nodes: a value an event cannot hold (a function, ...)");
    nd->type = LECHO_TTABLE;
    if (depth >= NODES_MAX_DEPTH)
        return lei_lecho_fail(x, LECHO_ELIMIT, "lecho_nodes: tables nested deeper than 200");
    if (!lua_checkstack(L, 4)) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    /* The array part: elements 1.. up to the first nil (Lua's # may stop
     * past a hole: what follows it is listed with its keys below). */
    size_t len = 0, pairs = 0, max = lua_objlen(L, idx);
    int rc;
    for (size_t i = 1; i <= max; i++) {
        lua_rawgeti(L, idx, (int)i);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            break;
        }
        rc = walk_nodes(x, L, lua_gettop(L), depth + 1, count);
        lua_pop(L, 1);
        if (rc) return rc;
        len++;
    }
    pairs = len;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) == LUA_TNUMBER) {
            lua_Number k = lua_tonumber(L, -2);
            if (k >= 1 && k <= (lua_Number)len && k == (lua_Number)(size_t)k) {
                lua_pop(L, 1);
                continue;
            }
        }
        int top = lua_gettop(L);
        if ((rc = walk_nodes(x, L, top - 1, depth + 1, count)) != 0 ||
            (rc = walk_nodes(x, L, top, depth + 1, count)) != 0)
            return rc;
        lua_pop(L, 1);
        pairs++;
    }
    x->nodes[at].n = pairs;
    x->nodes[at].len = len;
    return 0;
}

static int op_nodes(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    push_get(L, o);
    size_t count = 0;
    o->x->narrays = 0;
    o->rc = walk_nodes(o->x, L, lua_gettop(L), 0, &count);
    o->n = count;
    if (o->rc == 0 && o->x->narrays)
        for (size_t i = 0; i < count; i++)
            if (o->x->nodes[i].type == LECHO_TARRAY) {
                o->x->nodes[i].array = &o->x->arrays[o->x->nodes[i].len];
                o->x->nodes[i].len = 0;
            }
    return 0;
}

int lecho_nodes(const lecho_value *v, const char *key, const lecho_node **nodes, size_t *count) {
    if (nodes) *nodes = NULL;
    if (count) *count = 0;
    if (!v || !nodes || !count) return LECHO_EINVAL;
    struct op o = { .a = v, .key = key };
    int rc = lei_lecho_protect(v->h.ctx, op_nodes, &o);
    if (rc != 0) return rc;
    *nodes = v->h.ctx->nodes;
    *count = o.n;
    return 0;
}

int lecho_nodes_packed(const lecho_value *v, const char *key, const lecho_node **nodes, size_t *count,
                       const char **bytes, size_t *nbytes) {
    if (bytes) *bytes = NULL;
    if (nbytes) *nbytes = 0;
    if (!bytes || !nbytes) return LECHO_EINVAL;
    int rc = lecho_nodes(v, key, nodes, count);
    if (rc != 0) return rc;
    lecho_ctx *x = v->h.ctx;
    size_t total = 0;
    for (size_t i = 0; i < *count; i++)
        if (x->nodes[i].type == LECHO_TSTRING) {
            if (x->nodes[i].n + 1 > (size_t)-1 - total) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
            total += x->nodes[i].n + 1;
        }
    /* Bounded by the largest value read lately: a buffer grown by a huge
     * string shrinks once values are small again. */
    if (x->packed_cap > ((size_t)4 << 20) && total <= ((size_t)1 << 20)) {
        free(x->packed);
        x->packed = NULL;
        x->packed_cap = 0;
    }
    if (total > x->packed_cap) {
        char *p = realloc(x->packed, total);
        if (!p) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
        x->packed = p;
        x->packed_cap = total;
    }
    size_t at = 0;
    for (size_t i = 0; i < *count; i++) {
        lecho_node *nd = &x->nodes[i];
        if (nd->type != LECHO_TSTRING) continue;
        memcpy(x->packed + at, nd->str, nd->n);
        x->packed[at + nd->n] = 0;
        nd->str = x->packed + at;
        at += nd->n + 1;
    }
    *bytes = x->packed;
    *nbytes = total;
    return 0;
}

/* Pushes the value whose nodes begin at o->nums' node *i (o->res: the
 * nodes, o->n: their count), advancing *i past them. */
static int build_nodes(struct op *o, lua_State *L, size_t *i, int depth) {
    const lecho_node *nodes = o->res;
    if (*i >= o->n) return lei_lecho_fail(o->x, LECHO_EINVAL, "lecho_set_nodes: the nodes end inside a table");
    const lecho_node *nd = &nodes[(*i)++];
    char msg[96];
    switch (nd->type) {
    case LECHO_TNIL: lua_pushnil(L); return 0;
    case LECHO_TBOOLEAN: lua_pushboolean(L, nd->num != 0); return 0;
    case LECHO_TNUMBER: lua_pushnumber(L, nd->num); return 0;
    case LECHO_TSTRING:
        if (!nd->str && nd->n > 0) break;
        lua_pushlstring(L, nd->str ? nd->str : "", nd->n);
        return 0;
    case LECHO_TTABLE: {
        if (depth >= NODES_MAX_DEPTH)
            return lei_lecho_fail(o->x, LECHO_ELIMIT, "lecho_set_nodes: tables nested deeper than 200");
        if (nd->len > nd->n || nd->n > o->n) break;
        if (!lua_checkstack(L, 4)) return lei_lecho_fail(o->x, LECHO_ENOMEM, "out of memory");
        size_t len = nd->len, n = nd->n;
        lua_createtable(L, len > 0x7fffffff ? 0x7fffffff : (int)len, (int)(n - len > 0x7fffffff ? 0 : n - len));
        int t = lua_gettop(L), rc;
        for (size_t k = 1; k <= len; k++) {
            if ((rc = build_nodes(o, L, i, depth + 1)) != 0) return rc;
            lua_rawseti(L, t, (int)k);
        }
        for (size_t k = len; k < n; k++) {
            size_t at = *i;
            if ((rc = build_nodes(o, L, i, depth + 1)) != 0) return rc;
            if (lua_isnil(L, -1) || (lua_type(L, -1) == LUA_TNUMBER && lua_tonumber(L, -1) != lua_tonumber(L, -1))) {
                snprintf(msg, sizeof msg, "lecho_set_nodes: a nil or NaN key at node %zu", at);
                return lei_lecho_fail(o->x, LECHO_EINVAL, msg);
            }
            if ((rc = build_nodes(o, L, i, depth + 1)) != 0) return rc;
            lua_rawset(L, t);
        }
        return 0;
    }
    default: break;
    }
    snprintf(msg, sizeof msg, "lecho_set_nodes: bad node %zu", *i - 1);
    return lei_lecho_fail(o->x, LECHO_EINVAL, msg);
}

int lecho_set_nodes(lecho_value *v, const char *key, const lecho_node *nodes, size_t count) {
    if (!v || (!nodes && count > 0)) return LECHO_EINVAL;
    struct op o = { .kind = S_NODES, .res = (void *)nodes, .n = count };
    return set(v, key, &o);
}
