-- lecho.sockets: the libc socket calls the Lua-side servers of a context
-- (lecho.metrics, lecho.gateway) make through LuaJIT's FFI, declared once.
-- Requiring it declares them (each in a pcall: another module may have
-- declared the same C already); the servers use ffi.C.  IPv4 only: the
-- address is struct lecho_metrics_sin (sockaddr_in's layout).
local ffi = require "ffi"

pcall(ffi.cdef, "struct lecho_metrics_sin { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };")
for _, decl in ipairs{ "int socket(int domain, int type, int protocol);",
                       "int setsockopt(int fd, int level, int name, const void *val, unsigned int len);",
                       "int bind(int fd, const void *addr, unsigned int len);",
                       "int listen(int fd, int backlog);",
                       "int accept4(int fd, void *addr, void *len, int flags);",
                       "int getsockname(int fd, void *addr, unsigned int *len);",
                       "long recv(int fd, void *buf, size_t n, int flags);",
                       "long send(int fd, const void *buf, size_t n, int flags);",
                       "int close(int fd);", "char *strerror(int errnum);", "int shutdown(int fd, int how);",
                       "int inet_pton(int af, const char *src, void *dst);",
                       "unsigned short htons(unsigned short v);" } do
  pcall(ffi.cdef, decl)
end

return true
