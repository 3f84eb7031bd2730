/* lua_prod.h: the producer handle's data plane as a table of functions, for
 * callers outside the binding that are not linked with the core: liblecho
 * (core/capi/lecho.c) and lecho.producer's FFI (lua/lecho/producer.lua).  core.so
 * hands it out as a light userdata (`core.dataplane()`); the functions take
 * the handle's userdata block (what `ctx:producer` returned, lua_touserdata
 * or ffi.cast of it) and never call a Lua function.
 *
 * No Lua header is needed here: liblecho includes it beside lua.h, the FFI
 * declares the same struct from the text of LB_DATAPLANE_CDEF.
 */
#ifndef LECHO_LUA_PROD_H
#define LECHO_LUA_PROD_H

#include <stddef.h>
#include <stdint.h>

struct lua_State;
struct lb_bounds;

/* lb_dataplane.submit's "nothing done: take the Lua path" (no error code of
 * errors.h is negative). */
#define LB_PROD_SLOW (-1)

typedef struct lb_dataplane {
    /* An async submit of the value at idx of L (a thread of the state the
     * context lives in) through producer handle h: encoded here with the
     * context's limits, sent plain and through the handle's modulators.
     * Returns 0 (sent; the sequence advanced), LB_PROD_SLOW when nothing was
     * done and the caller must take the Lua path (the producer or context is
     * closed, submits of this producer wait for room, or the block policy
     * finds no room: the Lua path waits), or a code of errors.h (> 0) with
     * the message in err[0..errlen) and nothing sent.  Raises only for Lua
     * memory errors (pinning a long string): call it under lua_cpcall. */
    int (*submit)(void *h, struct lua_State *L, int idx, char *err, size_t errlen);
    /* Stages p[0..n), an encoded value (lecho.fastenc's buffer), as the
     * handle's next event: one copy into the message the queues will hold,
     * taken by the next h:submit_staged.  0, or -1 out of memory.  Touches
     * no Lua state: callable through the FFI. */
    int (*stage)(void *h, const uint8_t *p, size_t n);
    /* submit for a value already encoded by the caller (liblecho's values
     * built in C): p[0..n), one value in the codec's wire form, checked
     * against the context's limits (LEI_E_LIMIT, with err), copied once
     * into the message the queues hold, sent as submit sends.  bd (or
     * NULL) is what the caller vouches for p: when its bounds are within
     * the limits, the check is those three comparisons instead of a read
     * of every item (lb_bounds).  Same returns as submit; touches no Lua
     * state and never raises. */
    int (*submit_bytes)(void *h, const uint8_t *p, size_t n, const struct lb_bounds *bd, char *err,
                        size_t errlen);
} lb_dataplane;

/* What the maker of an encoded value vouches for, so that submit_bytes
 * checks the context's limits in O(1): the bytes are one well-formed value
 * (every table's keys strings, no trailing bytes) whose longest string
 * (key or value) has at most longest bytes, whose tables nest at most
 * tables deep (0: no table; a table in a table: 2) and whose decoded size,
 * as the codec charges it (codec.h, LEI_DEC_*), is at most decoded.  Upper
 * bounds: when one is past its limit, the bytes are read as before (a
 * value within the limits is never refused for a loose bound). */
typedef struct lb_bounds {
    size_t longest;
    unsigned tables;
    size_t decoded;
} lb_bounds;

/* One async event for a C sink: the record the event hook hands over (the
 * value itself is decoded onto the sink's Lua stack, or for a bytes sink
 * left in its encoded bytes). */
typedef struct lb_event {
    const char *from;  /* the producing context's address; NULL: this context */
    uint64_t producer; /* the producer's id in that context */
    uint64_t seq;
    size_t n;          /* the value's encoded bytes */
    /* For lb_sink.bytes only (else NULL): pushes onto L the value decoded
     * from the bytes, then the list of its arrays received in place (views
     * into the read buffer, as for fn) or nil.  Raises on a Lua memory
     * error: call it inside a protected call; valid while the bytes call
     * runs. */
    void (*decode)(const struct lb_event *ev, struct lua_State *L);
} lb_event;

/* A channel's one consumer written in C (liblecho's lecho_consumer_open):
 * set with ctx:set_sink(chid, sink) (lua_sink.c) by Channel:_hot_update
 * while it is the channel's only plain consumer.  Each async event of the
 * channel is decoded onto L (at index idx) and handed to fn from the event
 * hook without a Lua function called; sync events, markers and everything
 * else take the Lua dispatch.  Its arrays of 4 KiB or more
 * (LB_ARRAY_VIEW_MIN) point into the read buffer, listed in a table at
 * idx + 1 (nil when none): lecho.core's array_keep gives one memory of its
 * own, and those not kept end (no elements) when fn returns or raises.
 * fn runs inside the hook's protected call and may raise.  The userdata carrying it has the metatable LB_SINK_MT and
 * begins with this struct; the Lua consumer (its `sink` field) keeps it. */
typedef struct lb_sink {
    void (*fn)(struct lb_sink *s, struct lua_State *L, int idx, const lb_event *ev);
    /* NULL, or called instead of fn with the event's encoded bytes
     * p[0..ev->n) (the codec's wire form, checked against the context's
     * limits first: a bad value costs its connection before the call),
     * nothing decoded; ev->decode makes the Lua value when the sink needs
     * it, and its views end when bytes returns.  Called outside any
     * protected call: bytes must not raise (liblecho runs each Lua call
     * it makes in a protected call of its own).  p is valid while the
     * call runs. */
    void (*bytes)(struct lb_sink *s, struct lua_State *L, const uint8_t *p, const lb_event *ev);
} lb_sink;

#define LB_SINK_MT "lecho.sink"

/* The same struct for ffi.cdef. */
#define LB_DATAPLANE_CDEF                                                          \
    "typedef struct lb_dataplane { int (*submit)(void *, void *, int, char *, size_t);" \
    " int (*stage)(void *, const uint8_t *, size_t);"                                   \
    " int (*submit_bytes)(void *, const uint8_t *, size_t, const void *, char *, size_t); } lb_dataplane;"

#endif
