/* lua_rsink.c: a recorder that writes from C (issue 29, binding).
 *
 * `lecho record` without --count hands its file to this sink: the events
 * of its raw channels (lua_raw.c) are written as records of
 * doc/recording.md straight from the event hook, never entering Lua (no
 * string made, nothing for the collector): the recorder keeps up with a
 * producer at full rate.  Lua opens the file and writes its magic line and
 * header first (lua/lecho/recording.lua); the sink appends, rotates past
 * max bytes (the same header again, channel and producer records again in
 * each new file), and writes its buffer when it passes 64 KiB and on
 * ctx:rsink_flush() (a 50 ms timer in Lua).  The sink, its buffer, paths
 * and tables are owned by the lb_ctx (lb_rsink_free at close). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <libdeflate.h>

#include "lua_int.h"

#define RS_FLUSH_AT (64u * 1024)

typedef struct rs_prod {
    char *name;       /* owned: "addr#id" */
    uint32_t idx;
    uint32_t seg;     /* the segment its P record was written in */
} rs_prod;

struct lb_rsink {
    int fd;                       /* owned */
    char *path;                   /* owned */
    unsigned char *buf;           /* owned: bytes not written yet */
    size_t len, cap;
    char *hdr;                    /* owned: magic line + header record, for a rotated file */
    size_t hdrlen, magiclen;
    uint64_t size, max, events, bytes;
    int keep, rotations, err;
    double created;
    char **cname;                 /* owned, by chid: short names (each owned) */
    uint32_t *cseg;               /* by chid: segment its C record was written in (0: never) */
    uint32_t ncname;
    rs_prod *prods;               /* owned: open addressing by name */
    uint32_t pcap, pn, nextp;
    uint32_t seg;                 /* current segment, from 1 */
    /* the last event's producer: its name is not formatted again while
     * events come from it (snprintf was 7% of the recorder's CPU) */
    const void *last_from;        /* a peer, only compared, never followed */
    uint64_t last_producer;
    rs_prod *last_pr;             /* into prods: NULL when prods moves */
    char last_addr[LEI_ADDR_MAX];
    char errmsg[128];
};

/* CRC-32 (zlib's polynomial, the one recording.lua checks with) from
 * libdeflate: folded with PCLMUL where the CPU has it, 4x zlib's own and
 * ~15x the bytewise table loop this replaced, which was 63% of the
 * recorder's CPU at 1000 B events (perf, bench/README.md). */
static uint32_t crc32_of(uint32_t crc, const unsigned char *p, size_t n) {
    return libdeflate_crc32(crc, p, n);
}


static int rs_write_out(lb_rsink *s) {
    size_t off = 0;
    while (off < s->len) {
        ssize_t w = write(s->fd, s->buf + off, s->len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            snprintf(s->errmsg, sizeof s->errmsg, "%s: %s", s->path, strerror(errno));
            s->err = 1;
            s->len = 0;
            return -1;
        }
        off += (size_t)w;
    }
    s->len = 0;
    return 0;
}

static int rs_room(lb_rsink *s, size_t n) {
    if (s->len + n <= s->cap) return 0;
    if (s->len && rs_write_out(s)) return -1;
    if (n > s->cap) {
        unsigned char *b = realloc(s->buf, n); /* owned by s */
        if (!b) return -1;
        s->buf = b;
        s->cap = n;
    }
    return 0;
}

/* One record: u32 length, u32 crc of head + tail, head, tail. */
static int rs_record(lb_rsink *s, const unsigned char *head, size_t hn, const unsigned char *tail, size_t tn) {
    size_t n = 8 + hn + tn;
    if (rs_room(s, n)) return -1;
    unsigned char *o = s->buf + s->len;
    lb_rsink_put_u32(o, (uint32_t)(hn + tn));
    lb_rsink_put_u32(o + 4, crc32_of(crc32_of(0, head, hn), tail, tn));
    memcpy(o + 8, head, hn);
    if (tn) memcpy(o + 8 + hn, tail, tn);
    s->len += n;
    s->size += n;
    s->bytes += n;
    if (s->len >= RS_FLUSH_AT) return rs_write_out(s);
    return 0;
}

/* Moves path.(keep-1) to path.keep, ..., path to path.1 (a missing one:
 * nothing to move).  0, or -1 (out of memory).  libc only: the in-process
 * recorder's writer thread calls it too (lua_rec.c). */
int lb_rsink_rotate_names(const char *path, int keep) {
    size_t pl = strlen(path) + 24;
    char *from = malloc(pl), *to = malloc(pl); /* freed below */
    if (!from || !to) {
        free(from);
        free(to);
        return -1;
    }
    for (int k = keep; k >= 1; k--) {
        if (k == 1)
            snprintf(from, pl, "%s", path);
        else
            snprintf(from, pl, "%s.%d", path, k - 1);
        snprintf(to, pl, "%s.%d", path, k);
        rename(from, to); /* a missing one: nothing to move */
    }
    free(from);
    free(to);
    return 0;
}

