/* test_addr.c: unit tests for addr.c: parse/format roundtrips of every
 * form, each malformed input with its exact message (the cases shared with
 * spec/addr_spec.lua are in core/test/test_addr_cases.txt), listening on
 * 127.0.0.1:0, [::1]:0 (skipped with a message when the host has no IPv6
 * loopback), a unix path and an abstract name and exchanging a byte with a
 * connection to each, the stale-socket-file rule, processes racing for one
 * path (forked), and the advertised address of a wildcard.  Sockets only on
 * loopback and under /tmp, every descriptor closed, every file removed.
 * Prints "N passed, N failed" and exits nonzero on failure.
 *
 *   make ctest                       (builds build/test_addr and runs it)
 *   build/test_addr [CASES]          (CASES: core/test/test_addr_cases.txt, from
 *                                     the top of the tree by default)
 */
#include "addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#define STREQ(a, b) ((a) != NULL && strcmp((a), (b)) == 0)

/* ---- parse and format --------------------------------------------------- */

/* Parses in, checks its canonical text is want, and that the canonical text
 * parses to the same socket address. */
static void roundtrip(const char *in, int flags, const char *want) {
    lei_addr a, b;
    const char *err = NULL;
    char out[LEI_ADDR_TEXT_MAX];
    int rc = lei_addr_parse(in, flags, &a, &err);
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "  parse '%s': %s\n", in, err);
        return;
    }
    int n = lei_addr_format(&a, out, sizeof out);
    CHECK(n == (int)strlen(want) && STREQ(out, want));
    if (!STREQ(out, want)) fprintf(stderr, "  '%s' formats as '%s', want '%s'\n", in, out, want);
    CHECK(lei_addr_parse(out, flags, &b, &err) == 0);
    CHECK(a.len == b.len && memcmp(&a.ss, &b.ss, a.len) == 0);
}

static void malformed(const char *in, int flags, const char *want) {
    lei_addr a;
    const char *err = NULL;
    CHECK(lei_addr_parse(in, flags, &a, &err) == -1);
    CHECK(STREQ(err, want));
    if (!STREQ(err, want)) fprintf(stderr, "  '%s' gives '%s', want '%s'\n", in, err, want);
}

/* Runs the shared cases of core/test/test_addr_cases.txt (format in its header). */
static void test_cases(const char *file) {
    char line[512];
    int ncases = 0;
    FILE *f = fopen(file, "r");
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "  %s: %s\n", file, strerror(errno));
        return;
    }
    while (fgets(line, sizeof line, f)) {
        char *field[4], *p = line, *q;
        int n = 0;
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0') continue;
        for (; n < 3 && (q = strstr(p, " | ")); n++, p = q + 3) {
            *q = '\0';
            field[n] = p;
        }
        field[n++] = p;
        CHECK(n == 4);
        if (n != 4) continue;
        /* "\t" in the input is a tab */
        char *w = field[2];
        for (const char *r = field[2]; *r; r++) {
            if (r[0] == '\\' && r[1] == 't') {
                *w++ = '\t';
                r++;
            } else {
                *w++ = *r;
            }
        }
        *w = '\0';
        int flags = strcmp(field[1], "listen") == 0 ? LEI_ADDR_LISTEN : 0;
        if (strcmp(field[0], "ok") == 0)
            roundtrip(field[2], flags, field[3]);
        else
            malformed(field[2], flags, field[3]);
        ncases++;
    }
    fclose(f);
    CHECK(ncases >= 50);
}

