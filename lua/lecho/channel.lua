-- lecho.channel: the channel object of a context (a name at a name
-- server) and the lookup of channels by name.  Its endpoints are made by
-- lecho.producer and lecho.consumer, its membership kept by lecho.control,
-- its modulators by lecho.modulator.

local options = require "lecho.options"
local Context = require "lecho.context"

local parse_addr = options.parse_addr

local Channel = {}
Channel.__index = Channel

function Context:_fullname(name)
  if type(name) ~= "string" or name == "" then
    error("lecho: a channel name must be a non-empty string", 3)
  end
  local ns, short = name:match("^([^/]+:%d+)/(.+)$")
  if ns then
    local h, p = parse_addr(ns, "name server of the channel")
    ns = h .. ":" .. p
  else
    ns, short = self.ns, name
  end
  return ns .. "/" .. short, ns, short
end

--- Returns the channel object for name ("ozone" or "host:port/ozone").
function Context:channel(name)
  if self.closed then error("lecho: context is closed", 2) end
  local full, ns, short = self:_fullname(name)
  local ch = self.byname[full]
  if ch then return ch end
  ch = setmetatable({
    ctx = self, name = full, ns = ns, short = short,
    chid = self.c:channel(full),
    consumers = { short = short }, producers = {}, nprod = 0,
    ver = -1, manager = nil,
    dests = {}, mods = {}, modlist = {}, failed = {}, failed_dests = {}, grants = {},  -- producing side
    all = {}, streams = {}, cjoined = false,             -- consuming side
  }, Channel)
  self.byname[full] = ch
  self.bychid[ch.chid] = ch
  self.disp[ch.chid] = ch.consumers
  return ch
end

-- Does a submit also send the plain (unmodulated) event?  Only when some
-- context takes it.
function Channel:_hot_update()
  local plain = #self.dests > 0 or #self.consumers > 0
  for p in pairs(self.producers) do
    p.mods, p.plain = self.modlist, plain
  end
end

function Channel:_derived_name(key) return self.name .. "@" .. key end

return Channel
