/* lecho.c: liblecho, the public C API of lecho.h.
 *
 * Each lecho_ctx owns a private LuaJIT state that loads the Lua layer
 * (`require "lecho.capi"`, which requires "lecho") and drives it: the control
 * plane (name server, managers, joins, modulator lists) is Lua, reached
 * through lua/lecho/capi.lua; this file never reaches into core/transport/ctx.h.  The
 * data plane of an async submit is C: lecho_submit hands the value to the
 * producer's handle through core.so's table of functions (lb_dataplane,
 * core/binding/lua_prod.h: liblecho is not linked with the core), which
 * encodes it and queues it without calling a Lua function; a consumer's C
 * handler gets its channel's async events from the core's event hook
 * (sink_event).  Every Lua call goes through one protected call
 * (lei_lecho_protect), so a Lua error (memory included) becomes a code and a
 * message, never a longjmp past the caller.
 *
 * Handles keep their Lua object in the registry (h.ref); values are in
 * lecho_value.c, the shared structs in lecho_int.h.
 */
#include "errors.h"
#include "lecho_int.h"

#include <lualib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef LECHO_LUA_DIR
#define LECHO_LUA_DIR "/usr/local/share/lua/5.1"
#endif
#ifndef LECHO_LUA_CDIR
#define LECHO_LUA_CDIR "/usr/local/lib/lua/5.1"
#endif

/* lecho.h's LECHO_E* codes are errors.h's LEI_E_* under public names: the
 * same numbers, so a code passes between the two unchanged and one table
 * (errors.c) names them.  Each row of errors.h's list names its public
 * code; a row whose public code is missing or numbered otherwise, or a
 * public code past the list (the last one's successor is LEI_E_MAX), stops
 * the build here. */
#define LECHO_SAME(pub, core) _Static_assert((int)(pub) == (int)(core), #pub " must equal " #core)
LECHO_SAME(LECHO_OK, LEI_OK);
#define LECHO_SAME_ROW(code, name, text, pub) LECHO_SAME(LECHO_##pub, LEI_E_##code);
LEI_ERRDEF(LECHO_SAME_ROW)
#undef LECHO_SAME_ROW
LECHO_SAME(LECHO_ENOCONSUMER + 1, LEI_E_MAX);
#undef LECHO_SAME

const char *lecho_strerror(int code) {
    if (code == LECHO_OK) return "success";
    return code > 0 && code < LEI_E_MAX ? lei_err_name(code) : "unknown";
}

/* The code a Lua error code name stands for ("timeout", ...: the name the
 * Lua layer carried from where the error happened, never read from a
 * message); LECHO_EFAILED for anything else. */
static int code_named(const char *name) {
    int code = name ? lei_err_code(name, strlen(name)) : 0;
    return code ? code : LECHO_EFAILED;
}

const char *lecho_errmsg(const lecho_ctx *x) {
    return x ? x->err : "";
}

int lei_lecho_fail(lecho_ctx *x, int code, const char *msg) {
    snprintf(x->err, sizeof x->err, "%s", msg);
    return code;
}

char *lei_lecho_dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- handles ---- */

void *lei_lecho_h_new(lecho_ctx *x, size_t size, int kind) {
    struct lei_h *h = calloc(1, size);
    if (!h) return NULL;
    h->ctx = x;
    h->ref = LUA_NOREF;
    h->kind = kind;
    h->next = x->handles;
    if (h->next) h->next->prev = h;
    x->handles = h;
    return h;
}

void lei_lecho_h_free(struct lei_h *h) {
    lecho_ctx *x = h->ctx;
    if (x->L) luaL_unref(x->L, LUA_REGISTRYINDEX, h->ref);
    if (h->prev)
        h->prev->next = h->next;
    else
        x->handles = h->next;
    if (h->next) h->next->prev = h->prev;
    free(h);
}

/* Frees what a channel handle owns besides its head (the kind-specific half
 * of freeing it: lei_lecho_h_free sees only the head). */
static void channel_fini(lecho_channel *ch) {
    free(ch->asked);
    free(ch->name);
}

/* Frees what a consumer handle owns besides its head: its channel name and
 * the registry slot of its sink's events (x->L NULL: the state is gone). */
static void consumer_fini(lecho_consumer *c) {
    free(c->chan);
    c->chan = NULL;
    if (c->h.ctx->L && c->slot != LUA_NOREF) luaL_unref(c->h.ctx->L, LUA_REGISTRYINDEX, c->slot);
    c->slot = LUA_NOREF;
}

/* ---- protected calls ---- */

/* The one C function lei_lecho_protect calls through lua_pcall: runs the
 * op's function with the op as its first argument, as lua_cpcall would. */
static int api_tramp(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    return o->fn(L);
}

/* Runs f(op) protected on the current thread; a raised error becomes a code
 * and its message. */
int lei_lecho_protect(lecho_ctx *x, lua_CFunction f, struct op *o) {
    o->x = x;
    o->rc = 0;
    o->fn = f;
    int top = lua_gettop(x->L);
    int rc;
    if (x->tramp != LUA_NOREF) {
        lua_rawgeti(x->L, LUA_REGISTRYINDEX, x->tramp);
        lua_pushlightuserdata(x->L, o);
        rc = lua_pcall(x->L, 1, 0, 0);
    } else {
        rc = lua_cpcall(x->L, f, o);
    }
    if (rc != 0) {
        const char *m = lua_tostring(x->L, -1);
        lei_lecho_fail(x, rc == LUA_ERRMEM ? LECHO_ENOMEM : LECHO_EFAILED, m ? m : "error");
        lua_settop(x->L, top);
        return rc == LUA_ERRMEM ? LECHO_ENOMEM : LECHO_EFAILED;
    }
    return o->rc;
}

