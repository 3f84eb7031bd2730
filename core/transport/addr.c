/* addr.c: address text <-> sockaddr, listening, connecting and the
 * advertised address (grammar and rules in addr.h).  Socket API only: no
 * libev, no Lua; unit-tested by core/test/test_addr.c. */
#include "addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define UNIX_PREFIX "unix:"
#define UNIX_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1) /* 107 */

/* Reads the decimal port p (the text after the last ':').  Returns 0 with
 * *port, or -1 with *err. */
static int parse_port(const char *p, int flags, unsigned *port, const char **err) {
    unsigned v = 0;
    size_t i = 0;
    for (; p[i] >= '0' && p[i] <= '9' && i < 6; i++) v = v * 10 + (unsigned)(p[i] - '0');
    if (i == 0 || i > 5 || p[i] != '\0' || v > 65535) {
        *err = "bad port (want 1-65535)";
        return -1;
    }
    if (v == 0 && !(flags & LEI_ADDR_LISTEN)) {
        *err = "port 0 is only for listening";
        return -1;
    }
    *port = v;
    return 0;
}

static int parse_unix(const char *s, lei_addr *a, const char **err) {
    struct sockaddr_un *su = (struct sockaddr_un *)&a->ss;
    size_t n = strlen(s);
    if (s[0] != '/' && s[0] != '@') {
        *err = "unix socket path must be absolute (unix:/path) or abstract (unix:@name)";
        return -1;
    }
    if (n < 2 || n > UNIX_PATH_MAX) {
        *err = n < 2 ? "empty unix socket path" : "unix socket path too long (at most 107 bytes)";
        return -1;
    }
    if (strstr(s, "//") || s[n - 1] == '/') {
        *err = "unix socket path must not contain '//' or end in '/'";
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f) {
            *err = "space or control character in unix socket path";
            return -1;
        }
    memset(su, 0, sizeof *su);
    su->sun_family = AF_UNIX;
    memcpy(su->sun_path, s, n);
    if (s[0] == '@') su->sun_path[0] = '\0'; /* abstract: no NUL after the name */
    a->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (s[0] == '/'));
    return 0;
}

/* "[v6]" or "[v6%zone]" in s[0..n) (brackets included). */
static int parse_v6(const char *s, size_t n, struct sockaddr_in6 *s6, const char **err) {
    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if (n < 2 || s[n - 1] != ']' || n - 2 >= sizeof host) {
        *err = "bad IPv6 address";
        return -1;
    }
    memcpy(host, s + 1, n - 2);
    host[n - 2] = '\0';
    char *zone = strchr(host, '%');
    if (zone) *zone++ = '\0';
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) != 1) {
        *err = "bad IPv6 address";
        return -1;
    }
    if (zone) {
        unsigned long idx = 0;
        size_t i = 0;
        for (; zone[i] >= '0' && zone[i] <= '9' && i < 10; i++)
            idx = idx * 10 + (unsigned)(zone[i] - '0');
        if (i == 0 || zone[i] != '\0') idx = zone[0] ? if_nametoindex(zone) : 0;
        if (idx == 0 || idx > 0xffffffffUL) {
            *err = "unknown interface in IPv6 zone";
            return -1;
        }
        s6->sin6_scope_id = (uint32_t)idx;
    }
    return 0;
}

int lei_addr_parse(const char *text, int flags, lei_addr *a, const char **err) {
    memset(a, 0, sizeof *a);
    if (!text || !*text) {
        *err = "empty address";
        return -1;
    }
    if (strncmp(text, UNIX_PREFIX, sizeof UNIX_PREFIX - 1) == 0)
        return parse_unix(text + sizeof UNIX_PREFIX - 1, a, err);
    const char *colon = strrchr(text, ':');
    const char *close = strrchr(text, ']');
    if (!colon || (text[0] == '[' && (!close || colon < close))) {
        *err = "missing port (want host:port)";
        return -1;
    }
    unsigned port;
    if (parse_port(colon + 1, flags, &port, err)) return -1;
    size_t hn = (size_t)(colon - text);
    if (text[0] == '[') {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a->ss;
        if (parse_v6(text, hn, s6, err)) return -1;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        a->len = sizeof *s6;
        return 0;
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)&a->ss;
    char host[INET_ADDRSTRLEN];
    if (memchr(text, ':', hn)) {
        *err = "IPv6 address must be in brackets ([::1]:port)";
        return -1;
    }
    if (hn == 9 && memcmp(text, "localhost", 9) == 0) {
        memcpy(host, "127.0.0.1", 10);
    } else if (hn == 0 || hn >= sizeof host) {
        *err = hn ? "bad host (want IPv4, localhost, [IPv6] or unix:/path)" : "missing host";
        return -1;
    } else {
        memcpy(host, text, hn);
        host[hn] = '\0';
    }
    if (inet_pton(AF_INET, host, &s4->sin_addr) != 1) {
        *err = "bad host (want IPv4, localhost, [IPv6] or unix:/path)";
        return -1;
    }
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t)port);
    a->len = sizeof *s4;
    return 0;
}

