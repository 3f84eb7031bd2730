-- lecho: event channels between processes, the API people call.
--
--   local lecho = require "lecho"
--   local ctx = lecho.context{ nameserver = "127.0.0.1:7700" } -- omitted: embedded
--   local ch  = ctx:channel("ozone")
--   local p   = ch:producer()
--   p:submit(ev)                 p:submit_sync(ev, { timeout = 2 })
--   local c   = ch:consumer(function(ev, meta) end)
--   local m   = ch:consumer(demod, { modulator = src, params = {...} })  -- doc/modulators.md
--   ctx:run()  ctx:run_once(t)  ctx:stop()  ctx:every(s, fn)  ctx:after(s, fn)
--   ctx:channel("ozon", { create = false })   -- nil, "no such channel: ozon", "notfound"
--
-- Expected failures return nil, message, code (lecho.errors); misuse raises.
--
-- This file makes a context and holds the exports; the rest of the Lua half
-- of a context is in files named for their concept (doc/architecture.md "Layout"):
-- lecho.context (scheduler, timers, run loop, event dispatch, close),
-- lecho.control (requests, replies, joins, rejoin), lecho.channel,
-- lecho.producer, lecho.consumer, lecho.modulator (both sides),
-- lecho.options (the lists of policies, capabilities and options) and
-- lecho.errors (the error codes).  The C half (lecho.core) owns the loop,
-- the sockets, the queues and the codec; lecho.ns.registry answers the
-- control plane in name servers and managers.

require "lecho.check"
local core = require "lecho.core"
local ffi = require "ffi"
local registry = require "lecho.ns.registry"
local fastenc = require "lecho.fastenc"
local options = require "lecho.options"
local errors = require "lecho.errors"
local Context = require "lecho.context"
require "lecho.channel"
require "lecho.control"
local modulator = require "lecho.modulator"
require "lecho.producer"
require "lecho.recorder"
require "lecho.consumer"
require "lecho.service"
require "lecho.call"
require "lecho.group"
local push = require "lecho.push"
local logging = require "lecho.log"

local parse_addr = options.parse_addr

local M = {
  _VERSION = "0.1.0",
  protocol_version = core.protocol_version,
  modulator = modulator.source,   -- the text of a modulator: source, or a file's
  array = require "lecho.array",  -- typed n-D numeric arrays (lua/lecho/array.lua)
}

-- The value codec: string, or nil, err, code ("invalid", "limit").
function M.encode(v, ...)
  local s, err, code = core.encode(v, ...)
  if s == nil then return nil, err, code end -- (the encoder sets the code where it fails)
  return s
end

-- true, value; or nil, err, code (bytes that are not a value: "invalid";
-- past max_string, max_depth or max_value_bytes: "limit"; "nomem"), the
-- code set by the decoder where it failed.
function M.decode(s, ...)
  local ok, v, code = core.decode(s, ...)
  if not ok then return nil, v, code end
  return ok, v
end

local function now(self) return self.c:now() end

