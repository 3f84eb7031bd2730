/* lecho.h: the public C API of lecho (link with -llecho; `pkg-config lecho`).
 *
 * What a C (or Fortran, through ISO_C_BINDING) program needs to be a peer of
 * Lua processes on lecho event channels: a context, channels, producers,
 * consumers whose handler is a C function, async and sync submits, the event
 * loop, statistics and error codes.  Every type is opaque.
 *
 *   lecho_ctx *ctx;
 *   const char *opts[] = { "nameserver", "127.0.0.1:7700", NULL };
 *   char err[256];
 *   if (lecho_open(opts, &ctx, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); exit(1); }
 *   lecho_producer *p;
 *   lecho_producer_open(lecho_channel_get(ctx, "heat"), NULL, &p);
 *   lecho_value *ev = lecho_value_new(ctx);
 *   lecho_set_number(ev, "step", 1);
 *   lecho_set_numbers(ev, "u", u, n);            // a Lua array { u[0], ..., u[n-1] }
 *   lecho_submit(p, ev);                         // queued; leaves while the loop runs
 *   lecho_run_once(ctx, 0);                      // serve the loop without blocking
 *   lecho_value_free(ev);
 *   lecho_close(ctx, 2.0);                       // delivers what was submitted, frees all
 *
 * Implementation: liblecho runs a private LuaJIT state per context that loads
 * the Lua layer (`require "lecho"`), so a C peer behaves exactly like a Lua
 * one; the caller never sees Lua.  The Lua files are looked up in
 * $LECHO_LUA_DIR (the *.lua tree; default: where `make install` put them)
 * and $LECHO_LUA_CDIR (where lecho/core.so is; default: $LECHO_LUA_DIR when
 * that is set, else the install directory).
 *
 * Events are Lua values: nil, booleans, numbers (doubles), byte strings,
 * typed n-D arrays (lecho_set_array, lecho_get_array: no element-wise copy)
 * and tables.  In C an event is a lecho_value: one slot holding such a value.
 * Setters and getters take a key: NULL means the slot itself, a string means
 * the field of that name of the table in the slot (made a table by the first
 * keyed setter if the slot is nil).  Arrays of doubles cross in one call
 * (lecho_set_numbers, lecho_get_numbers); nested tables through lecho_field.
 * Fields and array elements are 0-based in C, 1-based in Lua.
 *
 * Threads: a context and everything made from it belong to one thread at a
 * time.  Independent contexts may live in different threads.
 *
 * Memory: each function says who owns what it returns.  Every handle
 * (channel, producer, consumer, value) belongs to its context and is freed by
 * lecho_close at the latest; strings returned as `const char *` are borrowed
 * and valid as said at each function.
 */
#ifndef LECHO_H
#define LECHO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LECHO_API __attribute__((visibility("default")))
#else
#define LECHO_API
#endif

/* ---- error codes: 0 is success; the names are those of the Lua layer's
 * third return value (`nil, msg, code`) ---- */
enum {
    LECHO_OK = 0,
    LECHO_ETIMEOUT,    /* "timeout": no answer in time */
    LECHO_ECLOSED,     /* "closed": the context, endpoint or connection is closed */
    LECHO_EREFUSED,    /* "refused": a peer refused (connection, join, modulator) */
    LECHO_ELIMIT,      /* "limit": a limit was reached (queue, size, depth) */
    LECHO_EWOULDBLOCK, /* "wouldblock": no room now under a non-blocking policy */
    LECHO_EINVAL,      /* "invalid": a bad argument or a value that cannot be sent */
    LECHO_ENOTFOUND,   /* "notfound": no such key, channel or file */
    LECHO_EIO,         /* "io": a system call failed */
    LECHO_EPROTOCOL,   /* "protocol": a peer broke the protocol */
    LECHO_ENOMEM,      /* "nomem": out of memory */
    LECHO_EFAILED,     /* "failed": anything else, e.g. consumers' handlers failed */
    LECHO_ENOSERVICE,  /* "noservice": no server of the service called is known */
    LECHO_EVERSION,    /* "version": servers exist, none with a compatible version */
    LECHO_EBUSY,       /* "busy": refused at once (a service's concurrency + queue, in-flight calls) */
    LECHO_ENOCONSUMER  /* "noconsumer": a sync submit to a channel nobody consumes */
};

typedef struct lecho_ctx lecho_ctx;

/* Static text of a code ("timeout", ...); "unknown" for other numbers. */
LECHO_API const char *lecho_strerror(int code);
/* The message of the last failed call on ctx that has one (the Lua layer's
 * text, e.g. "producer is closed"; getters that return LECHO_ENOTFOUND or
 * LECHO_EINVAL set none).  Borrowed: valid
 * until the next call on ctx.  "" when there was none. */
LECHO_API const char *lecho_errmsg(const lecho_ctx *ctx);

/* ---- contexts ---- */

