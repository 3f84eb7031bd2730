/* lpat.c: Lua's string patterns in C with a step count (see lpat.h).
 *
 * Written from the Lua 5.1 manual (section 5.4.1) and LuaJIT 2.1's
 * observable behaviour, which it reproduces on every input, quirks
 * included: a pattern ends at its first NUL byte (while a find with no
 * special character searches the whole string, NULs included); an init is
 * cut to a 32-bit integer and clamped to #s + 1; a back-reference to a
 * position capture never matches; a '%' ending a replacement adds a NUL;
 * more than 200 nested matches is "pattern too complex".
 *
 * The matcher is a backtracking one (the recursion shape decides where
 * "pattern too complex" is raised, so it is LuaJIT's).  Each step (a match
 * call, a character tried by a repetition, 64 bytes of a class, a compare
 * or a copy) counts; every LPAT_POLL steps it looks at *stop.  Nothing is
 * allocated outside the Lua state, so an error raised anywhere (a bad
 * pattern, the budget) leaks nothing.
 */
#define _GNU_SOURCE
#include "lpat.h"

#include <lauxlib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LPAT_MAXCAPTURES 32 /* LUA_MAXCAPTURES */
#define LPAT_MAXDEPTH 200   /* nested matches allowed (LuaJIT's LJ_MAX_XLEVEL) */
#define LPAT_POLL 4096      /* steps between two looks at *stop */
#define LPAT_BIG (64 * 1024)
#define LPAT_CHUNK (1u << 20) /* plain find: bytes searched between two looks */
#define CAP_UNFINISHED (-1)
#define CAP_POSITION (-2)
#define ESC '%'

typedef struct lpat_cap {
    const char *init;
    ptrdiff_t len; /* or CAP_UNFINISHED, CAP_POSITION */
} lpat_cap;

/* One search: lives on the C stack of the call. */
typedef struct lpat_ms {
    lua_State *L;
    const char *src, *end; /* the subject; *end is Lua's terminating NUL */
    int level, depth;
    int left;              /* steps before the next look at *stop */
    volatile sig_atomic_t *stop;
    lpat_cap cap[LPAT_MAXCAPTURES];
} lpat_ms;

/* ---- character classes (ASCII, as LuaJIT's, whatever the locale) ----- */

enum { C_ALPHA = 1, C_DIGIT = 2, C_LOWER = 4, C_UPPER = 8, C_SPACE = 16, C_CNTRL = 32, C_PUNCT = 64,
       C_XDIGIT = 128 };