/* In a protected function: calls lecho.capi's `name` with the nargs values
 * on top.  Its results are left from index *base on; 0, or the code of
 * nil, message, code (the message in x->err). */
int lei_lecho_glue_call(lua_State *L, lecho_ctx *x, const char *name, int nargs, int *base) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, x->glue);
    lua_getfield(L, -1, name);
    lua_replace(L, -2);
    lua_insert(L, -(nargs + 1));
    int b = lua_gettop(L) - nargs;
    lua_call(L, nargs, LUA_MULTRET);
    if (base) *base = b;
    if (lua_isnil(L, b)) {
        const char *m = lua_tostring(L, b + 1);
        return lei_lecho_fail(x, code_named(lua_tostring(L, b + 2)), m ? m : "failed");
    }
    return 0;
}

void lei_lecho_push_ref(lua_State *L, int ref) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
}

/* ---- contexts ---- */

struct open_args {
    const char *const *opts;
    lecho_ctx *x;
};

static void prepend_path(lua_State *L, const char *field, const char *fmt, const char *dir) {
    lua_getglobal(L, "package");
    lua_getfield(L, -1, field);
    const char *old = lua_tostring(L, -1);
    if (strcmp(field, "path") == 0)
        lua_pushfstring(L, fmt, dir, dir, old ? old : "");
    else
        lua_pushfstring(L, fmt, dir, old ? old : "");
    lua_setfield(L, -3, field);
    lua_pop(L, 2);
}

static int op_open(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lecho_ctx *x = o->x;
    const char *const *opts = o->a;
    const char *dir = getenv("LECHO_LUA_DIR");
    const char *cdir = getenv("LECHO_LUA_CDIR");
    if (!cdir) cdir = dir ? dir : LECHO_LUA_CDIR;
    if (!dir) dir = LECHO_LUA_DIR;
    luaL_openlibs(L);
    prepend_path(L, "path", "%s/?.lua;%s/?/init.lua;%s", dir);
    prepend_path(L, "cpath", "%s/?.so;%s", cdir);
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lecho.capi");
    lua_call(L, 1, 1);
    x->glue = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushcfunction(L, api_tramp);
    x->tramp = luaL_ref(L, LUA_REGISTRYINDEX);
    /* lecho.capi loaded lecho.core: its data plane table */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lecho.core");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "dataplane");
    if (lua_isfunction(L, -1)) {
        lua_call(L, 0, 1);
        x->dp = lua_touserdata(L, -1);
    }
    lua_pop(L, 2);
    lua_newtable(L);
    for (int i = 0; opts && opts[i]; i += 2) {
        if (!opts[i + 1]) {
            o->rc = lei_lecho_fail(x, LECHO_EINVAL, "lecho_open: an option name without a value");
            return 0;
        }
        lua_pushstring(L, opts[i]);
        lua_rawseti(L, -2, i + 1);
        lua_pushstring(L, opts[i + 1]);
        lua_rawseti(L, -2, i + 2);
    }
    int b;
    if ((o->rc = lei_lecho_glue_call(L, x, "open", 1, &b)) != 0) return 0;
    x->addr = lei_lecho_dupstr(lua_tostring(L, b + 1));
    x->ns = lei_lecho_dupstr(lua_tostring(L, b + 2));
    lua_pushvalue(L, b);
    x->self = luaL_ref(L, LUA_REGISTRYINDEX);
    if (!x->addr || !x->ns) o->rc = lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    return 0;
}

static void ctx_free(lecho_ctx *x) {
    while (x->handles) {
        struct lei_h *h = x->handles;
        x->handles = h->next;
        if (h->kind == H_CHANNEL) channel_fini((lecho_channel *)h);
        if (h->kind == H_CONSUMER) free(((lecho_consumer *)h)->chan);
        if (h->kind == H_VALUE) lei_wbuf_free(&((lecho_value *)h)->enc);
        free(h);
    }
    if (x->L0) lua_close(x->L0);
    free(x->addr);
    free(x->ns);
    free(x->show);
    free(x->nodes);
    free(x->packed);
    free(x->arrays);
    lei_lecho_value_scratch_reset(x, 1);
    free(x);
}

int lecho_open(const char *const *opts, lecho_ctx **out, char *err, size_t errlen) {
    if (!out) {
        if (err && errlen) snprintf(err, errlen, "lecho_open: out is NULL");
        return LECHO_EINVAL;
    }
    *out = NULL;
    lecho_ctx *x = calloc(1, sizeof *x);
    if (!x || !(x->L0 = luaL_newstate())) {
        free(x);
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return LECHO_ENOMEM;
    }
    x->L = x->L0;
    x->glue = x->self = x->tramp = x->views = LUA_NOREF;
    x->blocks = 1;
    for (int i = 0; opts && opts[i] && opts[i + 1]; i += 2)
        if (strcmp(opts[i], "policy") == 0) x->blocks = strcmp(opts[i + 1], "block") == 0;
    struct op o = { .a = opts };
    int rc = lei_lecho_protect(x, op_open, &o);
    if (rc != 0) {
        if (err && errlen) snprintf(err, errlen, "%s", x->err);
        ctx_free(x);
        return rc;
    }
    *out = x;
    return 0;
}

static int op_close(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, o->x->self);
    lua_pushnumber(L, o->d);
    o->rc = lei_lecho_glue_call(L, o->x, o->s ? o->s : "close", 2, NULL);
    return 0;
}

/* A timeout or a linger that is NaN: refused (LECHO_EINVAL with the
 * message) by every call that takes one, before anything is done; a NaN
 * compared as "< 0" or "> 0" is neither, so the Lua layer waited forever
 * on it (lecho_consumer_wait) or took it for another value. */