/* The cases that depend on the host or are too long for the shared file. */
static void test_parse(void) {
    char name[IF_NAMESIZE], want[LEI_ADDR_TEXT_MAX], in[200];
    /* a numeric zone formats by name when the interface exists */
    if (if_indextoname(1, name)) {
        snprintf(want, sizeof want, "[fe80::1%%%s]:7", name);
        roundtrip("[fe80::1%1]:7", 0, want);
    }
    /* the longest path that fits sun_path with its NUL: 107 bytes */
    memset(in, 'p', sizeof in);
    memcpy(in, "unix:/", 6);
    in[5 + 107] = '\0';
    roundtrip(in, 0, in);
    in[5 + 107] = 'p';
    in[5 + 108] = '\0';
    malformed(in, 0, "unix socket path too long (at most 107 bytes)");
    {
        lei_addr a;
        const char *err;
        CHECK(lei_addr_parse("unix:/tmp/x.sock", 0, &a, &err) == 0 && lei_addr_is_unix(&a) &&
              !lei_addr_is_wildcard(&a) && lei_addr_port(&a) == 0);
        CHECK(lei_addr_parse("0.0.0.0:0", LEI_ADDR_LISTEN, &a, &err) == 0 &&
              lei_addr_is_wildcard(&a) && !lei_addr_is_unix(&a));
        CHECK(lei_addr_parse("[::]:3", 0, &a, &err) == 0 && lei_addr_is_wildcard(&a) &&
              lei_addr_port(&a) == 3);
        CHECK(lei_addr_parse("[::1]:3", 0, &a, &err) == 0 && !lei_addr_is_wildcard(&a));
        CHECK(lei_addr_unclaimable(&a) == NULL);
        /* no peer's address: a second spelling of an IPv4 one, broadcast, multicast */
        static const char *const bad[][2] = {
            {"[::ffff:127.0.0.1]:5", "an IPv4-mapped IPv6 address (write a.b.c.d:port)"},
            {"255.255.255.255:5", "a broadcast address"},
            {"224.0.0.1:5", "a multicast address"},
            {"239.255.255.250:5", "a multicast address"},
            {"[ff02::1]:5", "a multicast address"}};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            lei_addr b;
            const char *why = "";
            CHECK(lei_addr_parse(bad[i][0], 0, &b, &err) == 0 &&
                  (why = lei_addr_unclaimable(&b)) && strcmp(why, bad[i][1]) == 0);
        }
        CHECK(lei_addr_parse("223.255.255.255:5", 0, &a, &err) == 0 && !lei_addr_unclaimable(&a));
        CHECK(lei_addr_parse("240.0.0.1:5", 0, &a, &err) == 0 && !lei_addr_unclaimable(&a));
        CHECK(lei_addr_parse("[::1]:3", 0, &a, &err) == 0);
        /* too small an output buffer is an error, not a cut text */
        CHECK(lei_addr_format(&a, want, 5) == -1);
    }
}

/* ---- sockets ------------------------------------------------------------ */

static int wait_fd(int fd, short ev) {
    struct pollfd p = {fd, ev, 0};
    return poll(&p, 1, 2000) == 1 && (p.revents & ev);
}

/* Listens on text, connects to the bound address, accepts, and sends one
 * byte each way.  Returns 0, or -1 when the listen fails with errno. */
