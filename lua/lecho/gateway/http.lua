-- lecho.gateway.http: the HTTP side of the gateway's port (one request per
-- connection, then closed): GET / the live view (lecho.gateway.page) and
-- its icon, and the WebSocket handshake (RFC 6455 4.2.1: the version, the
-- key, /ws; Origin: only the gateway's own page or --origin values, so that
-- a page of another site cannot drive a loopback gateway; a bearer token),
-- after which the connection is a WebSocket client (lecho.ws) greeted by
-- Gateway:_hello.  Its functions are methods of the Gateway (listed in
-- lecho.gateway's header, which mixes them in); lecho.gateway.conn reads
-- the head and calls Gateway:_http.

local ws = require "lecho.ws"

local M = {}

local Gateway = {}   -- this file's methods of lecho.gateway's Gateway
M.Gateway = Gateway

local REASON = { [200] = "OK", [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden",
                 [404] = "Not Found", [405] = "Method Not Allowed", [426] = "Upgrade Required",
                 [431] = "Request Header Fields Too Large", [503] = "Service Unavailable" }

-- The live view's icon (the page names /favicon.svg; browsers ask for
-- /favicon.ico whatever the page says): a trace on the page's colours.
local ICON = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
  .. '<rect width="16" height="16" rx="3" fill="#182028"/>'
  .. '<path d="M2 9h3l2-5 2 8 2-5h3" fill="none" stroke="#4fb3ff" stroke-width="1.6" stroke-linejoin="round"/></svg>\n'

function Gateway:_http_error(cl, code, why, extra)
  self:_http_send(cl, code, "text/plain; charset=utf-8", why .. "\n", extra)
  if code ~= 404 then
    self.ctx.log(("gateway: client %d (%s) refused: %d %s"):format(cl.id, cl.peer or "?", code, why))
  end
end

function Gateway:_http_send(cl, code, ctype, body, extra)
  cl.kind = "done"
  if cl.watch then cl.watch:stop(); cl.watch = nil end
  cl.out:put(("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nCache-Control: no-store\r\n%sConnection: close\r\n\r\n"):format(
    code, REASON[code] or "Error", ctype, #body, extra or ""), cl.head_only and "" or body) -- HEAD: no body (RFC 9110 9.3.2)
  cl.closing = true
  self:_flush(cl)
end

local function unquery(s)
  return (s:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

function Gateway:_http(cl, rest)
  if cl.dtimer then cl.dtimer:stop(); cl.dtimer = nil end
  local head = cl.head
  cl.head = ""
  local method, target, ver = head:match("^(%u+) (%S+) HTTP/(%d%.%d)\r\n")
  if not method then return self:_http_error(cl, 400, "not an HTTP/1.x request") end
  cl.head_only = method == "HEAD"
  local h = {}
  for k, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
    k = k:lower()
    h[k] = h[k] and (h[k] .. ", " .. v) or v
  end
  local path, query = target:match("^([^?]*)%??(.*)$")
  local q = {}
  for k, v in query:gmatch("([^&=]+)=([^&]*)") do q[unquery(k)] = unquery(v) end
  if (h.upgrade or ""):lower() ~= "websocket" then
    if method ~= "GET" and method ~= "HEAD" then return self:_http_error(cl, 405, "only GET and HEAD", "Allow: GET, HEAD\r\n") end
    if path == "/" or path == "/index.html" then
      return self:_http_send(cl, 200, "text/html; charset=utf-8", self.page)
    end
    if path == "/favicon.ico" or path == "/favicon.svg" then
      return self:_http_send(cl, 200, "image/svg+xml", ICON)
    end
    return self:_http_error(cl, 404, "no such page")
  end
  -- RFC 6455 4.2.1
  if method ~= "GET" or ver ~= "1.1" then return self:_http_error(cl, 400, "a WebSocket handshake is GET HTTP/1.1") end
  if not (h.connection or ""):lower():find("upgrade", 1, true) then
    return self:_http_error(cl, 400, "Connection: Upgrade missing")
  end
  if h["sec-websocket-version"] ~= "13" then
    return self:_http_send(cl, 426, "text/plain", "WebSocket version 13 only\n", "Sec-WebSocket-Version: 13\r\n")
  end
  local key = h["sec-websocket-key"] or ""
  if not key:match("^[%w+/]+=*$") or #key ~= 24 then return self:_http_error(cl, 400, "bad Sec-WebSocket-Key") end
  if path ~= "/ws" and path ~= "/" then return self:_http_error(cl, 404, "WebSocket endpoint is /ws") end
  -- a browser page of another site must not drive a loopback gateway
  local origin = h.origin
  if origin and not self.origins[origin] then
    local host = h.host or ""
    if origin ~= "http://" .. host then return self:_http_error(cl, 403, "origin " .. origin .. " not allowed") end
  end
  local token = q.token or (h.authorization or ""):match("^[Bb]earer%s+(%S+)$")
  if token then
    local p = self.tokens[token]
    if not p then return self:_http_error(cl, 401, "unknown token") end
    cl.principal = p
  end
  cl.out:put("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    ws.accept(key), "\r\n\r\n")
  self:_flush(cl)
  if cl.closed then return end
  cl.kind = "ws"
  cl.ws = ws.server(cl.fd, self.lim.message)
  if #rest > 0 then cl.ws:feed(rest) end
  -- what the out buffer still holds of the 101 goes first: wait for it
  if #cl.out > 0 then return self:_drop(cl, nil, "socket full during the handshake") end
  self:_hello(cl)
  if #rest > 0 then return self:_read(cl) end
end

return M