int lei_addr_format(const lei_addr *a, char *out, size_t size) {
    char host[INET6_ADDRSTRLEN];
    int n = -1;
    switch (a->ss.ss_family) {
    case AF_INET: {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&a->ss;
        if (!inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host)) return -1;
        n = snprintf(out, size, "%s:%u", host, ntohs(s4->sin_port));
        break;
    }
    case AF_INET6: {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&a->ss;
        char zone[IF_NAMESIZE + 12] = "";
        if (!inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host)) return -1;
        if (s6->sin6_scope_id) {
            char name[IF_NAMESIZE];
            if (if_indextoname(s6->sin6_scope_id, name))
                snprintf(zone, sizeof zone, "%%%s", name);
            else
                snprintf(zone, sizeof zone, "%%%u", (unsigned)s6->sin6_scope_id);
        }
        n = snprintf(out, size, "[%s%s]:%u", host, zone, ntohs(s6->sin6_port));
        break;
    }
    case AF_UNIX: {
        const struct sockaddr_un *su = (const struct sockaddr_un *)&a->ss;
        size_t off = offsetof(struct sockaddr_un, sun_path);
        if (a->len <= off + 1 || a->len > sizeof *su) return -1;
        size_t pn = a->len - off;
        if (su->sun_path[0] == '\0') /* abstract: the name is every byte after the NUL */
            n = snprintf(out, size, UNIX_PREFIX "@%.*s", (int)(pn - 1), su->sun_path + 1);
        else
            n = snprintf(out, size, UNIX_PREFIX "%.*s", (int)strnlen(su->sun_path, pn),
                         su->sun_path);
        break;
    }
    }
    return n < 0 || (size_t)n >= size ? -1 : n;
}

int lei_addr_is_unix(const lei_addr *a) {
    return a->ss.ss_family == AF_UNIX;
}

int lei_addr_is_wildcard(const lei_addr *a) {
    if (a->ss.ss_family == AF_INET)
        return ((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->ss.ss_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr);
    return 0;
}

const char *lei_addr_unclaimable(const lei_addr *a) {
    if (a->ss.ss_family == AF_INET) {
        uint32_t v4 = ntohl(((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr);
        if (v4 == 0xffffffffu) return "a broadcast address";
        if ((v4 >> 28) == 0xe) return "a multicast address";
    } else if (a->ss.ss_family == AF_INET6) {
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)&a->ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(v6)) return "an IPv4-mapped IPv6 address (write a.b.c.d:port)";
        if (IN6_IS_ADDR_MULTICAST(v6)) return "a multicast address";
    }
    return NULL;
}

int lei_addr_is_local(const lei_addr *a) {
    if (a->ss.ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss.ss_family == AF_INET6) {
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)&a->ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(v6) || (IN6_IS_ADDR_V4MAPPED(v6) && v6->s6_addr[12] == 127);
    }
    return lei_addr_is_unix(a);
}