static int exchange(const char *text, char *bound) {
    lei_addr a, b;
    const char *perr;
    char err[LEI_ADDR_ERR_MAX];
    CHECK(lei_addr_parse(text, LEI_ADDR_LISTEN, &a, &perr) == 0);
    int lfd = lei_addr_listen(&a, 16, bound, err, sizeof err);
    if (lfd < 0) return -1;
    CHECK((fcntl(lfd, F_GETFL) & O_NONBLOCK) && (fcntl(lfd, F_GETFD) & FD_CLOEXEC));
    CHECK(lei_addr_parse(bound, 0, &b, &perr) == 0); /* port resolved: not 0 */
    CHECK(lei_addr_is_unix(&a) || lei_addr_port(&b) != 0);
    int cfd = lei_addr_connect(&b, err, sizeof err);
    CHECK(cfd >= 0);
    if (cfd < 0) fprintf(stderr, "  connect %s: %s\n", bound, err);
    CHECK((fcntl(cfd, F_GETFL) & O_NONBLOCK) && (fcntl(cfd, F_GETFD) & FD_CLOEXEC));
    CHECK(wait_fd(lfd, POLLIN));
    int afd = accept(lfd, NULL, NULL);
    CHECK(afd >= 0);
    lei_addr_nodelay(afd);
    CHECK(wait_fd(cfd, POLLOUT));
    int soerr = -1, nd = -1;
    socklen_t sl = sizeof soerr;
    CHECK(getsockopt(cfd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0);
    sl = sizeof nd;
    if (lei_addr_is_unix(&a)) {
        CHECK(getsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &nd, &sl) == -1);
    } else {
        CHECK(getsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &nd, &sl) == 0 && nd == 1);
        nd = -1;
        CHECK(getsockopt(afd, IPPROTO_TCP, TCP_NODELAY, &nd, &sl) == 0 && nd == 1);
    }
    char c = 0;
    CHECK(write(cfd, "x", 1) == 1 && wait_fd(afd, POLLIN) && read(afd, &c, 1) == 1 && c == 'x');
    CHECK(write(afd, "y", 1) == 1 && wait_fd(cfd, POLLIN) && read(cfd, &c, 1) == 1 && c == 'y');
    close(afd);
    close(cfd);
    lei_addr_close(lfd, &a);
    return 0;
}

static void test_sockets(const char *dir) {
    char bound[LEI_ADDR_TEXT_MAX], text[LEI_ADDR_TEXT_MAX];
    struct stat st;
    CHECK(exchange("127.0.0.1:0", bound) == 0);
    CHECK(strncmp(bound, "127.0.0.1:", 10) == 0 && strcmp(bound, "127.0.0.1:0") != 0);
    if (exchange("[::1]:0", bound) == 0)
        CHECK(strncmp(bound, "[::1]:", 6) == 0 && strcmp(bound, "[::1]:0") != 0);
    else
        printf("skipped: no IPv6 loopback on this host (%s)\n", strerror(errno));
    snprintf(text, sizeof text, "unix:%s/s.sock", dir);
    CHECK(exchange(text, bound) == 0 && STREQ(bound, text));
    CHECK(lstat(text + 5, &st) == -1 && errno == ENOENT); /* lei_addr_close removed it */
    snprintf(text, sizeof text, "unix:@lecho-test-addr-%d", (int)getpid());
    CHECK(exchange(text, bound) == 0 && STREQ(bound, text));

    /* connecting to nobody fails now (unix) or later (tcp), with port 0 at once */
    lei_addr a;
    const char *perr;
    char err[LEI_ADDR_ERR_MAX];
    snprintf(text, sizeof text, "unix:%s/nobody.sock", dir);
    CHECK(lei_addr_parse(text, 0, &a, &perr) == 0);
    CHECK(lei_addr_connect(&a, err, sizeof err) == -2 && errno == ENOENT); /* the address's failure */
    CHECK(strncmp(err, "connect: ", 9) == 0);
    CHECK(lei_addr_parse("127.0.0.1:0", LEI_ADDR_LISTEN, &a, &perr) == 0);
    CHECK(lei_addr_connect(&a, err, sizeof err) == -2 && errno == EINVAL);
    CHECK(STREQ(err, "connect: port 0 is only for listening"));
}

/* A unix path: a stale socket file is replaced, a live one and a file that
 * is not a socket are left alone, and closing removes only our own. */
