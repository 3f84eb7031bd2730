/* moe.h: the modulator operating environment (MOE).
 *
 * A lei_moe is one modulator, a consumer's Lua source with its params, loaded
 * in a LuaJIT state of its own inside the producing process.  It sits between
 * a producer's submit and one derived channel of the context: every submitted
 * event goes through its enqueue(ev), an optional dequeue(ev, waiting) when
 * the transport has room, an optional period() on a timer and receivers(n)
 * when a receiving context is added; what they return or emit() is encoded
 * and submitted on the derived channel.
 *
 * Containment: the state sees only a curated environment (doc/modulators.md),
 * runs with the JIT compiler off so that a count hook can always interrupt
 * it, has a CPU budget per call (its C functions included: see
 * lei_moe_group) and a memory cap enforced by its allocator; its pcall and
 * xpcall cannot catch a stop, and no message handler runs after one.
 * A call that raises, overruns or runs out of memory fails the modulator: its
 * state is closed at once, its pending events dropped, and `on_fail` is
 * called (as the last thing the failing function does; the binding must not
 * free the moe from inside it).  Every later call on it is a no-op.
 *
 * Ownership: the caller of lei_moe_new owns the moe and frees it with
 * lei_moe_free (the state, the period timer, pending events and unsent
 * outputs go with it).  The context must outlive the moe.  Messages handed
 * to lei_submit are the context's business from then on.
 */
#ifndef LECHO_MOE_H
#define LECHO_MOE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "ctx.h"

typedef struct lei_moe lei_moe;

/* What the modulators of one context share (one per context, used from the
 * context's thread only): a cap on the memory of all their states together,
 * a cap on their share of the thread's CPU over 1 s windows, and the timer
 * on the thread's CPU clock that stops a call stuck in a C function (the
 * count hook only runs between Lua instructions).  The timer raises signal
 * LEI_MOE_SIGNAL (SIGRTMIN + 5) at this thread every LEI_MOE_TICK_NS of its
 * CPU time while a modulator call runs (and at most once more after it);
 * the handler finds the group in the signal's value (no global state) and,
 * past the call's budget, sets the moe's stop flag and a hook that fires at
 * the next instruction; it also charges the tick to the call's modulator
 * for the CPU share.  Owned by the context's binding, freed after its last
 * moe (lei_moe_group_free detaches any left). */
typedef struct lei_moe_group lei_moe_group;
#define LEI_MOE_SIGNAL (SIGRTMIN + 5)
#define LEI_MOE_TICK_NS 1000000L

/* mem_cap: bytes (0: none); cpu_share: of the CPU the thread ran over 1 s
 * (at least 0.5 s counted), charged per principal (moe_group.c) (0: none).
 * NULL when out of memory.  Without the timer (the signal is taken by the
 * application, or timer_create fails: logged once) the count hook alone
 * enforces budgets, as before. */
lei_moe_group *lei_moe_group_new(lei_ctx *c, size_t mem_cap, double cpu_share);
void lei_moe_group_free(lei_moe_group *g);
/* 1 while a member's call, batch or the submit of its outputs runs: the
 * application's Lua may run then (a granted log's line goes to the
 * context's log hook), and what it does must not free a member up the
 * stack: the binding refuses a turn of the loop (whose control messages
 * unload modulators) and the context's close meanwhile. */
int lei_moe_group_busy(const lei_moe_group *g);

typedef struct lei_moe_opts {
    double budget;            /* CPU seconds per call (default 0.005) */
    size_t mem_limit;         /* bytes per state (default 32 MiB) */
    int grant_clock;          /* clock() in the environment */
    int grant_log;            /* log(...) in the environment */
    size_t max_pending;       /* events held for dequeue before the oldest goes */
    double period;            /* seconds between period() calls, 0: none */
    lei_codec_limits lim;     /* for what it emits */
    lei_moe_group *group;     /* shared caps and the CPU timer, or NULL (borrowed) */
    const char *principal;    /* who installed it, for the CPU share (copied; NULL: "") */
    void (*on_fail)(void *ud, lei_moe *m, const char *why);
    void *ud;
} lei_moe_opts;

typedef struct lei_moe_stats {
    uint64_t calls, events_in, events_out, dropped, pending_drops, time_ns;
    uint64_t period_skips; /* period() not called: its destinations were full (block) */
    uint64_t passed;       /* outputs sent as the submitted event's own message (unchanged) */
    size_t pending, mem;
    size_t staged;         /* async events staged for the next batch (lei_moe_flush) */
} lei_moe_stats;

void lei_moe_opts_default(lei_moe_opts *o);

/* Loads src (Lua text only) under name (for messages) with params, the
 * encoded value p[0..plen), and runs its top level.  Outputs go to channel
 * chid of c.  Returns the moe, or NULL with err filled (nothing to free). */
lei_moe *lei_moe_new(lei_ctx *c, uint32_t chid, const char *name, const char *src, size_t len,
                     const uint8_t *p, size_t plen, const lei_moe_opts *o, char *err,
                     size_t errlen);
void lei_moe_free(lei_moe *m);

/* Replaces params (an encoded value) between two events: 0, or -1 when the
 * value does not decode or the modulator failed meanwhile. */
int lei_moe_set_params(lei_moe *m, const uint8_t *p, size_t plen);