/* Opens the context of this process.  opts: NULL, or a NULL-terminated list
 * of option name, value strings, the options of the Lua `lecho.context`
 * (doc/api.md): "nameserver" (an address: "a.b.c.d:PORT", "[V6]:PORT" or
 * "unix:/PATH"; without it this context runs a name server of its own),
 * "listen" ("127.0.0.1:0"; any of those forms, port 0: the OS chooses),
 * "advertise" (the address peers are told when "listen" is a wildcard such
 * as "0.0.0.0:0"; port 0: the bound port), "timeout", "sync_timeout",
 * "queue_limit", "policy", "quiet" ("true"), "key" (a secret key file),
 * "trust" (a trust file, or several separated by ':' as in $LECHO_TRUST), ...  A value that reads whole as
 * a number is passed as a number, "true"/"false" as booleans, anything else
 * as a string.  0 with *out set (owned by the caller: lecho_close), or a code
 * and *out NULL; then err (when not NULL) gets why, cut to errlen bytes with
 * the NUL.  An unknown option or a bad value is LECHO_EINVAL; out NULL too. */
LECHO_API int lecho_open(const char *const *opts, lecho_ctx **out, char *err, size_t errlen);
/* Delivers what was submitted (waiting at most linger seconds; < 0: the
 * context's `linger` option, 2 s), closes every endpoint and frees the
 * context and every handle made from it.  0, or a code when something could
 * not be delivered (LECHO_ETIMEOUT: still queued at the end of linger;
 * LECHO_ECLOSED: async events a connection's end dropped, at any time since
 * the context began, counted in the stats' "undelivered", or written to a
 * consuming context whose connection ended abnormally before it confirmed
 * reading them, counted in "unconfirmed"; it is logged
 * unless "quiet"; the context is freed all the same).  NULL is a no-op.
 * A linger that is NaN is refused (LECHO_EINVAL, as in a consumer handler):
 * nothing is closed nor freed, the context stays open and usable, and the
 * caller closes it again with a number.  A program that returns from
 * main, or calls exit(), without lecho_close has its contexts closed so
 * (with their `linger`; what could not be delivered on stderr, and an
 * exit status 0 made 1 then: the handler flushes stdio and _exits) by an exit
 * handler registered per context's state (glibc's on_exit), but only in
 * the thread that opened them: a context of another thread, _exit(), a
 * kill or a crash loses what is still queued.  Call lecho_close before the
 * end. */
LECHO_API int lecho_close(lecho_ctx *ctx, double linger);
/* lecho_close that also tells why: err (when not NULL) gets the message of
 * a failure ("3 events (3145728 bytes) not delivered within ..."), "" on
 * success, cut to errlen bytes with the NUL (ctx is gone: lecho_errmsg
 * cannot say it afterwards). */
LECHO_API int lecho_close_err(lecho_ctx *ctx, double linger, char *err, size_t errlen);
/* lecho_close_err that frees no memory: the endpoints are closed, what was
 * submitted delivered (or LECHO_ETIMEOUT, LECHO_ECLOSED), no call but lecho_close_free is
 * valid on ctx afterwards, and the values (and the arrays in them) the
 * caller still points into stay valid until lecho_close_free(ctx) frees
 * them with the context (the Python binding's close under live arrays). */
LECHO_API int lecho_close_keep(lecho_ctx *ctx, double linger, char *err, size_t errlen);
/* Frees a context closed by lecho_close_keep (NULL: a no-op). */
LECHO_API void lecho_close_free(lecho_ctx *ctx);
/* The address peers reach this context at ("host:port", "[v6]:port",
 * "unix:/path"; for a wildcard listen, the advertised one); with no
 * "nameserver" option, also the address of its name server, to give to
 * other processes.  Borrowed: valid while ctx is open. */
LECHO_API const char *lecho_address(const lecho_ctx *ctx);
/* The name server this context uses (an address, as above).  Borrowed, as above. */
LECHO_API const char *lecho_nameserver(const lecho_ctx *ctx);

/* ---- the event loop: events leave, arrive and handlers run only inside
 * these calls (and inside a waiting submit_sync or lecho_close) ---- */
/* Runs until lecho_stop.  0, or a code.  Unless opened with signals false,
 * SIGINT and SIGTERM during it close the context and end the process by
 * that signal; a handler that loops in C is not interrupted by the first,
 * and a second one ends the process at once (doc/c-api.md). */
LECHO_API int lecho_run(lecho_ctx *ctx);
/* One loop turn: waits at most timeout seconds for something to do (0: does
 * not block; < 0: until something happens), then runs what is due. */
LECHO_API int lecho_run_once(lecho_ctx *ctx, double timeout);
/* Makes lecho_run return after the current turn (e.g. from a handler). */
LECHO_API int lecho_stop(lecho_ctx *ctx);

/* ---- values (events) ---- */
typedef struct lecho_value lecho_value;

