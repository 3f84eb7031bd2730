/* lecho_int.h: what the files of liblecho (lecho.c, lecho_value.c, lecho_array.c,
 * lecho_pending.c, lecho_recorder.c) share:
 * the structs behind lecho.h's opaque handles and the protected-call
 * helpers.  Private: nothing outside liblecho includes it. */
#ifndef LECHO_INT_H
#define LECHO_INT_H

#include "lecho.h"
#include "lua_prod.h"
#include "codec.h"

#include <lauxlib.h>
#include <lua.h>

/* H_BORROWED: a value handle on the stack of liblecho (a handler's event,
 * a lecho_each key or value), not linked, freed by nobody. */
enum { H_VALUE, H_CHANNEL, H_PRODUCER, H_CONSUMER, H_BORROWED, H_SERVICE, H_RECORDER };

/* Common head of every handle.  Owned by its context: linked in
 * ctx->handles until freed by its close/free function or lecho_close. */
struct lei_h {
    lecho_ctx *ctx;
    int ref;  /* registry reference of the Lua object (value: its box) */
    int kind; /* H_* */
    struct lei_h *prev, *next;
};

/* A value handle.  bp non-NULL: a C sink's event still in its encoded
 * bytes (bp[0..bn), the read buffer's, borrowed for the handler's call),
 * read in place by the getters (lecho_value.c); the first operation that
 * needs a Lua value decodes it (src->decode) into the slot h.ref names
 * and sets bp to NULL. */
struct lecho_value {
    struct lei_h h;
    const uint8_t *bp;
    size_t bn;
    const lb_event *src;
    /* cb: a value built in C (lecho_value_new, then the setters of
     * scalars and of string-keyed scalar fields): enc, owned by the
     * handle (freed by lecho_value_free or lecho_close), is its encoding
     * and the Lua slot is unused; lecho_submit hands enc to the core
     * without a Lua call.  What needs a Lua value decodes it once into the
     * slot (lei_lecho_value_decode) and clears cb.  Only cb_set writes
     * enc, so it holds a scalar, a string, an empty table or a table of
     * string keys whose values are those (never an array, at most two
     * tables deep): lei_lecho_value_bounds relies on it. */
    int cb;
    lei_wbuf enc;
    /* excl: a queued consumer's events taken into this handle
     * (lecho_consumer_take) whose arrays hold read buffers nobody else
     * holds (the box's [2] lists them): lecho_value_free gives those back
     * at once (lecho.capi M.release) instead of a collection finding them.
     * Cleared by any use that may let something else hold them
     * (lei_lecho_value_push_slot: lecho_field, lecho_set_value from it, a
     * submit, ...); the read-only getters and lecho_nodes leave it. */
    int excl;
};

/* Scratch memory for what a byte-backed event's getters hand out (strings
 * NUL-terminated): a list of chunks owned by the context, emptied when
 * the handler returns (lei_lecho_value_scratch_reset), freed by
 * lecho_close. */
struct lei_scratch {
    struct lei_scratch *next;
    size_t cap, used;
    char data[];
};

struct lecho_channel {
    struct lei_h h;
    char *asked; /* owned: the name given to lecho_channel */
    char *name;  /* owned: the full name */
};

struct lecho_producer {
    struct lei_h h;
    int blocks; /* under the "block" policy: its submits may wait */
    void *ph;   /* borrowed: the core's producer handle (lua_prod.c), which the
                 * Lua producer h.ref holds keeps alive; NULL: Lua path only */
};

/* The trampoline's upvalue (a Lua userdata, owned by the Lua state): points
 * back at the consumer until the consumer is closed. */
struct cbox {
    lecho_consumer *c;
};

/* The consumer's C sink (lua_prod.h lb_sink, a Lua userdata owned by the
 * Lua consumer): the core hands it the channel's async events directly.
 * Points back at the consumer until the consumer is closed. */
struct csink {
    lb_sink s; /* first: the core sees an lb_sink */
    lecho_consumer *c;
};

struct lecho_consumer {
    struct lei_h h;
    lecho_handler fn;
    void *ud;
    struct cbox *box;   /* borrowed from Lua: valid while h.ref holds the consumer; NULL when queued */
    struct csink *sink; /* borrowed from Lua as box is; NULL when queued */
    struct cbox *ebox;  /* borrowed from Lua as box is: on_error's upvalue; NULL until set */
    lecho_error_fn efn; /* lecho_consumer_on_error's function and its ud (the caller's) */
    void *eud;
    int qref;           /* a queued consumer: registry ref of its queue (else LUA_NOREF) */
    int slot;           /* registry ref of the table whose [1] holds the sink's event */
    char *chan;         /* owned: meta.channel (the channel's short name) */
    char pname[320];    /* meta.producer of the last sink event ("addr#id") */
    uint64_t pid;       /* ... its producer id, and its address (pname up to '#') */
    size_t plen;        /* length of that address in pname; 0: none cached */
};

/* The service trampoline's upvalue, as struct cbox for consumers. */
struct sbox {
    lecho_service *s;
};

struct lecho_service {
    struct lei_h h;
    lecho_service_fn fn;
    void *ud;
    struct sbox *box; /* borrowed from Lua: valid while h.ref holds the service */
};

/* A recording of the context's producers (lecho.recorder's object, held
 * by h.ref). */
struct lecho_recorder {
    struct lei_h h;
};

/* Owned by the caller of lecho_submit_sync; every string is malloc'd here. */
struct lecho_errors {
    size_t n;
    char **f;   /* 4 * n strings: context, consumer, message, code name */
    char *text; /* the list as one line */
};

