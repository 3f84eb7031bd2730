/* addr.h: the addresses of lecho contexts and name servers, as text and as
 * sockets: IPv4, IPv6 and Unix-domain stream sockets.
 *
 * Text grammar (lua/lecho/addr.lua checks the same one, with the same
 * messages):
 *
 *   a.b.c.d:PORT        IPv4, dotted quad (no names are resolved)
 *   localhost:PORT      taken as 127.0.0.1:PORT
 *   [V6]:PORT           IPv6 in any form inet_pton takes, in brackets
 *   [V6%ZONE]:PORT      with a zone (interface name or index), for link-local
 *   unix:/ABS/PATH      a Unix-domain socket file; the path is absolute, at
 *                       most 107 bytes, has no "//", does not end in "/" and
 *                       has no space or control character
 *   unix:@NAME          a Linux abstract socket (no file), same rules
 *
 * PORT is decimal, 1..65535; 0 (the OS picks) only with LEI_ADDR_LISTEN.
 * The canonical text, which is what the context compares and advertises:
 * IPv4 as dotted quad, IPv6 in brackets as inet_ntop writes it (lowercase,
 * longest zero run compressed), a zone by interface name when the interface
 * exists, else by index; unix addresses as given.  Canonical text never
 * contains "//", so a channel reference "unix:/p//name" splits without doubt
 * (see lua/lecho/addr.lua).
 *
 * Leans on the socket API only: no libev, no Lua, no global state.  Parsing
 * and formatting are pure; the socket functions return plain descriptors
 * that belong to the caller.  Unit-tested by core/test/test_addr.c.
 */
#ifndef LECHO_ADDR_H
#define LECHO_ADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* Room for any canonical address text with its NUL ("unix:" + 107 bytes of
 * path is the longest). */
#define LEI_ADDR_TEXT_MAX 128

/* Room for an error text of the socket functions below. */
#define LEI_ADDR_ERR_MAX 160

/* lei_addr_parse flags */
#define LEI_ADDR_LISTEN 1 /* port 0 is allowed: the OS picks one */

typedef struct lei_addr {
    struct sockaddr_storage ss; /* rw: family, address and port */
    socklen_t len;              /* rw: the bytes of ss in use */
} lei_addr;

/* Parses text into *a.  Returns 0, or -1 with *err pointing at a static
 * message ("missing port (want host:port)", "unix socket path too long (at
 * most 107 bytes)", ...) and *a unspecified. */
int lei_addr_parse(const char *text, int flags, lei_addr *a, const char **err);

/* Writes the canonical text of a into out[size].  Returns its length, or -1
 * when a is not an address this file makes or out is too small (size
 * LEI_ADDR_TEXT_MAX is always enough). */
int lei_addr_format(const lei_addr *a, char *out, size_t size);

/* Properties of a parsed address. */
int lei_addr_is_unix(const lei_addr *a);
int lei_addr_is_wildcard(const lei_addr *a); /* 0.0.0.0 or [::] */
/* Why a peer may not claim a as its address (a HELLO), or NULL: an
 * IPv4-mapped IPv6 address (a second spelling of an IPv4 one), broadcast
 * or multicast (not one context's). */
const char *lei_addr_unclaimable(const lei_addr *a);
int lei_addr_is_local(const lei_addr *a);    /* 127.0.0.0/8, ::1 or a unix socket */
unsigned lei_addr_port(const lei_addr *a);   /* 0 for unix */

/* Opens a listening socket on a: non-blocking, close-on-exec, SO_REUSEADDR
 * for TCP.  For a unix path that exists already: a socket file on which
 * nothing listens is a stale one and is unlinked first; a live socket (one
 * that accepts a connection) or a file that is not a socket is left alone
 * and the call fails (errno EADDRINUSE or EEXIST).  The check, removal and
 * bind hold an flock on the path's directory, so of processes starting on
 * one path at once exactly one listens, and none removes the file of
 * another (lei_addr_close takes it too).  On success returns the
 * descriptor, owned by the caller (close it with lei_addr_close), and writes
 * the bound address, port resolved, to bound[LEI_ADDR_TEXT_MAX].  On failure
 * returns -1 with errno set and a message in err[esize]. */
int lei_addr_listen(const lei_addr *a, int backlog, char *bound, char *err, size_t esize);

/* Closes a descriptor from lei_addr_listen on a and removes its socket file
 * if it is still a socket on which nothing listens (never one that another
 * process has bound since). */
void lei_addr_close(int fd, const lei_addr *a);

/* Starts a non-blocking connect to a (close-on-exec; TCP_NODELAY for TCP).
 * Returns the descriptor, owned by the caller, whose connect may still be in
 * progress (wait for it to be writable, then read SO_ERROR), or < 0 with
 * errno set and a message in err[esize]: -2 when the address cannot be
 * reached (connect() failed at once, as a unix socket's does, or port 0),
 * -1 when this side could not try (socket(): no descriptor, ...). */
int lei_addr_connect(const lei_addr *a, char *err, size_t esize);

/* Sets TCP_NODELAY on fd when it is a TCP socket (an accepted one, say);
 * does nothing on a Unix-domain socket. */
void lei_addr_nodelay(int fd);

/* The address peers should be told, given the bound address text (from
 * lei_addr_listen).  The rule, first that applies:
 *   1. advertise (may be NULL) when given: a full address; its port 0 means
 *      the bound port.  It must not be a wildcard.
 *   2. bound itself when it is not a wildcard (a unix address never is).
 *   3. toward (may be NULL: the address of the process that peers will
 *      learn ours from, the name server) when it is of bound's family: the
 *      local address this host sends from to reach it (a UDP socket is
 *      connected to it, which sends nothing, and asked getsockname), unless
 *      that is a wildcard; with bound's port.
 *   4. the first address of an interface that is up and not loopback, of
 *      bound's family (for IPv6, not link-local: it would need a zone),
 *      with bound's port, in getifaddrs order.
 *   5. loopback (127.0.0.1 or [::1]) with bound's port.
 * Writes out[LEI_ADDR_TEXT_MAX]; returns 0, or -1 with a message in
 * err[esize] when bound, advertise or toward does not parse. */
int lei_addr_advertise(const char *bound, const char *advertise, const char *toward, char *out,
                       char *err, size_t esize);

#endif