enum { LECHO_TNIL = 0, LECHO_TBOOLEAN, LECHO_TNUMBER, LECHO_TSTRING, LECHO_TTABLE,
       LECHO_TOTHER, LECHO_TARRAY };

/* A new slot holding nil.  Owned by the caller: lecho_value_free (or
 * lecho_close).  NULL when out of memory. */
LECHO_API lecho_value *lecho_value_new(lecho_ctx *ctx);
/* Frees the handle (not the values other handles or tables still refer to).
 * NULL is a no-op, and so is a borrowed handle (the event given to a
 * handler, the key and value given to a lecho_each or lecho_pairs callback). */
LECHO_API void lecho_value_free(lecho_value *v);

/* Setters: key NULL sets the slot; a key sets that field of the table in the
 * slot (a nil slot becomes a new table first).  The value is copied (strings
 * and arrays too): the caller keeps its buffers.  0, LECHO_EINVAL (a key
 * was given and the slot holds neither a table nor nil) or LECHO_ENOMEM. */
LECHO_API int lecho_set_nil(lecho_value *v, const char *key);
LECHO_API int lecho_set_bool(lecho_value *v, const char *key, int b);
LECHO_API int lecho_set_number(lecho_value *v, const char *key, double x);
/* len bytes from s (any bytes, zeros included); s may be NULL when len is 0
 * (NULL with len > 0: LECHO_EINVAL). */
LECHO_API int lecho_set_string(lecho_value *v, const char *key, const char *s, size_t len);
/* A Lua array { x[0], ..., x[n-1] } (an empty table when n is 0). */
LECHO_API int lecho_set_numbers(lecho_value *v, const char *key, const double *x, size_t n);
/* An empty table. */
LECHO_API int lecho_set_table(lecho_value *v, const char *key);
/* Stores (a reference to) what the slot `from` holds: a table is shared, so
 * later changes through `from` show through v (as in Lua). */
LECHO_API int lecho_set_value(lecho_value *v, const char *key, const lecho_value *from);

/* Getters: key NULL reads the slot, a key the field of the table in it.
 * lecho_type: one of LECHO_T*; LECHO_TNIL when the slot is not a table or
 * has no such field. */
LECHO_API int lecho_type(const lecho_value *v, const char *key);
/* 0 with *out set; LECHO_ENOTFOUND (nil or missing) or LECHO_EINVAL (another type). */
LECHO_API int lecho_get_number(const lecho_value *v, const char *key, double *out);
LECHO_API int lecho_get_bool(const lecho_value *v, const char *key, int *out);
/* The bytes of a string (NUL-terminated after *len bytes), or NULL when it is
 * not a string.  Borrowed: valid while v holds the same value (for a
 * handler's event: until the handler returns).  len may be NULL. */
LECHO_API const char *lecho_get_string(const lecho_value *v, const char *key, size_t *len);
/* Length of the array part (Lua's #), 0 when not a table. */
LECHO_API size_t lecho_len(const lecho_value *v, const char *key);
/* Copies at most max numbers of the array (elements 1.. of the Lua table) to
 * out and returns how many elements the array has (which may be more than
 * max); a non-number element is copied as NaN.  out NULL: nothing copied
 * (the count only). */
LECHO_API size_t lecho_get_numbers(const lecho_value *v, const char *key, double *out, size_t max);
/* A new handle on the field `key` (NULL: on array element `index`, 0-based)
 * of the table in v.  Owned by the caller (lecho_value_free).  NULL when v
 * holds no table or out of memory; a missing field gives a slot holding nil. */
LECHO_API lecho_value *lecho_field(const lecho_value *v, const char *key, size_t index);
/* Calls fn(key, value, ud) for each string-keyed field of the table in v, in
 * no particular order, and skips every other key (array elements, numbers,
 * booleans: lecho_pairs sees them); key and value are borrowed for the call.
 * Stops when fn returns nonzero and returns that.  fn must not add fields
 * to the table, and, as a handler, cannot call what waits (lecho_run,
 * lecho_run_once, lecho_close, lecho_submit_sync, ...: LECHO_EINVAL). */
LECHO_API int lecho_each(const lecho_value *v,
                         int (*fn)(const char *key, const lecho_value *value, void *ud),
                         void *ud);
/* As lecho_each, for every key of the table, whatever its type: fn gets the
 * key as a value (lecho_type(key, NULL), lecho_get_string(key, NULL, &len),
 * lecho_get_number(key, NULL, &x), ...).  To refuse a table with a key
 * that is not a string, return nonzero when lecho_type(key, NULL) !=
 * LECHO_TSTRING. */
LECHO_API int lecho_pairs(const lecho_value *v,
                          int (*fn)(const lecho_value *key, const lecho_value *value, void *ud),
                          void *ud);
/* ---- arrays: typed n-D numeric arrays (doc/wire-format.md, tag 0x07),
 * a lecho.array in Lua ---- */
