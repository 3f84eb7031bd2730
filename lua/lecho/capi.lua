-- lecho.capi: the Lua half of liblecho (core/lecho.c), loaded in the private
-- LuaJIT state that each C context runs.  It calls only the public API of
-- `lecho` and turns its results into what lecho.c reads: every function
-- returns its results, or nil, message, code (a name of the shared error
-- list) for an expected failure or a raised one.  Not for Lua programs.

local lecho = require "lecho"

local M = {}

-- The code of a failure: the Lua layer's own when it gives one, else a
-- guess from the message (older layers return nil, message only).
local function code_of(msg, code)
  if type(code) == "string" then return code end
  msg = tostring(msg)
  if msg:find("no answer within", 1, true) or msg:find("timed out", 1, true)
      or msg:find("timeout", 1, true) then
    return "timeout"
  end
  if msg:find("closed", 1, true) then return "closed" end
  if msg:find("refused", 1, true) then return "refused" end
  if msg:find("cannot encode", 1, true) then return "invalid" end
  if msg:find("limit", 1, true) then return "limit" end
  return "failed"
end

-- Calls fn(...) protected: its results, or nil, message, code.
local function protect(fn, ...)
  local r = { pcall(fn, ...) }
  if not r[1] then return nil, tostring(r[2]), code_of(r[2]) end
  if r[2] == nil then return nil, tostring(r[3]), code_of(r[3], r[4]) end
  return unpack(r, 2, table.maxn(r))
end

-- { "name", "value", ... } strings to an options table (see lecho.h).
local function options(list)
  local opts = {}
  for i = 1, #list, 2 do
    local k, v = list[i], list[i + 1]
    if v == "true" then
      v = true
    elseif v == "false" then
      v = false
    elseif tonumber(v) then
      v = tonumber(v)
    end
    opts[k] = v
  end
  return opts
end

function M.open(list)
  return protect(function()
    local ctx = lecho.context(options(list))
    return ctx, ctx.addr, ctx.ns
  end)
end

function M.close(ctx, linger)
  return protect(function()
    local ok, err = ctx:close(linger >= 0 and { linger = linger } or nil)
    if not ok then return nil, err end
    return true
  end)
end

function M.run(ctx) return protect(function() ctx:run(); return true end) end

function M.run_once(ctx, t)
  return protect(function()
    if t < 0 then ctx:run_once() else ctx:run_once(t) end
    return true
  end)
end

function M.stop(ctx) return protect(function() ctx:stop(); return true end) end

function M.channel(ctx, name)
  return protect(function()
    local ch = ctx:channel(name)
    return ch, ch.name
  end)
end

function M.producer(ch, policy)
  return protect(ch.producer, ch, policy and { policy = policy } or nil)
end

-- The hot path: no table per call.
function M.submit(p, ev)
  local ok, r, err, code = pcall(p.submit, p, ev)
  if not ok then return nil, tostring(r), code_of(r) end
  if r == nil then return nil, tostring(err), code_of(err, code) end
  return true
end

-- true; or nil, message, code and a flat list { context, consumer, err, ... }
-- when the failure is per consumer.
function M.submit_sync(p, ev, timeout)
  local r = { pcall(p.submit_sync, p, ev, timeout >= 0 and { timeout = timeout } or nil) }
  if not r[1] then return nil, tostring(r[2]), code_of(r[2]) end
  if r[2] then return true end
  local errs = r[3]
  if type(errs) ~= "table" then return nil, tostring(errs), code_of(errs, r[4]) end
  local flat, all_timeouts = {}, #errs > 0
  for _, e in ipairs(errs) do
    flat[#flat + 1] = tostring(e.context or "")
    flat[#flat + 1] = tostring(e.consumer or "")
    flat[#flat + 1] = tostring(e.err or "")
    if code_of(e.err) ~= "timeout" then all_timeouts = false end
  end
  return nil, tostring(errs), all_timeouts and "timeout" or "failed", flat
end

function M.flush(p) return protect(function() p:flush(); return true end) end

function M.producer_close(p) return protect(function() p:close(); return true end) end

-- cfn(ev, meta) is lecho.c's trampoline: nothing, or the handler's message.
function M.consumer(ch, cfn)
  return protect(ch.consumer, ch, function(ev, meta)
    local err = cfn(ev, meta)
    if err then error(err, 0) end
  end)
end

function M.consumer_close(c) return protect(function() c:close(); return true end) end

function M.stats(ctx) return protect(function() return ctx:stats() end) end

function M.stat(ctx, name, counter)
  return protect(function()
    local full = ctx:channel(name).name
    local cs = ctx:stats().channels[full]
    local v = cs and cs[counter]
    return type(v) == "number" and v or -1
  end)
end

-- A bounded one-line text of a value, for logs.
local function show(v, depth, out)
  local t = type(v)
  if t == "string" then
    out[#out + 1] = #v > 60 and ("%q..."):format(v:sub(1, 60)) or ("%q"):format(v)
  elseif t ~= "table" then
    out[#out + 1] = tostring(v)
  elseif depth > 3 then
    out[#out + 1] = "{...}"
  else
    out[#out + 1] = "{ "
    local n, shown = #v, 0
    for i = 1, n do
      if shown == 8 then out[#out + 1] = "..., "; break end
      show(v[i], depth + 1, out)
      out[#out + 1] = ", "
      shown = shown + 1
    end
    local keys = {}
    for k in pairs(v) do
      if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for i, k in ipairs(keys) do
      if i > 16 then out[#out + 1] = "..., "; break end
      out[#out + 1] = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. tostring(k) .. "]")
      out[#out + 1] = " = "
      show(v[k], depth + 1, out)
      out[#out + 1] = ", "
    end
    if out[#out] == ", " then out[#out] = " " end
    out[#out + 1] = "}"
  end
  return out
end

function M.show(v) return table.concat(show(v, 0, {})) end

return M