static int nan_time(lecho_ctx *x, double d, const char *what) {
    if (!isnan(d)) return 0;
    char msg[96];
    snprintf(msg, sizeof msg, "%s is NaN (a number of seconds, or < 0)", what);
    return x ? lei_lecho_fail(x, LECHO_EINVAL, msg) : LECHO_EINVAL;
}

int lecho_close(lecho_ctx *x, double linger) {
    return lecho_close_err(x, linger, NULL, 0);
}

int lecho_close_err(lecho_ctx *x, double linger, char *err, size_t errlen) {
    /* A refused linger frees nothing: the context stays open and usable
     * (as a close refused in a handler), and the caller closes it again. */
    if (x && isnan(linger)) return lecho_close_keep(x, linger, err, errlen);
    int rc = lecho_close_keep(x, linger, err, errlen);
    if (x && !x->in_handler) ctx_free(x);   /* in a handler: refused, nothing freed */
    return rc;
}

void lecho_close_free(lecho_ctx *x) {
    if (x) ctx_free(x);
}

int lecho_close_keep(lecho_ctx *x, double linger, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!x) return 0;
    if (x->in_handler || isnan(linger)) {
        if (x->in_handler)
            lei_lecho_fail(x, LECHO_EINVAL, "lecho_close: not from a consumer handler or a lecho_each callback");
        else
            nan_time(x, linger, "lecho_close: linger");
        if (err && errlen) snprintf(err, errlen, "%s", x->err);
        return LECHO_EINVAL;
    }
    /* The events submitted to this context's own consumers run first,
     * within the linger, while the handlers are still here (they were
     * freed unseen: outside attack s8 D); an error here is close's to say. */
    struct op lo = { .d = linger, .s = "close_local" };
    (void)lei_lecho_protect(x, op_close, &lo);
    /* No handler runs once closing started: the trampolines find no consumer. */
    for (struct lei_h *h = x->handles; h; h = h->next)
        if (h->kind == H_CONSUMER) {
            if (((lecho_consumer *)h)->box) ((lecho_consumer *)h)->box->c = NULL;
            if (((lecho_consumer *)h)->sink) ((lecho_consumer *)h)->sink->c = NULL;
        }
        else if (h->kind == H_SERVICE)
            ((lecho_service *)h)->box->s = NULL;
    struct op o = { .d = linger };
    int rc = lei_lecho_protect(x, op_close, &o);
    if (rc != 0 && err && errlen) snprintf(err, errlen, "%s", x->err);
    return rc;
}

const char *lecho_address(const lecho_ctx *x) {
    return x ? x->addr : NULL;
}

const char *lecho_nameserver(const lecho_ctx *x) {
    return x ? x->ns : NULL;
}


/* ---- the loop ---- */

static int op_loop(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, o->x->self);
    if (o->kind) { /* run_once */
        lua_pushnumber(L, o->d);
        o->rc = lei_lecho_glue_call(L, o->x, o->s, 2, NULL);
    } else {
        o->rc = lei_lecho_glue_call(L, o->x, o->s, 1, NULL);
    }
    return 0;
}

int lecho_run(lecho_ctx *x) {
    if (!x) return LECHO_EINVAL;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_run: not from a consumer handler");
    struct op o = { .s = "run" };
    return lei_lecho_protect(x, op_loop, &o);
}

int lecho_run_once(lecho_ctx *x, double timeout) {
    if (!x) return LECHO_EINVAL;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_run_once: not from a consumer handler");
    if (isnan(timeout)) return nan_time(x, timeout, "lecho_run_once: timeout");
    struct op o = { .s = "run_once", .kind = 1, .d = timeout };
    return lei_lecho_protect(x, op_loop, &o);
}

/* The Lua side's view of lecho_set_interrupt's fn: true ends the wait. */
static int l_interrupted(lua_State *L) {
    lecho_ctx *x = lua_touserdata(L, lua_upvalueindex(1));
    lua_pushboolean(L, x->intr_fn && x->intr_fn(x->intr_ud) != 0);
    return 1;
}

static int op_interrupt(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, o->x->self);
    if (o->x->intr_fn) {
        lua_pushlightuserdata(L, o->x);
        lua_pushcclosure(L, l_interrupted, 1);
    } else {
        lua_pushnil(L);
    }
    o->rc = lei_lecho_glue_call(L, o->x, "set_interrupt", 2, NULL);
    return 0;
}

int lecho_set_interrupt(lecho_ctx *x, int (*fn)(void *ud), void *ud) {
    if (!x) return LECHO_EINVAL;
    x->intr_fn = fn;
    x->intr_ud = ud;
    struct op o = { .s = "set_interrupt" };
    return lei_lecho_protect(x, op_interrupt, &o);
}

int lecho_stop(lecho_ctx *x) {
    if (!x) return LECHO_EINVAL;
    struct op o = { .s = "stop" };
    return lei_lecho_protect(x, op_loop, &o);
}

/* ---- channels, producers, consumers ---- */

static int op_channel(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    struct lecho_channel *ch = o->res;
    lei_lecho_push_ref(L, o->x->self);
    lua_pushstring(L, o->s);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "channel", 2, &b)) != 0) return 0;
    ch->name = lei_lecho_dupstr(lua_tostring(L, b + 1));
    lua_pushvalue(L, b);
    ch->h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

