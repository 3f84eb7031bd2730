-- lecho.sockets: the libc socket calls the Lua-side servers of a context
-- (lecho.metrics, lecho.gateway) make through LuaJIT's FFI, declared once.
-- Requiring it declares them (each in a pcall: another module may have
-- declared the same C already); the servers use ffi.C.  Addresses: struct
-- lecho_metrics_sin (sockaddr_in's layout) and struct lecho_sin6
-- (sockaddr_in6's).
local ffi = require "ffi"

pcall(ffi.cdef, "struct lecho_metrics_sin { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };")
pcall(ffi.cdef, "struct lecho_sin6 { uint16_t family; uint16_t port; uint32_t flow; uint8_t addr[16]; uint32_t scope; };")
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
                       "const char *inet_ntop(int af, const void *src, char *dst, unsigned int size);",
                       "unsigned int if_nametoindex(const char *ifname);",
                       "unsigned short htons(unsigned short v);" } do
  pcall(ffi.cdef, decl)
end

return true
