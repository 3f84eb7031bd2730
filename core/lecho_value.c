/* lecho_value.c: lecho.h's values (events) in C: a handle holds one Lua
 * value of the context's private state, in a box table { v } kept in the
 * registry; setters and getters go through lua_cpcall (lecho_int.h). */
#include "lecho_int.h"
#include "array.h"

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

lecho_value *lei_api_value_from(lecho_ctx *x, lua_CFunction op, struct op *o) {
    lecho_value *v = lei_api_h_new(x, sizeof *v, H_VALUE);
    if (!v) return NULL;
    if (lei_api_protect(x, op, o) != 0) {
        lei_api_h_free(&v->h);
        return NULL;
    }
    v->h.ref = o->i;
    return v;
}

lecho_value *lecho_value_new(lecho_ctx *x) {
    if (!x) return NULL;
    struct op o = { 0 };
    return lei_api_value_from(x, op_box, &o);
}

void lecho_value_free(lecho_value *v) {
    /* A borrowed handle (a handler's event, lecho_each's value) is not the
     * caller's: freeing it would unlink the context's list.  No-op. */
    if (v && v->h.kind != H_BORROWED) lei_api_h_free(&v->h);
}

/* Pushes the slot of v. */
void lei_api_push_slot(lua_State *L, const lecho_value *v) {
    lei_api_push_ref(L, v->h.ref);
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
}

enum { S_NIL, S_BOOL, S_NUMBER, S_STRING, S_NUMBERS, S_TABLE, S_VALUE };

static int op_set(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    const lecho_value *v = o->a;
    lei_api_push_ref(L, v->h.ref);
    int box = lua_gettop(L);
    if (o->key) {
        lua_rawgeti(L, box, 1);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, -1);
            lua_rawseti(L, box, 1);
        } else if (!lua_istable(L, -1)) {
            o->rc = lei_api_fail(o->x, LECHO_EINVAL, "lecho_set: the value is not a table");
            return 0;
        }
        lua_pushstring(L, o->key);
    }
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
    default: lei_api_push_slot(L, o->b); break;
    }
    if (o->key)
        lua_rawset(L, -3);
    else
        lua_rawseti(L, box, 1);
    return 0;
}

static int set(lecho_value *v, const char *key, struct op *o) {
    if (!v) return LECHO_EINVAL;
    o->a = v;
    o->key = key;
    return lei_api_protect(v->h.ctx, op_set, o);
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
    if (!s && len > 0) return v ? lei_api_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_string: s is NULL") : LECHO_EINVAL;
    struct op o = { .kind = S_STRING, .s = s, .n = len };
    return set(v, key, &o);
}

int lecho_set_numbers(lecho_value *v, const char *key, const double *x, size_t n) {
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
    lei_api_push_slot(L, o->a);
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

static int get(const lecho_value *v, const char *key, struct op *o) {
    if (!v) return LECHO_EINVAL;
    o->a = v;
    o->key = key;
    return lei_api_protect(v->h.ctx, op_get, o);
}

int lecho_type(const lecho_value *v, const char *key) {
    struct op o = { .kind = G_TYPE };
    return get(v, key, &o) == 0 ? o.i : LECHO_TNIL;
}

int lecho_get_number(const lecho_value *v, const char *key, double *out) {
    struct op o = { .kind = G_NUMBER };
    int rc = get(v, key, &o);
    if (rc == 0) *out = o.d;
    return rc;
}

int lecho_get_bool(const lecho_value *v, const char *key, int *out) {
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
    struct op o = { .kind = G_NUMBERS, .out = out, .idx = max };
    return get(v, key, &o) == 0 ? o.n : 0;
}

static int op_field(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_api_push_slot(L, o->a);
    if (!lua_istable(L, -1)) {
        o->rc = LECHO_EINVAL;
        return 0;
    }
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
    return lei_api_value_from(v->h.ctx, op_field, &o);
}

struct each_args {
    int (*fn)(const char *, const lecho_value *, void *);           /* lecho_each */
    int (*pfn)(const lecho_value *, const lecho_value *, void *);   /* lecho_pairs */
    void *ud;
};

/* A borrowed handle (on the caller's stack, not linked) on the value at idx. */
static void borrow(lua_State *L, lecho_ctx *x, int idx, lecho_value *tmp) {
    tmp->h = (struct lei_h){ x, LUA_NOREF, H_BORROWED, NULL, NULL };
    lua_pushvalue(L, idx);
    lua_createtable(L, 1, 0);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    tmp->h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

static int op_each(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    const struct each_args *e = o->b;
    lei_api_push_slot(L, o->a);
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
    return lei_api_protect(v->h.ctx, op_each, &o);
}

int lecho_pairs(const lecho_value *v, int (*fn)(const lecho_value *, const lecho_value *, void *),
                void *ud) {
    if (!v || !fn) return LECHO_EINVAL;
    struct each_args e = { NULL, fn, ud };
    struct op o = { .a = v, .b = &e };
    return lei_api_protect(v->h.ctx, op_each, &o);
}

static int op_show(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_api_push_slot(L, o->a);
    int b;
    if ((o->rc = lei_api_glue_call(L, o->x, "show", 1, &b)) != 0) return 0;
    char *s = lei_api_dupstr(lua_tostring(L, b));
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
    if (lei_api_protect(v->h.ctx, op_show, &o) != 0) return "?";
    return v->h.ctx->show;
}

