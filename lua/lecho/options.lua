-- lecho.options: what the API checks against, in one place: queue
-- policies, modulator capabilities, the options each call takes with the
-- kind of value each takes, and address parsing.

local addr = require "lecho.addr"

-- Never compiled, as lecho.tables: M.check's pairs loop runs on every call
-- with options (a hot loop under load), and Debian's LuaJIT miscompiles such
-- loops (LuaJIT #829): a keiretsu blaster's valid `p:submit_sync(v, {
-- timeout = 4 })` failed "unknown option 'true'" in CI (ci-s5d, s6b-s6d).
if jit then jit.off(true, true) end

local M = {}

-- Capabilities a producer may grant to modulators (doc/modulators.md).
M.CAPS = { clock = true, log = true }

-- Queue policies when a queue is full (doc/semantics.md "Bounded memory").
M.POLICIES = { block = true, drop_oldest = true, drop_newest = true, disconnect = true }

-- The kinds of option values.  Each checks value v of option k and returns
-- nil when it fits, or why not: a text that follows "WHERE: k " or, with a
-- second value true, the whole message.
local function time(min, above)
  local why = ("must be a finite number %s %g"):format(above and ">" or ">=", min)
  return function(v)
    if type(v) ~= "number" or v ~= v or v == math.huge or v < min or (above and v == min) then
      return why
    end
  end
end
-- A count of bytes or levels: an integer the C core can take as a size.
local function size(min)
  local why = ("must be an integer from %d to 2^53"):format(min)
  return function(v)
    if type(v) ~= "number" or not (v >= min and v <= 2 ^ 53) or v ~= math.floor(v) then return why end
  end
end
local function typed(t, article)
  local why = ("must be %s %s"):format(article or "a", t)
  return function(v) if type(v) ~= t then return why end end
end
local function address(v)
  if type(v) ~= "string" then return "must be an address string (host:port, [v6]:port or unix:/path)" end
end
-- nameserver: one address, or an ordered list of 1 to MAX_NAMESERVERS (issue
-- 12: the client registers with all and looks up from any; the first is
-- the channels' default name server).
M.MAX_NAMESERVERS = 16
local function addresses(v)
  if type(v) == "string" then return end
  local why = ("must be an address string (host:port, [v6]:port or unix:/path) or a list of 1 to %d of them")
              :format(M.MAX_NAMESERVERS)
  if type(v) ~= "table" or getmetatable(v) ~= nil then return why end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  if n == 0 or n ~= #v or n > M.MAX_NAMESERVERS then return why end
  for _, a in ipairs(v) do
    if type(a) ~= "string" then return why end
  end
end
-- history: "last" or a count of events (lecho.history, at most 1024)
local function history(v)
  if v == "last" then return end
  if type(v) ~= "number" or not (v >= 1 and v <= 1024) or v ~= math.floor(v) then
    return 'must be "last" or an integer from 1 to 1024'
  end
end
-- a consumer's history: also "key" (from the last key frame its modulator
-- marked: doc/modulators.md "Key frames")
local function chistory(v)
  if v == "key" then return end
  local why = history(v)
  if why then return 'must be "last", "key" or an integer from 1 to 1024' end
end
-- record: a file name (a recorder of the producer's own) or a recorder
-- (ctx:recorder, lecho.recorder sets M.RECORDER, its metatable)
local function record(v)
  if type(v) == "string" and v ~= "" then return end
  if type(v) == "table" and M.RECORDER and getmetatable(v) == M.RECORDER then return end
  return "must be a file name or a recorder (ctx:recorder)"
end
local function policy(v)
  if not M.POLICIES[v] then return "lecho: unknown policy '" .. tostring(v) .. "'", true end
end
local function caps(v)
  if type(v) ~= "table" then return "must be a list of capability names (clock, log)" end
  -- a list and nothing else: { net = true } or a hole ({ "clock", nil, "net" })
  -- would pass an ipairs walk unseen
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  if n ~= #v or (n > 0 and v[n] == nil) then return "must be a list of capability names (clock, log)" end
  for _, cap in ipairs(v) do
    if not M.CAPS[cap] then
      local known = {}
      for name in pairs(M.CAPS) do known[#known + 1] = name end
      table.sort(known)
      return ("lecho: unknown capability '%s' (known: %s)"):format(tostring(cap),
             table.concat(known, ", ")), true
    end
  end
end
-- accept_code: false, true, a list of principal names (keyed mode), or
-- { principals = true | list, names = { "calc.*", "{principal}.*", ... } }
-- (lecho.push: who may push, and which service names).
local function strings(v, pat)
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  if n ~= #v or n == 0 then return false end
  for _, p in ipairs(v) do if type(p) ~= "string" or p == "" or (pat and not p:find(pat)) then return false end end
  return true
end
local function accept_code(v)
  if type(v) == "boolean" then return end
  local why = "must be true, false, a list of principal names or { principals = true | list, names = "
              .. "list of service names or prefixes ending in * }"
  if type(v) ~= "table" then return why end
  if v.principals ~= nil or v.names ~= nil then
    for k in pairs(v) do if k ~= "principals" and k ~= "names" then return why end end
    if v.principals ~= nil and v.principals ~= true and not strings(v.principals) then return why end
    if v.names ~= nil and not strings(v.names, "^[%w%._%-{}]*%*?$") then return why end
    return
  end
  if not strings(v) then return why end
end
-- Keyed mode (doc/keys.md): the secret key file, the trust files, the
-- principal the name server must be.  false: none, whatever $LECHO_KEY and
-- $LECHO_TRUST say.
local function keyfile(v)
  if v ~= false and (type(v) ~= "string" or v == "") then
    return "must be the path of a secret key file (or false: none)"
  end
end
local function trustfiles(v)
  if v == false or (type(v) == "string" and v ~= "") then return end
  local why = "must be the path of a trust file, a non-empty list of them, or false"
  if type(v) ~= "table" or getmetatable(v) ~= nil then return why end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  if n == 0 or n ~= #v then return why end
  for _, p in ipairs(v) do
    if type(p) ~= "string" or p == "" then return why end
  end
end
local function principal(v)
  local keys = require "lecho.keys"     -- (its lua-cjson only when asked)
  if not keys.valid_name(v) then return "must be a principal name: " .. keys.NAME_RULE end
end
-- 0 (off) or long enough that a peer can answer: 1e-300 declared every
-- peer dead at once
local AT_LEAST_10MS = time(0.01)
local function HEARTBEAT(v)
  if v ~= 0 and AT_LEAST_10MS(v) then return "must be 0 (off) or a finite number >= 0.01" end
end
local TIME, TIME_POS, BOOL, FN, TABLE = time(0), time(0, true), typed("boolean"), typed("function"),
                                        typed("table")
-- A group's lease (lecho.ns.presence: [0.1, 3600] s); a group's data: anything.
local function LEASE(v)
  if type(v) ~= "number" or not (v >= 0.1 and v <= 3600) then return "must be a number of seconds from 0.1 to 3600" end
end
local function ANY() end
-- A share of the CPU the producer thread ran: modulators_cpu (0: no cap).
local function SHARE(v)
  if type(v) ~= "number" or not (v >= 0 and v <= 1) then return "must be a number from 0 (no cap) to 1" end
end

-- The names each options table takes (doc/api.md "Using it" says what they
-- do), with the kind of value each takes and the default where the Lua side
-- applies one (nil: the C core or lecho.ns.registry applies it, or there is
-- none).  A key not listed is a mistake (`namserver`) and raises at the call
-- with its name: an unknown option never silently means its default; so
-- does a value of the wrong kind (a NaN timeout, a negative queue_limit).
local SCHEMA = {
  CONTEXT = {
    nameserver = { addresses }, listen = { address, "127.0.0.1:0" }, advertise = { address },
    manager = { BOOL }, log = { FN }, quiet = { BOOL },
    -- doc/operations.md: the log threshold (else $LECHO_LOG, else info), the
    -- Prometheus endpoint's address (lecho.metrics; none by default)
    log_level = { function(v)
      if v ~= "debug" and v ~= "info" and v ~= "warn" and v ~= "error" then
        return "must be \"debug\", \"info\", \"warn\" or \"error\""
      end
    end },
    metrics = { address },
    signals = { BOOL, true },  -- false: ctx:run() leaves SIGINT and SIGTERM to the host program
    timeout = { TIME_POS, 5 }, sync_timeout = { TIME, 10 }, linger = { TIME, 2 },
    queue_limit = { size(1) }, policy = { policy }, batch_bytes = { size(0) },
    max_string = { size(0) }, max_depth = { size(1) }, max_frame = { size(0) },
    pin_threshold = { size(0) },
    max_value_bytes = { size(0) },  -- issue 11 (H5): decoded size of one value received, 64 MiB
    key = { keyfile }, trust = { trustfiles }, nameserver_principal = { principal, "nameserver" },
    -- keyed: seconds between looks (one stat per file) at the trust files and a name
    -- server's policy file, read again when one changed (0: only on SIGHUP)
    trust_poll = { TIME, 0.5 },
    retry_interval = { TIME }, retry_max = { TIME }, heartbeat = { HEARTBEAT },
    heartbeat_misses = { time(1, true) },
    -- connections (issue 11, doc/limits.md; the C core applies the defaults:
    -- 10 s, 1024, 512 MiB, 65536)
    handshake_timeout = { TIME }, max_connections = { size(1) }, max_buffered = { size(0) },
    max_peer_channels = { size(1) },
    modulator_budget = { TIME_POS, 0.005 }, modulator_memory = { size(256 * 1024), 32 * 1024 * 1024 },
    -- issue 11, every modulator of the context together (doc/modulators.md; 0: no cap): the
    -- memory of their states, their share of the thread's CPU over 1 s, the shortest period
    -- one may ask, how many one consumer principal may have installed here
    modulators_memory = { size(0), 256 * 1024 * 1024 }, modulators_cpu = { SHARE, 0.5 },
    modulator_min_period = { TIME, 0.01 }, modulators_per_principal = { size(1), 16 },
    -- the registry of a name server or manager run inside the context
    ack_timeout = { TIME, 2.0 }, settle = { TIME }, recovering = { BOOL }, forget_after = { TIME },
    channel_quota = { size(1) },
    -- keyed: how long a producer ticket this manager signs is valid (renewed at 2/3 of it)
    ticket_ttl = { TIME_POS, 3600 },
    -- groups with leases (issue 12, lecho.ns.presence): groups held, and the
    -- memberships and watches one requester may have (defaults 65536, 1024)
    max_groups = { size(1) }, group_quota = { size(1) },
    -- and in total: memberships, and bytes of member data (262144, 256 MiB)
    max_memberships = { size(1) }, max_group_bytes = { size(1) },
    policy_file = { typed("string") },  -- a name server's authorization policy (lecho.policy)
    -- issue 11, state limits (doc/limits.md): channels open in the C core
    -- (its default 262144), consumer contexts in one member list (the
    -- producer refuses a longer one, or one naming a context twice; a
    -- manager refuses the join past it), distinct peer contexts member
    -- lists may make a producer send to
    max_channels = { size(1) }, max_members = { size(1), 4096 }, max_peers = { size(1), 4096 },
    peer_free_after = { TIME, 30.0 },  -- an unused peer record is freed this long after (doc/limits.md)
    log_window = { TIME, 10.0 },       -- one log line per kind of refusal per this long (doc/limits.md)
    max_calls_in_flight = { size(1), 1024 },  -- issue 12: ctx:call's in flight at once (lecho.call)
    -- issue 12, pushed code (doc/services.md "Pushing code", lecho.push): who may push
    accept_code = { accept_code },
  },
  SERVICE = { version = { size(1), 1 }, concurrency = { size(1), 16 }, queue = { size(0), 64 },
              queue_bytes = { size(0), 64 * 1024 * 1024 }, budget = { TIME, 5 } },
  CALL = { timeout = { TIME }, version = { size(1) }, min_version = { size(1) }, key = { typed("string") },
           at = { typed("string") }, retries = { size(0), 2 } },
  CHANNEL = { create = { BOOL } },
  -- ctx:group (issue 12, lecho.group): data is any value (its size is the
  -- name server's to refuse)
  GROUP = { lease = { LEASE, 10 }, data = { ANY }, watch = { FN }, join = { BOOL } },
  PRODUCER = { policy = { policy }, grant = { caps },
               -- issue 29, lecho.history: the last events kept for late joiners
               history = { history }, history_bytes = { size(1), 1024 * 1024 },
               -- issue 29, lecho.recorder: every event submitted recorded in this process
               record = { record } },
  CONSUMER = { modulator = { typed("string") }, params = { TABLE }, period = { time(0.001) },
               capabilities = { caps }, on_error = { FN }, buffer = { BOOL },
               history = { chistory } },
  SUBMIT_SYNC = { timeout = { TIME } },
  CLOSE = { linger = { TIME } },
}

-- Checks on options together (after each value passed): the message, or nil.
local TOGETHER = {
  CONTEXT = function(o)
    if o.manager and o.nameserver == nil then
      return "manager needs a nameserver (the name server it registers with)"
    end
    if o.manager and type(o.nameserver) == "table" and o.nameserver[2] then
      return "manager takes one nameserver (the name server it registers with), not a list"
    end
  end,
  CONSUMER = function(o)
    if o.history ~= nil and o.buffer then return "history does not go with buffer" end
    if o.modulator == nil then
      for _, k in ipairs{ "params", "period", "capabilities" } do
        if o[k] ~= nil then return k .. " needs a modulator" end
      end
    end
  end,
}

-- M.CONTEXT, M.CHANNEL, ...: name -> the default, or true when there is none
-- here; kinds and together: the same tables -> their checks.
local kinds, together = {}, {}
for name, schema in pairs(SCHEMA) do
  local known, k_of = {}, {}
  for k, spec in pairs(schema) do
    known[k] = spec[2] == nil and true or spec[2]
    k_of[k] = spec[1]
  end
  M[name] = known
  kinds[known], together[known] = k_of, TOGETHER[name]
end

-- Raises "WHERE: unknown option 'KEY'" for a key of opts not in `known`, and
-- "WHERE: KEY must be ..." for a value not of its kind (level: as error's,
-- for the caller of the API function).  Returns opts, or an empty table for
-- nil.
function M.check(opts, known, where, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(("%s: options must be a table, not a %s"):format(where, type(opts)), level + 1)
  end
  -- values behind a metatable would be read by indexing but never checked
  if getmetatable(opts) ~= nil then
    error(("%s: options must be a plain table (no metatable)"):format(where), level + 1)
  end
  local k_of = kinds[known]
  for k, v in pairs(opts) do
    if not known[k] then
      error(("%s: unknown option '%s'"):format(where, tostring(k)), level + 1)
    end
    local why, whole
    if k_of then why, whole = k_of[k](v) end
    if why then error(whole and why or ("%s: %s %s"):format(where, k, why), level + 1) end
  end
  local why = together[known] and together[known](opts)
  if why then error(("%s: %s"):format(where, why), level + 1) end
  return opts
end

-- Raises "WHERE: NAME must be a finite number >= 0" (> 0 when positive)
-- unless v is one: the time arguments of ctx:after, ctx:every, run_once.
function M.check_time(v, where, name, level, positive)
  local why = (positive and TIME_POS or TIME)(v)
  if why then error(("%s: %s %s"):format(where, name, why), level + 1) end
  return v
end

-- The canonical text of address s (lecho.addr: "a.b.c.d:port",
-- "localhost:port", "[v6]:port", "unix:/path"; port 0 only when listen is
-- true); raises "lecho: bad WHAT 'S': why" for the caller of the API
-- function (level as error's).
function M.parse_addr(s, what, listen, level)
  if type(s) ~= "string" then
    error(("lecho: %s must be an address string (host:port, [v6]:port or unix:/path)")
      :format(what), (level or 2) + 1)
  end
  local a, why = addr.parse(s, { listen = listen })
  if not a then error(("lecho: bad %s '%s': %s"):format(what, s, why), (level or 2) + 1) end
  return a
end

return M
