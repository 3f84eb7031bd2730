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

/* The list: code suffix, stable name (never changes), generic text. */
#define LEI_ERRDEF(_)                                                            \
    _(TIMEOUT, "timeout", "timed out")                                          \
    _(CLOSED, "closed", "closed")                                               \
    _(REFUSED, "refused", "refused by the peer")                                \
    _(LIMIT, "limit", "over a limit")                                           \
    _(WOULDBLOCK, "wouldblock", "would block: queue full")                      \
    _(INVALID, "invalid", "invalid argument")                                   \
    _(NOTFOUND, "notfound", "not found")                                        \
    _(IO, "io", "input/output error")                                           \
    _(PROTOCOL, "protocol", "protocol error: malformed input from a peer")      \
    _(NOMEM, "nomem", "out of memory")                                          \
    _(FAILED, "failed", "failed")                                               \
    _(NOSERVICE, "noservice", "no server of that service is known")             \
    _(VERSION, "version", "no server has a compatible version")                 \
    _(BUSY, "busy", "refused at once: over a concurrency or in-flight limit")    \
    _(NOCONSUMER, "noconsumer", "no consumer of the channel anywhere")

enum lei_err {
    LEI_OK = 0,
#define LEI_ERRENUM(code, name, text) LEI_E_##code,
    LEI_ERRDEF(LEI_ERRENUM)
#undef LEI_ERRENUM
    LEI_E_MAX
};

/* The stable name of a code ("timeout", ...), negative codes accepted;
 * "failed" for anything outside the list. */
const char *lei_err_name(int code);
/* The generic text of a code, for when no message says more. */
const char *lei_err_text(int code);

#endif
