/* lua_int.h: what the files of the Lua binding share (lua_ctx.c,
 * lua_hook.c, lua_chan.c, lua_prod.c, lua_sink.c, lua_moe.c, lua_loop.c,
 * lua_auth.c, lua_raw.c, lua_rsink.c, lua_rec.c): the userdata structs and
 * the helpers that cross files.  Only these files include it (lua_ws.c,
 * the gateway's WebSocket, is a module of its own and does not).
 *
 * The binding reaches the core through ctx.h (the transport), moe.h (the
 * MOE) and codec.h (base), and the public headers of base (array.h) and of
 * the MOE (lpat.h) where it makes their userdata.
 * Ownership: the context userdata owns the context; each timer userdata owns
 * its ev_timer and, while active, pins itself and its function in the
 * registry; a modulator userdata owns its lei_moe; a producer handle owns
 * its list of modulator pointers (lua_prod.c).  Strings pinned by the
 * codec are released through the unpin hook.
 */
#ifndef LECHO_LUA_INT_H
#define LECHO_LUA_INT_H

#include <signal.h>

#include <lauxlib.h>
#include <lua.h>

#include "codec.h"
#include "ctx.h"
#include "moe.h"

#define CTX_MT "lecho.ctx"
#define TIMER_MT "lecho.timer"
#define MOE_MT "lecho.moe"

typedef struct lb_timer lb_timer;
struct lb_sink;
typedef struct lb_moe lb_moe;

typedef struct lb_ctx {
    lei_ctx *c;            /* owned; NULL once closed */
    lua_State *L;          /* the thread every callback runs on (owned via ref_thread) */
    int ref_event, ref_ctrl, ref_peer, ref_log, ref_tb, ref_moe_error, ref_turn;
    int ref_events;           /* the batch hook (lua_hook.c lb_hook_events), or LUA_NOREF */
    int ref_thread;        /* pins L */
    int ref_calls;         /* the protected calls (LB_CALL_*): made once, no allocation per call */
    int want_turn;         /* call the turn hook before each loop turn's writes */
    int close_pending;     /* close() came from inside a callback: done on return */
    lei_codec_limits lim;
    size_t pin_threshold;
    int stopping;
    int views;             /* ctx:views(true): long string values go to Lua as (pointer, length) */
    unsigned char *raw;    /* ctx:raw: a byte per channel index, events as encoded bytes (lua_raw.c; owned) */
    uint32_t nraw;
    struct lb_rsink *rsink; /* a recorder writing from C (lua_rsink.c; owned) or NULL */
    struct lb_rec *recs;   /* the open in-process recorders (lua_rec.c), each the memory of its
                            * userdata: listed, not owned; closed before the context goes */
    lb_timer *timers;      /* live timers, stopped when the context closes */
    lb_moe *moes;          /* live modulators, freed when the context closes */
    lei_moe_group *moeg;   /* owned: what they share (made by the first), freed after them */
    ev_signal sigw[3];     /* ctx:run(true, fn): [2] SIGHUP with a reload (SIGINT and SIGTERM:
                            * lua_loop.c's own handler; [0], [1] unused), a reload
                            * function; started only inside l_run */
    int hup;               /* a SIGHUP came during ctx:run(true, fn): fn runs next */
    ev_async sigasync;     /* ctx:run: woken by lua_loop.c's signal handler (started only
                            * inside l_run) */
    volatile sig_atomic_t sig_pending; /* the SIGINT/SIGTERM lecho's handler took during
                            * ctx:run (signals true), or 0; a second one ends the process */
    volatile sig_atomic_t sig_chained; /* signals false: the host's handler ran (the run
                            * lets Lua run once so that a hook it set can fire) */
    int intr_raised;       /* an interrupt was raised in Lua, not yet taken by the main line:
                            * a copy of lecho.signals' flag (process-wide), which that module
                            * owns and writes (c:interrupted(on)); lb_hook_events hands no
                            * event to a C sink while set (the Lua dispatch counts them not
                            * handled) */
    int sig_in_cb;         /* a callback C called (lb_pcall) raised LuaJIT's "interrupted!"
                            * (a SIGINT's hook): the loop stops, run raises it again
                            * or closes, run_once returns true (context.lua) */
    lua_Hook old_hook;     /* the hook of b->L's state when the run began: put back */
    int old_hook_mask, old_hook_count;
    int signal;            /* the signal that ended the last ctx:run(true), or 0 */
    struct lb_sink **sinks; /* owned array by channel id (nsinks long): the C sink of
                             * each channel that has one (lua_sink.c), else NULL */
    uint32_t nsinks;
    int ref_sinks;         /* the table chid -> sink userdata pinning them */
    int sink_calls;        /* lb_sink_event's bytes calls running (nested: more than 1) */
    int ref_sinks_held;    /* a list of the sinks set_sink let go while one ran (pinned
                            * till the outermost returns), or LUA_NOREF */
    uint64_t array_collections; /* collections run to find adopted read buffers let go of
                                 * (ctx:keep_array, ctx:reclaim): stats "array_collections" */
} lb_ctx;