#define LECHO_ARRAY_MAXDIM 8
/* Called once the array (and every message being sent from its memory) no
 * longer needs data, from inside a lecho call on the context's thread. */
typedef void (*lecho_free_fn)(void *data, void *ud);
/* Sets key (NULL: the slot) to an array of dtype ("<u1" "<i1" "<u2" "<i2"
 * "<u4" "<i4" "<u8" "<i8" "<f4" "<f8": NumPy's names, little-endian), ndim
 * (0..8) dims shape[], whose elements are at data, row-major, without gaps
 * (product(shape) * element size bytes; any alignment).  No element-wise
 * copy:
 *   - free_fn NULL: data is lent.  It must stay valid and unchanged while a
 *     lecho_submit or lecho_submit_sync of a value holding the array runs;
 *     each submit copies its bytes into the message (one memcpy) and
 *     returns; the caller may then change or free data, and must not
 *     submit the value again without setting the array again.
 *   - free_fn given: the array owns data from a successful call on (on a
 *     failure it stays the caller's).  Submits send it with no copy at all
 *     (the frame's iovec points at data, 64 KiB and more); data must not
 *     change until free_fn(data, ud) is called, once, when neither the
 *     value nor a queued event holds the array any more (at the latest by
 *     lecho_close).
 * 0, LECHO_EINVAL (bad dtype, ndim, shape, data NULL with elements, or a
 * key given and the slot holds neither a table nor nil), LECHO_ENOMEM. */
LECHO_API int lecho_set_array(lecho_value *v, const char *key, const char *dtype, int ndim,
                              const size_t *shape, const void *data, lecho_free_fn free_fn,
                              void *ud);
/* What lecho_get_array fills in. */
typedef struct lecho_array_info {
    const void *data;   /* the first element, aligned to its size; NULL when no elements */
    const char *dtype;  /* "<f8", ...: static */
    int ndim;
    size_t shape[LECHO_ARRAY_MAXDIM];
    size_t count;       /* elements: the product of shape */
    size_t itemsize;    /* bytes per element */
} lecho_array_info;
/* The array at key (NULL: the slot): 0 with *out filled, its elements
 * row-major without gaps.  Borrowed: valid while v holds the same value
 * (for a handler's event: until the handler returns; an array received in
 * place is moved once into memory of its own if it was not aligned).
 * LECHO_ENOTFOUND (nil or missing), LECHO_EINVAL (not an array). */
LECHO_API int lecho_get_array(const lecho_value *v, const char *key, lecho_array_info *out);
/* A whole value in one call, as nodes in pre-order, for bindings that
 * convert it to their own values (python/lecho/): a scalar is one node; a
 * table is a LECHO_TTABLE node followed by its pairs, each a key's nodes
 * then the value's nodes, the array part (keys 1..len, in order) first.
 * Strings (keys too) point into the value: borrowed, valid while v holds
 * the same value (for a handler's event: until the handler returns).  An
 * array is one LECHO_TARRAY node whose str points at its elements, in
 * memory of the array's own (a view into the read buffer is copied out
 * once, as a waiting Lua handler's is): valid while anything holds the
 * array (a lecho_value holding the value, lecho_set_value, pins it), so a
 * binding can hand the memory over without copying it.  A strided view
 * (made in Lua) is LECHO_EINVAL. */
typedef struct lecho_node {
    int type;        /* LECHO_T*: LECHO_TNIL, _TBOOLEAN, _TNUMBER, _TSTRING, _TTABLE, _TARRAY */
    size_t n;        /* TSTRING: its length; TTABLE: its number of pairs; TARRAY: its bytes */
    size_t len;      /* TTABLE: the length of its array part (pairs 1..len come first) */
    double num;      /* TNUMBER: the number; TBOOLEAN: 0 or 1 */
    const char *str; /* TSTRING: the bytes (NUL after n); TARRAY: the elements (no copy) */
    const lecho_array_info *array; /* TARRAY: dtype, shape (owned by the context, as the nodes) */
} lecho_node;
/* The nodes of the value in v (key: NULL, the slot; a string, that field).
 * 0 with *nodes and *count set (an array owned by the context, valid until
 * the next lecho_nodes on it or lecho_close); LECHO_ELIMIT when tables nest
 * deeper than 200 (a table that holds itself) and LECHO_EINVAL for a value
 * an event cannot hold (a function: LECHO_TOTHER), both with lecho_errmsg;
 * LECHO_ENOMEM. */
LECHO_API int lecho_nodes(const lecho_value *v, const char *key, const lecho_node **nodes,
                          size_t *count);
/* lecho_nodes with every string's bytes (keys too) copied, in node order,
 * into one array owned by the context: each node's str points into it,
 * *bytes is its start, *nbytes its length.  A binding then takes all the
 * strings of a value (a batch of events) out of the library in one copy.
 * Valid until the next lecho_nodes or lecho_nodes_packed on the context. */