/* One submitted event, encoded in p[0..n), the bytes of its message msg
 * (NULL: none).  Outputs are submitted on the derived channel with
 * producer/seq (and sync, policy) before return, or held for dequeue.  For
 * a sync event, everything held is dequeued at once and the sync ids of
 * what was submitted are kept for lei_moe_syncs.  0, or -1 when the
 * modulator failed (it is then unloaded).  A flat msg (no pinned slices)
 * that enqueue returns unchanged (the same string, boolean or number it was
 * given) is submitted itself (one more reference) instead of the value
 * encoded again. */
int lei_moe_enqueue_msg(lei_moe *m, uint64_t producer, uint64_t seq, lei_msg *msg,
                        const uint8_t *p, size_t n, int sync, int policy);
/* An async event (flat, at most STG_EV_BYTES encoded: moe_int.h) to a
 * modulator without dequeue is staged instead, one more reference to msg:
 * the staged events run in one entry into the state (a call and a budget
 * each), when STG_MAX are staged, before any other call of the modulator
 * (a sync event, params, period, receivers, retarget, pump), and in
 * lei_moe_flush; lei_moe_has_pending says there are some.  Until then
 * their outputs are not queued. */
/* 1 when m's own call is running (the event comes from a hook that call
 * ran, e.g. a granted log's handler) and the event could not be staged
 * behind it: the caller refuses the submit before anything is sent. */
int lei_moe_busy_for(const lei_moe *m, const lei_msg *msg, size_t n, int sync, int policy);
/* Runs the staged events now: 0, or -1 when the modulator failed (notified). */
int lei_moe_flush(lei_moe *m);
/* How many staged events lei_moe_flush would run now (0 inside a call or
 * a batch of m). */
int lei_moe_staged(const lei_moe *m);
/* Sync ids submitted by the last lei_moe_enqueue_msg (valid until the next). */
size_t lei_moe_syncs(const lei_moe *m, const uint64_t **ids);

/* A receiving context was added: calls the modulator's receivers(n), if it
 * has one (n: how many contexts receive its output now), so that it can
 * start over (a key frame).  0, or -1 when the modulator failed. */
int lei_moe_receivers(lei_moe *m, int n);

/* Sends what is held (through dequeue) on the old channel, then sends to
 * chid from now on (a params change keeps the modulator's state but starts
 * a new stream).  0, or -1 when the modulator failed. */
int lei_moe_retarget(lei_moe *m, uint32_t chid);

/* Runs dequeue on held events while the derived channel's destinations have
 * room.  The binding calls it once per loop iteration, before writing. */
void lei_moe_pump(lei_moe *m);
int lei_moe_has_pending(const lei_moe *m);

/* ---- sandboxes (moe_svc.c) ----------------------------------------------
 * A sandbox is a lei_moe made for calls, not a stream: a state like a
 * modulator's (same environment without emit, same memory cap, budget per
 * call, group caps and CPU share), whose chunk returns a function or a table
 * of functions (named by strings).  It is called with arguments and returns
 * results; a call that raises, overruns its budget or its memory fails
 * alone and the state serves the next call.  Only the group's CPU share
 * (lei_moe_group) ends a sandbox for good: every later call is refused with
 * the reason (lei_moe_error).  Freed with lei_moe_free; the caller owns it.
 * NULL with err when the chunk cannot serve (it does not compile, raises,
 * overruns its budget: "budget exceeded: ...", said by moe_new's flag). */
lei_moe *lei_moe_svc_new(lei_ctx *c, const char *name, const char *src, size_t len,
                         const lei_moe_opts *o, char *err, size_t errlen);
/* Names of the table's functions in *names (an encoded array of strings,
 * owned by the caller), or NULL when the chunk returned one function. */
int lei_moe_svc_names(lei_moe *m, lei_msg **names);
/* Calls function fn (NULL: the one function) with the arguments encoded in
 * in[0..n) as a table { n = N, ... }.  0 and *out = the results encoded as
 * { n = N, ... }; -LEI_E_FAILED when the function raised, *out = { e =
 * error value, tb = traceback }; else *out = NULL and err says why:
 * -LEI_E_LIMIT "budget exceeded: ..." or "memory: ...", -LEI_E_INVALID
 * (bad arguments, a result that cannot be encoded, no such function),
 * -LEI_E_CLOSED (the sandbox was ended).  *out is owned by the caller. */
int lei_moe_svc_call(lei_moe *m, const char *fn, const uint8_t *in, size_t n, lei_msg **out,
                     char *err, size_t errlen);

/* True while a call of m runs (a hook it calls must not free it). */
int lei_moe_svc_in_call(const lei_moe *m);

/* One output kept in the key-frame ring: the encoded value data[0..len)
 * and the producer id and sequence it was submitted with. */
typedef struct lei_moe_kf {
    uint8_t *data;
    size_t len;
    uint64_t producer, seq;
} lei_moe_kf;

/* The outputs submitted since the last key frame the modulator marked
 * (emit(ev, { key = true })), the key frame first, oldest first, in *kf
 * (valid until the next call into m); -1 when there is none: no key frame
 * marked yet, the ring passed its bound since, the stream was retargeted, or
 * the modulator failed. */
long lei_moe_keyframes(const lei_moe *m, const lei_moe_kf **kf);

/* The derived channel its outputs go to. */
uint32_t lei_moe_chid(const lei_moe *m);
/* NULL while loaded; the reason once failed. */
const char *lei_moe_error(const lei_moe *m);
void lei_moe_get_stats(const lei_moe *m, lei_moe_stats *s);

#endif