/* The shortest string value handed to Lua as a view (lua_hook.c view_of):
 * below it a copy costs less than the buffer object that saves it. */
#define LB_VIEW_MIN ((size_t)64 * 1024)
/* The smallest array handed to Lua as a view into the payload (lua_hook.c;
 * smaller ones are copied into their userdata as they are decoded). */
#define LB_ARRAY_VIEW_MIN ((size_t)4096)

/* A modulator userdata: owns its lei_moe until close, gc or context close. */
struct lb_moe {
    lei_moe *m;            /* owned; NULL once closed */
    lb_ctx *b;
    lb_moe *next;
    int id;                /* given by the caller, passed to the moe_error hook */
};

/* A timer or, for ctx:io, a read watcher: one userdata type, one stop. */
struct lb_timer {
    union {
        ev_timer w;
        ev_io io;
    };
    int is_io;
    lb_ctx *b;
    lb_timer *next;
    int ref_fn, ref_self;
    int active;
};

/* A value handed to a modulator: encoded from the application's state and
 * flat.  p/n are valid until lb_flat_done. */
typedef struct lb_flat {
    lei_msg *m;      /* owned */
    uint8_t *tmp;    /* owned: the flat copy when m has pinned slices */
    const uint8_t *p;
    size_t n;
} lb_flat;

/* lua_ctx.c: results, arguments, options */
/* An expected failure as Lua sees it: nil, message (NULL: the code's own
 * text), code name.  Returns 3, the number of values pushed. */
int lb_push_err(lua_State *L, const char *msg, int code);
/* true, or nil, err, code name. */
int lb_ok_or_err(lua_State *L, const char *err, int code);
/* The open context at index 1 (raises when closed). */
lb_ctx *lb_check_ctx(lua_State *L);
size_t lb_opt_size(lua_State *L, int t, const char *k, size_t def);
void lb_setn(lua_State *L, const char *k, double v);
/* The metatable `name` of a userdata type, made once: __index a table of
 * methods (NULL: none), __gc gc (NULL: none).  Leaves the stack as it was. */
void lb_metatable(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc);
/* After a run or run_once returned: a close asked for from inside. */
void lb_close_if_pending(lb_ctx *b, lua_State *L);

/* lua_hook.c: every call into Lua from the loop */
/* Calls the function below nargs arguments on b->L through the traceback
 * handler; errors are logged, never raised.  0 or -1. */
int lb_pcall(lb_ctx *b, int nargs, int nres);
/* The C functions of b->ref_calls (lb_hooks_init): each runs one callback
 * into Lua from its arguments, a struct passed as a light userdata. */
enum { LB_CALL_HOOK = 1, LB_CALL_LOG, LB_CALL_BATCH, LB_CALL_SINK };
/* Runs b->ref_calls[k] on L (b->L) with args under the traceback handler,
 * allocating nothing before the pcall (an out-of-memory error then comes
 * from inside it): lua_pcall's code, with the handler left on the stack
 * and, on an error, the message above it.  Needs 4 free slots. */
static inline int lb_calls_pcall(lua_State *L, lb_ctx *b, int k, void *args) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_tb);
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_calls);
    lua_rawgeti(L, -1, k);
    lua_remove(L, -2);
    lua_pushlightuserdata(L, args);
    return lua_pcall(L, 1, 0, -3);
}
/* Makes b->L, the thread every callback runs on, and fills in h. */
void lb_hooks_init(lua_State *L, lb_ctx *b, lei_hooks *h);
void lb_hook_unpin(void *ud, int ref);

/* lua_chan.c: channels, submitting, sync answers, acks, control messages */
extern const char *const lb_policy_names[];
uint32_t lb_check_chan(lua_State *L, lb_ctx *b, int i);
/* Encodes the value at idx of L into a new message (the caller releases it
 * with lb_hook_unpin); NULL with the code in *code and the message in err,
 * nothing pushed. */
lei_msg *lb_encode(lb_ctx *b, lua_State *L, int idx, char *err, size_t errlen, int *code);
/* Encodes the value at idx flat: 0, or -1 with nil, err, code pushed. */
int lb_flat_encode(lua_State *L, lb_ctx *b, int idx, lb_flat *f);
void lb_flat_done(lb_ctx *b, lb_flat *f);
/* Acknowledges sync event `sync` from p (NULL: local) with nran handlers
 * run and the error list at idx (nil: none). */
void lb_ack(lb_ctx *b, lei_peer *p, const uint64_t *gen, uint64_t sync, uint64_t nran, lua_State *L,
            int idx);
extern const luaL_Reg lb_chan_methods[];

/* lua_moe.c: modulators */
extern const luaL_Reg lb_moe_ctx_methods[];
void lb_moe_open(lua_State *L);
/* core.stream_key (lua_moe.c): a modulator's key, or nil for lecho.modulator's canon */
int lb_moe_stream_key(lua_State *L);
/* The key of n bytes at p (lua_moe.c): BLAKE2b-256 as LB_KEY_HEX lowercase hex
 * digits and a NUL in out (core.hash, core.stream_key) */
