-- lecho.channel: the channel object of a context (a name at a name
-- server) and the lookup of channels by name (ctx:channel, a method of
-- Context's, listed in lecho.context).  This is the home of Channel: its
-- methods not defined here are defined in these modules (each adds them
-- when required; spec/lua_layout_spec.lua checks this list against the
-- code):
--   lecho.producer:  producer
--   lecho.consumer:  consumer, _install_direct, _direct_ok
--   lecho.control:   _join, _leave, _leave_due, _manager, _apply_members, _update_subs, _subs,
--                    _schedule_rejoin, _forget_kept, _revoked, _secure,
--                    _secure_all, _take_ticket
--   lecho.modulator: _set_consumers, _rebuild_modlist, _install, _rekey, _unload,
--                    _refuse, _mod_failed, _mod_errors, _attach, _detach,
--                    _end_watch, _end_streams, _stream_ended, _tell_mod_error,
--                    _tell_failed, _dead_key, _fresh,
--                    _params_req, _params_here, _params_at, _params_at_tell, _tell_owed,
--                    _install_req, _install_apply, _with_direct, _direct_wrong,
--                    _direct_apply, _direct_withdrawn

local options = require "lecho.options"
local Context = require "lecho.context"

local address = require "lecho.addr"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local Channel = {}
Channel.__index = Channel

-- The addresses of `list` (nil: none) but `addr`: a fresh list.
function Channel.without(list, addr)
  local out = {}
  for _, a in ipairs(list or {}) do
    if a ~= addr then out[#out + 1] = a end
  end
  return out
end

function Context:_fullname(name)
  local ns, short = address.split(name, self.ns)
  if not ns then error("lecho: " .. short, 3) end
  self:_add_nameserver(ns)
  return address.join(ns, short), ns, short
end

--- Returns the channel object for name ("ozone", "host:port/ozone",
-- "[v6]:port/ozone" or "unix:/path//ozone": lecho.addr's reference grammar).
-- opts.create = false: only a channel that has a producer or a consumer (in
-- any process); else nil, "no such channel: NAME", "notfound" (this asks the
-- name server, and waits).
function Context:channel(name, opts)
  if self.closed then error("lecho: context is closed", 2) end
  if opts ~= nil then options.check(opts, options.CHANNEL, "ctx:channel", 2) end
  local full, ns, short = self:_fullname(name)
  local ch = self.byname[full]
  if opts and opts.create == false and not (ch and (ch.nprod > 0 or ch.all[1])) then
    local ok, err, code = self:_channel_exists(full, ns, name)
    if not ok then return nil, err, code end
  end
  if ch then return ch end
  local chid, err, code = self.c:channel(full)     -- (max_channels)
  if not chid then return nil, err, code end
  ch = setmetatable({
    ctx = self, name = full, ns = ns, short = short,
    chid = chid,
    consumers = { short = short }, producers = {}, nprod = 0,
    ver = -1, manager = nil,
    dests = {}, mods = {}, modlist = {}, failed = {}, failed_dests = {}, grants = {},  -- producing side
    all = {}, streams = {}, cjoined = false,             -- consuming side
  }, Channel)
  self.byname[full] = ch
  self.bychid[ch.chid] = ch
  self.disp[ch.chid] = ch.consumers
  self.dshort[ch.chid] = short
  return ch
end

-- Does a submit also send the plain (unmodulated) event?  Only when some
-- context takes it.
function Channel:_plain() return #self.dests > 0 or #self.consumers > 0 end

-- The producers' copies of what a submit reads (lecho.producer's slots).
function Channel:_hot_update()
  local plain = self:_plain()
  local mods = self.modlist[1] and self.modlist or false
  for p in each(self.producers) do p:_retarget(mods, plain) end
  -- Context:_on_event's fast path: a plain channel with one consumer
  -- (called whenever that list changes: Channel:consumer, Consumer:_unlink);
  -- when that consumer is C code (lecho.capi sets its `sink`), its async
  -- events go to it from the event hook, never into Lua (core/binding/lua_sink.c)
  local list = self.consumers
  local one = #list == 1 and list[1] or nil
  self.ctx.dcon[self.chid] = one
  local sink = one and not one.closed and one.sink or nil
  if sink ~= self.sink and not self.ctx.closed then
    self.sink = sink
    self.ctx.c:set_sink(self.chid, sink)
  end
end

function Channel:_derived_name(key) return self.name .. "@" .. key end

-- A host-local address: loopback (127.0.0.0/8, [::1]) or a unix socket.
local function host_local(a)
  return type(a) == "string" and (a:match("^127%.") or a:match("^%[::1%]:") or a:match("^unix:")) and true or false
end

-- A consumer joined: a producer (of the join reply's list) on another host
-- cannot dial this context when it is known by a host-local address; it
-- would only log "cannot reach" in its own process.  Said here, once per
-- channel and producer, with what to do.
function Channel:_check_reach(producers)
  local me = self.ctx.addr
  if not host_local(me) or type(producers) ~= "table" then return end
  self.unreach_told = self.unreach_told or {}
  for _, a in ipairs(producers) do
    if type(a) == "string" and not host_local(a) and not self.unreach_told[a] then
      self.unreach_told[a] = true
      self.ctx.log(("consumer of '%s': producer %s is on another host and cannot connect to this "
        .. "context's address %s, so its events will not arrive; listen on an address it can "
        .. "reach (listen = \"0.0.0.0:0\", the scripts' --listen 0.0.0.0:0) or advertise one "
        .. "(advertise, --advertise)"):format(self.name, a, me))
    end
  end
end

return Channel