lecho_channel *lecho_channel_get(lecho_ctx *x, const char *name) {
    if (!x || !name) return NULL;
    for (struct lei_h *h = x->handles; h; h = h->next)
        if (h->kind == H_CHANNEL && strcmp(((lecho_channel *)h)->asked, name) == 0)
            return (lecho_channel *)h;
    lecho_channel *ch = lei_lecho_h_new(x, sizeof *ch, H_CHANNEL);
    if (!ch) return NULL;
    struct op o = { .s = name, .res = ch };
    int rc = (ch->asked = lei_lecho_dupstr(name)) ? lei_lecho_protect(x, op_channel, &o) : LECHO_ENOMEM;
    if (rc != 0 || !ch->name) {
        /* Only a failed copy is "out of memory"; a refused name keeps its reason. */
        if (rc == LECHO_ENOMEM || (rc == 0 && !ch->name)) lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
        channel_fini(ch);
        lei_lecho_h_free(&ch->h);
        return NULL;
    }
    return ch;
}

const char *lecho_channel_name(const lecho_channel *ch) {
    return ch ? ch->name : NULL;
}

static int op_producer(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const lecho_channel *)o->a)->h.ref);
    if (o->s)
        lua_pushstring(L, o->s);
    else
        lua_pushnil(L);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "producer", 2, &b)) != 0) return 0;
    lua_rawgeti(L, b, 1); /* the Lua producer's handle (lecho.producer's slot H) */
    o->res = lua_touserdata(L, -1);
    lua_pop(L, 1);
    lua_pushvalue(L, b);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_producer_open(lecho_channel *ch, const char *policy, lecho_producer **out) {
    if (out) *out = NULL;
    if (!ch || !out) return LECHO_EINVAL;
    lecho_ctx *x = ch->h.ctx;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_producer_open: not from a consumer handler");
    lecho_producer *p = lei_lecho_h_new(x, sizeof *p, H_PRODUCER);
    if (!p) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    struct op o = { .a = ch, .s = policy };
    int rc = lei_lecho_protect(x, op_producer, &o);
    if (rc != 0) {
        lei_lecho_h_free(&p->h);
        return rc;
    }
    p->h.ref = o.i;
    p->ph = x->dp ? o.res : NULL;
    p->blocks = policy ? strcmp(policy, "block") == 0 : x->blocks;
    *out = p;
    return 0;
}

static int op_submit(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const lecho_producer *)o->a)->h.ref);
    lei_lecho_value_push_sent(L, o->b);
    if (o->kind == 0) {
        o->rc = lei_lecho_glue_call(L, o->x, "submit", 2, NULL);
        return 0;
    }
    lua_pushnumber(L, o->d);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "submit_sync", 3, &b)) == 0 || !lua_istable(L, b + 3))
        return 0;
    /* The per-consumer list: build the caller's lecho_errors. */
    struct lecho_errors *e = calloc(1, sizeof *e);
    if (!e) return 0;
    size_t n = lua_objlen(L, b + 3) / 4;
    e->f = calloc(4 * n + 1, sizeof *e->f);
    const char *text = lua_tostring(L, b + 1);
    e->text = lei_lecho_dupstr(text ? text : "");
    int ok = e->f && e->text;
    for (size_t i = 0; ok && i < 4 * n; i++) {
        lua_rawgeti(L, b + 3, (int)(i + 1));
        const char *f = lua_tostring(L, -1);
        ok = (e->f[i] = lei_lecho_dupstr(f ? f : "")) != NULL;
        lua_pop(L, 1);
    }
    if (!ok) {
        lecho_errors_free(e);
        return 0;
    }
    e->n = n;
    o->res = e;
    return 0;
}

/* The data plane: the value handed to the producer's handle in C (protected
 * only against Lua memory errors while pinning a long string).  o->rc is
 * LB_PROD_SLOW when the Lua path must do it (it waits for room). */
static int op_submit_fast(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lecho_ctx *x = o->x;
    lei_lecho_value_push_slot(L, o->b);
    o->rc = x->dp->submit(((const lecho_producer *)o->a)->ph, L, lua_gettop(L), x->err, sizeof x->err);
    return 0;
}

int lecho_submit(lecho_producer *p, const lecho_value *ev) {
    if (!p || !ev || ev->h.ctx != p->h.ctx) return LECHO_EINVAL;
    lecho_ctx *x = p->h.ctx;
    /* A wait for room cannot suspend a C handler (and a failed one would
     * leave the producer's queue of waiting submits inconsistent). */
    if (x->in_handler && p->blocks)
        return lei_lecho_fail(x, LECHO_EINVAL, "lecho_submit: not from a consumer handler "
                            "with a producer under the block policy (it may have to wait)");
    if (p->ph && ev->cb && x->dp->submit_bytes) {
        /* built in C: its bytes to the core, no Lua state touched, the
         * limits checked from what the value is by construction */
        lb_bounds bd;
        lei_lecho_value_bounds(ev, &bd);
        int rc = x->dp->submit_bytes(p->ph, (const uint8_t *)ev->enc.data, ev->enc.len, &bd, x->err,
                                     sizeof x->err);
        if (rc != LB_PROD_SLOW) return rc;
    }
    struct op o = { .a = p, .b = ev };
    if (p->ph && !ev->cb) {
        int rc = lei_lecho_protect(x, op_submit_fast, &o);
        if (rc != LB_PROD_SLOW) return rc;
    }
    return lei_lecho_protect(x, op_submit, &o);
}

int lecho_submit_sync(lecho_producer *p, const lecho_value *ev, double timeout,
                      lecho_errors **errs) {
    if (errs) *errs = NULL;
    if (!p || !ev || ev->h.ctx != p->h.ctx) return LECHO_EINVAL;
    lecho_ctx *x = p->h.ctx;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_submit_sync: not from a consumer handler");
    if (isnan(timeout)) return nan_time(x, timeout, "lecho_submit_sync: timeout");
    struct op o = { .a = p, .b = ev, .kind = 1, .d = timeout };
    int rc = lei_lecho_protect(x, op_submit, &o);
    if (errs)
        *errs = o.res;
    else
        lecho_errors_free(o.res);
    return rc;
}