/* The classes of every byte, built at compile time, one load each. */
#define CT1(c) ((unsigned char)(                                                                   \
    (((c) >= 'a' && (c) <= 'z') ? (C_ALPHA | C_LOWER) : 0) |                                      \
    (((c) >= 'A' && (c) <= 'Z') ? (C_ALPHA | C_UPPER) : 0) |                                      \
    (((c) >= '0' && (c) <= '9') ? (C_DIGIT | C_XDIGIT) : 0) |                                     \
    ((((c) >= 'a' && (c) <= 'f') || ((c) >= 'A' && (c) <= 'F')) ? C_XDIGIT : 0) |                 \
    (((c) == ' ' || ((c) >= '\t' && (c) <= '\r')) ? C_SPACE : 0) |                                \
    (((c) < 32 || (c) == 127) ? C_CNTRL : 0) |                                                    \
    (((c) > 32 && (c) < 127 && !(((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z') ||      \
                                 ((c) >= '0' && (c) <= '9'))) ? C_PUNCT : 0)))
#define CT4(c) CT1(c), CT1((c) + 1), CT1((c) + 2), CT1((c) + 3)
#define CT16(c) CT4(c), CT4((c) + 4), CT4((c) + 8), CT4((c) + 12)
#define CT64(c) CT16(c), CT16((c) + 16), CT16((c) + 32), CT16((c) + 48)
static const unsigned char ctype[256] = {CT64(0), CT64(64), CT64(128), CT64(192)};

/* Is c in class %cl?  A letter not naming a class, or any other
 * character, stands for itself. */
static int class_match(int c, int cl) {
    int res, lo = (cl >= 'A' && cl <= 'Z') ? cl + 32 : cl;
    unsigned char t = ctype[c];
    switch (lo) {
    case 'a': res = t & C_ALPHA; break;
    case 'c': res = t & C_CNTRL; break;
    case 'd': res = t & C_DIGIT; break;
    case 'g': res = t & (C_ALPHA | C_DIGIT | C_PUNCT); break;
    case 'l': res = t & C_LOWER; break;
    case 'p': res = t & C_PUNCT; break;
    case 's': res = t & C_SPACE; break;
    case 'u': res = t & C_UPPER; break;
    case 'w': res = t & (C_ALPHA | C_DIGIT); break;
    case 'x': res = t & C_XDIGIT; break;
    case 'z': res = (c == 0); break;
    default: return cl == c;
    }
    return (lo != cl) ? !res : res != 0;
}

/* ---- the matcher ------------------------------------------------------ */

static void ms_poll(lpat_ms *ms) {
    ms->left = LPAT_POLL;
    if (ms->stop && *ms->stop) luaL_error(ms->L, "CPU budget exceeded");
}

static inline void ms_step(lpat_ms *ms, size_t n) {
    ms->left -= (n > LPAT_POLL) ? LPAT_POLL : (int)n;
    if (ms->left <= 0) ms_poll(ms);
}

/* Where the single-character class at p ends. */
static const char *class_end(lpat_ms *ms, const char *p) {
    switch (*p++) {
    case ESC:
        if (*p == '\0') luaL_error(ms->L, "malformed pattern (ends with '%%')");
        return p + 1;
    case '[': {
        const char *p0 = p;
        if (*p == '^') p++;
        do { /* the first character may be ']' */
            if (*p == '\0') luaL_error(ms->L, "malformed pattern (missing ']')");
            if (*p++ == ESC && *p != '\0') p++;
        } while (*p != ']');
        ms_step(ms, (size_t)(p - p0) >> 6);
        return p + 1;
    }
    default:
        return p;
    }
}

/* c against the set [p .. ec], p at '[' and ec at its ']'. */
static int set_match(int c, const char *p, const char *ec) {
    int yes = 1;
    if (p[1] == '^') {
        yes = 0;
        p++;
    }
    while (++p < ec) {
        if (*p == ESC) {
            p++;
            if (class_match(c, (unsigned char)*p)) return yes;
        } else if (p[1] == '-' && p + 2 < ec) {
            p += 2;
            if ((unsigned char)p[-2] <= c && c <= (unsigned char)*p) return yes;
        } else if ((unsigned char)*p == c) {
            return yes;
        }
    }
    return !yes;
}

/* c against the single-character class [p, ep). */
static inline int single_match(int c, const char *p, const char *ep) {
    switch (*p) {
    case '.': return 1;
    case ESC: return class_match(c, (unsigned char)p[1]);
    case '[': return set_match(c, p, ep - 1);
    default: return (unsigned char)*p == c;
    }
}

/* What one single_match of [p, ep) costs in steps. */
static inline size_t class_cost(const char *p, const char *ep) { return 1 + ((size_t)(ep - p) >> 6); }

static const char *do_match(lpat_ms *ms, const char *s, const char *p);

static const char *max_expand(lpat_ms *ms, const char *s, const char *p, const char *ep) {
    ptrdiff_t i = 0;
    if (*p == '.') { /* any character: all of them */
        i = ms->end - s;
        ms_step(ms, (size_t)i >> 4);
    } else {
        size_t cost = class_cost(p, ep);
        while (s + i < ms->end && single_match((unsigned char)s[i], p, ep)) {
            i++;
            ms_step(ms, cost);
        }
    }
    for (; i >= 0; i--) { /* the longest first, then one less */
        const char *r = do_match(ms, s + i, ep + 1);
        if (r) return r;
    }
    return NULL;
}

static const char *min_expand(lpat_ms *ms, const char *s, const char *p, const char *ep) {
    for (;;) {
        const char *r = do_match(ms, s, ep + 1);
        if (r) return r;
        if (s < ms->end && single_match((unsigned char)*s, p, ep))
            s++; /* one more */
        else
            return NULL;
    }
}

static const char *start_capture(lpat_ms *ms, const char *s, const char *p, int what) {
    int level = ms->level;
    if (level >= LPAT_MAXCAPTURES) luaL_error(ms->L, "too many captures");
    ms->cap[level].init = s;
    ms->cap[level].len = what;
    ms->level = level + 1;
    const char *r = do_match(ms, s, p);
    if (!r) ms->level--;
    return r;
}

static const char *end_capture(lpat_ms *ms, const char *s, const char *p) {
    int l = ms->level - 1;
    while (l >= 0 && ms->cap[l].len != CAP_UNFINISHED) l--;
    if (l < 0) luaL_error(ms->L, "invalid pattern capture");
    ms->cap[l].len = s - ms->cap[l].init;
    const char *r = do_match(ms, s, p);
    if (!r) ms->cap[l].len = CAP_UNFINISHED;
    return r;
}

/* %1-%9 in a pattern: the text of that (closed) capture again.  A position
 * capture's length is negative, so as a size it never fits: no match. */
static const char *match_backref(lpat_ms *ms, const char *s, int digit) {
    int l = digit - '1';
    if (l < 0 || l >= ms->level || ms->cap[l].len == CAP_UNFINISHED)
        luaL_error(ms->L, "invalid capture index");
    size_t len = (size_t)ms->cap[l].len;
    if ((size_t)(ms->end - s) < len) return NULL;
    ms_step(ms, len >> 6);
    return memcmp(ms->cap[l].init, s, len) == 0 ? s + len : NULL;
}

/* %bxy at p (x and y at p[0], p[1]). */
static const char *match_balance(lpat_ms *ms, const char *s, const char *p) {
    if (p[0] == '\0' || p[1] == '\0') luaL_error(ms->L, "unbalanced pattern");
    if (*s != *p) return NULL; /* at the end *s is the NUL, never x */
    int open = p[0], close = p[1], depth = 1;
    const char *s0 = s;
    while (++s < ms->end) {
        if (*s == close) {
            if (--depth == 0) {
                ms_step(ms, (size_t)(s - s0) >> 4);
                return s + 1;
            }
        } else if (*s == open) {
            depth++;
        }
    }
    ms_step(ms, (size_t)(s - s0) >> 4);
    return NULL;
}

/* The end of the match of pattern p at s, or NULL.  Recursion where a
 * choice is left to backtrack to; a plain item continues in the loop. */
static const char *do_match(lpat_ms *ms, const char *s, const char *p) {
    if (++ms->depth > LPAT_MAXDEPTH) luaL_error(ms->L, "pattern too complex");
    ms_step(ms, 1);
again:
    switch (*p) {
    case '(':
        if (p[1] == ')')
            s = start_capture(ms, s, p + 2, CAP_POSITION);
        else
            s = start_capture(ms, s, p + 1, CAP_UNFINISHED);
        break;
    case ')':
        s = end_capture(ms, s, p + 1);
        break;
    case ESC:
        if (p[1] == 'b') {
            s = match_balance(ms, s, p + 2);
            if (!s) break;
            p += 4;
            goto again;
        }
        if (p[1] == 'f') {
            p += 2;
            if (*p != '[') luaL_error(ms->L, "missing '[' after '%%f' in pattern");
            const char *ep = class_end(ms, p);
            int prev = (s == ms->src) ? 0 : (unsigned char)s[-1];
            if (set_match(prev, p, ep - 1) || !set_match((unsigned char)*s, p, ep - 1)) {
                s = NULL;
                break;
            }
            p = ep;
            goto again;
        }
        if (p[1] >= '0' && p[1] <= '9') {
            s = match_backref(ms, s, (unsigned char)p[1]);
            if (!s) break;
            p += 2;
            goto again;
        }
        goto item;
    case '\0': /* the pattern's end: a match */
        break;
    case '$':
        if (p[1] != '\0') goto item; /* a '$' anywhere else is itself */
        if (s != ms->end) s = NULL;
        break;
    default:
    item: {
        const char *ep = class_end(ms, p);
        int m = s < ms->end && single_match((unsigned char)*s, p, ep);
        switch (*ep) {
        case '?': {
            const char *r;
            if (m && (r = do_match(ms, s + 1, ep + 1)) != NULL) {
                s = r;
                break;
            }
            p = ep + 1;
            goto again;
        }
        case '*':
            s = max_expand(ms, s, p, ep);
            break;
        case '+':
            s = m ? max_expand(ms, s + 1, p, ep) : NULL;
            break;
        case '-':
            s = min_expand(ms, s, p, ep);
            break;
        default:
            if (!m) {
                s = NULL;
                break;
            }
            s++;
            p = ep;
            ms_step(ms, 1);
            goto again;
        }
        break;
    }
    }
    ms->depth--;
    return s;
}

/* ---- results ----------------------------------------------------------- */

static void push_capture(lpat_ms *ms, int i, const char *s, const char *e) {
    if (i >= ms->level) {
        if (i != 0) luaL_error(ms->L, "invalid capture index");
        lua_pushlstring(ms->L, s, (size_t)(e - s)); /* no captures: the whole match */
        return;
    }
    ptrdiff_t l = ms->cap[i].len;
    if (l == CAP_UNFINISHED) luaL_error(ms->L, "unfinished capture");
    if (l == CAP_POSITION)
        lua_pushinteger(ms->L, ms->cap[i].init - ms->src + 1);
    else
        lua_pushlstring(ms->L, ms->cap[i].init, (size_t)l);
}

/* The captures (or the whole match when there are none and s is given). */
static int push_captures(lpat_ms *ms, const char *s, const char *e) {
    int n = (ms->level == 0 && s) ? 1 : ms->level;
    luaL_checkstack(ms->L, n, "too many captures");
    for (int i = 0; i < n; i++) push_capture(ms, i, s, e);
    return n;
}

/* ---- arguments ------------------------------------------------------- */

/* A number cut to 32 bits as LuaJIT cuts find's init (x86's conversion:
 * out of range or NaN gives INT32_MIN). */
static int32_t opt_i32(lua_State *L, int arg, int32_t def) {
    if (lua_isnoneornil(L, arg)) return def;
    lua_Number n = luaL_checknumber(L, arg);
    return (n >= -2147483648.0 && n < 2147483648.0) ? (int32_t)n : INT32_MIN;
}

/* A number as gsub's count: through 64 bits, then its low 32. */
static int opt_count(lua_State *L, int arg, int def) {
    if (lua_isnoneornil(L, arg)) return def;
    lua_Number n = luaL_checknumber(L, arg);
    int64_t v = (n >= -9223372036854775808.0 && n < 9223372036854775808.0) ? (int64_t)n : INT64_MIN;
    return (int)(int32_t)(uint32_t)(uint64_t)v;
}

/* Any of ^$*+?.([%- in all of p (NULs included): else find is plain. */
static int has_specials(const char *p, size_t lp) {
    for (size_t i = 0; i < lp; i++) {
        switch (p[i]) {
        case '^': case '$': case '*': case '+': case '?': case '.': case '(': case '[': case '%':
        case '-':
            return 1;
        }
    }
    return 0;
}

/* A plain find, linear in ls + lp, looking at *stop every LPAT_CHUNK bytes:
 * memchr for the first byte and memcmp for the rest (what LuaJIT does, the
 * fastest on usual text) while the bytes memcmp may have compared stay
 * below 64 KiB plus those memchr skipped; past that memmem (two-way, linear
 * whatever the input) takes over. */
static const char *plain_find(lpat_ms *ms, const char *s, size_t ls, const char *p, size_t lp) {
    if (lp == 0) return s;
    if (lp > ls) return NULL;
    const char *q = s, *last = s + (ls - lp); /* the last possible start */
    size_t credit = 64 * 1024;
    while (q <= last && lp <= credit) {
        size_t span = (size_t)(last - q) + 1;
        if (span > LPAT_CHUNK) span = LPAT_CHUNK;
        const char *c = memchr(q, (unsigned char)p[0], span);
        if (!c) {
            q += span;
            credit += span;
            if (q <= last) ms_poll(ms);
            continue;
        }
        if (memcmp(c + 1, p + 1, lp - 1) == 0) return c;
        credit = credit + (size_t)(c - q) - lp; /* >= 0: lp <= credit */
        q = c + 1;
    }
    while (q <= last) {
        size_t span = (size_t)(last - q) + 1;
        if (span > LPAT_CHUNK) span = LPAT_CHUNK;
        const char *r = memmem(q, span + lp - 1, p, lp);
        if (r) return r;
        q += span;
        if (q <= last) ms_poll(ms);
    }
    return NULL;
}

/* The literal a search must start with, or -1: a pattern whose first item
 * is a plain character with no repetition fails at once, with nothing
 * raised, where the subject holds another (so memchr may skip there). */
static int first_literal(const char *p) {
    switch (p[0]) {
    case '\0': case '^': case '$': case '*': case '+': case '?': case '.': case '(': case ')':
    case '[': case '%': case '-':
        return -1;
    }
    switch (p[1]) {
    case '*': case '+': case '?': case '-':
        return -1;
    }
    return (unsigned char)p[0];
}

static volatile sig_atomic_t *stop_of(lua_State *L) {
    return (volatile sig_atomic_t *)lua_touserdata(L, lua_upvalueindex(1));
}

static void ms_init(lpat_ms *ms, lua_State *L, const char *s, size_t ls, size_t lp) {
    ms->L = L;
    ms->src = s;
    ms->end = s + ls;
    ms->level = ms->depth = 0;
    ms->left = LPAT_POLL;
    ms->stop = stop_of(L);
    if (ls > LPAT_BIG || lp > LPAT_BIG) ms_poll(ms);
}

/* Where a search from s1 may next match: s1, or with a first literal lit
 * (first_literal; -1: none) the next place holding it, the bytes skipped
 * counted against the budget; NULL when none is left (and at the end itself
 * it cannot match). */
static inline const char *next_start(lpat_ms *ms, const char *s1, int lit) {
    if (lit < 0 || s1 >= ms->end || (unsigned char)*s1 == lit) return s1;
    const char *n = memchr(s1, lit, (size_t)(ms->end - s1));
    if (n) ms_step(ms, (size_t)(n - s1) >> 6);
    return n;
}

/* One match attempt of p at s1, from a clean state: its end, or NULL. */
static inline const char *match_at(lpat_ms *ms, const char *s1, const char *p) {
    ms->level = 0;
    ms->depth = 0;
    return do_match(ms, s1, p);
}

/* ---- find, match, gmatch, gsub ------------------------------------------ */

static int find_aux(lua_State *L, int find) {
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int64_t init = opt_i32(L, 3, 1);
    if (init < 0) init += (int64_t)ls + 1;
    init = (init > 0 ? init : 0) - 1; /* 0-based */
    if (init < 0)
        init = 0;
    else if ((uint64_t)init > ls)
        init = (int64_t)ls;
    lpat_ms ms;
    ms_init(&ms, L, s, ls, lp);
    if (find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
        const char *r = plain_find(&ms, s + init, ls - (size_t)init, p, lp);
        if (r) {
            lua_pushinteger(L, r - s + 1);
            lua_pushinteger(L, r - s + (ptrdiff_t)lp);
            return 2;
        }
    } else {
        int anchor = (*p == '^');
        if (anchor) p++;
        int lit = anchor ? -1 : first_literal(p);
        const char *s1 = s + init;
        do {
            if (!(s1 = next_start(&ms, s1, lit))) break;
            const char *e = match_at(&ms, s1, p);
            if (e) {
                if (!find) return push_captures(&ms, s1, e);
                lua_pushinteger(L, s1 - s + 1);
                lua_pushinteger(L, e - s);
                return push_captures(&ms, NULL, NULL) + 2;
            }
        } while (s1++ < ms.end && !anchor);
    }
    lua_pushnil(L);
    return 1;
}

static int l_find(lua_State *L) { return find_aux(L, 1); }

static int l_match(lua_State *L) { return find_aux(L, 0); }

/* gmatch's step: gnext(pos, s, p), pos a userdata holding the next
 * position (0-based).  Called by the iterator, a Lua closure over the three
 * (see GMATCH_SRC): a C closure per gmatch would be a new function each
 * time, which LuaJIT's compiler specializes traces to, one side trace per
 * loop. */
static int l_gmatch_next(lua_State *L) {
    size_t ls, lp;
    size_t *pos = lua_touserdata(L, 1);
    const char *s = lua_tolstring(L, 2, &ls);
    const char *p = lua_tolstring(L, 3, &lp);
    lpat_ms ms;
    ms_init(&ms, L, s, ls, lp);
    int lit = first_literal(p);
    for (const char *s1 = s + *pos; s1 <= ms.end; s1++) {
        if (!(s1 = next_start(&ms, s1, lit))) break;
        const char *e = match_at(&ms, s1, p);
        if (e) {
            /* after an empty match the next search starts one further on */
            *pos = (size_t)(e - s) + (e == s1);
            return push_captures(&ms, s1, e);
        }
    }
    *pos = ls + 1; /* done for good */
    return 0;
}

/* The iterator factory, called with gnext: the iterator tail-calls it, so
 * that an error names the caller's line as LuaJIT's does. */
static const char GMATCH_SRC[] =
    "local gnext = ...\n"
    "return function(pos, s, p) return function() return gnext(pos, s, p) end end\n";

/* Upvalues: stop, the factory. */
static int l_gmatch(lua_State *L) {
    luaL_checkstring(L, 1);
    luaL_checkstring(L, 2);
    lua_pushvalue(L, lua_upvalueindex(2));
    size_t *pos = lua_newuserdata(L, sizeof *pos); /* owned by the iterator (an upvalue) */
    *pos = 0;
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_call(L, 3, 1);
    return 1;
}

/* Appends the replacement string (argument 3) for the match [s, e). */
static void add_repl_string(lpat_ms *ms, luaL_Buffer *b, const char *s, const char *e) {
    size_t l;
    const char *r = lua_tolstring(ms->L, 3, &l);
    const char *end = r + l;
    ms_step(ms, l >> 6);
    while (r < end) {
        const char *pct = memchr(r, ESC, (size_t)(end - r));
        if (!pct) {
            luaL_addlstring(b, r, (size_t)(end - r));
            break;
        }
        luaL_addlstring(b, r, (size_t)(pct - r));
        int c = (unsigned char)pct[1]; /* the NUL after the string when '%' is last */
        if (c < '0' || c > '9') {
            luaL_addchar(b, (char)c);
        } else if (c == '0') {
            luaL_addlstring(b, s, (size_t)(e - s));
        } else {
            push_capture(ms, c - '1', s, e);
            luaL_addvalue(b);
        }
        r = pct + 2;
    }
}

static void add_value(lpat_ms *ms, luaL_Buffer *b, const char *s, const char *e, int tr) {
    lua_State *L = ms->L;
    if (tr == LUA_TSTRING || tr == LUA_TNUMBER) {
        add_repl_string(ms, b, s, e);
        return;
    }
    if (tr == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        int n = push_captures(ms, s, e);
        lua_call(L, n, 1);
    } else { /* table */
        push_capture(ms, 0, s, e);
        lua_gettable(L, 3);
    }
    if (!lua_toboolean(L, -1)) { /* nil or false: the match stays */
        lua_pop(L, 1);
        lua_pushlstring(L, s, (size_t)(e - s));
    } else if (!lua_isstring(L, -1)) {
        luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    }
    luaL_addvalue(b);
}

static int l_gsub(lua_State *L) {
    size_t ls, lp;
    const char *src = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int tr = lua_type(L, 3);
    int max_n = opt_count(L, 4, (int)(ls + 1));
    if (!(tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION || tr == LUA_TTABLE))
        luaL_argerror(L, 3, "string/function/table expected");
    int anchor = (*p == '^');
    if (anchor) p++;
    int lit = anchor ? -1 : first_literal(p);
    lpat_ms ms;
    ms_init(&ms, L, src, ls, lp);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int n = 0;
    while (n < max_n) {
        if (lit >= 0 && src < ms.end && (unsigned char)*src != lit) {
            const char *nx = memchr(src, lit, (size_t)(ms.end - src));
            if (!nx) nx = ms.end; /* no match left, not even at the end */
            ms_step(&ms, (size_t)(nx - src) >> 6);
            luaL_addlstring(&b, src, (size_t)(nx - src));
            src = nx;
            if (src == ms.end) break;
        }
        const char *e = match_at(&ms, src, p);
        if (e) {
            n++;
            add_value(&ms, &b, src, e, tr);
        }
        if (e && e > src)
            src = e;
        else if (src < ms.end)
            luaL_addchar(&b, *src++);
        else
            break;
        if (anchor) break;
    }
    luaL_addlstring(&b, src, (size_t)(ms.end - src));
    luaL_pushresult(&b);
    lua_pushinteger(L, n);
    return 2;
}

/* ---- registration ------------------------------------------------------ */

static const luaL_Reg lpat_funcs[] = {{"find", l_find}, {"match", l_match}, {"gsub", l_gsub}, {NULL, NULL}};

void lei_lpat_open(lua_State *L, volatile sig_atomic_t *stop) {
    for (const luaL_Reg *f = lpat_funcs; f->name; f++) {
        lua_pushlightuserdata(L, (void *)stop);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
    lua_pushlightuserdata(L, (void *)stop);
    if (luaL_loadbuffer(L, GMATCH_SRC, sizeof GMATCH_SRC - 1, "=lpat")) lua_error(L);
    lua_pushlightuserdata(L, (void *)stop);
    lua_pushcclosure(L, l_gmatch_next, 1);
    lua_call(L, 1, 1); /* the factory */
    lua_pushcclosure(L, l_gmatch, 2);
    lua_setfield(L, -2, "gmatch");
}

int lei_lpat_new(lua_State *L) {
    lua_newtable(L);
    lei_lpat_open(L, NULL);
    return 1;
}
