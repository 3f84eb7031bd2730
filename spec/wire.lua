-- spec/wire.lua: frames built by hand for the specs that play a peer over a
-- raw socket (doc/wire-format.md): one definition of the layout they share.

local M = { HELLO = 1, HELLO_OK = 2, ERROR = 3, CTRL = 4, BIND = 5, EVENT = 6, ACK = 7,
            HEARTBEAT = 8, PING = 9, AUTH = 10, AUTH_OK = 11 }

-- The protocol version this build's core speaks: the default of M.hello,
-- and from 2 on (doc/protocol.md) HELLO ends with a mode byte and BIND with
-- a has_ticket byte.  (spec/support/rogue.lua speaks it all, keys included.)
M.VERSION = require("lecho.core").protocol_version

function M.u32le(n)
  return string.char(n % 256, math.floor(n / 2 ^ 8) % 256, math.floor(n / 2 ^ 16) % 256,
                     math.floor(n / 2 ^ 24) % 256)
end

function M.varint(n)
  local out = {}
  repeat
    local b = n % 128
    n = math.floor(n / 128)
    out[#out + 1] = string.char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(out)
end

function M.frame(ftype, body) return M.u32le(#body + 1) .. string.char(ftype) .. body end

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
