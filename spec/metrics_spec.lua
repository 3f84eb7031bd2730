-- Metrics (doc/operations.md "Metrics"): a producer process serving
-- `metrics = "127.0.0.1:0"` and a name server started with --metrics are
-- scraped over HTTP; every line of what they answer is read by a parser of
-- the Prometheus text format 0.0.4 written here from its description;
-- counters move when events flow; histogram buckets are cumulative and end
-- in +Inf equal to _count; label values are escaped; the endpoint's limits
-- (request size, connections, a slow client) never stop the loop.
local S = require "spec.support"
local socket = require "socket"
local lecho = require "lecho"

-- pred() true within timeout seconds, polled every step
local function wait_until(pred, timeout, step)
  local deadline = socket.gettime() + timeout
  repeat
    if pred() then return true end
    S.sleep(step)
  until socket.gettime() > deadline
  return false
end

------------------------------------------------------------------------------
-- A parser of the text exposition format: families by name, with type,
-- help and samples { name, labels, value }.  Raises on any line that does
-- not parse, with its number.

local NAME = "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
local LABEL = "^[a-zA-Z_][a-zA-Z0-9_]*$"
local TYPES = { counter = true, gauge = true, histogram = true, summary = true, untyped = true }

local function parse_value(s, n)
  if s == "+Inf" then return math.huge elseif s == "-Inf" then return -math.huge elseif s == "NaN" then return 0 / 0 end
  local v = tonumber(s)
  if not v or not s:match("^[%-+]?[%d.]+[eE]?[%-+]?%d*$") then error(("line %d: bad value '%s'"):format(n, s)) end
  return v
end