LECHO_API int lecho_nodes_packed(const lecho_value *v, const char *key, const lecho_node **nodes,
                                 size_t *count, const char **bytes, size_t *nbytes);
/* The reverse: sets v's slot (key NULL) or field key to the value whose
 * count nodes, in the order lecho_nodes gives (for a table: its n pairs,
 * len of them the array part; a binding may give len 0 and list the
 * elements as pairs with number keys), are at nodes.  Strings are copied;
 * an array node is LECHO_EINVAL (set arrays with lecho_set_array).
 * 0; LECHO_EINVAL for nodes that do not make one value (lecho_errmsg says
 * where), a nil or NaN key, or a key given and a slot that holds neither a
 * table nor nil; LECHO_ENOMEM. */
LECHO_API int lecho_set_nodes(lecho_value *v, const char *key, const lecho_node *nodes,
                              size_t count);

/* The value as text, bounded (for logs): "{ step = 3, u = { 1, 2, ... } }".
 * Borrowed: valid until the next lecho_to_string on the same context or
 * lecho_close; "?" when out of memory. */
LECHO_API const char *lecho_to_string(const lecho_value *v);

/* ---- channels ---- */
typedef struct lecho_channel lecho_channel;

/* The channel `name` ("ozone", or "host:port/ozone" for a channel of another
 * name server).  Owned by ctx (the same handle for the same name); NULL when
 * out of memory or the name is invalid ("" for instance; lecho_errmsg says
 * why). */
LECHO_API lecho_channel *lecho_channel_get(lecho_ctx *ctx, const char *name);
/* Its full name "ns-host:port/name".  Borrowed: valid while ctx is open. */
LECHO_API const char *lecho_channel_name(const lecho_channel *ch);

/* ---- producers ---- */
typedef struct lecho_producer lecho_producer;

/* A producer on ch; returns once the channel's manager said where the
 * consumers are (runs the loop meanwhile).  policy: NULL (the context's),
 * "block", "drop_oldest", "drop_newest" or "disconnect" (doc/semantics.md: what happens
 * when a consumer's queue is full).  0 with *out set (owned by ctx;
 * lecho_producer_close ends it early), or a code. */
LECHO_API int lecho_producer_open(lecho_channel *ch, const char *policy, lecho_producer **out);
/* Queues ev for every consumer of the channel and returns at once (under the
 * "block" policy, first runs the loop until there is room).  The value is
 * encoded during the call: the caller may change or free ev afterwards.
 * 0, or a code (LECHO_EINVAL: ev cannot be encoded; LECHO_ETIMEOUT: the
 * wait for room was ended by lecho_set_interrupt's fn; nothing was sent). */
LECHO_API int lecho_submit(lecho_producer *p, const lecho_value *ev);

/* What a sync submit reports per failing consumer. */
typedef struct lecho_errors lecho_errors;

/* Submits ev and runs the loop until every consumer ran its handler on it
 * (and, by order, on everything submitted before), or timeout seconds
 * (< 0: the context's sync_timeout, 10 s).  0 when all succeeded; else the
 * Lua layer's code (LECHO_ETIMEOUT when every listed consumer was silent,
 * LECHO_EFAILED when a handler failed, whatever its message says: see
 * lecho_errors_code) and, when errs is not NULL, *errs gets the list of
 * failing or silent consumers (owned by the caller: lecho_errors_free; NULL
 * when the failure is not per consumer, e.g. a closed producer:
 * lecho_errmsg says why).  LECHO_ENOCONSUMER at once when the channel has
 * no consumer anywhere (nothing is sent), or when the consumers of a
 * consuming context closed before the event came there (its entry).
 * Must not be called from a consumer handler (LECHO_EINVAL). */
LECHO_API int lecho_submit_sync(lecho_producer *p, const lecho_value *ev, double timeout,
                                lecho_errors **errs);
/* Writes what this context has queued, now, instead of at the end of the
 * loop turn. */
LECHO_API int lecho_flush(lecho_producer *p);
/* Records every event p submits from now on into the file at path, in the
 * format `lecho record` writes (doc/recording.md), from a writer thread of
 * the library (the submit pays a copy; the policy at a full buffer is
 * "block"); path NULL: no more (the file closed, everything submitted
 * written).  An existing file is refused (LECHO_EFAILED with why); closing
 * the producer or the context closes the file too. */
LECHO_API int lecho_producer_record(lecho_producer *p, const char *path);
/* A recording several producers of ctx share, with the options of Lua's
 * ctx:recorder (doc/recording.md "In the producer's process"): opts NULL,
 * or a table value (lecho_value_new + lecho_set_*) of "policy" ("block" or
 * "drop"), "buffer_bytes", "max_bytes", "keep", "append" (boolean),
 * "fsync" (boolean).  0 with *out set (owned by ctx: lecho_recorder_close,
 * or lecho_close closes it), or a code (LECHO_EFAILED: the file exists and
 * append is not set, ...; LECHO_EINVAL: an unknown option or a bad value)
 * and *out NULL. */
