"""lecho._ffi: the declarations of core/lecho.h that the package uses, and
the loaded liblecho (cffi, ABI mode: no compiler needed at run time).

Where liblecho is looked for, first found wins:
  1. $LECHO_LIBRARY (a path to liblecho.so);
  2. the path `make install` wrote into lecho/_paths.py;
  3. this checkout's build/liblecho.so (`make`, or `make liblecho`), which finds the
     checkout's Lua files by itself.
"""
import os
import sys


def _debian_python(module, package):
    """The message of an ImportError for a module this package needs from
    Debian: which python3 runs, and that Debian's has it."""
    return ("lecho needs %s (Debian's %s), which %s cannot import: run Debian's /usr/bin/python3 "
            "(make deps installs %s for it), not another python3 found first on PATH (pyenv, conda, "
            "a virtualenv without system packages)" % (module, package, sys.executable, package))


try:
    from cffi import FFI
except ImportError as _e:
    raise ImportError(_debian_python("cffi", "python3-cffi")) from _e

CDEF = r"""
enum {
    LECHO_OK = 0, LECHO_ETIMEOUT, LECHO_ECLOSED, LECHO_EREFUSED, LECHO_ELIMIT,
    LECHO_EWOULDBLOCK, LECHO_EINVAL, LECHO_ENOTFOUND, LECHO_EIO, LECHO_EPROTOCOL,
    LECHO_ENOMEM, LECHO_EFAILED, LECHO_ENOSERVICE, LECHO_EVERSION, LECHO_EBUSY,
    LECHO_ENOCONSUMER
};
enum { LECHO_TNIL = 0, LECHO_TBOOLEAN, LECHO_TNUMBER, LECHO_TSTRING, LECHO_TTABLE, LECHO_TOTHER,
       LECHO_TARRAY };
#define LECHO_ARRAY_MAXDIM 8

typedef struct lecho_ctx lecho_ctx;
typedef struct lecho_value lecho_value;
typedef struct lecho_channel lecho_channel;
typedef struct lecho_producer lecho_producer;
typedef struct lecho_consumer lecho_consumer;
typedef struct lecho_errors lecho_errors;
typedef struct lecho_service lecho_service;
typedef struct lecho_recorder lecho_recorder;

typedef struct lecho_meta {
    const char *channel;
    const char *producer;
    double seq;
} lecho_meta;

typedef void (*lecho_free_fn)(void *data, void *ud);
typedef struct lecho_array_info {
    const void *data;
    const char *dtype;
    int ndim;
    size_t shape[8];
    size_t count;
    size_t itemsize;
} lecho_array_info;

typedef struct lecho_node {
    int type;
    size_t n;
    size_t len;
    double num;
    const char *str;
    const lecho_array_info *array;
} lecho_node;

typedef const char *(*lecho_handler)(const lecho_value *ev, const lecho_meta *meta, void *ud);
typedef const char *(*lecho_service_fn)(const lecho_value *args, const lecho_value *meta,
                                        lecho_value *result, void *ud);

const char *lecho_strerror(int code);
const char *lecho_errmsg(const lecho_ctx *ctx);
int lecho_open(const char *const *opts, lecho_ctx **out, char *err, size_t errlen);
int lecho_close_err(lecho_ctx *ctx, double linger, char *err, size_t errlen);
int lecho_close_keep(lecho_ctx *ctx, double linger, char *err, size_t errlen);
void lecho_close_free(lecho_ctx *ctx);
const char *lecho_address(const lecho_ctx *ctx);
const char *lecho_nameserver(const lecho_ctx *ctx);
int lecho_run_once(lecho_ctx *ctx, double timeout);
int lecho_stop(lecho_ctx *ctx);

lecho_value *lecho_value_new(lecho_ctx *ctx);
void lecho_value_free(lecho_value *v);
int lecho_set_array(lecho_value *v, const char *key, const char *dtype, int ndim,
                    const size_t *shape, const void *data, lecho_free_fn free_fn, void *ud);
lecho_value *lecho_field(const lecho_value *v, const char *key, size_t index);
int lecho_set_value(lecho_value *v, const char *key, const lecho_value *from);
int lecho_nodes(const lecho_value *v, const char *key, const lecho_node **nodes, size_t *count);
int lecho_nodes_packed(const lecho_value *v, const char *key, const lecho_node **nodes,
                       size_t *count, const char **bytes, size_t *nbytes);
int lecho_set_nodes(lecho_value *v, const char *key, const lecho_node *nodes, size_t count);

lecho_channel *lecho_channel_get(lecho_ctx *ctx, const char *name);
const char *lecho_channel_name(const lecho_channel *ch);

int lecho_producer_open(lecho_channel *ch, const char *policy, lecho_producer **out);
int lecho_submit(lecho_producer *p, const lecho_value *ev);
int lecho_submit_sync(lecho_producer *p, const lecho_value *ev, double timeout, lecho_errors **errs);
int lecho_flush(lecho_producer *p);
int lecho_producer_record(lecho_producer *p, const char *path);
int lecho_recorder_open(lecho_ctx *ctx, const char *path, const lecho_value *opts, lecho_recorder **out);
int lecho_producer_record_to(lecho_producer *p, lecho_recorder *r);
int lecho_recorder_flush(lecho_recorder *r, int fsync);
lecho_value *lecho_recorder_stats(lecho_recorder *r);
lecho_value *lecho_recorder_close(lecho_recorder *r);
void lecho_producer_close(lecho_producer *p);

size_t lecho_errors_count(const lecho_errors *e);
const char *lecho_errors_context(const lecho_errors *e, size_t i);
const char *lecho_errors_consumer(const lecho_errors *e, size_t i);
const char *lecho_errors_message(const lecho_errors *e, size_t i);
int lecho_errors_code(const lecho_errors *e, size_t i);
const char *lecho_errors_text(const lecho_errors *e);
void lecho_errors_free(lecho_errors *e);

int lecho_consumer_open_opts(lecho_channel *ch, lecho_handler fn, void *ud,
                             const lecho_value *opts, lecho_consumer **out);
int lecho_consumer_open_queued(lecho_channel *ch, const lecho_value *opts, size_t limit,
                               lecho_consumer **out);
int lecho_consumer_take(lecho_consumer *c, lecho_value *v, size_t max, int meta,
                        size_t *taken, size_t *dropped);
int lecho_consumer_settle(lecho_consumer *c, size_t n, const char *err);
int lecho_consumer_wait(lecho_consumer *c, double timeout);
int lecho_consumer_set_params(lecho_consumer *c, const lecho_value *params);
void lecho_consumer_close(lecho_consumer *c);
typedef void (*lecho_error_fn)(const char *msg, void *ud);
int lecho_consumer_on_error(lecho_consumer *c, lecho_error_fn fn, void *ud);

int lecho_service_open(lecho_ctx *ctx, const char *name, lecho_service_fn fn, void *ud,
                       const lecho_value *opts, lecho_service **out);
void lecho_service_close(lecho_service *s);
int lecho_call(lecho_ctx *ctx, const char *name, const lecho_value *args,
               const lecho_value *opts, lecho_value **results);
int lecho_submit_sync_start(lecho_producer *p, const lecho_value *ev, double timeout,
                            lecho_value **pending);
int lecho_call_start(lecho_ctx *ctx, const char *name, const lecho_value *args,
                     const lecho_value *opts, lecho_value **pending);
int lecho_get_bool(const lecho_value *v, const char *key, int *out);

typedef int (*lecho_interrupt_fn)(void *ud);
int lecho_set_interrupt(lecho_ctx *ctx, lecho_interrupt_fn fn, void *ud);
lecho_value *lecho_stats(lecho_ctx *ctx);
double lecho_stat(lecho_ctx *ctx, const char *channel, const char *counter);
"""

ffi = FFI()
ffi.cdef(CDEF)


def _candidates():
    env = os.environ.get("LECHO_LIBRARY")
    if env:
        yield env
    try:
        from . import _paths  # written by `make install`
        yield _paths.LIBRARY
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "liblecho.so")


def _load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            # RTLD_GLOBAL: lecho/core.so, which the Lua layer loads, takes
            # the LuaJIT symbols from the process (liblecho brings libluajit).
            return ffi.dlopen(os.path.realpath(path), ffi.RTLD_NOW | ffi.RTLD_GLOBAL), path
        tried.append(path)
    raise ImportError("lecho: liblecho.so not found (tried %s; `make` in the checkout, "
                      "`make install`, or set LECHO_LIBRARY)" % ", ".join(tried))


lib, LIBRARY = _load()