unsigned lei_addr_port(const lei_addr *a) {
    if (a->ss.ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
    if (a->ss.ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
    return 0;
}

static void set_port(lei_addr *a, unsigned port) {
    if (a->ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&a->ss)->sin_port = htons((uint16_t)port);
    else if (a->ss.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&a->ss)->sin6_port = htons((uint16_t)port);
}

/* err[esize] = "what: strerror(errno)"; errno is kept. */
static int fail(char *err, size_t esize, const char *what) {
    int e = errno;
    snprintf(err, esize, "%s: %s", what, strerror(e));
    errno = e;
    return -1;
}

void lei_addr_nodelay(int fd) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int one = 1;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Whether a process listens on the unix socket at a: 1 yes, 0 no (nothing
 * accepts there), -1 cannot tell (errno set). */
static int unix_live(const lei_addr *a) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int rc = connect(fd, (const struct sockaddr *)&a->ss, a->len);
    int e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS) return 1; /* EAGAIN: its backlog is full */
    if (e == ECONNREFUSED) return 0;
    errno = e;
    return -1;
}

/* Before binding a unix path: nothing there, or a stale socket file (which
 * is removed).  Anything else is left alone and fails. */
static int unix_clear(const lei_addr *a, char *err, size_t esize) {
    const char *path = ((const struct sockaddr_un *)&a->ss)->sun_path;
    struct stat st;
    if (path[0] == '\0') return 0; /* abstract: the kernel says if it is taken */
    if (lstat(path, &st)) return errno == ENOENT ? 0 : fail(err, esize, path);
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, esize, "%s exists and is not a socket (not removed)", path);
        errno = EEXIST;
        return -1;
    }
    int live = unix_live(a);
    if (live < 0) return fail(err, esize, path);
    if (live) {
        snprintf(err, esize, "%s: a live process listens there", path);
        errno = EADDRINUSE;
        return -1;
    }
    if (unlink(path) && errno != ENOENT) return fail(err, esize, path);
    return 0;
}

/* Takes an exclusive flock on the directory of a's socket file, so that
 * processes checking, removing and binding the same path do it one after
 * the other (else one could remove the file another has just bound, leaving
 * a listener nobody reaches).  Returns the descriptor that holds the lock
 * (closing it releases it), or -1: no lock (abstract name, or the directory
 * cannot be opened: go on without). */
static int dir_lock(const lei_addr *a) {
    const char *path = ((const struct sockaddr_un *)&a->ss)->sun_path;
    char dir[sizeof((struct sockaddr_un *)0)->sun_path];
    if (!lei_addr_is_unix(a) || path[0] != '/') return -1;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/'); /* there is one: the path is absolute */
    if (slash == dir) slash++;       /* a file in "/": lock "/" */
    *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_EX))
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    return fd;
}

static void dir_unlock(int lk) {
    int e = errno;
    if (lk >= 0) close(lk);
    errno = e;
}

/* lei_addr_close's removal, under the directory lock (or none). */
static void unix_remove(const lei_addr *a) {
    const char *path = ((const struct sockaddr_un *)&a->ss)->sun_path;
    struct stat st;
    if (path[0] && lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && unix_live(a) == 0)
        unlink(path);
}

