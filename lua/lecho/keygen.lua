-- lecho.keygen: what scripts/lecho-keygen does (the script holds its
-- usage text): reads the command line, makes a key pair per NAME, writes
-- DIR/NAME.key (0600) and DIR/NAME.pub with lecho.keys (DIR and its missing
-- parents made 0700 when they are not there), certified by
-- --sign-with's authority (for --valid-for, default 365 days but never past
-- the authority's own end, and the --address list) or marked as an
-- authority with --authority (valid --valid-for, default 3650 days).  With
-- --revoke, adds keys to the authority's signed revocation list instead.
-- Never overwrites a key file.

local keys = require "lecho.keys"
local server = require "lecho.server"

local M = {}

M.CERT_DAYS, M.AUTHORITY_DAYS = 365, 3650
M.SKEW = 300       -- a certificate's not_before: this many seconds before now (clocks differ)

--- Seconds of a duration "30d", "12h", "90m", "3600s" or "3600", or nil.
function M.duration(text)
  local n, unit = tostring(text):match("^(%d+)([dhms]?)$")
  n = tonumber(n)
  if not n or n <= 0 then return nil end
  return n * (({ d = 86400, h = 3600, m = 60, s = 1 })[unit] or 1)
end

local function utc(t) return os.date("!%Y-%m-%dT%H:%M:%SZ", t) end