#define LB_KEY_HEX 64
void lb_moe_key_hex(const void *p, size_t n, char out[LB_KEY_HEX + 1]);
/* Runs the batch of async events staged in each modulator of b (moe.h
 * lei_moe_flush): before anything that writes, counts or waits on the
 * queues (flush, pending, shutdown). */
void lb_moe_flush_all(lb_ctx *b);
/* Raises unless no modulator or sandbox of b is in a call, a batch or the
 * submit of its outputs (lei_moe_group_busy): from there (a log hook the
 * call runs) a turn of the loop or a close could free the state whose
 * call is up the stack.  `what`: the refused action, for the message. */
void lb_moe_not_busy(lua_State *L, const lb_ctx *b, const char *what);

/* lua_prod.c: producer handles (ctx:producer) and the data plane table
 * (core.dataplane, lua_prod.h) in the module table on top */
extern const luaL_Reg lb_prod_ctx_methods[];
void lb_prod_open(lua_State *L);

/* lua_sink.c: C sinks, a channel's one consumer in C (lua_prod.h) */
#define LB_NO_SINK (-2)
extern const luaL_Reg lb_sink_ctx_methods[];
/* The event hook's first step: the channel's C sink, if it has one and the
 * event is async: 0, or -1 (a bad value: close the connection); LB_NO_SINK
 * when the Lua dispatch must take it. */
int lb_sink_event(lb_ctx *b, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                  uint64_t sync, const uint8_t *p, size_t n);
/* Pushes the protected function lb_sink_event calls (ref_calls[LB_CALL_SINK]). */
void lb_sink_push_call(lua_State *L);
void lb_sinks_free(lb_ctx *b, lua_State *L);

/* lua_auth.c: keys, signatures, identity and trust */
extern const luaL_Reg lb_auth_methods[];
extern const luaL_Reg lb_auth_funcs[];

/* lua_loop.c: running the loop, timers, watchers */
extern const luaL_Reg lb_loop_methods[];
/* core.end_signals, core.end_signal: SIGINT and SIGTERM during the close at
 * the program's end (lua_loop.c); lb_loop_end_exit: the process ends by
 * the one that came then, if one did (the exit handler, lua_ctx.c). */
extern const luaL_Reg lb_loop_end_funcs[];
void lb_loop_end_exit(void);
/* lua_raw.c: channels whose events reach Lua as their encoded bytes */
extern const luaL_Reg lb_raw_methods[];
int lb_raw_is(const lb_ctx *b, uint32_t chid);
int lb_raw_push(lua_State *L, lb_ctx *b, const uint8_t *p, size_t n, char *err, size_t errlen);
void lb_raw_free(lb_ctx *b);
/* lua_rsink.c: a recorder writing its channels' events from the hook */
typedef struct lb_rsink lb_rsink;
extern const luaL_Reg lb_rsink_methods[];
int lb_rsink_event(lb_ctx *b, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                   uint64_t sync, const uint8_t *p, size_t n, char *err, size_t errlen);
void lb_rsink_free(lb_ctx *b);
/* Moves PATH.(keep-1) .. PATH to PATH.keep .. PATH.1 (a recording's
 * rotation; libc only, any thread): 0, or -1 out of memory. */
int lb_rsink_rotate_names(const char *path, int keep);
/* A recording's varint (doc/recording.md: doc/wire-format.md's, 7 bits a
 * byte, low first; at most 10 bytes) at o: its length.  Both recorders
 * write their records with these (lua_rsink.c, lua_rec.c). */
static inline size_t lb_rsink_put_varint(unsigned char *o, uint64_t v) {
    size_t i = 0;
    do {
        unsigned char b = v & 0x7f;
        v >>= 7;
        o[i++] = v ? (unsigned char)(b | 0x80) : b;
    } while (v);
    return i;
}
/* A record's u32 (its length, its CRC), little-endian, at o. */
static inline void lb_rsink_put_u32(unsigned char *o, uint32_t v) {
    o[0] = v & 0xff, o[1] = (v >> 8) & 0xff, o[2] = (v >> 16) & 0xff, o[3] = (v >> 24) & 0xff;
}
/* lua_rec.c: a recorder in the producer's process, its writer a thread of
 * its own (ctx:recorder_open); producer handles append their events */
typedef struct lb_rec lb_rec;
extern const luaL_Reg lb_rec_ctx_methods[];
void lb_rec_open(lua_State *L);
lb_rec *lb_rec_check(lua_State *L, int idx);
lb_ctx *lb_rec_ctx(const lb_rec *r);
int lb_rec_attach(lb_rec *r, const char *chname, const char *pname, uint32_t *cidx, uint32_t *pidx);
lei_msg *lb_rec_stage(lb_rec *r, uint32_t cidx, uint32_t pidx, uint64_t seq, const uint8_t *p, size_t n);
int lb_rec_event(lb_rec *r, uint32_t cidx, uint32_t pidx, uint64_t seq, int sync, lei_msg *m);
void lb_rec_close_all(lb_ctx *b);
void lb_loop_open(lua_State *L);

#endif
