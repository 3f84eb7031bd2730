/* moe_int.h: what the parts of the MOE share (moe.c: states, steps and the
 * public calls; moe_env.c: the sandbox's environment; moe_group.c: what the
 * modulators of a context share; moe_svc.c: sandboxes for pushed services).
 * Not for the rest of the core. */
#ifndef LECHO_MOE_INT_H
#define LECHO_MOE_INT_H

#include "moe.h"

#include <lua.h>
#include <time.h>

#define HOOK_COUNT 10000 /* instructions between budget checks */
#define REG_KEY "lecho.moe"
/* The key-frame ring's bounds: it goes to a joiner in one control message
 * (at most 16 MiB framed, 64 MiB decoded: doc/limits.md), each entry a
 * table of three fields (~200 bytes decoded) beside its bytes. */
#define KF_BYTES (8u << 20)
#define KF_ENTRIES 65536

/* ST_HOOK: an optional function of the modulator called by name (period,
 * receivers), with hook_arg when >= 0. */
/* ST_SVC: a sandbox's function called with arguments (moe_svc.c). */
/* ST_BATCH: the staged async events, each an enqueue call (moe.c run_batch). */
enum { ST_INIT, ST_PARAMS, ST_ENQ, ST_DEQ, ST_HOOK, ST_SVC, ST_BATCH };

/* Async events staged for one entry into the state (moe.c run_batch): at
 * most STG_MAX of them, each at most STG_EV_BYTES encoded (a larger one,
 * a sync one, or one under another policy runs the batch and then itself);
 * a batch's step returns to submit once its outputs pass STG_OUT_BYTES. */
#define STG_MAX 64
#define STG_EV_BYTES 4096
#define STG_OUT_BYTES 65536

typedef struct moe_stg {
    lei_msg *msg; /* one reference, owned until the batch ran */
    uint64_t producer, seq;
} moe_stg;

/* How a sandbox's call failed (m->svc_kind, moe_svc.c): the state survives
 * all but SVC_FATAL. */
enum { SVC_ERROR, SVC_BUDGET, SVC_MEMORY, SVC_FATAL };

typedef struct moe_out {
    lei_msg *msg; /* one reference, owned until submitted */
    size_t mem;   /* bytes charged to the moe's and the group's memory for it */
    uint64_t producer, seq;
    int sync;
    int key;      /* emit(ev, { key = true }): a key frame (the key-frame ring restarts at it) */
} moe_out;

typedef struct moe_held {
    uint64_t producer, seq;
    int sync;
} moe_held;

struct lei_moe {
    lua_State *L;          /* owned; NULL once failed */
    lei_ctx *ctx;          /* borrowed */
    uint32_t chid;
    lei_moe_opts o;
    char name[96];
    int own_alloc;         /* the allocator below counts memory */
    size_t mem;            /* bytes held by L (own_alloc) */
    int mem_hit;           /* an allocation was refused */
    int out_hit;           /* ... or the outputs of a call passed the cap */
    int limit_on;          /* the cap applies (off while closing) */
    /* the call in progress */
    int in_call, over;
    volatile sig_atomic_t stop; /* set by the CPU-time timer; lpat polls it */
    struct timespec mono0;
    double cpu0;           /* thread CPU seconds at the first check, < 0: not yet */
    int stage, sync, policy;
    const char *hook_fn;   /* ST_HOOK: which function */
    int hook_arg;
    uint64_t producer, seq;
    const uint8_t *in;
    size_t inlen;
    /* ST_ENQ: the submitted event's message (borrowed for the call; its
     * bytes are in[0..inlen), no pinned slices), or NULL.  A value enqueue
     * returns unchanged goes out as this message (moe.c, pass_through). */
    lei_msg *in_msg;
    /* async events staged for the next batch (STG_*): stg[istg..nstg) not
     * run yet; all under policy stg_policy.  nout_ok: outputs of the
     * batch's step that belong to events whose call returned. */
    moe_stg stg[STG_MAX];
    int nstg, istg, stg_policy;
    int in_batch;          /* run_batch is running (it is not entered again) */
    size_t nout_ok;
    /* outputs of the call, then submitted */
    moe_out *out;          /* owned */
    size_t nout, cout;
    /* events held for dequeue: values in the Lua table ref_q at [qhead, qtail) */
    int ref_q, ref_env;
    moe_held *held;        /* owned, parallel to the table: held[i - qhead + hoff] */
    size_t hoff, nheld, cheld;
    uint64_t qhead, qtail;
    /* sync ids of the last enqueue */
    uint64_t *sids;        /* owned */
    size_t nsids, csids;
    ev_timer period_w;
    uint64_t pseq;
    char err[384];
    lei_moe_stats st;
    /* shared caps (o.group) */
    lei_moe *gnext;        /* the group's list (borrowed) */
    int pool_hit;          /* the group's memory cap refused an allocation */
    volatile unsigned long win_ticks; /* CPU ticks charged in the group's window */
    double log_t0;         /* log(): the current second, lines in it, lines not logged */
    unsigned log_n;
    unsigned long log_dropped;
    char doom[320];        /* set by the CPU share check: fails at its next call */
    char principal[96];    /* o.principal, copied */
    /* a sandbox (lei_moe_svc_new): its chunk's function or table of
     * functions in the registry at ref_fn; a failed call keeps the state */
    int svc, ref_fn, svc_kind, svc_raised;
    const char *svc_fn;    /* the call in progress: which function (NULL: the one) */
    /* The step every call runs (step, or moe_svc_step for a sandbox), kept
     * in the registry at hot_ref once the state is set up (moe.c make_hot:
     * its upvalues m, and for a modulator the environment and the names
     * below; called without arguments): lua_cpcall makes
     * a closure per call, and a call that allocates nothing else never runs
     * the collector (a trivial filter of numbers filled 32 MiB of closures
     * in 700,000 events and was failed for memory). */
    lua_CFunction hot_fn;
    int hot_ref;
    /* The names "enqueue" and "dequeue" as strings in the registry: the
     * per-event lookup of the function in the environment without
     * interning the name each time (lua_getfield does). */
    int ref_kenq, ref_kdeq;
    /* emit(ev, { key = true }) in the call in progress: the next output routed is a key frame */
    int route_key;
    /* The key-frame ring (doc/modulators.md "Key frames"): copies of the
     * encoded outputs submitted since the last one marked a key frame, in
     * order, at most KF_BYTES (or o.mem_limit when smaller) bytes and
     * KF_ENTRIES of them (past that: none until the next key frame,
     * kf_valid 0).  kf and each kf[i].data owned. */
    lei_moe_kf *kf;
    size_t nkf, ckf, kf_bytes;
    int kf_valid;
};