--- Creates the context of this process.
-- opts: nameserver (an address: "host:port", "[v6]:port" or "unix:/path",
-- or an ordered list of them: ctx.ns is the first, the channels' default,
-- ctx.nslist all; omitted: a name server runs inside this context), listen ("127.0.0.1:0";
-- any of those forms, port 0: the OS picks), advertise (the address peers
-- are told, for a wildcard listen; port 0: the bound port), manager (true: act as a channel manager
-- registered with opts.nameserver), timeout (control requests, 5 s),
-- sync_timeout (10 s), queue_limit, policy, batch_bytes, max_string,
-- max_depth, max_frame, pin_threshold, retry_interval, retry_max, heartbeat,
-- heartbeat_misses, handshake_timeout, max_connections, max_buffered,
-- max_peer_channels, max_peers, peer_free_after, log_window (see doc/limits.md), log (fn(level, msg, component), or fn(msg): doc/operations.md "Logs"), log_level, metrics (doc/operations.md "Metrics"), quiet, key, trust and
-- nameserver_principal (keyed mode: doc/keys.md; without key and trust
-- the context is in protected mode); the full list with defaults is
-- lecho.options.CONTEXT.
function M.context(opts)
  opts = options.check(opts, options.CONTEXT, "lecho.context", 2)
  local D = options.CONTEXT
  local listen = parse_addr(opts.listen or D.listen, "listen address", true, 2)
  -- nameserver: one address or an ordered list (issue 12); ns is the first,
  -- the channels' default; nslist all of them, canonical, none twice
  local nslist = {}
  if opts.nameserver ~= nil then
    local given = type(opts.nameserver) == "table" and opts.nameserver or { opts.nameserver }
    local seen = {}
    for _, a in ipairs(given) do
      local canon = parse_addr(a, "nameserver", false, 2)
      if seen[canon] then error(("lecho: nameserver %s is listed twice"):format(canon), 2) end
      seen[canon] = true
      nslist[#nslist + 1] = canon
    end
  end
  local ns = nslist[1]
  local advertise = opts.advertise and parse_addr(opts.advertise, "advertise address", true, 2)
  -- keyed mode (key and trust, doc/keys.md) or protected mode (neither)
  local identity, keys = false, nil
  if opts.key ~= nil or opts.trust ~= nil or os.getenv("LECHO_KEY") or os.getenv("LECHO_TRUST") then
    keys = require "lecho.keys"     -- (and lua-cjson) only for keyed mode
    local err
    identity, err = keys.identity(opts.key, opts.trust)
    if identity == nil then error("lecho: " .. err, 2) end
  end
  if opts.policy_file and not identity then
    error("lecho: policy_file needs keys (key and trust): without them (protected mode) every local "
          .. "process is trusted and no policy could apply", 2)
  end
  local c = core.new(opts)
  if identity then
    local ok, err = keys.apply(c, identity)
    if not ok then c:close(); error("lecho: " .. err, 2) end
  end
  -- addr: what peers are told (advertise, or for a wildcard the address
  -- this host reaches the name server from); bound: what we listen on
  local addr, err = c:listen(listen, advertise, ns)
  if not addr then c:close(); error("lecho: " .. err, 2) end
  local self = setmetatable({
    c = c, addr = addr,
    byname = {}, bychid = {},
    disp = {},            -- chid -> the list of its consumers (a small table: hot path)
    -- chid -> the sole consumer of a plain channel, and chid -> its short
    -- name: dense arrays an event reads instead of its channel's tables
    -- (thousands of channels: each table touched is a cache miss)
    dcon = {}, dshort = {},
    peer_addrs = {}, pnames = {},
    pending = {},         -- rid -> a request waiting for its reply (lecho.control)
    expect_keys = {},     -- keyed: address -> the key it was pinned to (c:expect)
    nextpid = 0, nextcid = 0,
    selfq = {}, draining = false,
    waiters = {}, cos = setmetatable({}, { __mode = "k" }), held = {}, views = {},
    linger = opts.linger or D.linger,
    signals = opts.signals ~= false,   -- ctx:run() closes on SIGINT/SIGTERM unless false
    moes = {}, nextmoe = 0, moe_failed = {},
    -- the compiled encoder for submits (nil without string.buffer): same
    -- bytes as the C one, which still does what it declines; it returns
    -- its buffer (pointer, length), staged into the producer handle
    fastenc = fastenc.new({ max_depth = opts.max_depth, max_string = opts.max_string,
                            pin = opts.pin_threshold, max_value_bytes = opts.max_value_bytes }, true),
    mod_budget = opts.modulator_budget or D.modulator_budget,
    mod_memory = opts.modulator_memory or D.modulator_memory,
    mods_memory = opts.modulators_memory or D.modulators_memory,
    mods_cpu = opts.modulators_cpu or D.modulators_cpu,
    mod_min_period = opts.modulator_min_period or D.modulator_min_period,
    mods_per_principal = opts.modulators_per_principal or D.modulators_per_principal,
    mod_principals = {},  -- principal id -> modulator instances installed for it here
    pinned_keys = {},     -- keyed: address -> the key a member list pinned it to
    trust_names = {},     -- keyed: trusted key -> its principal's name
    timeout = opts.timeout or D.timeout,
    keyed = identity and true or false,
    principal = identity and identity.key.name or nil,   -- ro: our name in keyed mode
    ns_principal = opts.nameserver_principal or D.nameserver_principal,
    sync_timeout = opts.sync_timeout or D.sync_timeout,
    -- member lists a producer takes (lecho.control, doc/limits.md)
    max_members = opts.max_members or D.max_members,
    max_peers = opts.max_peers or D.max_peers,
    max_calls = opts.max_calls_in_flight or D.max_calls_in_flight,  -- lecho.call
    closed = false,
    quiet = opts.quiet or false,
  }, Context)
  -- The program's end without ctx:close(): closed as close does, delivering
  -- what was queued within linger (Context:_at_end says why a cdata's
  -- finalizer); ctx:close() removes it.
  self._end_guard = ffi.gc(ffi.new("char[1]"), function()
    local ok, err = pcall(self._at_end, self)
    if not ok then
      pcall(io.stderr.write, io.stderr, ("lecho[%s]: close at the program's end failed, what was queued "
        .. "may be lost: %s\n"):format(tostring(self.addr), tostring(err)))
    end
  end)
  self._pid = ffi.C.getpid()
  self:_opened()
  -- exit() without the state closed (os.exit(code)): the same close
  core.on_exit(Context._exit_all)
  for _, e in ipairs(identity and identity.trust.keys or {}) do self.trust_names[e.public] = e.name end
  -- ctx.log(msg [, level [, component]]): lecho.log (doc/operations.md "Logs")
  self.log, self.log_level = logging.logger(opts, function() return ("lecho[%s]"):format(addr) end)
  if not identity then
    self.log("protected mode: no key configured; listening on loopback only, every local process is trusted",
             "info", "context")
  end
  self._send = function(to, msg) self:_send_ctrl(to, msg) end
  self.ns = ns or addr
  -- ro: the name servers, in order (always set: { self.ns } with one); a
  -- group (lecho.ns.presence) and a service register with every one
  if not ns then nslist[1] = addr end
  self.nslist = nslist
  -- every address used as a name server (ours, those of nslist, and those
  -- channel names give): keyed, each must be the principal ns_principal
  self.nameservers = {}
  for _, a in ipairs(nslist) do self:_add_nameserver(a) end
  if opts.manager or not opts.nameserver then
    self.reg = registry.new{
      addr = addr, role = opts.manager and opts.nameserver and "manager" or "nameserver",
      ack_timeout = opts.ack_timeout or D.ack_timeout,
      settle = opts.settle, recovering = opts.recovering, forget_after = opts.forget_after,
      channel_quota = opts.channel_quota, ticket_ttl = opts.ticket_ttl, max_groups = opts.max_groups, group_quota = opts.group_quota,
      max_memberships = opts.max_memberships, max_group_bytes = opts.max_group_bytes,
      max_members = opts.max_members or D.max_members,
      nameserver = opts.manager and opts.nameserver and self.ns or nil,
      policy = opts.policy_file,
      -- keyed mode: who each peer is (this context's own key for addr), and
      -- signatures for producer tickets (doc/security.md)
      identity = identity and function(a)
        if a == addr then return identity.key.name, identity.key.public end
        return c:peer_identity(a)
      end or nil,
      sign = identity and function(m) return c:sign(m) end or nil,
      -- (its per-channel "info" lines were never shown: debug here)
      log = function(level, msg) self.log(msg, level == "info" and "debug" or level, "registry") end,
    }
    self.tick = c:timer(0.1, 0.1, function() self.reg:tick(self._send, now(self)) end)
  end
  c:hooks{
    event = function(chid, value, peer, producer, seq, sync, gen, nbytes, vlen, avs)
      return self:_dispatch(chid, value, peer, producer, seq, sync, gen, nbytes, vlen, avs)
    end,
    events = function(t, n, peer) return self:_dispatch_batch(t, n, peer) end,
    ctrl = function(from, msg, gen)
      if self.keyed and not self:_nameserver_ok(from) then return end
      return self:_on_ctrl(from, msg, gen)
    end,
    peer = function(idx, paddr, up, reason, gen, code, unreached)
      if up and self.keyed then
        self:_check_nameserver(paddr)
        -- a name server hands its revocation lists to who connects
        if self.trustwatch then self._trustwatch.peer_up(self, paddr) end
      end
      return self:_on_peer(idx, paddr, up, reason, gen, code, unreached)
    end,
    log = function(msg) self.log(msg, nil, "core") end,
    moe_error = function(id, why) self:_moe_error(id, why) end,
    turn = function() self:_turn() end,
  }
  -- keyed: the trust files (revocation lists among them) and a name
  -- server's policy file are read again when they change or on SIGHUP
  if identity then
    self.revoked = identity.trust.revoked
    self.revocation_lists = identity.trust.lists
    self.authorities = {}       -- keyed: trusted authority keys (revocation lists they sign)
    for _, e in ipairs(identity.trust.authorities) do self.authorities[e.public] = true end
    -- (the module kept: nothing keyed is required again later, when a
    -- close at the program's end could run a module's chunk again:
    -- Context:_at_end)
    self._trustwatch = require "lecho.trustwatch"
    self._trustwatch.start(self, identity, self.reg and opts.policy_file or nil, opts.trust_poll)
  end
  if opts.manager and opts.nameserver then
    local r, rerr = self:request(self.ns, { op = "register_manager" })
    if not r then
      self:close()
      error("lecho: cannot register as a manager with " .. self.ns .. ": " .. tostring(rerr), 2)
    end
    self:_registered(r)
  end
  -- the Prometheus endpoint (lecho.metrics, doc/operations.md "Metrics")
  if opts.metrics then
    local srv, merr = require("lecho.metrics").serve(self, opts.metrics)
    if not srv then
      self:close()
      error("lecho: " .. merr, 2)
    end
    self.metrics = srv   -- ro: its addr is where it listens
  end
  -- pushed code (doc/services.md "Pushing code"): the built-in service lecho.code
  if opts.accept_code then
    local ac = opts.accept_code
    if not identity and ac ~= true and not (ac.names ~= nil and (ac.principals == nil or ac.principals == true)) then
      self:close()
      error("lecho: accept_code lists principals, which only keyed mode knows: in protected mode it is "
            .. "true or { names = {...} } (any local process may push)", 2)
    end
    local ok, perr = push.serve(self, opts.accept_code)
    if not ok then
      self:close()
      error("lecho: accept_code: cannot serve " .. push.SERVICE .. ": " .. tostring(perr), 2)
    end
  end
  return self
end

return M