-- labels in `{...}` starting at i of line: the table and the index after '}'
local function parse_labels(line, i, n)
  local labels = {}
  i = i + 1
  while true do
    if line:sub(i, i) == "}" then return labels, i + 1 end
    local name, j = line:match("^([^=]+)=()", i)
    if not name or not name:match(LABEL) then error(("line %d: bad label name at %d"):format(n, i)) end
    if line:sub(j, j) ~= '"' then error(("line %d: label value not quoted"):format(n)) end
    local k, buf = j + 1, {}
    while true do
      local c = line:sub(k, k)
      if c == "" then error(("line %d: label value not closed"):format(n)) end
      if c == "\\" then
        local e = line:sub(k + 1, k + 1)
        if e == "\\" then buf[#buf + 1] = "\\" elseif e == '"' then buf[#buf + 1] = '"'
        elseif e == "n" then buf[#buf + 1] = "\n" else error(("line %d: bad escape \\%s"):format(n, e)) end
        k = k + 2
      elseif c == '"' then
        k = k + 1
        break
      else
        buf[#buf + 1] = c
        k = k + 1
      end
    end
    if labels[name] then error(("line %d: label %s twice"):format(n, name)) end
    labels[name] = table.concat(buf)
    local c = line:sub(k, k)
    if c == "," then i = k + 1 elseif c == "}" then i = k else error(("line %d: after a label: '%s'"):format(n, c)) end
  end
end

-- The family a sample belongs to: its name, or for a histogram's
-- _bucket/_sum/_count the base name.
local function family_of(fams, name)
  if fams[name] then return fams[name] end
  for _, suf in ipairs{ "_bucket", "_sum", "_count" } do
    local base = name:sub(1, -#suf - 1)
    if name:sub(-#suf) == suf and fams[base] and fams[base].type == "histogram" then return fams[base], suf end
  end
end

local function parse(text)
  assert(text:sub(-1) == "\n", "the text ends with a newline")
  local fams, order, n = {}, {}, 0
  for line in text:gmatch("([^\n]*)\n") do
    n = n + 1
    if line:match("^#") then
      local kind, name, rest = line:match("^# (%u+) (%S+) ?(.*)$")
      if kind == "HELP" or kind == "TYPE" then
        if not name:match(NAME) then error(("line %d: bad metric name %s"):format(n, name)) end
        local f = fams[name]
        if not f then f = { name = name, samples = {} }; fams[name] = f; order[#order + 1] = name end
        if kind == "TYPE" then
          if not TYPES[rest] then error(("line %d: bad type %s"):format(n, rest)) end
          if f.type or #f.samples > 0 then error(("line %d: TYPE of %s after its samples or twice"):format(n, name)) end
          f.type = rest
        else
          f.help = rest
        end
      end
    elseif line:match("%S") then
      local name, i = line:match("^([^{%s]+)()")
      if not name or not name:match(NAME) then error(("line %d: bad sample name"):format(n)) end
      local labels = {}
      if line:sub(i, i) == "{" then labels, i = parse_labels(line, i, n) end
      local value, ts = line:sub(i):match("^ (%S+) ?(%S*)$")
      if not value then error(("line %d: no value"):format(n)) end
      if ts ~= "" and not ts:match("^%-?%d+$") then error(("line %d: bad timestamp"):format(n)) end
      local f, suf = family_of(fams, name)
      if not f or not f.type then error(("line %d: sample %s without its TYPE before"):format(n, name)) end
      if f.type == "counter" and not name:match("_total$") then
        error(("line %d: counter %s does not end in _total"):format(n, name))
      end
      if f.type == "histogram" and not suf then error(("line %d: histogram sample %s"):format(n, name)) end
      if suf == "_bucket" and not labels.le then error(("line %d: bucket without le"):format(n)) end
      f.samples[#f.samples + 1] = { name = name, labels = labels, value = parse_value(value, n), suffix = suf }
    end
  end
  return fams, n
end

-- The sample of family `fam` (and suffix) whose labels include `want`.
local function sample(fams, fam, want, suffix)
  local f = assert(fams[fam], "no family " .. fam)
  for _, s in ipairs(f.samples) do
    local ok = s.suffix == suffix
    for k, v in pairs(want or {}) do if s.labels[k] ~= v then ok = false end end
    if ok then return s.value end
  end
end

-- Checks every histogram: per label set (le aside), buckets in increasing
-- le, counts not decreasing, the last le="+Inf" equal to _count.
local function check_histograms(fams)
  local checked = 0
  for _, f in pairs(fams) do
    if f.type == "histogram" then
      local sets = {}
      for _, s in ipairs(f.samples) do
        local key = {}
        for k, v in pairs(s.labels) do if k ~= "le" then key[#key + 1] = k .. "=" .. v end end
        table.sort(key)
        key = table.concat(key, ",")
        sets[key] = sets[key] or { buckets = {} }
        if s.suffix == "_bucket" then table.insert(sets[key].buckets, s) else sets[key][s.suffix] = s.value end
      end
      for key, set in pairs(sets) do
        local prev_le, prev = -math.huge, 0
        for _, b in ipairs(set.buckets) do
          local le = b.labels.le == "+Inf" and math.huge or tonumber(b.labels.le)
          assert(le and le > prev_le, key .. ": le increasing")
          assert(b.value >= prev, key .. ": cumulative buckets")
          prev_le, prev = le, b.value
        end
        assert.are.equal(math.huge, prev_le, key .. ": the last bucket is +Inf")
        assert.are.equal(set._count, prev, key .. ": +Inf equals _count")
        assert(set._sum, key .. ": has _sum")
        checked = checked + 1
      end
    end
  end
  return checked
end

------------------------------------------------------------------------------

-- GET path from addr: status, headers text, body (a plain HTTP/1.1 client).
local function get(addr, path, raw)
  local host, port = addr:match("^(.+):(%d+)$")
  local c = assert(socket.tcp())
  c:settimeout(10)
  assert(c:connect(host, tonumber(port)))
  c:send(raw or ("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n"):format(path, addr))
  local all, _, partial = c:receive("*a")
  all = all or partial
  c:close()
  local status, head, body = all:match("^HTTP/1%.1 (%d+) [^\r]*\r\n(.-)\r\n\r\n(.*)$")
  return tonumber(status), head, body
end

-- A producer with a metrics endpoint: every 0.05 s one async and one sync
-- event on "m" and one async on a channel whose name needs escaping.
local PRODUCER = [[
  local lecho = require "lecho"
  require("lecho.metrics").LIMITS.deadline = tonumber(arg[3])
  local ctx = lecho.context{ nameserver = arg[1], metrics = "127.0.0.1:0", quiet = true }
  local p = ctx:channel("m"):producer()
  local q = ctx:channel('odd"name\\x'):producer()
  local f = io.open(arg[2] .. ".tmp", "w") f:write(ctx.metrics.addr) f:close()
  os.rename(arg[2] .. ".tmp", arg[2])
  ctx:every(0.05, function()
    p:submit("a")
    p:submit_sync("s", { timeout = 2 })
    q:submit(1)
  end)
  ctx:after(60, function() ctx:stop() end)
  ctx:run()
]]

local CONSUMER = [[
  local lecho = require "lecho"
  local ctx = lecho.context{ nameserver = arg[1], quiet = true }
  ctx:channel("m"):consumer(function() end)
  ctx:channel('odd"name\\x'):consumer(function() end)
  print("ready") io.stdout:flush()
  ctx:after(60, function() ctx:stop() end)
  ctx:run()
]]

describe("the metrics endpoint", function()
  after_each(function() S.cleanup() end)

  it("serves the text format: every line parses, counters move, histograms are cumulative to +Inf = _count", function()
    local _, ns = S.nameserver("--quiet")
    local con = S.lua(CONSUMER, ns)
    assert(S.wait_file(con.out, "ready", 20), S.errors(con))
    local af = S.tmpname("metrics-addr")
    local prod = S.lua(PRODUCER, ns, af, "5")
    local maddr = S.wait_file(af, "%d+:%d+", 20)
    assert(maddr, "no metrics address: " .. S.errors(prod))
    local full = ns .. "/m"
    local function scrape()
      local status, head, body = get(maddr, "/metrics")
      assert.are.equal(200, status)
      assert.matches("Content%-Type: text/plain; version=0%.0%.4", head)
      return parse(body)
    end
    -- wait until sync events were answered
    local fams
    assert(wait_until(function()
      fams = scrape()
      return (sample(fams, "lecho_sync_latency_seconds", { channel = full }, "_count") or 0) >= 3
    end, 20, 0.1), "no sync latency observed")
    local out1 = sample(fams, "lecho_channel_events_out_total", { channel = full })
    local sync1 = sample(fams, "lecho_sync_latency_seconds", { channel = full }, "_count")
    assert.is_true(out1 > 0)
    assert.are.equal(1, sample(fams, "lecho_channel_producers", { channel = full }))
    assert.are.equal(1, sample(fams, "lecho_channel_destinations", { channel = full }))
    -- the escaped label reads back as the channel's name
    assert.is_true(sample(fams, "lecho_channel_events_out_total", { channel = ns .. '/odd"name\\x' }) >= 0)
    -- every family has HELP and TYPE
    for name, f in pairs(fams) do
      assert(f.help and f.type, name .. " has HELP and TYPE")
    end
    assert.is_true(check_histograms(fams) >= 1)
    assert.are.equal(1, sample(fams, "lecho_info", { role = "context" }))
    -- the consumer's peer entry: events out to it, its connection up
    local peer_out = 0
    for _, s in ipairs(fams.lecho_peer_events_out_total.samples) do peer_out = peer_out + s.value end
    assert.is_true(peer_out > 0)
    -- counters move while events flow, and a slow client (connected, never
    -- sending its request) does not stop the loop meanwhile
    local host, port = maddr:match("^(.+):(%d+)$")
    local slow = assert(socket.tcp())
    assert(slow:connect(host, tonumber(port)))
    S.sleep(0.5)
    fams = scrape()
    assert.is_true(sample(fams, "lecho_channel_events_out_total", { channel = full }) > out1)
    assert.is_true(sample(fams, "lecho_sync_latency_seconds", { channel = full }, "_count") > sync1)
    check_histograms(fams)
    -- the slow client is closed after the deadline (5 s here)
    slow:settimeout(10)
    local t0 = socket.gettime()
    local data, err = slow:receive("*a")
    assert.are.equal("", data or "")
    assert.is_true(err == nil or err == "closed")
    assert.is_true(socket.gettime() - t0 < 9)
    slow:close()
    -- /stats: the same counters as JSON; others 404; POST 405; a request too large 431
    local status, _, body = get(maddr, "/stats")
    assert.are.equal(200, status)
    local st = require("cjson").decode(body)
    assert.is_true(st.channels[full].events_out > 0)
    assert.are.equal(404, (get(maddr, "/nope")))
    assert.are.equal(405, (get(maddr, "/metrics", "POST /metrics HTTP/1.1\r\n\r\n")))
    -- past 16 connections at once: 503 and closed, the others still served
    local held = {}
    for i = 1, 16 do
      held[i] = assert(socket.tcp())
      assert(held[i]:connect(host, tonumber(port)))
    end
    S.sleep(0.2)
    assert.are.equal(503, (get(maddr, "/metrics")))
    for _, c in ipairs(held) do c:close() end
    assert(wait_until(function()
      local ok, s = pcall(get, maddr, "/metrics")
      return ok and s == 200
    end, 10, 0.1), "served again once the connections closed")
    -- (after the connections test: its answer waits for the client's close)
    assert.are.equal(431, (get(maddr, "/metrics", "GET /metrics HTTP/1.1\r\nX: " .. ("a"):rep(9000) .. "\r\n\r\n")))
  end)

  it("the name server's --metrics, and loopback only in protected mode", function()
    local pf = S.tmpname("ns")
    local ns = S.spawn(("%s %s/scripts/lecho-nameserver --listen 127.0.0.1:0 --settle 0 --for 30 --metrics 127.0.0.1:0 "
      .. "--port-file %s"):format(S.luajit, S.root, pf))
    assert(S.wait_file(pf, "%d+:%d+", 20), S.errors(ns))
    local line = S.wait_file(ns.err, "metrics on http://[%d.:]+/metrics", 20)
    local maddr = assert(line and line:match("metrics on http://([%d.:]+)/metrics"), S.errors(ns))
    local status, _, body = get(maddr, "/metrics")
    assert.are.equal(200, status)
    local fams = parse(body)
    assert.are.equal(1, sample(fams, "lecho_info", { role = "nameserver" }))
    assert.has_error(function() lecho.context{ metrics = "0.0.0.0:0", quiet = true } end,
      "lecho: refusing to serve metrics on 0.0.0.0:0 without keys (protected mode: loopback only)")
    assert.has_error(function() lecho.context{ metrics = "[::1]:0", quiet = true } end,
      "lecho: metrics address [::1]:0: only IPv4 HOST:PORT")
  end)

  it("the parser refuses what is not the format", function()
    assert.has_error(function() parse("x_total 1\n") end, "line 1: sample x_total without its TYPE before")
    assert.has_error(function() parse("# TYPE x counter\nx 1\n") end, "line 2: counter x does not end in _total")
    assert.has_error(function() parse('# TYPE x gauge\nx{a="b} 1\n') end, "line 2: label value not closed")
    assert.has_error(function() parse('# TYPE x gauge\nx{a="\\q"} 1\n') end, "line 2: bad escape \\q")
    assert.has_error(function() parse("# TYPE x gauge\nx one\n") end, "line 2: bad value 'one'")
    local f = parse('# TYPE x gauge\nx{a="q\\"\\\\\\n"} 2\n')
    assert.are.equal('q"\\\n', f.x.samples[1].labels.a)
  end)
end)

-- The renderer alone: escaping of every special byte.
describe("lecho.metrics.render", function()
  it("escapes label values: backslash, double quote, newline", function()
    local m = require "lecho.metrics"
    assert.are.equal('a\\\\b\\"c\\nd', m.escape('a\\b"c\nd'))
    local fams = parse(m.render{ addr = "x", role = "context", channels = { ['a"\n\\'] = { events_out = 3 } }, peers = {} })
    assert.are.equal(3, sample(fams, "lecho_channel_events_out_total", { channel = 'a"\n\\' }))
  end)
end)