typedef struct lecho_recorder lecho_recorder;
LECHO_API int lecho_recorder_open(lecho_ctx *ctx, const char *path, const lecho_value *opts,
                                  lecho_recorder **out);
/* p records every event it submits from now on into r (a recorder of the
 * same context); r NULL: no more (as lecho_producer_record(p, NULL)). */
LECHO_API int lecho_producer_record_to(lecho_producer *p, lecho_recorder *r);
/* Waits until every event its producers submitted is in the file (fsync
 * nonzero: and on the disk).  0 or a code (LECHO_ECLOSED: closed). */
LECHO_API int lecho_recorder_flush(lecho_recorder *r, int fsync);
/* Its counters, a table value (owned by the caller: lecho_value_free):
 * events (written), submitted, queued, dropped, lost, bytes, rotations,
 * blocked, buffered, open, error.  NULL on failure. */
LECHO_API lecho_value *lecho_recorder_stats(lecho_recorder *r);
/* Writes what is left, closes the file (its producers record nothing more)
 * and frees the handle; returns the last counters as lecho_recorder_stats
 * does (owned by the caller; NULL on failure, closed all the same). */
LECHO_API lecho_value *lecho_recorder_close(lecho_recorder *r);
/* Ends the producer (what it submitted is still delivered while the context
 * lives) and frees the handle.  NULL is a no-op. */
LECHO_API void lecho_producer_close(lecho_producer *p);

/* The list of a failed sync submit. */
LECHO_API size_t lecho_errors_count(const lecho_errors *e);
/* Entry i (0-based): the consuming context ("host:port", or "local" for a
 * consumer of the producing context itself), the consumer ("host:port/cN",
 * or "" when the whole context failed) and the message (what the handler
 * returned or raised, or why there was no answer).  Borrowed: valid until
 * lecho_errors_free.  NULL past the end. */
LECHO_API const char *lecho_errors_context(const lecho_errors *e, size_t i);
LECHO_API const char *lecho_errors_consumer(const lecho_errors *e, size_t i);
LECHO_API const char *lecho_errors_message(const lecho_errors *e, size_t i);
/* Entry i's code: LECHO_EFAILED (its handler or modulator failed),
 * LECHO_ETIMEOUT (no answer in time), LECHO_ECLOSED (the consumer went
 * away), ...; lecho_submit_sync returns it when every entry has the same
 * one, else LECHO_EFAILED.  LECHO_OK past the end. */
LECHO_API int lecho_errors_code(const lecho_errors *e, size_t i);
/* The whole list as one line, as Lua prints it.  Borrowed as above. */
LECHO_API const char *lecho_errors_text(const lecho_errors *e);
LECHO_API void lecho_errors_free(lecho_errors *e);

/* ---- consumers ---- */
typedef struct lecho_consumer lecho_consumer;

/* What a handler learns besides the event.  Borrowed for the call. */
typedef struct lecho_meta {
    const char *channel;  /* ro: the channel's name (as Lua's meta.channel) */
    const char *producer; /* ro: "host:port#id" */
    double seq;           /* ro: 1, 2, 3 ... per producer */
} lecho_meta;

/* A consumer handler: runs inside the loop calls for each event of the
 * channel, in each producer's order.  ev is borrowed for the call (read it
 * with the getters; copy what you keep).  Returns NULL on success, or a
 * message: the event counts as failed, and a producer's lecho_submit_sync
 * (or Lua submit_sync) gets that message (the string is copied at once; it
 * may be static or in a buffer of ud's).  A handler may call lecho_submit,
 * lecho_flush, lecho_stop, lecho_*_close of endpoints and the value
 * functions.  What waits cannot run inside a C handler (it cannot suspend
 * the way a Lua handler does): lecho_submit_sync, lecho_producer_open,
 * lecho_consumer_open, lecho_run, lecho_run_once and lecho_close return
 * LECHO_EINVAL there, and so does lecho_submit on a producer under the
 * "block" policy (the default), which may have to wait for room: a handler
 * that forwards events uses a producer opened with "drop_oldest",
 * "drop_newest" or "disconnect". */
typedef const char *(*lecho_handler)(const lecho_value *ev, const lecho_meta *meta, void *ud);

/* A consumer on ch running fn(ev, meta, ud); returns once every producing
 * process knows of it (runs the loop meanwhile).  0 with *out set (owned by
 * ctx; lecho_consumer_close ends it early), or a code. */
LECHO_API int lecho_consumer_open(lecho_channel *ch, lecho_handler fn, void *ud,
                                  lecho_consumer **out);