static void test_stale(const char *dir) {
    char text[LEI_ADDR_TEXT_MAX], bound[LEI_ADDR_TEXT_MAX], err[LEI_ADDR_ERR_MAX];
    const char *perr;
    lei_addr a;
    struct stat st;
    snprintf(text, sizeof text, "unix:%s/stale.sock", dir);
    const char *path = text + 5;
    CHECK(lei_addr_parse(text, LEI_ADDR_LISTEN, &a, &perr) == 0);

    /* a listener that died without cleaning up leaves a stale file */
    int l1 = lei_addr_listen(&a, 4, bound, err, sizeof err);
    CHECK(l1 >= 0);
    close(l1);
    CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
    l1 = lei_addr_listen(&a, 4, bound, err, sizeof err);
    CHECK(l1 >= 0);
    if (l1 < 0) fprintf(stderr, "  stale: %s\n", err);

    /* a live one is not taken over, and still accepts after the attempt */
    CHECK(lei_addr_listen(&a, 4, bound, err, sizeof err) == -1 && errno == EADDRINUSE);
    CHECK(strstr(err, "a live process listens there") != NULL);
    int c = lei_addr_connect(&a, err, sizeof err);
    CHECK(c >= 0 && wait_fd(l1, POLLIN));
    if (c >= 0) close(c);

    /* a successor bound since: closing the old descriptor keeps its file */
    close(l1);
    int l2 = lei_addr_listen(&a, 4, bound, err, sizeof err);
    CHECK(l2 >= 0);
    lei_addr_close(-1, &a);
    CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
    lei_addr_close(l2, &a);
    CHECK(lstat(path, &st) == -1 && errno == ENOENT);

    /* a file that is not a socket is never removed */
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("keep me", f);
        fclose(f);
    }
    CHECK(lei_addr_listen(&a, 4, bound, err, sizeof err) == -1 && errno == EEXIST);
    CHECK(strstr(err, "exists and is not a socket (not removed)") != NULL);
    lei_addr_close(-1, &a);
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 7);
    unlink(path);

    /* an abstract name in use is refused by the kernel */
    snprintf(text, sizeof text, "unix:@lecho-test-stale-%d", (int)getpid());
    CHECK(lei_addr_parse(text, LEI_ADDR_LISTEN, &a, &perr) == 0);
    l1 = lei_addr_listen(&a, 4, bound, err, sizeof err);
    CHECK(l1 >= 0);
    CHECK(lei_addr_listen(&a, 4, bound, err, sizeof err) == -1 && errno == EADDRINUSE);
    CHECK(strncmp(err, "bind: ", 6) == 0);
    lei_addr_close(l1, &a);
}


/* Processes starting on one path at once (each round over a stale file):
 * exactly one listens, and no one's file is removed by another (which would
 * leave a listener nobody can reach).  Each child tries once, says so on a
 * pipe, and keeps its listener until every child has tried (a slow host may
 * start one child long after another: a winner gone by then would leave a
 * stale file, rightly taken over).  It exits 0: lost (refused), 1: listens
 * and its file is still its own once all have tried, 2: listens but its
 * file was replaced or removed. */
