-- spec/support/cdp.lua: headless Chromium driven through the DevTools
-- protocol over its WebSocket (spec/support/wsclient.lua), for the browser
-- spec of the gateway's live view.
--
--   local b = cdp.start(url, { dir = tmpdir })   -- nil, why when no chromium
--   b:eval("document.title")                     -- a JSON-able value
--   b:screenshot(path)                           -- PNG
--   b:close()
local socket = require "socket"
local cjson = require "cjson"
local W = require "wsclient"

local M = {}

M.FLAGS = { "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            "--window-size=1400,860", "--remote-debugging-port=0" }

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local B = {}
B.__index = B

--- Starts chromium on url; the browser, or nil, why.  opts.dir: a fresh
-- directory for its profile and logs; opts.bin (default "chromium").
function M.start(url, opts)
  local bin = opts.bin or "chromium"
  local profile = opts.dir .. "/chromium-profile"
  os.execute("rm -rf '" .. profile .. "' && mkdir -p '" .. profile .. "'")
  local log = opts.dir .. "/chromium.log"
  local pidf = opts.dir .. "/chromium.pid"
  -- (without LD_PRELOAD: under make asan the specs' environment preloads
  -- libasan, and chromium's start script and allocator do not run with it:
  -- "chromium did not start: /usr/bin/chromium: 9: [: ...: unexpected operator")
  local cmd = ("env -u LD_PRELOAD %s %s --user-data-dir=%s %s >/dev/null 2>%s </dev/null & echo $! > %s"):format(
    bin, table.concat(M.FLAGS, " "), profile, "'" .. url .. "'", log, pidf)
  os.execute("sh -c \"" .. cmd:gsub('"', '\\"') .. "\"")
  local port
  local deadline = socket.gettime() + 30
  while socket.gettime() < deadline do
    port = (read(log) or ""):match("DevTools listening on ws://127%.0%.0%.1:(%d+)/")
    if port then break end
    socket.sleep(0.1)
  end
  local self = setmetatable({ pid = tonumber((read(pidf) or ""):match("%d+")), log = log, nextid = 0 }, B)
  if not port then self:close() return nil, "chromium did not start: " .. (read(log) or "") end
  self.port = tonumber(port)
  -- the page's target: its own WebSocket
  local target
  while socket.gettime() < deadline and not target do
    local s = socket.tcp()
    s:settimeout(5)
    if s:connect("127.0.0.1", self.port) then
      s:send("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:" .. self.port .. "\r\nConnection: close\r\n\r\n")
      local d, _, part = s:receive("*a")
      local body = d or part or ""
      local ok, list = pcall(cjson.decode, body:match("\r\n\r\n(.*)$") or "")
      for _, t in ipairs(ok and list or {}) do
        if t.type == "page" and t.webSocketDebuggerUrl then target = t.webSocketDebuggerUrl end
      end
    end
    s:close()
    if not target then socket.sleep(0.1) end
  end
  if not target then self:close() return nil, "no page target" end
  local path = target:match("^ws://[^/]+(/.*)$")
  local c, e = W.connect("127.0.0.1", self.port, { path = path })
  if not c then self:close() return nil, "DevTools WebSocket: " .. tostring(e) end
  self.ws = c
  return self
end

--- One DevTools call: its result, or nil, the error.
function B:call(method, params, timeout)
  self.nextid = self.nextid + 1
  local id = self.nextid
  self.ws:send_text(cjson.encode{ id = id, method = method, params = params or setmetatable({}, cjson.empty_array_mt) })
  local deadline = socket.gettime() + (timeout or 20)
  while socket.gettime() < deadline do
    local op, p = self.ws:recv(math.max(0.05, deadline - socket.gettime()))
    if not op then return nil, p end
    if op == 1 then
      local m = cjson.decode(p)
      if m.id == id then
        if m.error then return nil, m.error.message end
        return m.result
      end
    end
  end
  return nil, "timeout"
end

--- A JavaScript expression's value in the page (promises awaited).
function B:eval(expr)
  local r, e = self:call("Runtime.evaluate", { expression = expr, returnByValue = true, awaitPromise = true })
  if not r then return nil, e end
  if r.exceptionDetails then
    return nil, (r.exceptionDetails.exception and r.exceptionDetails.exception.description) or r.exceptionDetails.text
  end
  return r.result.value
end

--- Polls expr until it is truthy or timeout seconds pass.
function B:wait(expr, timeout)
  local deadline = socket.gettime() + (timeout or 20)
  repeat
    local v = self:eval(expr)
    if v and v ~= cjson.null then return v end
    socket.sleep(0.1)
  until socket.gettime() > deadline
  return nil
end

local function unb64(s)
  local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  local map = {}
  for i = 1, 64 do map[B64:byte(i)] = i - 1 end
  local out, acc, bits = {}, 0, 0
  for i = 1, #s do
    local v = map[s:byte(i)]
    if v then
      acc = acc * 64 + v
      bits = bits + 6
      if bits >= 8 then
        bits = bits - 8
        local b = math.floor(acc / 2 ^ bits)
        out[#out + 1] = string.char(b)
        acc = acc - b * 2 ^ bits
      end
    end
  end
  return table.concat(out)
end

--- Saves a PNG of the page to path; true or nil, why.
function B:screenshot(path)
  local r, e = self:call("Page.captureScreenshot", { format = "png" })
  if not r then return nil, e end
  local f = assert(io.open(path, "wb"))
  f:write(unb64(r.data))
  f:close()
  return true
end

function B:close()
  if self.ws then pcall(self.call, self, "Browser.close", nil, 3); self.ws:close(); self.ws = nil end
  if self.pid then
    os.execute(("kill %d 2>/dev/null; sleep 0.3; kill -9 %d 2>/dev/null"):format(self.pid, self.pid))
    self.pid = nil
  end
end

return M
