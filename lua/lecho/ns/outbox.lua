-- lecho.ns.outbox: what the registry (lecho.ns.registry) says to the world: each
-- message queued while the state changes, sent once it is consistent, in
-- FIFO order, each through pcall.  A `send` that re-enters the registry
-- (loopback to its own context) only appends to the queue, after ours.

-- Never compiled, as lecho.ns.registry (Debian's LuaJIT and LuaJIT #827).
if jit then jit.off(true, true) end

local M = {}

local function emit(self, io, addr, msg)
  local q = self.outq
  q[#q + 1] = { io.send, addr, msg }
end

local function reply(self, io, to, rid, fields)
  local m = fields or {}
  m.op, m.rid = "reply", rid
  if m.ok == nil then m.ok = true end
  emit(self, io, to, m)
end

-- An error reply carries its code (lecho.errors), set by the caller where
-- the error happens, never read from err's text: fail(..., err, code [, extra]).
local CODES = require("lecho.errors").CODES
local function fail(self, io, to, rid, err, code, extra)
  if not CODES[code] then error(("outbox.fail: bad code %s for %q"):format(tostring(code), tostring(err)), 2) end
  local m = extra or {}
  m.ok, m.err, m.code = false, err, code
  reply(self, io, to, rid, m)
end

-- Drain the queue. Re-entrant calls only append; the outermost call sends.
local function flush(self)
  if self.flushing then return end
  self.flushing = true
  local q, i = self.outq, 1
  while q[i] do
    local item = q[i]
    q[i] = false
    local ok, err = pcall(item[1], item[2], item[3])
    if not ok then
      self.log("warn", ("send to %s failed: %s"):format(tostring(item[2]), tostring(err)))
    end
    i = i + 1
  end
  self.outq = {}
  self.flushing = false
end

M.emit, M.reply, M.fail, M.flush = emit, reply, fail, flush

return M