static void test_race(const char *dir) {
    char text[LEI_ADDR_TEXT_MAX];
    const char *perr;
    lei_addr a;
    snprintf(text, sizeof text, "unix:%s/race.sock", dir);
    CHECK(lei_addr_parse(text, LEI_ADDR_LISTEN, &a, &perr) == 0);
    int bad_rounds = 0;
    for (int round = 0; round < 20; round++) {
        char bound[LEI_ADDR_TEXT_MAX], err[LEI_ADDR_ERR_MAX];
        int go[2], tried[2], done[2], nwin = 0, nlost = 0;
        pid_t kids[8];
        int fd = lei_addr_listen(&a, 4, bound, err, sizeof err);
        if (fd >= 0) close(fd); /* a stale file to start from */
        if (pipe(go) || pipe(tried) || pipe(done)) break;
        for (int k = 0; k < 8; k++) {
            kids[k] = fork();
            if (kids[k] == 0) {
                char c = 't', b2[LEI_ADDR_TEXT_MAX], e2[LEI_ADDR_ERR_MAX];
                struct stat s1, s2;
                close(go[1]);
                close(tried[0]);
                close(done[1]);
                if (read(go[0], &c, 1) != 0) _exit(3);
                int l = lei_addr_listen(&a, 4, b2, e2, sizeof e2);
                int have = l >= 0 && lstat(text + 5, &s1) == 0;
                if (write(tried[1], &c, 1) != 1) _exit(3);
                if (read(done[0], &c, 1) != 0) _exit(3); /* until all have tried */
                if (l < 0) _exit(0);
                _exit(have && lstat(text + 5, &s2) == 0 && s1.st_ino == s2.st_ino ? 1 : 2);
            }
        }
        close(go[0]);
        close(tried[1]);
        close(done[0]);
        close(go[1]); /* all start now */
        for (int k = 0; k < 8; k++) { /* each child's one byte (or EOF if one died) */
            char c;
            if (read(tried[0], &c, 1) != 1) break;
        }
        close(tried[0]);
        close(done[1]); /* all have tried: the winners may look and exit */
        for (int k = 0; k < 8; k++) {
            int st = 0;
            if (kids[k] > 0 && waitpid(kids[k], &st, 0) == kids[k] && WIFEXITED(st)) {
                if (WEXITSTATUS(st) == 1) nwin++;
                if (WEXITSTATUS(st) == 2) nlost++;
            }
        }
        if (nwin != 1 || nlost != 0) {
            bad_rounds++;
            fprintf(stderr, "  race round %d: %d listen with their file, %d lost it\n", round, nwin,
                    nlost);
        }
        lei_addr_close(-1, &a);
    }
    CHECK(bad_rounds == 0);
    unlink(text + 5);
}

/* ---- advertised address ------------------------------------------------- */

/* Whether the host part of text is an address of this host (binding a
 * socket to it with port 0 works). */
static int is_local(const char *text) {
    lei_addr a;
    const char *perr;
    if (lei_addr_parse(text, 0, &a, &perr)) return 0;
    if (a.ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&a.ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&a.ss)->sin6_port = 0;
    int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a.ss, a.len) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