/* CPU charged in the current window to one principal by modulators that are
 * gone (replaced, failed), and its cool-down after the share check unloaded
 * one of its modulators. */
typedef struct moe_pcharge {
    char name[96];
    unsigned long ticks;
    double cool_until;     /* monotonic seconds: installs refused until then */
    unsigned pass;         /* the share check's pass that last handled it */
} moe_pcharge;

struct lei_moe_group {
    lei_ctx *ctx;              /* borrowed */
    size_t mem, mem_cap;       /* bytes of all states; cap (0: none) */
    double cpu_share;          /* of one core over a window (0: none) */
    struct timespec win0;      /* the current 1 s window's start */
    volatile unsigned long win_ticks; /* CPU ticks charged in it, all members */
    lei_moe *list;             /* members (borrowed: each unlinks itself when freed) */
    double win_cpu0;           /* the thread's CPU seconds at the window's start */
    moe_pcharge *pc;           /* owned: charges of gone members, cool-downs */
    size_t npc, cpc;
    unsigned pass;             /* share checks that tripped */
    int has_timer;
    timer_t tid;               /* owned (timer_delete) */
    /* shared with the signal handler (same thread) */
    lei_moe *volatile cur;     /* the moe in a call, or NULL */
    int busy;                  /* members' calls, batches, output submits running (lei_moe_group_busy) */
    volatile sig_atomic_t armed;
    volatile unsigned long callno;
    /* The sandbox's setup chunk (moe_env.c) as bytecode, dumped from the
     * first state that compiled it (owned, malloc): parsing its text was a
     * third of an install's CPU.  NULL until then, or when out of memory. */
    char *env_bc;
    size_t env_bclen;
    unsigned long sig_call;    /* handler only: the call its first tick saw */
    double sig_cpu0;           /* handler only: thread CPU at that tick */
};

/* moe.c */
/* (over, when not NULL: set to 1 when the creation failed because the
 * chunk overran its CPU budget, else 0) */
lei_moe *moe_new(lei_ctx *c, uint32_t chid, const char *name, const char *src, size_t len,
                 const uint8_t *p, size_t plen, const lei_moe_opts *o, int svc, int *over,
                 char *err, size_t errlen);
/* Runs fn in the state: 0, or -1 with m->err set (a modulator is failed; a
 * sandbox only when m->svc_kind is SVC_FATAL). */
int moe_run_step(lei_moe *m, lua_CFunction fn, void *arg);
/* The first output of the last step, uncharged and handed over (NULL: none);
 * the others are dropped. */
lei_msg *moe_take_out(lei_moe *m);
double moe_ts_sec(const struct timespec *t);
double moe_cpu_now(void); /* this thread's CPU seconds */
lei_moe *moe_of(lua_State *L);
/* The moe of a step: the hot step's upvalue, else moe_of (a lua_cpcall). */
lei_moe *moe_step_of(lua_State *L);
/* The wall clock of calls (their time in stats, the CPU share's windows):
 * the coarse one (a tick of a few ms): a call's precise monotonic reads
 * were ~2 x 115 ns per event on a loaded VM, more than the rest of a
 * trivial filter's call.  Summed over calls it is exact in the long run
 * (each call counts the ticks it spans). */
#define MOE_WALL_CLOCK CLOCK_MONOTONIC_COARSE
void moe_hook(lua_State *L, lua_Debug *ar);
/* Sends (after the step) or holds the value at idx, per the stage. */
void moe_route(lua_State *L, lei_moe *m, int idx);

/* moe_svc.c: the step of a sandbox's call (moe_run_step's hot step). */
int moe_svc_step(lua_State *L);

/* moe_env.c: the libraries (before lpat replaces their pattern functions), then the
 * environment on top of the stack (its index returned; m->ref_env set). */
void moe_env_sandbox_open(lua_State *L);
int moe_env_build(lua_State *L, lei_moe *m);

/* moe_group.c: around each call of a member. */
void moe_group_enter(lei_moe_group *g, lei_moe *m);
void moe_group_leave(lei_moe_group *g, const struct timespec *now);
/* A member going away: its charges of the window stay with its principal. */
void moe_group_retain(lei_moe_group *g, lei_moe *m);
/* Seconds left of the principal's cool-down (0: none). */
double moe_group_cooling(lei_moe_group *g, const char *principal);

#endif
