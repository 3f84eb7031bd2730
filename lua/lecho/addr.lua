-- lecho.addr: addresses and channel references as text, on the Lua side.
--
--   local addr = require "lecho.addr"
--   addr.parse("localhost:5")                --> "127.0.0.1:5"
--   addr.parse("[::1]:0", { listen = true }) --> "[::1]:0"
--   addr.parse("nohost")                     --> nil, "missing port (want host:port)", "invalid"
--   addr.split("ozone", ns)                  --> ns, "ozone"
--   addr.split("[::1]:5/ozone", ns)          --> "[::1]:5", "ozone"
--   addr.split("unix:/run/ns.sock//a/b", ns) --> "unix:/run/ns.sock", "a/b"
--   addr.join("unix:/run/ns.sock", "a/b")    --> "unix:/run/ns.sock//a/b"
--
-- The grammar, the canonical text and the error messages are those of
-- core/transport/addr.h (IPv4 "a.b.c.d:port" and "localhost:port", IPv6 "[v6]:port"
-- and "[v6%zone]:port", "unix:/abs/path" and "unix:@abstract"; port 1-65535,
-- 0 only to listen); IPv6 goes through the C library's inet_pton/inet_ntop
-- by the FFI, so both sides write the same canonical text.  Only the NUL
-- byte, which a C string cannot hold, has a message of its own here.
--
-- A channel reference is a name of the default name server, or the name of
-- another one's channel:
--
--   ref  = name                          (no address before it: the default)
--        | tcp-address "/" name          "127.0.0.1:5/ozone", "[::1]:5/ozone"
--        | unix-address "//" name        "unix:/run/ns.sock//ozone"
--
-- A unix path contains "/", so its end is marked by "//": a unix address
-- never contains "//" nor ends in "/", hence the first "//" ends it and
-- whatever follows, "/" included, is the name.  The address is written the
-- same way as everywhere else (copy it from `listen` or the logs), where
-- bracketing it ("[unix:/p]/name") would give it a second spelling.  So a
-- name of the default name server cannot start with "unix:", nor with
-- "host:port/" or "[...]:port/".  join() is the inverse: split(join(ns, n))
-- gives ns, n for every canonical ns and non-empty n.

local ffi = require "ffi"

local M = {}

local AF_INET, AF_INET6 = 2, 10 -- Linux
local UNIX_PATH_MAX = 107       -- sun_path less its NUL

local function declare(decl)
  pcall(ffi.cdef, decl) -- already declared by another module: the same C
end
declare "int inet_pton(int af, const char *src, void *dst);"
declare "const char *inet_ntop(int af, const void *src, char *dst, unsigned int size);"
declare "unsigned int if_nametoindex(const char *ifname);"
declare "char *if_indextoname(unsigned int ifindex, char *ifname);"

local C = ffi.C
local bin = ffi.new("uint8_t[16]")
local txt = ffi.new("char[64]")

local function invalid(msg) return nil, msg, "invalid" end

local function parse_unix(s)
  local c = s:sub(1, 1)
  if c ~= "/" and c ~= "@" then
    return invalid("unix socket path must be absolute (unix:/path) or abstract (unix:@name)")
  end
  if #s < 2 then return invalid("empty unix socket path") end
  if #s > UNIX_PATH_MAX then return invalid("unix socket path too long (at most 107 bytes)") end
  if s:find("//", 1, true) or s:sub(-1) == "/" then
    return invalid("unix socket path must not contain '//' or end in '/'")
  end
  if s:find("[%z\1- \127]") then return invalid("space or control character in unix socket path") end
  return "unix:" .. s
end

-- "[v6]" or "[v6%zone]" (brackets included) -> "[canonical]".
local function parse_v6(h)
  if #h < 2 or h:sub(-1) ~= "]" or #h - 2 >= 46 + 16 + 2 then return invalid("bad IPv6 address") end
  local host, zone = h:sub(2, -2), nil
  local pct = host:find("%", 1, true)
  if pct then host, zone = host:sub(1, pct - 1), host:sub(pct + 1) end
  if C.inet_pton(AF_INET6, host, bin) ~= 1 then return invalid("bad IPv6 address") end
  local out = ffi.string(C.inet_ntop(AF_INET6, bin, txt, 64))
  if zone then
    local idx = 0
    if zone:match("^%d+$") and #zone <= 10 then
      idx = tonumber(zone)
    elseif zone ~= "" then
      idx = tonumber(C.if_nametoindex(zone))
    end
    if idx == 0 or idx > 0xffffffff then return invalid("unknown interface in IPv6 zone") end
    local name = C.if_indextoname(idx, txt)
    out = out .. "%" .. (name ~= nil and ffi.string(name) or tostring(idx))
  end
  return "[" .. out .. "]"
end

