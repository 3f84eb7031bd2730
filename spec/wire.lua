-- spec/wire.lua: frames built by hand for the specs that play a peer over a
-- raw socket (doc/wire-format.md): one definition of the layout they share.

-- The frame types, the version this build's core speaks (from 2 on,
-- doc/protocol.md: HELLO ends with a mode byte and BIND with a has_ticket
-- byte) and the byte helpers are spec/support/rogue.lua's, which speaks it
-- all, keys included: one definition of the layout.
local R = require "spec.support.rogue"
local M = {}
for k, v in pairs(R.F) do M[k] = v end
M.VERSION = R.VERSION
M.u32le, M.varint, M.frame = R.u32le, R.varint, R.frame

-- Splits received bytes into { type, body } frames (a partial tail, or
-- what follows a frame of length 0, is left out).
function M.frames(buf)
  local out, pos = {}, 1
  while true do
    local t, body, nxt = R.parse_frame(buf, pos)
    if not t then return out end
    out[#out + 1] = { type = t, body = body }
    pos = nxt
  end
end

-- HELLO (or ftype): "LECH", u16 big-endian version, varint incarnation,
-- varint address length, address; from version 2 on, u8 mode (opts.mode,
-- default 0: protected mode, the only one a hand-built frame can do).
function M.hello(addr, opts)
  opts = opts or {}
  local version = opts.version or M.VERSION
  return M.frame(opts.ftype or M.HELLO, "LECH" .. string.char(math.floor(version / 256), version % 256)
                 .. M.varint(opts.incarnation or 4242) .. M.varint(#addr) .. addr
                 .. (version >= 2 and string.char(opts.mode or 0) or ""))
end

-- BIND: channel index, varint name length, name; from version 2 on, u8
-- has_ticket = 0 (protected mode takes no ticket).
function M.bind(idx, name)
  return M.frame(M.BIND, M.varint(idx) .. M.varint(#name) .. name .. (M.VERSION >= 2 and "\0" or ""))
end

-- EVENT: channel index, producer id, sequence number, sync id, value bytes.
function M.event(idx, value, seq, opts)
  opts = opts or {}
  return M.frame(M.EVENT, M.varint(idx) .. M.varint(opts.producer or 1) .. M.varint(seq or 1)
                 .. M.varint(opts.sync or 0) .. value)
end

return M