static int op_simple(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const struct lei_h *)o->a)->ref);
    o->rc = lei_lecho_glue_call(L, o->x, o->s, 1, NULL);
    return 0;
}

int lecho_flush(lecho_producer *p) {
    if (!p) return LECHO_EINVAL;
    struct op o = { .a = p, .s = "flush" };
    return lei_lecho_protect(p->h.ctx, op_simple, &o);
}

void lecho_producer_close(lecho_producer *p) {
    if (!p) return;
    struct op o = { .a = p, .s = "producer_close" };
    lei_lecho_protect(p->h.ctx, op_simple, &o);
    lei_lecho_h_free(&p->h);
}

size_t lecho_errors_count(const lecho_errors *e) {
    return e ? e->n : 0;
}

static const char *err_field(const lecho_errors *e, size_t i, int k) {
    return e && i < e->n ? e->f[4 * i + k] : NULL;
}

const char *lecho_errors_context(const lecho_errors *e, size_t i) {
    return err_field(e, i, 0);
}

const char *lecho_errors_consumer(const lecho_errors *e, size_t i) {
    return err_field(e, i, 1);
}

const char *lecho_errors_message(const lecho_errors *e, size_t i) {
    return err_field(e, i, 2);
}

int lecho_errors_code(const lecho_errors *e, size_t i) {
    const char *name = err_field(e, i, 3);
    return name ? code_named(name) : LECHO_OK;
}

const char *lecho_errors_text(const lecho_errors *e) {
    return e ? e->text : NULL;
}

void lecho_errors_free(lecho_errors *e) {
    if (!e) return;
    for (size_t i = 0; e->f && e->f[i]; i++) free(e->f[i]);
    free(e->f);
    free(e->text);
    free(e);
}

/* The consumer's Lua handler (through lecho.capi): runs the C handler in the
 * coroutine the loop gave it, with ctx->L switched to that coroutine so that
 * what the handler calls runs there.  Returns the handler's message, if any. */
static int trampoline(lua_State *L) {
    struct cbox *box = lua_touserdata(L, lua_upvalueindex(1));
    lecho_consumer *c = box->c;
    if (!c) return 0;
    lecho_ctx *x = c->h.ctx;
    lecho_value ev = { .h = { x, LUA_NOREF, H_BORROWED, NULL, NULL } };
    lecho_meta m = { "", "", 0 };
    if (lua_istable(L, 2)) {
        lua_getfield(L, 2, "channel");
        lua_getfield(L, 2, "producer");
        lua_getfield(L, 2, "seq");
        m.channel = lua_isstring(L, -3) ? lua_tostring(L, -3) : "";
        m.producer = lua_isstring(L, -2) ? lua_tostring(L, -2) : "";
        m.seq = lua_tonumber(L, -1);
    }
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    ev.h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_State *saved = x->L;
    int saved_views = x->views;
    x->L = L;
    x->views = LUA_REFNIL; /* the Lua dispatch's views: ctx:keep_values() */
    x->in_handler++;
    const char *err = c->fn(&ev, &m, c->ud);
    x->in_handler--;
    x->L = saved;
    x->views = saved_views;
    luaL_unref(L, LUA_REGISTRYINDEX, ev.h.ref);
    if (!err) return 0;
    lua_pushstring(L, err);
    return 1;
}

static int op_consumer_failed(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, o->x->glue);
    lua_getfield(L, -1, "consumer_failed");
    lei_lecho_push_ref(L, ((const lecho_consumer *)o->a)->h.ref);
    lua_pushstring(L, o->s);
    lua_call(L, 2, 0);
    return 0;
}

/* The consumer's C sink (core/binding/lua_sink.c, lb_sink.bytes): an async
 * event of its channel, still in its encoded bytes p[0..e->n) (checked by
 * the core), handed to the C handler without a Lua function called and
 * nothing decoded: the handler's getters read the bytes in place
 * (lecho_value.c); what needs a Lua value decodes it into the slot then
 * (e->decode, once, inside that call's protected call).  As trampoline
 * does, with meta made here.  The core calls it unprotected (L, its
 * callback thread): it never raises. */
static void sink_bytes(lb_sink *s, lua_State *L, const uint8_t *p, const lb_event *e) {
    struct csink *k = (struct csink *)s;
    lecho_consumer *c = k->c;
    if (!c) return;
    lecho_ctx *x = c->h.ctx;
    /* meta.producer as the Lua dispatch names it: "address#id", made once
     * per producer in a row */
    const char *from = e->from ? e->from : x->addr;
    size_t fl = strlen(from);
    if (c->plen == 0 || c->pid != e->producer || c->plen != fl || memcmp(c->pname, from, fl) != 0) {
        int w = snprintf(c->pname, sizeof c->pname, "%s#%llu", from, (unsigned long long)e->producer);
        c->pid = e->producer;
        c->plen = w > 0 && (size_t)w < sizeof c->pname ? fl : 0;
    }
    int slot = c->slot;
    /* the slot table: [1] the value once decoded, [2] its arrays received
     * in place (views, which the core ends after this call; a handle made
     * from the event keeps them: lei_lecho_value_keep_views) */
    lecho_value ev = { .h = { x, slot, H_BORROWED, NULL, NULL }, .bp = p, .bn = e->n, .src = e };
    lecho_meta m = { c->chan ? c->chan : "", c->pname, (double)e->seq };
    lua_State *saved = x->L;
    int saved_views = x->views;
    x->L = L;
    x->views = slot;
    x->in_handler++;
    const char *err = c->fn(&ev, &m, c->ud);
    x->in_handler--;
    x->L = saved;
    x->views = saved_views;
    if (x->scratch) lei_lecho_value_scratch_reset(x, 0); /* the getters' strings: over */
    if (!ev.bp) { /* decoded: the value is garbage once the handler returned */
        lua_rawgeti(L, LUA_REGISTRYINDEX, slot);
        lua_pushnil(L);
        lua_rawseti(L, -2, 1);
        lua_pushnil(L);
        lua_rawseti(L, -2, 2);
        lua_pop(L, 1);
    }
    if (!err || !(c = k->c)) return;
    /* counted and logged by lecho.capi, as the Lua dispatch does; in a
     * protected call (the core calls this sink unprotected: it must not
     * raise) */
    struct op o = { .a = c, .s = err };
    lei_lecho_protect(x, op_consumer_failed, &o);
}

