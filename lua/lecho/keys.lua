-- lecho.keys: the files of keyed mode (doc/keys.md), read and written
-- with lua-cjson, and the certificates an authority signs.
--
--   local keys = require "lecho.keys"
--   local k = assert(keys.read_secret("alice.key"))   -- { name, public, secret, cert?, authority?, path }
--   local t = assert(keys.read_trust{ "ca.pub", "ns.pub", "ca.revoked" })
--     -- { keys = {...}, authorities = {...}, revoked = {pk...}, lists = {[apk] = list} }
--   keys.write_secret("bob.key", k)   keys.write_public("bob.pub", k)
--   local cert = keys.certify(ca, "bob", pk, not_before, not_after, { "10.0.0.5:7701" })
--   keys.check_cert(cert, "bob", pk, ca.public)
--
-- The formats (hex lowercase; public 32 bytes, secret 64 as libsodium's
-- Ed25519 keeps them: seed then public key; cert: doc/security.md; times:
-- Unix seconds):
--   secret key (0600)  {"lecho":"secret-key","version":1,"name":N,"public":HEX,"secret":HEX
--                       [,"cert":HEX,"authority":HEX | ,"not_before":T,"not_after":T]}
--   public key         {"lecho":"public-key","version":1,"name":N,"public":HEX[,"authority":true
--                       [,"not_before":T,"not_after":T]]}
--   trust list         {"lecho":"trust","version":1,"keys":[{"name":N,"public":HEX}...],
--                       "authorities":[{"name":N,"public":HEX[,"not_before":T,"not_after":T]}...]}
--   revocation list    {"lecho":"revocations","version":1,"authority":HEX,"seq":N,"issued":T,
--                       "keys":[HEX...],"sig":HEX}
-- A trust file is a public key file (an authority's when "authority" is
-- true), a trust list or a revocation list (signed by an authority the
-- other trust files trust).  Keys are Lua strings of raw bytes in the tables.
--
-- Failures return nil, "WHAT PATH: why", code (lecho.errors: notfound, io,
-- invalid, refused for a secret key file others may read, as ssh refuses
-- one).  The signing and checking is lecho.core's (libsodium), loaded when
-- first needed so that reading and writing files needs no core.
--
-- The files are read and written through the FFI (open, statx on the open
-- descriptor, read, write, fsync, rename): a secret key is checked for its
-- permissions on the descriptor it is read from, and written to a new file
-- created 0600, then renamed over the name, so no reader ever sees half a
-- key nor a moment where others could read it.

local cjson = require("cjson").new()
local ffi = require "ffi"
local bit = require "bit"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

M.MAX_FILE = 1024 * 1024          -- bytes of one key or trust file
M.NAME_RULE = "1 to 64 characters of A-Z a-z 0-9 . _ -"

pcall(ffi.cdef, [[
struct lecho_statx_ts { int64_t sec; uint32_t nsec; int32_t reserved; };
struct lecho_statx {
  uint32_t mask, blksize; uint64_t attributes;
  uint32_t nlink, uid, gid; uint16_t mode, spare0;
  uint64_t ino, size, blocks, attributes_mask;
  struct lecho_statx_ts atime, btime, ctime, mtime;
  uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
  uint64_t spare2[14];
};
int statx(int dirfd, const char *path, int flags, unsigned int mask, struct lecho_statx *buf);
]])
-- (declared by other modules too: pcall each, an existing one is the same C)
for _, decl in ipairs{ "int open(const char *path, int flags, ...);", "int close(int fd);",
                       "long read(int fd, void *buf, size_t n);", "long write(int fd, const void *buf, size_t n);",
                       "int fsync(int fd);", "char *strerror(int errnum);",
                       "int mkdir(const char *path, unsigned int mode);" } do
  pcall(ffi.cdef, decl)
end
local C = ffi.C
-- Linux (the values of every architecture lecho builds on)
local O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NONBLOCK, O_CLOEXEC = 0, 1, 64, 128, 2048, 524288
local AT_EMPTY_PATH, STATX_MODE, STATX_SIZE = 0x1000, 0x2, 0x200
local S_IFMT, S_IFREG = 0xF000, 0x8000
local ENOENT, EEXIST = 2, 17

local function syserr(what, path, errno)
  return nil, ("%s %s: %s"):format(what, path, ffi.string(C.strerror(errno))),
         errno == ENOENT and "notfound" or "io"