static int listen_locked(const lei_addr *a, int backlog, char *bound, char *err, size_t esize) {
    int is_unix = lei_addr_is_unix(a), one = 1;
    lei_addr b;
    if (is_unix && unix_clear(a, err, esize)) return -1;
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail(err, esize, "socket");
    if (!is_unix) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)&a->ss, a->len)) {
        fail(err, esize, "bind");
        close(fd);
        return -1;
    }
    b.len = sizeof b.ss;
    if (listen(fd, backlog) || getsockname(fd, (struct sockaddr *)&b.ss, &b.len)) {
        fail(err, esize, "listen");
        close(fd);
        if (is_unix) unix_remove(a);
        return -1;
    }
    /* getsockname gives the port the OS chose; a unix name is as we bound it */
    if (is_unix) b = *a;
    if (lei_addr_format(&b, bound, LEI_ADDR_TEXT_MAX) < 0) {
        snprintf(err, esize, "cannot format the bound address");
        close(fd);
        if (is_unix) unix_remove(a);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

int lei_addr_listen(const lei_addr *a, int backlog, char *bound, char *err, size_t esize) {
    int lk = dir_lock(a);
    int fd = listen_locked(a, backlog, bound, err, esize);
    dir_unlock(lk);
    return fd;
}

void lei_addr_close(int fd, const lei_addr *a) {
    int e = errno;
    if (fd >= 0) close(fd);
    if (lei_addr_is_unix(a)) {
        int lk = dir_lock(a);
        unix_remove(a);
        dir_unlock(lk);
    }
    errno = e;
}

int lei_addr_connect(const lei_addr *a, char *err, size_t esize) {
    if (!lei_addr_is_unix(a) && lei_addr_port(a) == 0) {
        snprintf(err, esize, "connect: port 0 is only for listening");
        errno = EINVAL;
        return -2;
    }
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail(err, esize, "socket");
    if (connect(fd, (const struct sockaddr *)&a->ss, a->len) && errno != EINPROGRESS) {
        fail(err, esize, "connect");
        int e = errno;
        close(fd);
        errno = e;
        return -2; /* the address's failure, not this side's */
    }
    lei_addr_nodelay(fd);
    return fd;
}

/* The first address of an up, non-loopback interface of the family, for
 * IPv6 not link-local.  Returns 0 with *out (port 0), -1 when none. */
static int first_iface(int family, lei_addr *out) {
    struct ifaddrs *ifs, *i;
    int rc = -1;
    if (getifaddrs(&ifs)) return -1;
    for (i = ifs; i && rc; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family) continue;
        if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        memset(out, 0, sizeof *out);
        if (family == AF_INET) {
            const struct sockaddr_in *s4 = (const struct sockaddr_in *)i->ifa_addr;
            if (ntohl(s4->sin_addr.s_addr) >> 24 == 127) continue;
            out->len = sizeof *s4;
        } else {
            const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)i->ifa_addr;
            if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr) || IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr))
                continue;
            out->len = sizeof *s6;
        }
        memcpy(&out->ss, i->ifa_addr, out->len);
        rc = 0;
    }
    freeifaddrs(ifs);
    if (rc == 0 && family == AF_INET6) ((struct sockaddr_in6 *)&out->ss)->sin6_scope_id = 0;
    return rc;
}

/* The local address this host sends from to reach *to (same family as
 * *to): 0 with *out, -1 when there is no route. */
static int route_local(const lei_addr *to, lei_addr *out) {
    int fd = socket(to->ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int rc = -1;
    if (fd < 0) return -1;
    out->len = sizeof out->ss;
    if (connect(fd, (const struct sockaddr *)&to->ss, to->len) == 0 &&
        getsockname(fd, (struct sockaddr *)&out->ss, &out->len) == 0 &&
        out->ss.ss_family == to->ss.ss_family && !lei_addr_is_wildcard(out))
        rc = 0;
    close(fd);
    return rc;
}

int lei_addr_advertise(const char *bound, const char *advertise, const char *toward, char *out,
                       char *err, size_t esize) {
    lei_addr b, r, t;
    const char *why;
    if (lei_addr_parse(bound, LEI_ADDR_LISTEN, &b, &why)) {
        snprintf(err, esize, "bound address '%s': %s", bound, why);
        return -1;
    }
    unsigned port = lei_addr_port(&b);
    if (toward && lei_addr_parse(toward, 0, &t, &why)) {
        snprintf(err, esize, "address '%s': %s", toward, why);
        return -1;
    }
    if (advertise) {
        if (lei_addr_parse(advertise, LEI_ADDR_LISTEN, &r, &why)) {
            snprintf(err, esize, "advertise address '%s': %s", advertise, why);
            return -1;
        }
        if (lei_addr_is_wildcard(&r)) {
            snprintf(err, esize, "advertise address '%s': a wildcard cannot be reached", advertise);
            return -1;
        }
        if (!lei_addr_is_unix(&r) && lei_addr_port(&r) == 0) set_port(&r, port);
    } else if (!lei_addr_is_wildcard(&b)) {
        r = b;
    } else {
        int fam = b.ss.ss_family;
        int found = toward && t.ss.ss_family == fam && route_local(&t, &r) == 0;
        if (!found) found = first_iface(fam, &r) == 0;
        if (!found) lei_addr_parse(fam == AF_INET ? "127.0.0.1:1" : "[::1]:1", 0, &r, &why);
        set_port(&r, port);
    }
    if (lei_addr_format(&r, out, LEI_ADDR_TEXT_MAX) < 0) {
        snprintf(err, esize, "cannot format the advertised address");
        return -1;
    }
    return 0;
}