/* lecho_consumer_open with options: opts NULL, or a value holding a table
 * of the Lua ch:consumer's options (README "Modulators"): "modulator" (Lua
 * source of a modulator shipped to every producing process), "params" (its
 * shared params, any value), "period", "capabilities" (a list of strings).
 * fn gets what the modulator sent.  A modulator that fails at a producer is
 * logged by the context (Lua's on_error default); "on_error" true instead
 * holds those failures (at most 100) until lecho_consumer_on_error sets the
 * function, which then hears them: the open turns the loop, a failure may
 * come before that call (lecho_consumer_open_queued takes it too).  An unknown option, or a
 * modulator that does not compile: LECHO_EINVAL with lecho_errmsg. */
LECHO_API int lecho_consumer_open_opts(lecho_channel *ch, lecho_handler fn, void *ud,
                                       const lecho_value *opts, lecho_consumer **out);
/* What a consumer hears when its modulator failed at a producer (it did
 * not compile or load there, the producer's policy refused it, or it
 * raised): the Lua API's consumer on_error.  msg is borrowed for the call. */
typedef void (*lecho_error_fn)(const char *msg, void *ud);
/* Sets (fn NULL: clears) c's error function: called inside the loop calls
 * with each such failure's message, instead of the context's log line.
 * It may call what a lecho_handler may.  fn and ud must stay valid until
 * lecho_consumer_close.  0, or LECHO_EINVAL. */
LECHO_API int lecho_consumer_on_error(lecho_consumer *c, lecho_error_fn fn, void *ud);
/* A consumer without a handler: its events wait in a queue inside the
 * context until lecho_consumer_take takes them, so that a binding makes no
 * call per event (python/lecho's iterators).  opts as for
 * lecho_consumer_open_opts.  At most limit events wait (>= 1); past it an
 * event fails at this consumer with "queue full" (a sync submit sees it)
 * and is counted (lecho_consumer_take's *dropped).  The ack of a sync
 * event is held until the binding says it is done with the event
 * (lecho_consumer_settle), or the consumer closes (then it fails with "not
 * handled: the subscription closed"); the producer's connection is not
 * held meanwhile.  0 with *out set (owned by ctx), or a code. */
LECHO_API int lecho_consumer_open_queued(lecho_channel *ch, const lecho_value *opts, size_t limit,
                                         lecho_consumer **out);
/* Moves at most max of c's queued events, oldest first, into v's slot: a
 * list { ev, ... }, or with meta nonzero { { ev, producer, seq, channel }, ... }
 * (lecho_meta's fields)
 * (an event that is nil is a hole in the list: use meta to see it).
 * *taken (when not NULL) gets how many, *dropped (when not NULL) how many
 * events the queue refused since the consumer opened.  Runs no loop: call
 * lecho_run_once when it takes 0.  LECHO_EINVAL for a consumer not opened
 * with lecho_consumer_open_queued.  When c is the only consumer of its
 * channel in the context, the large arrays of those events (read buffers
 * taken over, doc/python.md) are held by v alone: lecho_value_free(v)
 * gives their buffers back to the context at once, for the next frames
 * (no collection of the context's Lua state needed), and what pointed
 * into them is gone with v; a handle made from v first (lecho_field,
 * lecho_set_value from v) keeps them, and they go back when collected. */
LECHO_API int lecho_consumer_take(lecho_consumer *c, lecho_value *v, size_t max, int meta,
                                  size_t *taken, size_t *dropped);
/* Runs the loop until c (opened with lecho_consumer_open_queued) has an
 * event queued, or timeout seconds passed (< 0: no limit), or the context
 * closed: lecho_run_once's turns without a return to the caller for each
 * (a large event comes in many reads).  When nothing is queued it first
 * collects what the caller let go of, if a large array's read buffer is
 * out and no spare fits the next such frame: that buffer is the next
 * frame's (doc/python.md).  0 whether or not an event came
 * (lecho_consumer_take says), or a code; LECHO_EINVAL from a handler. */
LECHO_API int lecho_consumer_wait(lecho_consumer *c, double timeout);
/* Settles the n oldest events lecho_consumer_take took from c and not
 * settled yet (at most as many as were taken): err NULL, the code was done
 * with them, and the held acks of the sync ones among them go out (with
 * what the other consumers of the context found); else they fail at this
 * consumer with err (copied; a producer's lecho_submit_sync gets it).
 * Runs no loop.  LECHO_EINVAL for a consumer not opened with
 * lecho_consumer_open_queued. */
LECHO_API int lecho_consumer_settle(lecho_consumer *c, size_t n, const char *err);
/* Changes the params of the consumer's modulator at every producer and
 * returns once every producer applied them (c:set_params); 0, or a code
 * (LECHO_EINVAL: the consumer has no modulator).  Not from a handler. */