static int rs_rotate(lb_rsink *s) {
    if (rs_write_out(s)) return -1;
    close(s->fd);
    s->fd = -1;
    if (lb_rsink_rotate_names(s->path, s->keep)) {
        s->err = 1;
        snprintf(s->errmsg, sizeof s->errmsg, "out of memory");
        return -1;
    }
    s->fd = open(s->path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (s->fd < 0) {
        s->err = 1;
        snprintf(s->errmsg, sizeof s->errmsg, "%s: %s", s->path, strerror(errno));
        return -1;
    }
    s->rotations++;
    s->seg++;
    s->size = 0;
    if (rs_room(s, s->hdrlen)) return -1;
    memcpy(s->buf + s->len, s->hdr, s->hdrlen);
    s->len += s->hdrlen;
    s->size = s->hdrlen;
    s->bytes += s->hdrlen;
    return 0;
}

static rs_prod *rs_prod_find(lb_rsink *s, const char *name, size_t nl) {
    if (s->pn * 2 >= s->pcap) {
        uint32_t nc = s->pcap ? s->pcap * 2 : 64;
        rs_prod *np = calloc(nc, sizeof *np); /* owned by s */
        if (!np) return NULL;
        for (uint32_t i = 0; i < s->pcap; i++) {
            if (!s->prods[i].name) continue;
            uint32_t h = 2166136261u;
            for (const char *c = s->prods[i].name; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
            uint32_t j = h & (nc - 1);
            while (np[j].name) j = (j + 1) & (nc - 1);
            np[j] = s->prods[i];
        }
        free(s->prods);
        s->prods = np;
        s->last_pr = NULL;
        s->pcap = nc;
    }
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < nl; i++) h = (h ^ (unsigned char)name[i]) * 16777619u;
    uint32_t j = h & (s->pcap - 1);
    while (s->prods[j].name) {
        if (strcmp(s->prods[j].name, name) == 0) return &s->prods[j];
        j = (j + 1) & (s->pcap - 1);
    }
    char *copy = malloc(nl + 1); /* owned by the table */
    if (!copy) return NULL;
    memcpy(copy, name, nl + 1);
    s->prods[j].name = copy;
    s->prods[j].idx = ++s->nextp;
    s->prods[j].seg = 0;
    s->pn++;
    return &s->prods[j];
}

/* From the event hook: 1 when the sink took the event (written, or the
 * sink failed: said by ctx:rsink_stats), 0 when it is not the sink's, -1
 * when the payload is not a value (the connection is cut, as for Lua). */
int lb_rsink_event(lb_ctx *b, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                   uint64_t sync, const uint8_t *p, size_t n, char *err, size_t errlen) {
    lb_rsink *s = b->rsink;
    if (!s || chid >= s->ncname || !s->cname[chid]) return 0;
    const char *why = NULL;
    if (lei_codec_validate(p, n, &b->lim, &why)) {
        snprintf(err, errlen, "%s", why ? why : "invalid value");
        return -1;
    }
    if (s->err) return 1;
    const char *addr = from ? lei_peer_addr(from) : lei_ctx_addr(b->c);
    char pname[LEI_ADDR_MAX + 32];
    int pl = 0;
    rs_prod *pr = NULL;
    if (s->last_pr && s->last_from == (const void *)from && s->last_producer == producer &&
        strcmp(s->last_addr, addr) == 0)
        pr = s->last_pr;
    else {
        pl = snprintf(pname, sizeof pname, "%s#%llu", addr, (unsigned long long)producer);
        if (pl < 0 || (size_t)pl >= sizeof pname) return 1;
    }
    unsigned char head[64];
    size_t hn;
    size_t need = 8 + 40 + n;
    if (s->max && s->size + need + 2 * (8 + 16 + sizeof pname) > s->max && s->events && rs_rotate(s)) return 1;
    if (s->cseg[chid] != s->seg) {
        head[0] = 'C';
        hn = 1 + lb_rsink_put_varint(head + 1, chid + 1);
        const char *nm = s->cname[chid];
        if (rs_record(s, head, hn, (const unsigned char *)nm, strlen(nm))) return 1;
        s->cseg[chid] = s->seg;
    }
    if (!pr) {
        pr = rs_prod_find(s, pname, (size_t)pl);
        if (!pr) return 1;
        size_t al = strlen(addr);
        if (al < sizeof s->last_addr) {
            memcpy(s->last_addr, addr, al + 1);
            s->last_from = from;
            s->last_producer = producer;
            s->last_pr = pr;
        } else
            s->last_pr = NULL;
    }
    if (pr->seg != s->seg) {
        head[0] = 'P';
        hn = 1 + lb_rsink_put_varint(head + 1, pr->idx);
        if (rs_record(s, head, hn, (const unsigned char *)pr->name, strlen(pr->name))) return 1;
        pr->seg = s->seg;
    }
    double us = (ev_time() - s->created) * 1e6;
    head[0] = 'E';
    hn = 1;
    hn += lb_rsink_put_varint(head + hn, chid + 1);
    hn += lb_rsink_put_varint(head + hn, pr->idx);
    hn += lb_rsink_put_varint(head + hn, seq);
    hn += lb_rsink_put_varint(head + hn, us > 0 ? (uint64_t)(us + 0.5) : 0);
    head[hn++] = sync ? 1 : 0;
    if (rs_record(s, head, hn, p, n)) return 1;
    s->events++;
    return 1;
}

void lb_rsink_free(lb_ctx *b) {
    lb_rsink *s = b->rsink;
    if (!s) return;
    if (s->fd >= 0) {
        rs_write_out(s);
        close(s->fd);
    }
    for (uint32_t i = 0; i < s->ncname; i++) free(s->cname[i]);
    free(s->cname);
    free(s->cseg);
    for (uint32_t i = 0; i < s->pcap; i++) free(s->prods[i].name);
    free(s->prods);
    free(s->buf);
    free(s->hdr);
    free(s->path);
    free(s);
    b->rsink = NULL;
}

/* ctx:rsink_open(path, header_bytes, created, max_bytes, keep): the file
 * (its magic line and header already written by Lua) is appended to from
 * now on.  true, or nil, err. */
static int l_rsink_open(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    size_t pl, hl;
    const char *path = luaL_checklstring(L, 2, &pl);
    const char *hdr = luaL_checklstring(L, 3, &hl);
    double created = luaL_checknumber(L, 4);
    double max = luaL_optnumber(L, 5, 0);
    int keep = (int)luaL_optinteger(L, 6, 3);
    if (b->rsink) return luaL_error(L, "a recorder sink is open already");
    lb_rsink *s = calloc(1, sizeof *s); /* owned by b (lb_rsink_free) */
    if (!s) return luaL_error(L, "out of memory");
    s->fd = -1;
    b->rsink = s;
    s->path = malloc(pl + 1);
    s->hdr = malloc(hl);
    s->cap = RS_FLUSH_AT * 2;
    s->buf = malloc(s->cap);
    if (!s->path || !s->hdr || !s->buf) {
        lb_rsink_free(b);
        return luaL_error(L, "out of memory");
    }
    memcpy(s->path, path, pl + 1);
    memcpy(s->hdr, hdr, hl);
    s->hdrlen = hl;
    s->created = created;
    s->max = max > 0 ? (uint64_t)max : 0;
    s->keep = keep;
    s->seg = 1;
    s->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (s->fd < 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, strerror(errno));
        lb_rsink_free(b);
        return 2;
    }
    off_t end = lseek(s->fd, 0, SEEK_END);
    s->size = end > 0 ? (uint64_t)end : 0;
    lua_pushboolean(L, 1);
    return 1;
}