-- --revoke: the keys named (64 hex digits, a .pub or .key file, or NAME:
-- DIR/NAME.pub) added to the authority's revocation list file.
local function revoke(prog, opts, auth, dir)
  local list_path = opts.list or (dir == "." and "" or dir .. "/") .. auth.name .. ".revoked"
  local keys_, have = {}, {}
  local seq = 0
  local f = io.open(list_path, "r")
  if f then
    f:close()
    local l, err = keys.read_revocations(list_path)
    if not l then server.die(prog, err, 1) end
    if l.authority ~= auth.public or not keys.check_revocations(l) then
      server.die(prog, ("%s is not a list %s signed (remove it, or give another --list)")
        :format(list_path, auth.name), 1)
    end
    seq = l.seq
    for _, pk in ipairs(l.keys) do keys_[#keys_ + 1] = pk; have[pk] = true end
  end
  local added = {}
  for _, what in ipairs(opts.revoke) do
    local pk = #what == 64 and keys.unhex(what, 32)
    local label = what
    if not pk then
      local path = what
      local h = io.open(path, "r")
      if h then h:close() else path = (dir == "." and "" or dir .. "/") .. what .. ".pub" end
      local k, err = keys.read_public(path)
      if not k then
        local sk = keys.read_secret(path)
        if not sk then server.die(prog, ("--revoke %s: %s"):format(what, err), 1) end
        k = sk
      end
      pk, label = k.public, ("%s (%s)"):format(k.name, path)
    end
    if pk == auth.public then server.die(prog, "--revoke: an authority does not revoke its own key", 2) end
    if not have[pk] then
      have[pk] = true
      keys_[#keys_ + 1] = pk
      added[#added + 1] = ("%s %s"):format(label, keys.hex(pk))
    end
  end
  table.sort(keys_)
  local l = keys.sign_revocations(auth, seq + 1, os.time(), keys_)
  local ok, err = keys.write_revocations(list_path, l)
  if not ok then server.die(prog, err, 1) end
  io.write(("%s: %s: %d revoked key%s (seq %d)%s\n"):format(prog, list_path, #keys_, #keys_ == 1 and "" or "s",
    l.seq, #added > 0 and (", added " .. table.concat(added, ", ")) or ", nothing new"))
end

--- Runs lecho-keygen on argv (the script's `arg`); usage: its --help text.
-- Exits 2 on a usage error, 1 when a file cannot be read or written.
function M.main(argv, usage)
  local prog = "lecho-keygen"
  local opts = server.parse(argv, {
    prog = prog, usage = usage, positional = "names",
    options = {
      { "--dir", "dir", "string" },
      { "--authority", "authority", "flag" },
      { "--sign-with", "sign_with", "string" },
      { "--valid-for", "valid_for", "string" },
      { "--address", "addresses", "string", many = true },
      { "--revoke", "revoke", "string", many = true },
      { "--list", "list", "string" },
    },
    defaults = { dir = "." },
  })
  local names = opts.names
  local valid_for = opts.valid_for and M.duration(opts.valid_for)
  if opts.valid_for and not valid_for then
    server.die(prog, ("--valid-for takes a duration (30d, 12h, 90m, 3600s), not '%s'"):format(opts.valid_for))
  end
  if #opts.revoke > 0 then
    if #names > 0 or opts.authority or valid_for or #opts.addresses > 0 then
      server.die(prog, "--revoke takes --sign-with AUTHORITY.key (and --dir, --list) only, no NAME")
    end
    if not opts.sign_with then server.die(prog, "--revoke needs --sign-with AUTHORITY.key: the list's signer") end
  elseif opts.list then
    server.die(prog, "--list goes with --revoke")
  end
  if #opts.revoke == 0 and #names == 0 then server.die(prog, "give at least one NAME\n" .. usage) end
  if #opts.addresses > keys.CERT_ADDRS_MAX then
    server.die(prog, ("at most %d --address"):format(keys.CERT_ADDRS_MAX))
  end
  for i, a in ipairs(opts.addresses) do     -- as HELLOs carry them: canonical text
    local canon, why = require("lecho.addr").parse(a)
    if not canon or #canon > 127 then
      server.die(prog, ("--address %s: %s"):format(a, why or "longer than 127 bytes"))
    end
    opts.addresses[i] = canon
  end
  if #opts.addresses > 0 and not opts.sign_with then
    server.die(prog, "--address goes into a certificate: it needs --sign-with")
  end
  if opts.authority and opts.sign_with then
    server.die(prog, "--authority and --sign-with do not go together: an authority is trusted "
      .. "for itself, not certified by another")
  end
  local seen = {}
  for _, n in ipairs(names) do
    if not keys.valid_name(n) then server.die(prog, ("NAME '%s' must be %s"):format(n, keys.NAME_RULE)) end
    if seen[n] then server.die(prog, ("NAME '%s' is given twice"):format(n)) end
    seen[n] = true
  end
  local dir = opts.dir:gsub("(.)/+$", "%1")
  local auth                                 -- read first: a bad one makes no directory
  if opts.sign_with then
    local err
    auth, err = keys.read_secret(opts.sign_with)
    if not auth then server.die(prog, err, 1) end
    -- a certified key is an identity: peers trust authorities only, and
    -- do not follow a chain (its certificates would be refused by all)
    if auth.cert then
      server.die(prog, ("%s is %s's certified key, not an authority's (--authority makes one): "
        .. "certificates are not chained"):format(opts.sign_with, auth.name), 1)
    end
  end
  if #opts.revoke > 0 then return revoke(prog, opts, auth, opts.dir:gsub("(.)/+$", "%1")) end
  local now = os.time()
  local not_before, not_after = now - M.SKEW, nil
  if auth then
    if auth.not_before and auth.not_before > not_before then not_before = auth.not_before end
    if valid_for then
      not_after = now + valid_for
      if auth.not_after and not_after > auth.not_after then
        server.die(prog, ("--valid-for %s would end at %s, after authority %s's own end (%s): "
          .. "a certificate never outlasts its authority"):format(opts.valid_for, utc(not_after), auth.name,
          utc(auth.not_after)), 1)
      end
    else
      not_after = now + M.CERT_DAYS * 86400
      if auth.not_after and not_after > auth.not_after then not_after = auth.not_after end
    end
    if auth.not_after and auth.not_after <= now then
      server.die(prog, ("authority %s expired at %s"):format(auth.name, utc(auth.not_after)), 1)
    end
  elseif opts.authority then
    not_after = now + (valid_for or M.AUTHORITY_DAYS * 86400)
  elseif valid_for then
    server.die(prog, "--valid-for goes with --sign-with (a certificate) or --authority")
  end
  local made, merr = keys.make_dir(dir)       -- and its missing parents, 0700
  if not made then server.die(prog, merr, 1) end
  local function file(n, ext) return dir == "." and n .. ext or ("%s/%s%s"):format(dir, n, ext) end
  for _, n in ipairs(names) do
    for _, f in ipairs{ file(n, ".key"), file(n, ".pub") } do
      local h = io.open(f, "r")
      if h then
        h:close()
        server.die(prog, ("%s exists: %s never overwrites a key (remove it first)"):format(f, prog), 1)
      end
    end
  end
  for _, n in ipairs(names) do
    local k = keys.generate(n)
    if auth then
      k.cert, k.authority = keys.certify(auth, n, k.public, not_before, not_after, opts.addresses), auth.public
    elseif opts.authority then
      k.not_before, k.not_after = not_before, not_after
    end
    local ok, err = keys.write_secret(file(n, ".key"), k)
    if ok then ok, err = keys.write_public(file(n, ".pub"), k, opts.authority) end
    if not ok then server.die(prog, err, 1) end
    io.write(("%s: wrote %s (secret, 0600) and %s%s%s\n"):format(prog, file(n, ".key"), file(n, ".pub"),
      opts.authority and " (an authority's: a trust file)" or "",
      auth and (", certified by " .. auth.name) or ""))
  end
end

return M
