/* errors.h: lecho's error codes, one list shared by the C core (frame,
 * context files), the binding and the public C API.
 *
 * A function that can fail for an expected reason returns 0, or the
 * negative of one of these codes (-LEI_E_TIMEOUT, ...) with a message that
 * says what happened.  Lua sees the same failure as `nil, message, name`,
 * the name being the code's entry in the list below.  Malformed input from
 * a peer is -LEI_E_PROTOCOL (frame.c's parsers).
 */
#ifndef LECHO_ERRORS_H
#define LECHO_ERRORS_H

/* The list: code suffix, stable name (never changes), generic text, and
 * the suffix of its public name in core/lecho.h (LECHO_E...: the same
 * number, checked at compile time in core/capi/lecho.c).  The one table of
 * codes: errors.c makes the names and texts from it (lei_err_name,
 * lei_err_text, lei_err_code), and every other file asks errors.c;
 * lua/lecho/errors.lua lists the same names for Lua (spec/codes_spec.lua
 * checks that both lists are one). */
#define LEI_ERRDEF(_)                                                                    \
    _(TIMEOUT, "timeout", "timed out", ETIMEOUT)                                        \
    _(CLOSED, "closed", "closed", ECLOSED)                                              \
    _(REFUSED, "refused", "refused by the peer", EREFUSED)                              \
    _(LIMIT, "limit", "over a limit", ELIMIT)                                           \
    _(WOULDBLOCK, "wouldblock", "would block: queue full", EWOULDBLOCK)                 \
    _(INVALID, "invalid", "invalid argument", EINVAL)                                   \
    _(NOTFOUND, "notfound", "not found", ENOTFOUND)                                     \
    _(IO, "io", "input/output error", EIO)                                              \
    _(PROTOCOL, "protocol", "protocol error: malformed input from a peer", EPROTOCOL)   \
    _(NOMEM, "nomem", "out of memory", ENOMEM)                                          \
    _(FAILED, "failed", "failed", EFAILED)                                              \
    _(NOSERVICE, "noservice", "no server of that service is known", ENOSERVICE)         \
    _(VERSION, "version", "no server has a compatible version", EVERSION)               \
    _(BUSY, "busy", "refused at once: over a concurrency or in-flight limit", EBUSY)     \
    _(NOCONSUMER, "noconsumer", "no consumer of the channel anywhere", ENOCONSUMER)

enum lei_err {
    LEI_OK = 0,
#define LEI_ERRENUM(code, name, text, pub) LEI_E_##code,
    LEI_ERRDEF(LEI_ERRENUM)
#undef LEI_ERRENUM
    LEI_E_MAX
};

/* The stable name of a code ("timeout", ...), negative codes accepted;
 * "failed" for anything outside the list. */
const char *lei_err_name(int code);
/* The generic text of a code, for when no message says more. */
const char *lei_err_text(int code);
/* The code (> 0) whose stable name is name[0..len), or 0 when none is:
 * a code a peer names is believed only when it is one of this list. */
#include <stddef.h>
int lei_err_code(const char *name, size_t len);

#endif