/* ctx:rsink_channel(chid, short_name): record this channel's events. */
static int l_rsink_channel(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    size_t nl;
    const char *name = luaL_checklstring(L, 3, &nl);
    lb_rsink *s = b->rsink;
    if (!s) return luaL_error(L, "no recorder sink open");
    if (chid >= s->ncname) {
        uint32_t n = s->ncname ? s->ncname : 16;
        while (n <= chid) n *= 2;
        char **c = realloc(s->cname, n * sizeof *c); /* owned by s */
        if (!c) return luaL_error(L, "out of memory");
        s->cname = c;
        uint32_t *g = realloc(s->cseg, n * sizeof *g); /* owned by s */
        if (!g) return luaL_error(L, "out of memory");
        s->cseg = g;
        memset(s->cname + s->ncname, 0, (n - s->ncname) * sizeof *c);
        memset(s->cseg + s->ncname, 0, (n - s->ncname) * sizeof *g);
        s->ncname = n;
    }
    char *copy = malloc(nl + 1); /* owned by s */
    if (!copy) return luaL_error(L, "out of memory");
    memcpy(copy, name, nl + 1);
    free(s->cname[chid]);
    s->cname[chid] = copy;
    return 0;
}

/* ctx:rsink_flush(): writes what is buffered.  ctx:rsink_stats() ->
 * events, bytes, rotations, error or nil.  ctx:rsink_close(). */
static int l_rsink_flush(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    if (b->rsink && b->rsink->fd >= 0 && !b->rsink->err) rs_write_out(b->rsink);
    return 0;
}
static int l_rsink_stats(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_rsink *s = b->rsink;
    if (!s) return 0;
    lua_pushnumber(L, (lua_Number)s->events);
    lua_pushnumber(L, (lua_Number)s->bytes);
    lua_pushinteger(L, s->rotations);
    if (s->err)
        lua_pushstring(L, s->errmsg);
    else
        lua_pushnil(L);
    return 4;
}
static int l_rsink_close(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_rsink_free(b);
    return 0;
}

const luaL_Reg lb_rsink_methods[] = {{"rsink_open", l_rsink_open},   {"rsink_channel", l_rsink_channel},
                                     {"rsink_flush", l_rsink_flush}, {"rsink_stats", l_rsink_stats},
                                     {"rsink_close", l_rsink_close}, {NULL, NULL}};