static int op_consumer(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lecho_consumer *c = o->res;
    lei_lecho_push_ref(L, ((const lecho_channel *)o->a)->h.ref);
    c->box = lua_newuserdata(L, sizeof *c->box);
    c->box->c = c;
    lua_pushcclosure(L, trampoline, 1);
    lei_lecho_value_push_opt(L, o->b);
    lua_newtable(L);
    c->slot = luaL_ref(L, LUA_REGISTRYINDEX);
    c->sink = lua_newuserdata(L, sizeof *c->sink);
    c->sink->s.fn = NULL; /* the core calls bytes */
    c->sink->s.bytes = sink_bytes;
    c->sink->c = c;
    luaL_newmetatable(L, LB_SINK_MT);
    lua_setmetatable(L, -2);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "consumer", 4, &b)) != 0) {
        c->box->c = NULL;
        c->box = NULL;
        c->sink->c = NULL;
        c->sink = NULL;
        return 0;
    }
    const char *chan = lua_tostring(L, b + 1);
    if (chan && !(c->chan = lei_lecho_dupstr(chan))) {
        o->rc = lei_lecho_fail(o->x, LECHO_ENOMEM, "out of memory");
        /* the Lua consumer stays open until the context closes: no handler runs */
        c->box->c = NULL;
        c->box = NULL;
        c->sink->c = NULL;
        c->sink = NULL;
        return 0;
    }
    lua_pushvalue(L, b);
    c->h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_consumer_open(lecho_channel *ch, lecho_handler fn, void *ud, lecho_consumer **out) {
    return lecho_consumer_open_opts(ch, fn, ud, NULL, out);
}

int lecho_consumer_open_opts(lecho_channel *ch, lecho_handler fn, void *ud, const lecho_value *opts,
                             lecho_consumer **out) {
    if (out) *out = NULL;
    if (!ch || !fn || !out || (opts && opts->h.ctx != ch->h.ctx)) return LECHO_EINVAL;
    lecho_ctx *x = ch->h.ctx;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_consumer_open: not from a consumer handler");
    lecho_consumer *c = lei_lecho_h_new(x, sizeof *c, H_CONSUMER);
    if (!c) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    c->fn = fn;
    c->ud = ud;
    c->qref = c->slot = LUA_NOREF;
    struct op o = { .a = ch, .b = opts, .res = c };
    int rc = lei_lecho_protect(x, op_consumer, &o);
    if (rc != 0 || !c->box) {
        if (c->box) c->box->c = NULL;
        if (c->sink) c->sink->c = NULL;
        consumer_fini(c);
        lei_lecho_h_free(&c->h);
        return rc ? rc : LECHO_EFAILED;
    }
    *out = c;
    return 0;
}

void lecho_consumer_close(lecho_consumer *c) {
    if (!c) return;
    if (c->box) c->box->c = NULL;
    if (c->ebox) c->ebox->c = NULL;
    if (c->sink) c->sink->c = NULL;
    struct op o = { .a = c, .s = "consumer_close" };
    lei_lecho_protect(c->h.ctx, op_simple, &o);
    if (c->qref != LUA_NOREF) luaL_unref(c->h.ctx->L, LUA_REGISTRYINDEX, c->qref);
    consumer_fini(c);
    lei_lecho_h_free(&c->h);
}

/* The consumer's on_error (through lecho.capi): calls the C error function
 * as trampoline calls the handler. */
static int on_error_tramp(lua_State *L) {
    struct cbox *box = lua_touserdata(L, lua_upvalueindex(1));
    lecho_consumer *c = box->c;
    if (!c || !c->efn) return 0;
    lecho_ctx *x = c->h.ctx;
    const char *msg = lua_isstring(L, 1) ? lua_tostring(L, 1) : "modulator failed";
    lua_State *saved = x->L;
    x->L = L;
    x->in_handler++;
    c->efn(msg, c->eud);
    x->in_handler--;
    x->L = saved;
    return 0;
}

static int op_on_error(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lecho_consumer *c = o->res;
    lei_lecho_push_ref(L, c->h.ref);
    if (o->kind) {
        if (!c->ebox) {
            c->ebox = lua_newuserdata(L, sizeof *c->ebox);
            c->ebox->c = c;
            lua_pushcclosure(L, on_error_tramp, 1);
        } else {
            lua_pushnil(L); /* the closure is already the consumer's on_error */
        }
    } else {
        lua_pushboolean(L, 0); /* cleared: the context logs again */
    }
    o->rc = lei_lecho_glue_call(L, o->x, "on_error", 2, NULL);
    return 0;
}