LECHO_API int lecho_consumer_set_params(lecho_consumer *c, const lecho_value *params);
/* Leaves: fn is not called again.  Frees the handle.  NULL is a no-op.
 * The channel's manager is told before it returns (no lecho_run needed
 * after it); from a handler, at the next loop turn or when lecho_run or
 * lecho_run_once returns, whichever comes first (a close and an open in
 * one handler keep the flow). */
LECHO_API void lecho_consumer_close(lecho_consumer *c);

/* ---- services and calls (README "Services and calls") ---- */
typedef struct lecho_service lecho_service;

/* A service handler: runs inside the loop calls for each call of the
 * service, with args (the caller's value) and meta (a table: service,
 * version, caller, key, deadline), both borrowed for the call.  It sets
 * its one result in the slot `result` (key NULL; nil if it sets nothing)
 * and returns NULL, or returns a message: the caller's lecho_call (or Lua
 * ctx:call) fails with it, code LECHO_EFAILED.  What waits cannot run in it
 * (as in a consumer handler, lecho_handler). */
typedef const char *(*lecho_service_fn)(const lecho_value *args, const lecho_value *meta,
                                        lecho_value *result, void *ud);
/* Serves `name` with fn(args, meta, result, ud) (ctx:service): opts NULL or
 * a value holding a table of its options ("version", "concurrency",
 * "queue", "queue_bytes", "budget").  0 with *out set (owned by ctx;
 * lecho_service_close unloads it), or a code. */
LECHO_API int lecho_service_open(lecho_ctx *ctx, const char *name, lecho_service_fn fn, void *ud,
                                 const lecho_value *opts, lecho_service **out);
/* Unloads the service (calls running finish; later ones get "noservice")
 * and frees the handle.  NULL is a no-op. */
LECHO_API void lecho_service_close(lecho_service *s);
/* Calls a server of `name` with args (NULL: nil) and runs the loop until
 * it answers (ctx:call): opts NULL or a value holding a table ("timeout",
 * "version", "min_version", "key", "at", "retries").  0 with *results (when
 * not NULL) a new value holding the list of the handler's results, its
 * field "n" their count (nils kept); or a code (LECHO_ENOSERVICE,
 * LECHO_EVERSION, LECHO_EBUSY, LECHO_ETIMEOUT, LECHO_EFAILED: the handler
 * failed, ...) with lecho_errmsg, and *results a new value holding the
 * error value (a handler may raise a table).  *results is owned by the
 * caller (lecho_value_free).  Not from a handler (LECHO_EINVAL). */
LECHO_API int lecho_call(lecho_ctx *ctx, const char *name, const lecho_value *args,
                         const lecho_value *opts, lecho_value **results);

/* ---- without waiting (an event loop of the caller's: asyncio, a GUI) ---- */
/* lecho_submit_sync and lecho_call, started: the event leaves (the request
 * is queued) now, and *pending (owned by the caller: lecho_value_free) is
 * a table whose boolean "done" turns true once the outcome is in, carried
 * by the loop calls (lecho_run_once) meanwhile.  Then "ok" is true (a call:
 * "results", as lecho_call's), or false with "message", "code" (the name of
 * a code, as lecho_strerror's) and, for a submit_sync, "errors" (4 strings
 * per failing consumer: context, consumer, message, code name) or, for a
 * call, "value" (the error value).  0, or a code (nothing started).  Not
 * from a handler (LECHO_EINVAL). */
LECHO_API int lecho_submit_sync_start(lecho_producer *p, const lecho_value *ev, double timeout,
                                      lecho_value **pending);
LECHO_API int lecho_call_start(lecho_ctx *ctx, const char *name, const lecho_value *args,
                               const lecho_value *opts, lecho_value **pending);

/* ---- statistics ---- */
/* The context's counters as a value (the table Lua's ctx:stats() returns:
 * "channels" -> name -> { events_out, bytes_out, events_in, ... }, "peers",
 * ...).  Owned by the caller (lecho_value_free); NULL on failure. */
LECHO_API lecho_value *lecho_stats(lecho_ctx *ctx);
/* fn(ud) is asked between the loop turns of every wait on the caller's
 * line inside an API call (lecho_close's linger, opening a producer or a
 * consumer, the name server's answers, a submit waiting for room under
 * "block"): nonzero ends that wait at once, as if its time ran out (close
 * then closes without lingering further; an opening or that submit fails
 * with a timeout, the submit having sent nothing).  A signal ends a turn, so a binding whose
 * signal handlers run only between C calls (Python) lets Ctrl-C through a
 * long wait this way.  NULL: none (the default). */
LECHO_API int lecho_set_interrupt(lecho_ctx *ctx, int (*fn)(void *ud), void *ud);

/* One counter of one channel, e.g. lecho_stat(ctx, "heat", "events_out"):
 * the number, or -1 when the channel or counter does not exist (yet; a
 * channel this context has no handle for is not created by asking). */
LECHO_API double lecho_stat(lecho_ctx *ctx, const char *channel, const char *counter);

#ifdef __cplusplus
}
#endif

#endif
