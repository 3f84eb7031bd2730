-- lecho.gateway.client: a client of the gateway (a WebSocket or JSON-lines
-- connection, made by lecho.gateway.conn's Gateway:_accept) and what is
-- queued for it: replies, events under the slow-client policy ("drop":
-- events past --max-queued dropped and the client told how many before
-- the next one; "disconnect": closed), the bound past which a client that
-- does not read is closed.  Its socket is written by its Gateway at the
-- end of the loop turn (Gateway:_dirty, Gateway:_flush in
-- lecho.gateway.conn); what it is sent is made by lecho.gateway.wire.

local wire = require "lecho.gateway.wire"
local has_array, encode = wire.has_array, wire.encode

local M = {}

-- bytes a client that has not authenticated (keyed mode) may have queued:
-- its hello and a few error replies; past it, closed (1008) like any client
-- that does not read
M.PREAUTH_QUEUED = 65536

local Client = {}
Client.__index = Client
M.Client = Client

-- Bytes queued for the client, not yet taken by its socket.
function Client:queued()
  if self.ws then return self.ws:queued() end
  return #self.out
end

-- What the client may have queued before it is held not to read: the
-- --max-queued bound (M.PREAUTH_QUEUED before a keyed client authenticated),
-- plus the one event larger than it that was taken on an empty queue
-- (Client:deliver), while that one is not all sent.
function Client:bound()
  local gw = self.gw
  local b = (gw.keyed and not self.principal) and math.min(gw.lim.queued, M.PREAUTH_QUEUED) or gw.lim.queued
  return b + self.over
end

-- Queues one message (a JSON text) for the client; the socket is written
-- at the end of this loop turn (many events, few system calls).
function Client:_put(text, binary)
  if self.closed then return end
  if self.ws then
    local ok, why = self.ws:queue(text, binary)
    if not ok then return self.gw:_drop(self, nil, why) end
  else
    self.out:put(text, "\n")
  end
  self.gw:_dirty(self)
end

-- A reply: a client that sends requests but does not read the answers is
-- closed once they pass --max-queued (events are dropped instead, replies
-- cannot be).
-- A reply holding arrays (a service's result) goes out as events do: a
-- binary message to a WebSocket client, { dtype, shape, data } in JSON to
-- a lines one (doc/gateway.md "Arrays").
function Client:reply(t)
  if self.closed or self.closing then return end
  if self:queued() > self:bound() then
    return self.gw:_drop(self, 1008, ("client does not read its replies (%d bytes queued)"):format(self:queued()))
  end
  if has_array(t, 0) then
    if self.ws then
      local bin = wire.reply_binary(t)
      if bin then return self:_put(bin, true) end
    end
  end
  self:_put(encode(t))
end

-- An event for this client under the slow-client policy: text (a JSON
-- text), or wire.event_out's three values (the binary message to a WebSocket
-- client, the JSON text to a lines one).
function Client:deliver(text, msg, binary)
  if msg ~= nil then
    if self.ws then text = msg else text, binary = text(), false end
  end
  if self.closed or self.closing then return end
  local gw = self.gw
  local q = self:queued()
  -- an event larger than --max-queued is taken when the queue is empty
  -- (the client holds at most that one event then; the gateway takes no
  -- event larger than its context's decoded-size limit); the bound is
  -- back to --max-queued once it is sent (Gateway:_flush)
  if q == 0 and #text > gw.lim.queued then
    self.over = #text
  elseif q + #text > gw.lim.queued then
    if gw.slow == "disconnect" then
      return gw:_drop(self, 1008, ("slow client: more than %d bytes queued"):format(gw.lim.queued))
    end
    self.drops = self.drops + 1
    gw.drops = gw.drops + 1
    -- told as soon as the queue is empty: now, when nothing is queued
    if q == 0 then gw:_dirty(self) end
    return
  end
  if self.drops > self.told then
    -- Once dropping, the client's gap stays one gap until its queue is
    -- below half: what comes meanwhile is dropped too, so the notice always
    -- comes before the first event after the gap (never after events that
    -- followed it).
    if q > gw.lim.queued / 2 then
      self.drops = self.drops + 1
      gw.drops = gw.drops + 1
      return
    end
    self:_put(('{"dropped":%d,"total":%d}'):format(self.drops - self.told, self.drops))
    self.told = self.drops
  end
  self.events = self.events + 1
  self:_put(text, binary)
end

-- A drained queue tells the client what it missed at once.
function Client:deliver_notice()
  if self.drops > self.told then
    self:_put(('{"dropped":%d,"total":%d}'):format(self.drops - self.told, self.drops))
    self.told = self.drops
  end
end

return M