int lecho_consumer_on_error(lecho_consumer *c, lecho_error_fn fn, void *ud) {
    if (!c || c->h.ref == LUA_NOREF) return LECHO_EINVAL;
    c->efn = fn;
    c->eud = ud;
    struct op o = { .res = c, .kind = fn != NULL };
    if (!fn && c->ebox) {
        c->ebox->c = NULL;
        c->ebox = NULL;
    }
    return lei_lecho_protect(c->h.ctx, op_on_error, &o);
}

static int op_consumer_queued(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lecho_consumer *c = o->res;
    lei_lecho_push_ref(L, ((const lecho_channel *)o->a)->h.ref);
    lei_lecho_value_push_opt(L, o->b);
    lua_pushnumber(L, (lua_Number)o->n);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "consumer_queued", 3, &b)) != 0) return 0;
    lua_pushvalue(L, b + 1);
    c->qref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, b);
    c->h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_consumer_open_queued(lecho_channel *ch, const lecho_value *opts, size_t limit,
                               lecho_consumer **out) {
    if (out) *out = NULL;
    if (!ch || !out || limit < 1 || (opts && opts->h.ctx != ch->h.ctx)) return LECHO_EINVAL;
    lecho_ctx *x = ch->h.ctx;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_consumer_open_queued: not from a handler");
    lecho_consumer *c = lei_lecho_h_new(x, sizeof *c, H_CONSUMER);
    if (!c) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    c->qref = c->slot = LUA_NOREF;
    c->box = NULL; /* no C handler, no trampoline */
    struct op o = { .a = ch, .b = opts, .n = limit, .res = c };
    int rc = lei_lecho_protect(x, op_consumer_queued, &o);
    if (rc != 0) {
        if (x->L && c->qref != LUA_NOREF) luaL_unref(x->L, LUA_REGISTRYINDEX, c->qref);
        lei_lecho_h_free(&c->h);
        return rc;
    }
    *out = c;
    return 0;
}

static int op_take(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    const lecho_consumer *c = o->a;
    lei_lecho_push_ref(L, c->qref);
    lua_pushnumber(L, (lua_Number)o->n);
    lua_pushboolean(L, o->kind);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "take", 3, &b)) != 0) return 0;
    /* the count the glue gives (the list's length misses nil events at its end) */
    o->idx = lua_isnumber(L, b + 2) ? (size_t)lua_tonumber(L, b + 2) : lua_objlen(L, b);
    o->d = lua_tonumber(L, b + 1);
    /* into the slot of the caller's value (no longer built in C) */
    lecho_value *into = (lecho_value *)o->b;
    into->cb = 0;
    lei_wbuf_free(&into->enc);
    lei_lecho_push_ref(L, into->h.ref);
    lua_pushvalue(L, b);
    lua_rawseti(L, -2, 1);
    /* [2]: the arrays only this handle holds now (lecho.capi M.take), given
     * back when it is freed; what it held before is left to the collector */
    lua_pushvalue(L, b + 3);
    lua_rawseti(L, -2, 2);
    into->excl = lua_istable(L, b + 3);
    return 0;
}

int lecho_consumer_take(lecho_consumer *c, lecho_value *v, size_t max, int meta, size_t *taken,
                        size_t *dropped) {
    if (taken) *taken = 0;
    if (!c || !v || v->h.ctx != c->h.ctx || c->qref == LUA_NOREF) return LECHO_EINVAL;
    if (max > 0x7fffffff) max = 0x7fffffff;
    struct op o = { .a = c, .b = v, .n = max, .kind = meta != 0 };
    int rc = lei_lecho_protect(c->h.ctx, op_take, &o);
    if (rc != 0) return rc;
    if (taken) *taken = o.idx;
    if (dropped) *dropped = (size_t)o.d;
    return 0;
}

static int op_wait(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const lecho_consumer *)o->a)->qref);
    lua_pushnumber(L, o->d);
    o->rc = lei_lecho_glue_call(L, o->x, "wait", 2, NULL);
    return 0;
}

int lecho_consumer_wait(lecho_consumer *c, double timeout) {
    if (!c || c->qref == LUA_NOREF) return LECHO_EINVAL;
    lecho_ctx *x = c->h.ctx;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_consumer_wait: not from a consumer handler");
    if (isnan(timeout)) return nan_time(x, timeout, "lecho_consumer_wait: timeout");
    struct op o = { .a = c, .d = timeout };
    return lei_lecho_protect(x, op_wait, &o);
}

static int op_settle(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const lecho_consumer *)o->a)->qref);
    lua_pushnumber(L, (lua_Number)o->n);
    if (o->s)
        lua_pushstring(L, o->s);
    else
        lua_pushnil(L);
    o->rc = lei_lecho_glue_call(L, o->x, "settle", 3, NULL);
    return 0;
}

int lecho_consumer_settle(lecho_consumer *c, size_t n, const char *err) {
    if (!c || c->qref == LUA_NOREF) return LECHO_EINVAL;
    if (n == 0) return 0;
    if (n > 0x7fffffff) n = 0x7fffffff;
    struct op o = { .a = c, .n = n, .s = err };
    return lei_lecho_protect(c->h.ctx, op_settle, &o);
}

static int op_set_params(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const struct lei_h *)o->a)->ref);
    lei_lecho_value_push_slot(L, o->b);
    o->rc = lei_lecho_glue_call(L, o->x, "set_params", 2, NULL);
    return 0;
}

int lecho_consumer_set_params(lecho_consumer *c, const lecho_value *params) {
    if (!c || !params || params->h.ctx != c->h.ctx) return LECHO_EINVAL;
    lecho_ctx *x = c->h.ctx;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_consumer_set_params: not from a handler");
    struct op o = { .a = c, .b = params };
    return lei_lecho_protect(x, op_set_params, &o);
}