--- The canonical text of address s, or nil, message, "invalid".
-- opts.listen: port 0 (the OS picks one) is allowed.
function M.parse(s, opts)
  if type(s) ~= "string" then return invalid("address must be a string") end
  if s == "" then return invalid("empty address") end
  if s:find("\0", 1, true) then return invalid("NUL byte in address") end
  if s:sub(1, 5) == "unix:" then return parse_unix(s:sub(6)) end
  local colon = s:match("^.*():")
  local close = s:match("^.*()%]")
  if not colon or (s:sub(1, 1) == "[" and (not close or colon < close)) then
    return invalid("missing port (want host:port)")
  end
  local ps = s:sub(colon + 1)
  local port = ps:match("^%d+$") and #ps <= 5 and tonumber(ps)
  if not port or port > 65535 then return invalid("bad port (want 1-65535)") end
  if port == 0 and not (opts and opts.listen) then return invalid("port 0 is only for listening") end
  local host, err = s:sub(1, colon - 1), nil
  if host:sub(1, 1) == "[" then
    host, err = parse_v6(host)
    if not host then return invalid(err) end
  elseif host:find(":", 1, true) then
    return invalid("IPv6 address must be in brackets ([::1]:port)")
  elseif host == "" then
    return invalid("missing host")
  else
    if host == "localhost" then host = "127.0.0.1" end
    if #host >= 16 or C.inet_pton(AF_INET, host, bin) ~= 1 then
      return invalid("bad host (want IPv4, localhost, [IPv6] or unix:/path)")
    end
    host = ffi.string(C.inet_ntop(AF_INET, bin, txt, 64))
  end
  return host .. ":" .. port
end

--- "ipv4", "ipv6" or "unix": the kind of a canonical address.
function M.kind(canon)
  if canon:sub(1, 5) == "unix:" then return "unix" end
  return canon:sub(1, 1) == "[" and "ipv6" or "ipv4"
end

--- Whether a canonical address is a wildcard (0.0.0.0 or [::]).
function M.is_wildcard(canon)
  return canon:match("^0%.0%.0%.0:%d+$") ~= nil or canon:match("^%[::%]:%d+$") ~= nil
end

--- Why a HELLO may not carry canonical address canon, or nil (the
-- handshake's checks, core/transport/handshake.c hello_addr_refused and
-- core/transport/addr.c lei_addr_unclaimable): a wildcard cannot be dialled, a
-- broadcast or multicast address is no one context's, an IPv4-mapped IPv6
-- address is a second spelling of an IPv4 one.
function M.unclaimable(canon)
  if M.is_wildcard(canon) then return "a wildcard address cannot be dialled" end
  local kind = M.kind(canon)
  if kind == "ipv4" then
    local a = tonumber(canon:match("^(%d+)%."))
    if canon:match("^255%.255%.255%.255:") then return "a broadcast address" end
    if a and a >= 224 and a <= 239 then return "a multicast address" end
  elseif kind == "ipv6" then
    local host = canon:match("^%[([^%]%%]*)")
    if host and C.inet_pton(AF_INET6, host, bin) == 1 then
      if bin[0] == 0xff then return "a multicast address" end
      local mapped = bin[10] == 0xff and bin[11] == 0xff
      for i = 0, 9 do if bin[i] ~= 0 then mapped = false end end
      if mapped then return "an IPv4-mapped IPv6 address (write a.b.c.d:port)" end
    end
  end
  return nil
end

--- Splits a channel reference (grammar above) into the canonical address of
-- its name server (default_ns for a plain name) and the name; or nil,
-- message, "invalid".
function M.split(ref, default_ns)
  if type(ref) ~= "string" or ref == "" then
    return invalid("a channel name must be a non-empty string")
  end
  -- The C API (lecho.h), the logs and the tools see names as C strings:
  -- "a\0b" would be "a" there.
  if ref:find("\0", 1, true) then return invalid("a channel name must not contain a NUL byte") end
  local a, name
  if ref:sub(1, 5) == "unix:" then
    local i = ref:find("//", 6, true)
    if not i then
      return invalid(("channel '%s': a unix name server address ends with '//' (want unix:/path//name)")
        :format(ref))
    end
    a, name = ref:sub(1, i - 1), ref:sub(i + 2)
  else
    a, name = ref:match("^(%b[]:%d+)/(.*)$")
    if not a then a, name = ref:match("^([^/%[%]]+:%d+)/(.*)$") end
    if not a then return default_ns, ref end
  end
  if name == "" then return invalid(("channel '%s' has no name after its name server"):format(ref)) end
  local ns, err = M.parse(a)
  if not ns then return invalid(("bad name server address '%s' in channel '%s': %s"):format(a, ref, err)) end
  return ns, name
end

--- A channel's base name (doc/protocol.md section 1): its full name up to
-- (not including) the first '@' after its last '/'; the whole name when
-- there is none.  The one rule of the protocol (core/transport/auth.c lei_base_len:
-- tickets name it), the manager (tickets) and the policy (what its rules
-- match) use: "NS/a/b@k" -> "NS/a/b", "NS/public@x/secret" -> itself (its
-- '@' is not after the last '/': no derived stream).
function M.base(name)
  local slash = 0
  for i = #name, 1, -1 do
    if name:byte(i) == 47 then slash = i break end
  end
  local at = name:find("@", slash + 1, true)
  return at and name:sub(1, at - 1) or name
end

--- The full reference of channel name of name server ns (canonical).
function M.join(ns, name)
  return ns .. (ns:sub(1, 5) == "unix:" and "//" or "/") .. name
end

return M
