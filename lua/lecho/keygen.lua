-- lecho.keygen: what scripts/lecho-keygen does (the script holds its
-- usage text): reads the command line, makes a key pair per NAME, writes
-- DIR/NAME.key (0600) and DIR/NAME.pub with lecho.keys (DIR and its missing
-- parents made 0700 when they are not there), certified by
-- --sign-with's authority or marked as an authority with --authority.
-- Never overwrites a key file.

local keys = require "lecho.keys"
local server = require "lecho.server"

local M = {}

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
    },
    defaults = { dir = "." },
  })
  local names = opts.names
  if #names == 0 then server.die(prog, "give at least one NAME\n" .. usage) end
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
    if auth then k.cert, k.authority = keys.certify(auth, n, k.public), auth.public end
    local ok, err = keys.write_secret(file(n, ".key"), k)
    if ok then ok, err = keys.write_public(file(n, ".pub"), k, opts.authority) end
    if not ok then server.die(prog, err, 1) end
    io.write(("%s: wrote %s (secret, 0600) and %s%s%s\n"):format(prog, file(n, ".key"), file(n, ".pub"),
      opts.authority and " (an authority's: a trust file)" or "",
      auth and (", certified by " .. auth.name) or ""))
  end
end

return M