static void test_advertise(void) {
    char out[LEI_ADDR_TEXT_MAX], err[LEI_ADDR_ERR_MAX], bound[LEI_ADDR_TEXT_MAX];
    char want[LEI_ADDR_TEXT_MAX];
    lei_addr a, p;
    const char *perr;

    /* not a wildcard: itself; unix too */
    CHECK(lei_addr_advertise("127.0.0.1:5", NULL, NULL, out, err, sizeof err) == 0 &&
          STREQ(out, "127.0.0.1:5"));
    CHECK(lei_addr_advertise("unix:/tmp/x", NULL, NULL, out, err, sizeof err) == 0 &&
          STREQ(out, "unix:/tmp/x"));
    /* an explicit one wins; its port 0 is the bound port */
    CHECK(lei_addr_advertise("0.0.0.0:77", "192.0.2.9:0", NULL, out, err, sizeof err) == 0 &&
          STREQ(out, "192.0.2.9:77"));
    CHECK(lei_addr_advertise("[::]:77", "[2001:db8::9]:8", NULL, out, err, sizeof err) == 0 &&
          STREQ(out, "[2001:db8::9]:8"));
    CHECK(lei_addr_advertise("127.0.0.1:77", "localhost:0", NULL, out, err, sizeof err) == 0 &&
          STREQ(out, "127.0.0.1:77"));
    CHECK(lei_addr_advertise("0.0.0.0:77", "0.0.0.0:0", NULL, out, err, sizeof err) == -1 &&
          STREQ(err, "advertise address '0.0.0.0:0': a wildcard cannot be reached"));
    CHECK(lei_addr_advertise("0.0.0.0:77", "nohost", NULL, out, err, sizeof err) == -1 &&
          STREQ(err, "advertise address 'nohost': missing port (want host:port)"));
    CHECK(lei_addr_advertise("0.0.0.0", NULL, NULL, out, err, sizeof err) == -1 &&
          STREQ(err, "bound address '0.0.0.0': missing port (want host:port)"));

    /* a wildcard and the address peers learn ours from: the local address
     * on the way there */
    CHECK(lei_addr_advertise("0.0.0.0:77", NULL, "127.0.0.1:9", out, err, sizeof err) == 0 &&
          STREQ(out, "127.0.0.1:77"));
    CHECK(lei_addr_advertise("0.0.0.0:77", NULL, "127.8.9.10:9", out, err, sizeof err) == 0 &&
          STREQ(out, "127.0.0.1:77"));
    if (is_local("[::1]:1"))
        CHECK(lei_addr_advertise("[::]:77", NULL, "[::1]:9", out, err, sizeof err) == 0 &&
              STREQ(out, "[::1]:77"));
    /* ... the same from a real connection's local address, which it mirrors */
    CHECK(lei_addr_parse("127.0.0.1:0", LEI_ADDR_LISTEN, &a, &perr) == 0);
    int lfd = lei_addr_listen(&a, 4, bound, err, sizeof err);
    CHECK(lfd >= 0 && lei_addr_parse(bound, 0, &p, &perr) == 0);
    int cfd = lei_addr_connect(&p, err, sizeof err);
    CHECK(cfd >= 0 && wait_fd(cfd, POLLOUT));
    p.len = sizeof p.ss;
    CHECK(getsockname(cfd, (struct sockaddr *)&p.ss, &p.len) == 0);
    CHECK(lei_addr_format(&p, want, sizeof want) > 0);
    CHECK(lei_addr_advertise("0.0.0.0:0", NULL, bound, out, err, sizeof err) == 0);
    *strrchr(want, ':') = '\0';
    *strrchr(out, ':') = '\0';
    CHECK(STREQ(out, want));
    close(cfd);
    lei_addr_close(lfd, &a);
    /* ... of another family or a unix one: not used */
    CHECK(lei_addr_advertise("[::]:77", NULL, "127.0.0.1:9", out, err, sizeof err) == 0);
    CHECK(strncmp(out, "[", 1) == 0 && strstr(out, "]:77") != NULL);
    CHECK(lei_addr_advertise("0.0.0.0:77", NULL, "unix:/x", out, err, sizeof err) == 0);
    CHECK(strncmp(out, "0.0.0.0", 7) != 0);
    CHECK(lei_addr_advertise("0.0.0.0:77", NULL, "nohost", out, err, sizeof err) == -1 &&
          STREQ(err, "address 'nohost': missing port (want host:port)"));

    /* a wildcard alone: an address of this host, the first non-loopback one
     * if there is one, with the bound port */
    CHECK(lei_addr_advertise("0.0.0.0:77", NULL, NULL, out, err, sizeof err) == 0);
    CHECK(lei_addr_parse(out, 0, &p, &perr) == 0 && !lei_addr_is_wildcard(&p) &&
          lei_addr_port(&p) == 77 && p.ss.ss_family == AF_INET && is_local(out));
    printf("wildcard 0.0.0.0:77 advertises %s\n", out);
    CHECK(lei_addr_advertise("[::]:77", NULL, NULL, out, err, sizeof err) == 0);
    CHECK(lei_addr_parse(out, 0, &p, &perr) == 0 && !lei_addr_is_wildcard(&p) &&
          lei_addr_port(&p) == 77 && p.ss.ss_family == AF_INET6);
    CHECK(strncmp(out, "[fe80:", 6) != 0);
    printf("wildcard [::]:77 advertises %s\n", out);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/lecho-test-addr-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_cases(argc > 1 ? argv[1] : "core/test/test_addr_cases.txt");
    test_parse();
    test_sockets(dir);
    test_stale(dir);
    test_race(dir);
    test_advertise();
    if (rmdir(dir)) {
        failed++;
        fprintf(stderr, "%s left files behind: %s\n", dir, strerror(errno));
    }
    return TEST_SUMMARY();
}