struct lecho_ctx {
    lua_State *L0;  /* owned: the private state (lua_close in lecho_close) */
    lua_State *L;   /* the thread calls run on: L0, or a handler's coroutine */
    int glue;       /* registry ref of the lecho.capi table */
    const lb_dataplane *dp; /* core.so's data plane (static in core.so), or NULL */
    int tramp;      /* registry ref of the C function lei_lecho_protect calls (made once:
                     * lua_cpcall allocates a closure per call, and the C-only
                     * data plane runs no GC step that would free them) */
    int self;       /* registry ref of the Lua context */
    struct lei_scratch *scratch; /* owned: see struct lei_scratch */
    int in_handler; /* depth of C handlers running */
    int (*intr_fn)(void *ud); /* lecho_set_interrupt's: asked between the turns of a wait */
    void *intr_ud;
    int views;      /* registry ref of the running sink handler's slot table, whose [2]
                     * lists its event's arrays received in place; LUA_REFNIL: a
                     * handler of the Lua dispatch (its Context keeps them); LUA_NOREF: none */
    int blocks;     /* the context's policy is "block" (the default) */
    char *addr;     /* owned */
    char *ns;       /* owned */
    char *show;     /* owned: the last lecho_to_string text */
    struct lei_h *handles;
    lecho_node *nodes; /* owned: lecho_nodes' array (nodes_cap of them) */
    size_t nodes_cap;
    char *packed;      /* owned: lecho_nodes_packed's string bytes (packed_cap of them) */
    size_t packed_cap;
    lecho_array_info *arrays; /* owned: the arrays of lecho_nodes' nodes (arrays_cap of them) */
    size_t arrays_cap, narrays;
    char err[512];
};

/* The arguments and results of one protected operation. */
struct op {
    lecho_ctx *x;
    lua_CFunction fn; /* what lei_lecho_protect runs */
    int rc;
    const void *a, *b; /* handles */
    const char *key, *s;
    size_t n, idx;
    double d;
    const double *nums;
    double *out;
    int kind, i;
    void *res;
    const char *str;
};

/* Stores msg as the context's last error message; returns code. */
int lei_lecho_fail(lecho_ctx *x, int code, const char *msg);
/* malloc'd copy (owned by the caller), or NULL. */
char *lei_lecho_dupstr(const char *s);
/* A zeroed handle of size bytes linked into x's list (owned by x), or NULL. */
void *lei_lecho_h_new(lecho_ctx *x, size_t size, int kind);
/* Unrefs, unlinks and frees a handle. */
void lei_lecho_h_free(struct lei_h *h);
/* Runs f(o) under lua_cpcall on x->L; o->rc, or the code of a raised error. */
int lei_lecho_protect(lecho_ctx *x, lua_CFunction f, struct op *o);
/* In a protected function: calls lecho.capi's `name` on the nargs values on
 * top; 0 with its results from *base on, or the code of nil, msg, code. */
int lei_lecho_glue_call(lua_State *L, lecho_ctx *x, const char *name, int nargs, int *base);
/* Pushes a call's four arguments to the glue (lecho.capi's call and
 * call_start): the context, o->s the service, o->a the args, o->b the
 * options (NULL: nil). */
void lei_lecho_push_call(lua_State *L, const struct op *o);
void lei_lecho_push_ref(lua_State *L, int ref);
/* A new value handle (owned by x) holding the registry ref that op, run
 * under lei_lecho_protect, leaves in o->i; NULL if either fails. */
lecho_value *lei_lecho_value_from(lecho_ctx *x, lua_CFunction op, struct op *o);
/* lecho_array.c, for lecho_nodes: 1 with *out filled when the value at idx
 * is an array (a received view copied out of the read buffer first), 0
 * when it is not one, -1 for a strided view (x's message set). */
int lei_lecho_array_node(lecho_ctx *x, lua_State *L, int idx, lecho_array_info *out);
/* Empties x's scratch (keeping one small chunk); all = 1 frees it all. */
void lei_lecho_value_scratch_reset(lecho_ctx *x, int all);
/* In a protected function (lecho_set, lecho_set_array): where o->a's
 * value is set.  Pushes its box (its slot at [1]) and, with o->key, the
 * table in the slot (a new one when it is nil) and the key; returns the
 * box's index, or 0 with o->rc set and not_table the message when the slot
 * holds something else. */
int lei_lecho_value_target(lua_State *L, struct op *o, const char *not_table);
/* lecho_get_array on a byte-backed v, in place: 0 with *out filled,
 * LECHO_ENOTFOUND, LECHO_EINVAL, or -1: take the Lua path (unaligned, or
 * unreadable here). */
int lei_lecho_value_bytes_array(const lecho_value *v, const char *key, lecho_array_info *out);
/* Pushes the value to send for v: a value built in C decoded for this
 * once, v left as it is (a submit that waits for room takes the Lua path
 * without making v a Lua value for good); else its slot. */
void lei_lecho_value_push_sent(lua_State *L, const lecho_value *v);
/* Pushes what the value handle v holds (decoding a byte-backed one). */
void lei_lecho_value_push_slot(lua_State *L, const lecho_value *v);
/* The same for an optional argument: v's value, or nil when v is NULL. */
void lei_lecho_value_push_opt(lua_State *L, const lecho_value *v);
/* For a value built in C (v->cb): what its encoding is known to be by
 * construction (lb_bounds), so that a submit checks the limits in O(1). */
void lei_lecho_value_bounds(const lecho_value *v, lb_bounds *bd);

#endif