end

local function core() return require "lecho.core" end

--- The hex text of raw bytes s (lowercase): the core's (libsodium's).
function M.hex(s) return core().hex(s) end

-- The n raw bytes of hex text h, or nil when h is not 2n hex digits.
local function unhex(h, n)
  if type(h) ~= "string" or #h ~= 2 * n then return nil end
  return (core().unhex(h))
end
M.unhex = unhex

--- True when n is a principal name (M.NAME_RULE).
function M.valid_name(n)
  return type(n) == "string" and #n >= 1 and #n <= 64 and not n:find("[^A-Za-z0-9._-]")
end

-- The text of file path (what: "key file", "trust file"), at most
-- M.MAX_FILE bytes, and its permission bits (of the descriptor read).
local function read_file(what, path)
  if type(path) ~= "string" or path == "" then
    return nil, what .. " must be a path (a non-empty string)", "invalid"
  end
  -- O_NONBLOCK: a FIFO given as a key file must not hang the open (it is
  -- then refused as not a regular file); three arguments, as whoever
  -- declared open() first may have declared it
  local fd = C.open(path, bit.bor(O_RDONLY, O_NONBLOCK, O_CLOEXEC), ffi.new("int", 0))
  if fd < 0 then return syserr(what, path, ffi.errno()) end
  local st = ffi.new("struct lecho_statx")
  local buf, parts, total = nil, {}, 0
  local ok, err, code = true, nil, nil
  if C.statx(fd, "", AT_EMPTY_PATH, bit.bor(STATX_MODE, STATX_SIZE), st) ~= 0 then
    ok, err, code = syserr(what, path, ffi.errno())
  elseif bit.band(st.mode, S_IFMT) ~= S_IFREG then
    ok, err, code = nil, ("%s %s: not a regular file"):format(what, path), "invalid"
  else
    buf = ffi.new("char[?]", 65536)
    while true do
      local n = C.read(fd, buf, 65536)
      if n < 0 then ok, err, code = syserr(what, path, ffi.errno()) break end
      if n == 0 then break end
      total = total + tonumber(n)
      if total > M.MAX_FILE then
        ok, err, code = nil, ("%s %s: larger than %d bytes"):format(what, path, M.MAX_FILE), "limit"
        break
      end
      parts[#parts + 1] = ffi.string(buf, n)
    end
  end
  C.close(fd)
  if not ok then return nil, err, code end
  return table.concat(parts), bit.band(st.mode, 4095)
end

local KIND = { ["secret-key"] = "a lecho secret key", ["public-key"] = "a lecho public key",
               trust = "a lecho trust list" }

-- nil, "WHAT PATH: it is KIND, not WANT" for a file of the wrong kind.
local function wrong_kind(what, path, t, want)
  local is = KIND[t.lecho]
  return nil, ("%s %s: %s%s"):format(what, path, "not " .. want, is and (" (it is " .. is .. ")") or ""),
         "invalid"
end

-- The object of file path as a table whose "lecho" field names its kind
-- (kind given: that one, want its words for wrong_kind), and the file's
-- permission bits.
local function read_json(what, path, kind, want)
  local text, mode, code = read_file(what, path)
  if not text then return nil, mode, code end
  local ok, t = pcall(cjson.decode, text)
  if not ok or type(t) ~= "table" or type(t.lecho) ~= "string" then
    return nil, ("%s %s: not a lecho key file (JSON with a \"lecho\" field)"):format(what, path), "invalid"
  end
  if t.version ~= 1 then
    return nil, ("%s %s: version %s is not one this lecho reads (1)"):format(what, path, tostring(t.version)),
           "invalid"
  end
  if kind and t.lecho ~= kind then return wrong_kind(what, path, t, want) end
  return t, mode
end

-- name and public key of entry e (fields "name", "public"), or nil, why.
local function name_and_key(e, where)
  if type(e) ~= "table" then return nil, where .. " is not an object {name, public}" end
  if not M.valid_name(e.name) then return nil, ("%s: name must be %s"):format(where, M.NAME_RULE) end
  local pk = unhex(e.public, 32)
  if not pk then return nil, ("%s: public must be 64 hex digits"):format(where) end
  return e.name, pk
end


-- u64 big-endian of integer n in [0, 2^53)
local function u64(n)
  local hi, lo = math.floor(n / 2^32), n % 2^32
  local b = {}
  for i = 3, 0, -1 do b[#b + 1] = string.char(bit.band(bit.rshift(hi, i * 8), 255)) end
  for i = 3, 0, -1 do b[#b + 1] = string.char(bit.band(bit.rshift(lo, i * 8), 255)) end
  return table.concat(b)
end
local function get_u64(s, at)
  local hi, lo = 0, 0
  for i = 0, 3 do hi = hi * 256 + s:byte(at + i) end
  for i = 4, 7 do lo = lo * 256 + s:byte(at + i) end
  return hi * 2^32 + lo
end
M.u64, M.get_u64 = u64, get_u64

M.CERT_ADDRS_MAX = 8            -- addresses in one certificate (core/transport/frame.h)

--- The message an authority signs to certify that pk is name's key
-- (doc/security.md "Certificates"): body is the certificate without its
-- signature.  (v1, 64-byte certificates signed "lecho-cert-v1" 0 name 0 pk
-- only: refused by peers since validity periods came.)
function M.cert_message(name, pk, body)
  return "lecho-cert-v2\0" .. name .. "\0" .. pk .. body
end

--- The certificate by authority `auth` (a secret key table) that pk (32
-- raw bytes) is principal name's key from not_before to not_after (Unix
-- seconds, integers; default 5 minutes ago and 365 days from now), for the
-- addresses listed (nil or {}: any):
-- u64be not_before || u64be not_after || u8 n || n x (u8 len, address) || sig64.
function M.certify(auth, name, pk, not_before, not_after, addresses)
  addresses = addresses or {}
  -- (defaults, as lecho-keygen's: from 5 minutes ago, for 365 days)
  not_before = not_before or os.time() - 300
  not_after = not_after or os.time() + 365 * 86400
  local parts = { u64(not_before), u64(not_after), string.char(#addresses) }
  for _, a in ipairs(addresses) do parts[#parts + 1] = string.char(#a) .. a end
  local body = table.concat(parts)
  return body .. core().sign(auth.secret, M.cert_message(name, pk, body))
end

--- The fields of certificate cert: { not_before, not_after, addresses },
-- or nil, why (malformed, or a 64-byte v1 one).
function M.cert_fields(cert)
  if type(cert) ~= "string" then return nil, "not a certificate" end
  if #cert == 64 then return nil, "an old certificate without validity (lecho-cert-v1)" end
  if #cert < 17 + 64 then return nil, "a certificate too short" end
  local n, pos, addrs = cert:byte(17), 18, {}
  if n > M.CERT_ADDRS_MAX then return nil, "more than 8 addresses" end
  for _ = 1, n do
    local l = cert:byte(pos)
    if not l or l == 0 or pos + l > #cert - 64 then return nil, "a malformed address list" end
    addrs[#addrs + 1] = cert:sub(pos + 1, pos + l)
    pos = pos + 1 + l
  end
  if pos ~= #cert - 64 + 1 then return nil, "trailing bytes in a certificate" end
  return { not_before = get_u64(cert, 1), not_after = get_u64(cert, 9), addresses = addrs }
end

--- True when cert is authority apk's certificate that pk is name's key.
function M.check_cert(cert, name, pk, apk)
  if not M.cert_fields(cert) then return false end
  return core().verify(apk, M.cert_message(name, pk, cert:sub(1, -65)), cert:sub(-64)) == true
end

--- The message an authority signs in a revocation list (doc/security.md):
-- "lecho-revocations-v1" 0 || authority pk || u64be seq || u64be issued ||
-- u32be n || n x 32-byte key.
function M.revocations_message(apk, seq, issued, keys_)
  local n = #keys_
  return "lecho-revocations-v1\0" .. apk .. u64(seq) .. u64(issued)
    .. string.char(bit.band(bit.rshift(n, 24), 255), bit.band(bit.rshift(n, 16), 255),
                   bit.band(bit.rshift(n, 8), 255), bit.band(n, 255))
    .. table.concat(keys_)
end

--- True when list ({ authority, seq, issued, keys, sig }) is signed by its authority.
function M.check_revocations(list)
  return core().verify(list.authority, M.revocations_message(list.authority, list.seq, list.issued,
                                                             list.keys), list.sig) == true
end

--- A signed revocation list by authority auth: { authority, seq, issued, keys, sig }.
function M.sign_revocations(auth, seq, issued, keys_)
  local l = { authority = auth.public, seq = seq, issued = issued, keys = keys_ }
  l.sig = core().sign(auth.secret, M.revocations_message(l.authority, seq, issued, keys_))
  return l
end

-- The latest time a key file holds: the end of year 9999 (os.date's
-- last; below 2^53, which JSON numbers keep exactly).
M.MAX_TIME = 253402300799       -- 9999-12-31T23:59:59Z

local function is_time(v) return type(v) == "number" and v >= 0 and v < 2^53 and v == math.floor(v) end

--- Reads a secret key file: { name, public, secret, cert, authority, path }
-- (cert and authority nil unless an authority signed it), or nil, err, code.
function M.read_secret(path)
  local what = "key file"
  local t, mode, code = read_json(what, path, "secret-key", "a lecho secret key")
  if not t then return nil, mode, code end
  if bit.band(mode, 63) ~= 0 then     -- as ssh: group or others may read it
    return nil, ("%s %s: permissions %04o are too open: a secret key must be readable by its owner "
      .. "only (chmod 600 %s)"):format(what, path, mode, path), "refused"
  end
  local name, pk = name_and_key(t, ("%s %s"):format(what, path))
  if not name then return nil, pk, "invalid" end
  local sk = unhex(t.secret, 64)
  if not sk then return nil, ("%s %s: secret must be 128 hex digits"):format(what, path), "invalid" end
  if sk:sub(33) ~= pk then
    return nil, ("%s %s: its secret and public keys do not belong together"):format(what, path), "invalid"
  end
  local k = { name = name, public = pk, secret = sk, path = path }
  if t.cert ~= nil or t.authority ~= nil then
    local ch = type(t.cert) == "string" and #t.cert % 2 == 0 and t.cert or nil
    k.cert, k.authority = ch and unhex(ch, #ch / 2), unhex(t.authority, 32)
    if not k.cert or not k.authority then
      return nil, ("%s %s: a certificate needs cert (hex) and authority (64 hex digits)")
        :format(what, path), "invalid"
    end
    if #k.cert == 64 then
      -- a v1 certificate: read, so that the key still starts, and refused
      -- by every peer with its reason (certify the key again)
      k.cert_v1 = true
      if core().verify(k.authority, "lecho-cert-v1\0" .. name .. "\0" .. pk, k.cert) ~= true then
        return nil, ("%s %s: its certificate does not verify with authority %s")
          :format(what, path, t.authority:lower()), "invalid"
      end
    elseif not M.check_cert(k.cert, name, pk, k.authority) then
      return nil, ("%s %s: its certificate does not verify with authority %s")
        :format(what, path, t.authority:lower()), "invalid"
    else
      local f = M.cert_fields(k.cert)
      k.not_before, k.not_after, k.addresses = f.not_before, f.not_after, f.addresses
    end
  end
  for _, f in ipairs{ "not_before", "not_after" } do       -- an authority's own validity
    if t[f] ~= nil and not k.cert then
      if not is_time(t[f]) then
        return nil, ("%s %s: %s must be Unix seconds (an integer from 0 to 2^53)"):format(what, path, f), "invalid"
      end
      k[f] = t[f]
    end
  end
  return k
end

--- Reads a public key file: { name, public, authority = bool, path }, or
-- nil, err, code.
function M.read_public(path)
  local what = "public key file"
  local t, err, code = read_json(what, path, "public-key", "a lecho public key")
  if not t then return nil, err, code end
  local name, pk = name_and_key(t, ("%s %s"):format(what, path))
  if not name then return nil, pk, "invalid" end
  if t.authority ~= nil and type(t.authority) ~= "boolean" then
    return nil, ("%s %s: authority must be true or false"):format(what, path), "invalid"
  end
  for _, f in ipairs{ "not_before", "not_after" } do
    if t[f] ~= nil and not is_time(t[f]) then
      return nil, ("%s %s: %s must be Unix seconds (an integer from 0 to 2^53)"):format(what, path, f), "invalid"
    end
  end
  return { name = name, public = pk, authority = t.authority == true, path = path,
           not_before = t.not_before, not_after = t.not_after }
end

--- Reads a revocation list file: { authority, seq, issued, keys = {pk...},
-- sig, path } (its signature not checked here: read_trust checks it
-- against the authorities trusted), or nil, err, code.
function M.read_revocations(path)
  local what = "revocation list"
  local t, err, code = read_json(what, path, "revocations", "a lecho revocation list")
  if not t then return nil, err, code end
  local l = { authority = unhex(t.authority, 32), seq = t.seq, issued = t.issued, sig = unhex(t.sig, 64),
              keys = {}, path = path }
  if not l.authority or not l.sig or not is_time(l.seq) or not is_time(l.issued) or type(t.keys) ~= "table" then
    return nil, ("%s %s: needs authority (64 hex digits), seq and issued (integers), keys (a list) "
      .. "and sig (128 hex digits)"):format(what, path), "invalid"
  end
  for i, h in ipairs(t.keys) do
    local pk = unhex(h, 32)
    if not pk then return nil, ("%s %s: keys[%d] must be 64 hex digits"):format(what, path, i), "invalid" end
    l.keys[i] = pk
  end
  return l
end


--- Reads the trust files `paths` (one path or a list): every public key,
-- authority key and trust list they hold, as { keys = { {name, public}... },
-- authorities = { {name, public}... } }; or nil, err, code.  The same key
-- under two names is refused (the handshake checks the name a key claims).
function M.read_trust(paths)
  if type(paths) == "string" then paths = { paths } end
  if type(paths) ~= "table" or #paths == 0 then
    return nil, "trust must be a path or a non-empty list of paths", "invalid"
  end
  local out, named = { keys = {}, authorities = {}, revoked = {}, lists = {} }, {}
  local function add(list, name, pk, where, e)
    local seen = named[pk]
    if seen and seen.name ~= name then
      return nil, ("%s: key %s is %s here and %s in %s"):format(where, M.hex(pk), name, seen.name, seen.where)
    end
    named[pk] = { name = name, where = where }
    table.insert(out[list], { name = name, public = pk, not_before = e and e.not_before,
                              not_after = e and e.not_after })
    return true
  end
  local lists = {}
  for _, path in ipairs(paths) do
    local what = "trust file"
    local t, err, code = read_json(what, path)
    if not t then return nil, err, code end
    local where = ("%s %s"):format(what, path)
    if t.lecho == "public-key" then
      local k, kerr, kcode = M.read_public(path)
      if not k then return nil, (kerr:gsub("^public key file", what)), kcode end
      local ok, aerr = add(k.authority and "authorities" or "keys", k.name, k.public, where, k)
      if not ok then return nil, aerr, "invalid" end
    elseif t.lecho == "revocations" then
      local l, lerr, lcode = M.read_revocations(path)
      if not l then return nil, (lerr:gsub("^revocation list", what)), lcode end
      lists[#lists + 1] = l
    elseif t.lecho == "trust" then
      for _, list in ipairs{ "keys", "authorities" } do
        local l = t[list]
        if l ~= nil and type(l) ~= "table" then
          return nil, ("%s: %s must be a list"):format(where, list), "invalid"
        end
        for i, e in ipairs(l or {}) do
          local name, pk = name_and_key(e, ("%s: %s[%d]"):format(where, list, i))
          if not name then return nil, pk, "invalid" end
          for _, f in ipairs{ "not_before", "not_after" } do
            if e[f] ~= nil and not is_time(e[f]) then
              return nil, ("%s: %s[%d]: %s must be Unix seconds (an integer from 0 to 2^53)")
                :format(where, list, i, f), "invalid"
            end
          end
          local ok, aerr = add(list, name, pk, where, e)
          if not ok then return nil, aerr, "invalid" end
        end
      end
    else
      return wrong_kind(what, path, t, "a lecho public key, trust list or revocation list")
    end
  end
  -- a revocation list counts when an authority trusted here signed it; of
  -- an authority's lists the highest seq
  local auths = {}
  for _, a in ipairs(out.authorities) do auths[a.public] = true end
  for _, l in ipairs(lists) do
    if not auths[l.authority] then
      return nil, ("trust file %s: a revocation list by %s, not an authority trusted here")
        :format(l.path, M.hex(l.authority)), "invalid"
    end
    if not M.check_revocations(l) then
      return nil, ("trust file %s: its signature does not verify with authority %s")
        :format(l.path, M.hex(l.authority)), "invalid"
    end
    local cur = out.lists[l.authority]
    if not cur or l.seq > cur.seq then out.lists[l.authority] = l end
  end
  local seen = {}
  for _, l in each(out.lists) do
    for _, pk in ipairs(l.keys) do
      if not seen[pk] then seen[pk] = true; out.revoked[#out.revoked + 1] = pk end
    end
  end
  table.sort(out.revoked)
  return out
end

-- JSON object text of the (key, value) pairs in order (cjson's own order
-- is its hash table's: a file written twice would differ).
local function json(pairs_)
  local out = {}
  for i = 1, #pairs_, 2 do
    out[#out + 1] = cjson.encode(pairs_[i]) .. ":" .. cjson.encode(pairs_[i + 1])
  end
  return "{" .. table.concat(out, ",") .. "}\n"
end

-- Writes text to path through path.tmp created with mode, fsynced, then
-- renamed over path.  true, or nil, err, code.
local function write_atomic(what, path, text, mode)
  local tmp = path .. ".tmp"
  os.remove(tmp)          -- a leftover of a crash: O_EXCL refuses to reuse it
  local fd = C.open(tmp, bit.bor(O_WRONLY, O_CREAT, O_EXCL, O_CLOEXEC), ffi.new("int", mode))
  if fd < 0 then return syserr(what, tmp, ffi.errno()) end
  local off, errno = 0, nil
  while off < #text do
    local n = C.write(fd, ffi.cast("const char *", text) + off, #text - off)
    if n < 0 then errno = ffi.errno() break end
    off = off + tonumber(n)
  end
  if not errno and C.fsync(fd) ~= 0 then errno = ffi.errno() end
  C.close(fd)
  if errno then
    os.remove(tmp)
    return syserr(what, tmp, errno)
  end
  local ok, err = os.rename(tmp, path)
  if not ok then
    os.remove(tmp)
    return nil, ("%s %s: %s"):format(what, path, tostring(err)), "io"
  end
  return true
end

--- Writes secret key k ({ name, public, secret [, cert, authority] }) to
-- path, mode 0600.  true, or nil, err, code.
function M.write_secret(path, k)
  local f = { "lecho", "secret-key", "version", 1, "name", k.name, "public", M.hex(k.public),
              "secret", M.hex(k.secret) }
  if k.cert then
    f[#f + 1], f[#f + 2], f[#f + 3], f[#f + 4] = "cert", M.hex(k.cert), "authority", M.hex(k.authority)
  elseif k.not_after then                       -- an authority's own validity
    f[#f + 1], f[#f + 2], f[#f + 3], f[#f + 4] = "not_before", k.not_before or 0, "not_after", k.not_after
  end
  return write_atomic("key file", path, json(f), tonumber("600", 8))
end

--- Writes the public key of k ({ name, public }) to path, mode 0644; an
-- authority's (authority true) is a trust file for what it certifies.
function M.write_public(path, k, authority)
  local f = { "lecho", "public-key", "version", 1, "name", k.name, "public", M.hex(k.public) }
  if authority then f[#f + 1], f[#f + 2] = "authority", true end
  if authority and k.not_after then
    f[#f + 1], f[#f + 2], f[#f + 3], f[#f + 4] = "not_before", k.not_before or 0, "not_after", k.not_after
  end
  return write_atomic("public key file", path, json(f), tonumber("644", 8))
end

--- Writes revocation list l (M.sign_revocations') to path, mode 0644.
function M.write_revocations(path, l)
  local hk = {}
  for i, pk in ipairs(l.keys) do hk[i] = M.hex(pk) end
  local f = { "lecho", "revocations", "version", 1, "authority", M.hex(l.authority), "seq", l.seq,
              "issued", l.issued, "keys", hk, "sig", M.hex(l.sig) }
  local text = json(f):gsub('"keys":{}', '"keys":[]')
  return write_atomic("revocation list", path, text, tonumber("644", 8))
end

--- A stamp of file path that changes when it is written or replaced
-- (mtime, size, inode: one statx, no read), or "missing".
function M.stamp(path)
  local st = ffi.new("struct lecho_statx")
  if C.statx(-100, path, 0, 0xfff, st) ~= 0 then return "missing" end
  return ("%d.%d.%d.%d"):format(tonumber(st.mtime.sec), st.mtime.nsec, tonumber(st.size), tonumber(st.ino))
end

--- The permission bits of path (with the sticky bit, 0o1000), or nil.
function M.mode(path)
  local st = ffi.new("struct lecho_statx")
  if C.statx(-100, path, 0, STATX_MODE, st) ~= 0 then return nil end
  return bit.band(st.mode, 4095)
end

--- True when path names a directory.
function M.is_dir(path)
  local st = ffi.new("struct lecho_statx")
  return C.statx(-100, path, 0, STATX_MODE, st) == 0 and bit.band(st.mode, S_IFMT) == 0x4000
end

--- Makes directory path and its missing parents, each mode 0700 (as
-- `mkdir -p -m 700`, which leaves an existing one as it is).  true, or
-- nil, "directory PATH: why", code.
function M.make_dir(path)
  if M.is_dir(path) then return true end
  local mode = tonumber("700", 8)
  if C.mkdir(path, mode) == 0 then return true end
  local errno = ffi.errno()
  local parent = path:match("^(.*[^/])/+[^/]+$")
  if errno == ENOENT and parent then             -- a parent is missing: make it, then this
    local ok, err, code = M.make_dir(parent)
    if not ok then return nil, err, code end
    if C.mkdir(path, mode) == 0 then return true end
    errno = ffi.errno()
  end
  if errno == EEXIST and M.is_dir(path) then return true end   -- made meanwhile
  return syserr("directory", path, errno)
end

-- $NAME, nil when unset or empty.
local function env(name)
  local v = os.getenv(name)
  if v ~= nil and v ~= "" then return v end
end

--- The identity a context's options give (lecho.options.CONTEXT): key, a
-- secret key file (nil: $LECHO_KEY; false: none, whatever the environment
-- says), trust, a trust file or a list (nil: $LECHO_TRUST, paths separated
-- by ':').  Returns false (protected mode: neither), or { key = (as
-- read_secret), trust = (as read_trust) }, or nil, err, code: a key without
-- trust or trust without a key is an error, as is any file that does not
-- read.
function M.identity(key, trust)
  local off = key == false and trust == nil       -- key = false: the environment is not asked
  if key == nil then key = env("LECHO_KEY") or false end
  if trust == nil and not off and env("LECHO_TRUST") then
    trust = {}
    for p in env("LECHO_TRUST"):gmatch("[^:]+") do trust[#trust + 1] = p end
    if #trust == 0 then trust = false end
  end
  if not key and not trust then return false end
  if key and not trust then
    return nil, ("key %s needs trust (trust= or $LECHO_TRUST): the keys or authorities it trusts")
      :format(key), "invalid"
  end
  if trust and not key then
    return nil, "trust needs a key (key= or $LECHO_KEY): this context's own secret key file", "invalid"
  end
  local k, err, code = M.read_secret(key)
  if not k then return nil, err, code end
  local t
  t, err, code = M.read_trust(trust)
  if not t then return nil, err, code end
  return { key = k, trust = t, trust_paths = type(trust) == "string" and { trust } or trust }
end

--- Gives core context c (lecho.core) identity id (M.identity's): its key,
-- then every trusted key and authority.  true, or nil, err.
function M.apply(c, id)
  local k = id.key
  local ok, err = c:set_identity(k.secret, k.name, k.cert)
  if not ok then return nil, ("key file %s: %s"):format(k.path, tostring(err)) end
  for _, e in ipairs(id.trust.keys) do
    ok, err = c:trust_key(e.public, e.name)
    if ok == nil and err then return nil, ("trusting %s: %s"):format(e.name, tostring(err)) end
  end
  for _, e in ipairs(id.trust.authorities) do
    ok, err = c:trust_authority(e.public, e.not_before or 0, e.not_after or 0)
    if ok == nil and err then return nil, ("trusting authority %s: %s"):format(e.name, tostring(err)) end
  end
  return M.apply_revoked(c, id.trust.revoked)
end

--- Gives core context c the revoked keys (a list of 32-byte keys): live
-- connections of them are closed now.  true, or nil, err.
function M.apply_revoked(c, revoked)
  local n, err = c:set_revoked(table.concat(revoked or {}))
  if not n then return nil, "revoking keys: " .. tostring(err) end
  return true
end

--- A new key pair for principal name: { name, public, secret }.
function M.generate(name)
  local pk, sk = core().keypair()
  return { name = name, public = pk, secret = sk }
end

return M