/* ---- services and calls ---- */

/* The service's Lua handler (through lecho.capi): runs the C handler as
 * trampoline runs a consumer's; returns true, result or nil, message. */
static int svc_trampoline(lua_State *L) {
    struct sbox *box = lua_touserdata(L, lua_upvalueindex(1));
    lecho_service *s = box->s;
    if (!s) {
        lua_pushnil(L);
        lua_pushliteral(L, "service is closed");
        return 2;
    }
    lecho_ctx *x = s->h.ctx;
    /* Three borrowed slots: args, meta, the result. */
    lecho_value args = { .h = { x, LUA_NOREF, H_BORROWED, NULL, NULL } };
    lecho_value meta = args, res = args;
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    args.h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, 1);
    meta.h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_createtable(L, 1, 0);
    res.h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_State *saved = x->L;
    x->L = L;
    x->in_handler++;
    const char *err = s->fn(&args, &meta, &res, s->ud);
    x->in_handler--;
    x->L = saved;
    luaL_unref(L, LUA_REGISTRYINDEX, args.h.ref);
    luaL_unref(L, LUA_REGISTRYINDEX, meta.h.ref);
    if (err) {
        luaL_unref(L, LUA_REGISTRYINDEX, res.h.ref);
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    lua_pushboolean(L, 1);
    lei_lecho_value_push_slot(L, &res);
    luaL_unref(L, LUA_REGISTRYINDEX, res.h.ref);
    return 2;
}

static int op_service(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lecho_service *s = o->res;
    lei_lecho_push_ref(L, o->x->self);
    lua_pushstring(L, o->s);
    s->box = lua_newuserdata(L, sizeof *s->box);
    s->box->s = s;
    lua_pushcclosure(L, svc_trampoline, 1);
    lei_lecho_value_push_opt(L, o->b);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "service", 4, &b)) != 0) {
        s->box->s = NULL;
        s->box = NULL;
        return 0;
    }
    lua_pushvalue(L, b);
    s->h.ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_service_open(lecho_ctx *x, const char *name, lecho_service_fn fn, void *ud,
                       const lecho_value *opts, lecho_service **out) {
    if (out) *out = NULL;
    if (!x || !name || !fn || !out || (opts && opts->h.ctx != x)) return LECHO_EINVAL;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_service_open: not from a handler");
    lecho_service *s = lei_lecho_h_new(x, sizeof *s, H_SERVICE);
    if (!s) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    s->fn = fn;
    s->ud = ud;
    struct op o = { .s = name, .b = opts, .res = s };
    int rc = lei_lecho_protect(x, op_service, &o);
    if (rc != 0 || !s->box) {
        if (s->box) s->box->s = NULL;
        lei_lecho_h_free(&s->h);
        return rc ? rc : LECHO_EFAILED;
    }
    *out = s;
    return 0;
}

void lecho_service_close(lecho_service *s) {
    if (!s) return;
    s->box->s = NULL;
    struct op o = { .a = s, .s = "service_close" };
    lei_lecho_protect(s->h.ctx, op_simple, &o);
    lei_lecho_h_free(&s->h);
}

/* o->i: a registry ref of a box holding the results list or the error
 * value (LUA_NOREF when there is none). */
void lei_lecho_push_call(lua_State *L, const struct op *o) {
    lei_lecho_push_ref(L, o->x->self);
    lua_pushstring(L, o->s);
    lei_lecho_value_push_opt(L, o->a);
    lei_lecho_value_push_opt(L, o->b);
}

static int op_call(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_call(L, o);
    int b;
    o->rc = lei_lecho_glue_call(L, o->x, "call", 4, &b);
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, o->rc == 0 ? b + 1 : b + 3);
    lua_rawseti(L, -2, 1);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_call(lecho_ctx *x, const char *name, const lecho_value *args, const lecho_value *opts,
               lecho_value **results) {
    if (results) *results = NULL;
    if (!x || !name || (args && args->h.ctx != x) || (opts && opts->h.ctx != x)) return LECHO_EINVAL;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_call: not from a handler");
    lecho_value *v = lei_lecho_h_new(x, sizeof *v, H_VALUE);
    if (!v) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    struct op o = { .s = name, .a = args, .b = opts, .i = LUA_NOREF };
    int rc = lei_lecho_protect(x, op_call, &o);
    if (o.i == LUA_NOREF || !results) {
        if (o.i != LUA_NOREF) luaL_unref(x->L, LUA_REGISTRYINDEX, o.i);
        lei_lecho_h_free(&v->h);
        return rc;
    }
    v->h.ref = o.i;
    *results = v;
    return rc;
}

/* ---- statistics ---- */

static int op_stats(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, o->x->self);
    int b;
    if (o->s) {
        lua_pushstring(L, o->s);
        lua_pushstring(L, o->key);
        if ((o->rc = lei_lecho_glue_call(L, o->x, "stat", 3, &b)) == 0) o->d = lua_tonumber(L, b);
        return 0;
    }
    if ((o->rc = lei_lecho_glue_call(L, o->x, "stats", 1, &b)) != 0) return 0;
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, b);
    lua_rawseti(L, -2, 1);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

lecho_value *lecho_stats(lecho_ctx *x) {
    if (!x) return NULL;
    struct op o = { 0 };
    return lei_lecho_value_from(x, op_stats, &o);
}

double lecho_stat(lecho_ctx *x, const char *channel, const char *counter) {
    if (!x || !channel || !counter) return -1;
    struct op o = { .s = channel, .key = counter };
    return lei_lecho_protect(x, op_stats, &o) == 0 ? o.d : -1;
}
