/* fuzz_sock.h: what the socket harnesses (fuzz_conn.c, fuzz_handshake.c)
 * share: a one-string message, a non-blocking unix connection, and
 * reading a socket empty.  Each aborts the harness on a failure the input
 * cannot cause.  Static inline: a harness is one file. */
#ifndef FUZZ_SOCK_H
#define FUZZ_SOCK_H

#include "codec.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* A message holding the string s (owned by the caller: lei_msg_release). */
static inline lei_msg *msg_of(const char *s) {
    lei_msg *m = lei_msg_new();
    if (!m || lei_enc_string(&m->own, s, strlen(s))) abort();
    lei_msg_sync(m);
    return m;
}

/* A non-blocking connection to the unix socket at path (the caller closes it). */
static inline int unix_connect(const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) abort();
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* Reads non-blocking fd until nothing is left (what the context wrote back). */
static inline void drain(int fd) {
    uint8_t buf[65536];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

#endif
