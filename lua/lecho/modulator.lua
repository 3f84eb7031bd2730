-- lecho.modulator: modulators on both sides.  The spec of a modulator
-- (canonical text, key); on the producing side, installing, re-keying and
-- unloading instances as the manager's member lists say, refusals and
-- failures told to the consumers, and the in-band end of a stream; on the
-- consuming side, the streams of modulated events with their demodulators.

-- Never compiled, as lecho.control: modulator specs, installs, re-keys,
-- unloads and stream ends run per member list or control message, never per
-- event (a modulator runs in the MOE's own state, a demodulator is the
-- consumer's handler): see lecho.control for why.
if jit then jit.off(true, true) end

local core = require "lecho.core"
local options = require "lecho.options"
local Context = require "lecho.context"
local Channel = require "lecho.channel"

local CAPS = options.CAPS
local check_subs, key_ok = require("lecho.subs").check, require("lecho.subs").key_ok
local params_too_big = require("lecho.subs").params_too_big
local same_code, same_mod = require("lecho.subs").same_code, require("lecho.subs").same_mod
local others = Channel.without
local sorted_keys, same = require("lecho.tables").sorted_keys, require("lecho.tables").same
local ENOENT = 2   -- errno.h: 2 on Linux, the BSDs and macOS (io.open gives the errno third)

local M = {}

-- A deterministic text of a value (sorted keys), so that equal params give
-- equal modulator keys in every process.  The value was checked encodable.
-- (the canonical text of a value and the keys made from it: lecho.subs,
-- which the manager shares to check that a key is its code's)
local canon = require("lecho.subs").canon

local function looks_like_file(s)
  return not s:find("[\n()=]")
end

--- lecho.modulator(src or file): the text of a modulator.  A one-line
-- string that ends in ".lua" or names something that exists is a file name,
-- read from that file: its text, or nil, "no such file: NAME", "notfound"
-- (or "NAME: reason" it cannot be read, e.g. a directory, "io").  Anything
-- else is taken as the source itself.  Returns text, name (the file's, or nil).
function M.source(s)
  if type(s) ~= "string" or s == "" then
    error("lecho.modulator: want Lua source text or a file name (a non-empty string)", 2)
  end
  if s:find("\n") then return s end
  local f, err, errno = io.open(s, "rb")
  if not f then
    if s:sub(-4) ~= ".lua" then return s end
    -- the code from the system's errno, not from err's text (which the locale words)
    if errno == ENOENT then return nil, "no such file: " .. s, "notfound" end
    return nil, err, "io"
  end
  local text, rerr = f:read("*a")
  f:close()
  if not text then return nil, s .. ": " .. tostring(rerr), "io" end
  return text, s
end

-- The identity of a modulator: `base` names the code (source, period,
-- capabilities), `key` the code with its params.
-- `stream`: the stream an in-band params change keeps (the key of the
-- first params of it, doc/modulators.md "Ordering"): the key then names
-- code, params and that stream, so that equal keys are one instance on one
-- stream, and a consumer using the first key elsewhere is another instance.
local stream_key = require("lecho.subs").stream_key
local add_dest = require("lecho.subs").add_dest

local function mod_spec(src, params, period, caps, level, stream)
  if type(src) ~= "string" or src == "" then
    error("lecho: modulator must be Lua source text (a non-empty string)", level)
  end
  -- Compiled here, never run (that happens in each producer's sandbox): a
  -- modulator that does not compile fails at the call, not later through
  -- on_error once a producer exists.  Text only, as the sandbox loads it.
  if src:byte(1) == 27 then error("lecho: modulator must be Lua source text, not bytecode", level) end
  local f, cerr = load(src, "=modulator", "t")
  if not f then
    if looks_like_file(src) then
      cerr = cerr .. (" ('%s' looks like a file name: lecho.modulator(file) reads one)"):format(src)
    end
    error("lecho: the modulator does not compile: " .. cerr, level)
  end
  if params == nil then params = {} end
  local ok, err = core.encode(params)
  if not ok then error("lecho: modulator params cannot be sent: " .. err, level) end
  local big = params_too_big(params)
  if big then error("lecho: modulator " .. big, level) end
  local cl = {}
  for _, c in ipairs(caps or {}) do cl[#cl + 1] = c end
  table.sort(cl)
  local base = core.hash(table.concat(canon({ src, period or 0, cl }, {})))
  local key = stream_key(base, params, stream)
  return { src = src, params = params, period = period, caps = cl, base = base, key = key,
           stream = stream or key }
end

-- Spec m with other params (and `stream`): the code was compiled when m
-- was made; only the params are checked and hashed (set_params).
local function respec(m, params, level, stream)
  if params == nil then params = {} end
  local ok, err = core.encode(params)
  if not ok then error("lecho: modulator params cannot be sent: " .. err, level) end
  local big = params_too_big(params)
  if big then error("lecho: modulator " .. big, level) end
  local key = stream_key(m.base, params, stream)
  return { src = m.src, params = params, period = m.period, caps = m.caps, base = m.base, key = key,
           stream = stream or key }
end

-- Producing side: who takes the plain stream, and which modulators run
-- here (installed, re-targeted after a params change, or unloaded).
function Channel:_set_consumers(list, mods)
  local ctx = self.ctx
  local dests = others(list, ctx.addr)
  self.dests = dests
  ctx.c:set_dests(self.chid, dests)
  self:_hot_update()
  mods = type(mods) == "table" and mods or {}
  if self.direct and next(self.direct) ~= nil then mods = self:_with_direct(mods) end
  -- Instances whose key went: reused for a new key of the same code and the
  -- same consumers (a params change keeps the modulator's state), else closed.
  -- A key on the stream of a running instance (an in-band params change,
  -- told to the manager after the producers) changes its params in place,
  -- unless the instance already runs a newer one of its consumer (pseq):
  -- a list the manager made before it knew cannot undo it.
  local gone, bystream, used = {}, {}, {}
  for key, inst in pairs(self.mods) do
    if not mods[key] then gone[#gone + 1] = inst end
    bystream[inst.stream] = inst
  end
  for key in pairs(self.failed) do
    if not mods[key] then self.failed[key], self.failed_dests[key] = nil, nil end
  end
  local function take(inst)
    used[inst] = true
    for i, g in ipairs(gone) do
      if g == inst then table.remove(gone, i) break end
    end
  end
  for _, key in ipairs(sorted_keys(mods)) do
    local m = mods[key]
    local inst = self.mods[key]
    if inst and not same_mod(inst.runs, m) then
      -- a key is believed where it was hashed, the instance found under it
      -- only when it runs the entry's code and params: one that does not
      -- (a context's direct install under a key that named other code too,
      -- doc/modulators.md "Keys") is not joined by the entry's consumers,
      -- who would take its output for their modulator's; it goes, and the
      -- entry gets an instance of its own code
      ctx:_warn_limited("modulator key mismatch", ("modulator %s on '%s': the instance under that key here ran"
        .. " other code or params than the member list's entry: replaced"):format(key:sub(1, 16), self.short))
      if bystream[inst.stream] == inst then bystream[inst.stream] = nil end
      used[inst] = true
      self:_unload(inst)
      inst = nil
    end
    if inst then used[inst] = true end
    if not inst and self.failed[key] then self:_tell_failed(key, m.dests) end
    if not inst and not self.failed[key] then
      local same = table.concat(m.dests or {}, ",")
      local s = type(m.stream) == "string" and m.stream or key
      local cur = bystream[s]
      if cur and not used[cur] and not mods[cur.key] and cur.base == m.base and same_code(cur.runs, m)
         and cur.dests_key == same then
        take(cur)
        if (cur.pseq or 0) > (type(m.pseq) == "number" and m.pseq or 0) then
          inst = cur
        else
          inst = self:_params_here(cur, key, m.params, m.pseq)
          if inst then self:_params_at_tell(inst) end
        end
      elseif cur and (used[cur] or mods[cur.key]) then
        -- its stream is another instance's, which stays (a race with a change)
        self:_refuse(key, ("the stream %s is another modulator's here: changed through the manager only")
                            :format(s:sub(1, 16)), m.dests)
      else
        if cur then
          -- the instance on that stream goes (its consumers changed): first,
          -- its channel is this one's
          take(cur)
          self:_unload(cur)
        end
        for i, old in ipairs(gone) do
          if old.base == m.base and same_code(old.runs, m) and old.dests_key == same and not self.fresh_only then
            table.remove(gone, i)
            used[old] = true
            inst = self:_rekey(old, key, m)
            break
          end
        end
        if not inst then inst = self:_install(key, m) end
      end
    end
    if inst then
      local added = false
      if inst.dests then
        local had = {}
        for _, d in ipairs(inst.dests) do had[d] = true end
        for _, d in ipairs(m.dests or {}) do added = added or not had[d] end
      end
      inst.dests = m.dests
      inst.spec = m                   -- lecho.history runs a fresh copy of it for a late joiner
      inst.dests_key = table.concat(m.dests or {}, ",")
      ctx.c:set_dests(inst.dchid, others(m.dests, ctx.addr))
      -- A context joined a running modulator: it may want to start over
      -- (a differencing modulator sends a key frame).  Failures are reported
      -- through the moe_error hook.
      if added then inst.moe:receivers(#m.dests) end
    end
  end
  for _, inst in ipairs(gone) do self:_unload(inst) end
  self:_rebuild_modlist()
  self:_end_streams(mods)
end

-- Direct installs (doc/protocol.md `install`): a consumer context's
-- whole set of modulators on this channel, sent to this producer straight,
-- `self.direct[addr] = { sseq, mods }`.  It stands in for what the
-- manager's member list says of that context only while the context is a
-- member of the list (a consumer of the channel, plain or modulated: the
-- manager admitted it), while the list has not caught up with it (the
-- list's `sseq` for it is below the install's: the consumer tells the
-- manager after) and, keyed with a policy, while the list's `grants` give
-- it `modulate` with each modulator's capabilities.  Otherwise the
-- override goes and the list is whole again.
local MAX_DIRECT = 64          -- modulators in one install

local function caps_combo(caps)
  local cl = {}
  for _, c in ipairs(type(caps) == "table" and caps or {}) do cl[#cl + 1] = c end
  table.sort(cl)
  return table.concat(cl, ",")
end

-- Why the direct set `d` of context `a` may not stand now, or nil.
function Channel:_direct_wrong(a, d, members)
  if not self.lsseq then return "the manager's lists carry no sseq" end
  local ls = self.lsseq[a]
  if not members[a] then return "not a consumer of the channel in the manager's list" end
  if ls and ls >= d.sseq then return "superseded" end
  local g = self.lgrants
  if g then
    local mine = g[a]
    for _, m in pairs(d.mods) do
      if not (mine and mine[caps_combo(m.caps)]) then
        return ("the manager's list does not grant it modulate with caps {%s}"):format(caps_combo(m.caps)), "grants"
      end
    end
  end
  return nil
end

-- The member-list contexts of `list` and `mods`: { [addr] = true }.
local function members_in(list, mods)
  local set = {}
  for _, a in ipairs(type(list) == "table" and list or {}) do set[a] = true end
  for _, m in pairs(mods) do
    for _, a in ipairs(type(m) == "table" and m.dests or {}) do set[a] = true end
  end
  return set
end

-- `mods` of the manager's list with each standing direct set in place of
-- what the list says of its context (fresh tables; `mods` is not changed).
function Channel:_with_direct(mods)
  local members = members_in((self.last_members or {}).list, mods)
  local over = {}
  for _, a in ipairs(sorted_keys(self.direct)) do
    local d = self.direct[a]
    local why, kind = self:_direct_wrong(a, d, members)
    if why then
      self.direct[a] = nil
      -- withdrawn by the policy before the manager heard of it (it then
      -- refuses the subscription telling it, to nobody): the modulators
      -- of the set the list does not give `a` stop here, and `a` is told
      if kind == "grants" then self:_direct_withdrawn(a, d, mods, why) end
    else
      over[a] = d
    end
  end
  -- a key of a direct set names the code and params the list (or a set
  -- before it) has under that key, or the set goes as one the list's
  -- grants withdrew: one key, one modulator (its context's install was
  -- believed by its hash; another context's entry under the same key is
  -- what a collision of keys would give)
  local seen = {}
  for _, a in ipairs(sorted_keys(over)) do
    local d, why = over[a], nil
    for _, key in ipairs(sorted_keys(d.mods)) do
      local m, o = d.mods[key], mods[key] or seen[key]
      if type(o) == "table" and not same_mod(o, m) then
        why = ("modulator %s: another context's modulator of other code or params has that key here")
              :format(key:sub(1, 16))
        break
      end
    end
    if why then
      over[a], self.direct[a] = nil, nil
      self:_direct_withdrawn(a, d, mods, why)
    else
      for key, m in pairs(d.mods) do seen[key] = seen[key] or m end
    end
  end
  if next(over) == nil then return mods end
  local out = {}
  for key, m in pairs(mods) do
    local dl = {}
    for _, x in ipairs(m.dests or {}) do
      if not over[x] then dl[#dl + 1] = x end
    end
    if #dl > 0 then
      local c = {}
      for f, v in pairs(m) do c[f] = v end
      c.dests = dl
      out[key] = c
    end
  end
  for _, a in ipairs(sorted_keys(over)) do
    for _, key in ipairs(sorted_keys(over[a].mods)) do
      add_dest(out, key, over[a].mods[key], a)
    end
  end
  return out
end

-- Direct set `d` of context `a` withdrawn (why): `a` is told of each of
-- its modulators that `mods` (the manager's list) does not run for it, as
-- a mod_error (its consumers' on_error), never left without events and a
-- word.
function Channel:_direct_withdrawn(a, d, mods, why)
  local ctx = self.ctx
  for _, key in ipairs(sorted_keys(d.mods)) do
    local m, listed = mods[key], false
    for _, x in ipairs(type(m) == "table" and m.dests or {}) do
      if x == a then listed = true break end
    end
    if not listed then
      ctx:_warn_limited("modulator withdrawn", ("modulator %s of %s on '%s' stopped here: %s"):format(
        key:sub(1, 16), a, self.short, why))
      -- (a consumer believes it only from a producer with the channel bound there)
      if a ~= ctx.addr then ctx.c:bind_at(self.chid, a) end
      ctx:_send_ctrl(a, { op = "mod_error", ch = self.name, key = key, err = why, producer = ctx.addr })
    end
  end
end

-- Context `from`'s new set `mods` applied to the running instances only
-- where they change (what _set_consumers would make of the list with it,
-- without a pass over every modulator of the list): an instance no longer
-- its own stops sending to it (unloaded when it had no other consumer)
-- and its stream is ended there in band; a new key gets a fresh instance,
-- or `from` joins the running one of that key.  Returns true, or false
-- when this does not apply (a list kept after a manager's loss, a stream
-- changed in band) and the whole pass must run.
function Channel:_direct_apply(from, mods)
  local ctx = self.ctx
  if self.kept or self.regrace then return false end
  local had = {}
  for key, inst in pairs(self.mods) do
    for _, a in ipairs(inst.dests or {}) do
      if a == from then had[key] = inst break end
    end
  end
  for key, m in pairs(mods) do
    if not had[key] and (m.stream or key) ~= key then return false end
  end
  local sub = self.sub_dests or {}
  self.sub_dests = sub
  local changed = false
  for _, key in ipairs(sorted_keys(had)) do
    local inst = had[key]
    if not mods[key] then
      local dl = others(inst.dests, from)
      if #dl == 0 then
        self:_unload(inst, true)
      else
        inst.dests, inst.dests_key = dl, table.concat(dl, ",")
        ctx.c:set_dests(inst.dchid, others(dl, ctx.addr))
      end
      changed = true
      local set = sub[inst.stream]
      if set and set[from] then
        set[from] = nil
        if from == ctx.addr then ctx.c:drain_local() end -- local events first
        ctx:_send_ctrl(from, { op = "stream_end", ch = self.name, key = inst.stream, producer = ctx.addr,
                               ver = self.ver })
      end
    end
  end
  for _, key in ipairs(sorted_keys(mods)) do
    if not had[key] and self.failed[key] then self:_tell_failed(key, { from }) end
    if not had[key] and not self.failed[key] then
      local m = mods[key]
      local inst = self.mods[key]
      if inst and not same_mod(inst.runs, m) then
        -- (_install_req checked it this turn: never so, kept as the rule;
        -- told, not marked failed: the instance stays its consumers')
        local why = "the instance under that key here runs other code or params"
        ctx:_warn_limited("modulator refused", ("modulator %s of %s on '%s' not joined: %s"):format(
          key:sub(1, 16), from, self.short, why))
        if from ~= ctx.addr then ctx.c:bind_at(self.chid, from) end
        ctx:_send_ctrl(from, { op = "mod_error", ch = self.name, key = key, err = why, producer = ctx.addr })
        inst = nil
      elseif inst then
        local dl = {}
        for i, a in ipairs(inst.dests or {}) do dl[i] = a end
        dl[#dl + 1] = from
        inst.dests, inst.dests_key = dl, table.concat(dl, ",")
        ctx.c:set_dests(inst.dchid, others(dl, ctx.addr))
        inst.moe:receivers(#dl)
      else
        local e = { src = m.src, params = m.params, period = m.period, caps = m.caps, base = m.base,
                    stream = m.stream, pseq = m.pseq, dests = { from } }
        inst = self:_install(key, e)
        if inst then
          inst.spec, inst.dests_key = e, from
          ctx.c:set_dests(inst.dchid, others(e.dests, ctx.addr))
        end
      end
      if inst then
        sub[inst.stream] = sub[inst.stream] or {}
        sub[inst.stream][from] = true
      end
      changed = true
    end
  end
  if changed then self:_rebuild_modlist() end
  return true
end

-- An `install` from consumer context `from` (control.lua): its whole set
-- of modulators here, `msg.mods` as a subscription's (`subs.mods`), with
-- `msg.sseq` its count of subscription changes.  Believed only from a
-- context the manager's current member list names (keyed: its address is
-- pinned to the key the list gave, so the handshake proved it), for
-- itself only (no `dests`), above the last sseq it or the list said, each
-- key the hash of its code and params (recomputed here: one key is one
-- modulator, whoever else uses it), no stream another context's, and,
-- keyed with a policy, within the list's grants.  Applied at once (a new
-- instance is made, a dropped one unloaded); returns true, the errors of
-- its keys here ({ [key] = why }, nil when none); or nil, why, code.
function Channel:_install_req(from, msg)
  local ctx = self.ctx
  local sseq = msg.sseq
  if type(sseq) ~= "number" or sseq < 1 or sseq % 1 ~= 0 or sseq >= 2 ^ 53 or type(msg.mods) ~= "table" then
    return nil, "an install needs sseq (integer >= 1) and mods (a table)", "protocol"
  end
  if msg.dests ~= nil or msg.consumer ~= nil then
    return nil, "an install is for its sender only (no dests, no consumer)", "refused"
  end
  local last = self.last_members
  if not last then return nil, "no member list from the manager here yet", "refused" end
  -- a manager whose lists say no sseq (an older one) knows nothing of
  -- direct installs: it could not supersede one, nor say its grants
  if not self.lsseq then return nil, "the manager's lists carry no sseq: installs go through it", "refused" end
  -- (once per list: a channel of thousands of consumers is not gone over per install)
  local members = last.members or members_in(last.list, type(last.mods) == "table" and last.mods or {})
  last.members = members
  if not members[from] then
    return nil, ("%s is not a consumer of '%s' in the manager's list"):format(from, self.short), "refused"
  end
  local d = self.direct and self.direct[from]
  local ls = self.lsseq and self.lsseq[from] or 0
  if sseq <= ls or (d and sseq <= d.sseq) then
    return nil, ("install %d after %d: an older change"):format(sseq, math.max(ls, d and d.sseq or 0)), "refused"
  end
  local subs, err = check_subs{ op = "install", subs = { mods = msg.mods } }
  if not subs then return nil, err, "protocol" end
  local n = 0
  local lmods = type(last.mods) == "table" and last.mods or {}
  for key, m in pairs(subs.mods) do
    n = n + 1
    if n > MAX_DIRECT then return nil, ("more than %d modulators in one install"):format(MAX_DIRECT), "limit" end
    -- hashed here once: an entry of the install before, the same in all
    -- but pseq, was (a consumer's set goes whole in each install)
    local o = d and d.mods[key]
    if o and o.src == m.src and o.period == m.period and o.stream == m.stream and same(o.caps, m.caps)
       and same(o.params, m.params) then
      m.base = o.base
    else
      local kok, base = key_ok(key, m)
      if not kok then
        return nil, ("modulator %s: %s"):format(key:sub(1, 16), base), "refused"
      end
      m.base = base
    end
    -- an instance running here under that key runs its code and params
    -- too, and the manager's list and the other direct sets name the same
    -- under it: a list of a manager that did not hash its keys (before
    -- issue 27's attack), or another context's install under a key that
    -- named other code too (keys of FNV-1a 64 before issue 26's hash: a
    -- pair of sources of one key was made in minutes), would hand this
    -- consumer that code's output for its own modulator's
    local inst = self.mods[key]
    if inst and not (same_mod(inst.runs, m) and inst.stream == (m.stream or key)) then
      return nil, ("modulator %s: the instance under that key here runs other code or params"):format(
        key:sub(1, 16)), "refused"
    end
    local o = lmods[key]
    for a2, d2 in pairs(self.direct or {}) do
      if a2 ~= from and d2.mods[key] then o = o or d2.mods[key] end
    end
    if type(o) == "table" and not same_mod(o, m) then
      return nil, ("modulator %s: another context's modulator of other code or params has that key here")
                  :format(key:sub(1, 16)), "refused"
    end
    -- a stream kept through in-band params changes is its consumer's alone
    local s = m.stream or key
    if s ~= key then
      for k2, o in pairs(lmods) do
        if type(o) == "table" and (type(o.stream) == "string" and o.stream or k2) == s then
          for _, x in ipairs(o.dests or {}) do
            if x ~= from then
              return nil, ("modulator %s: stream %s is %s's"):format(key:sub(1, 16), s:sub(1, 16), x), "refused"
            end
          end
        end
      end
      for a2, d2 in pairs(self.direct or {}) do
        if a2 ~= from then
          for k2, o in pairs(d2.mods) do
            if (o.stream or k2) == s then
              return nil, ("modulator %s: stream %s is %s's"):format(key:sub(1, 16), s:sub(1, 16), a2), "refused"
            end
          end
        end
      end
    end
  end
  local nd = { sseq = sseq, mods = subs.mods }
  local why = self:_direct_wrong(from, nd, members)
  if why then return nil, why, "refused" end
  -- taken: applied by _install_apply (the caller answers first)
  return true, self:_mod_errors(subs.mods), nd
end

-- Applies install `nd` (checked by _install_req) of context `from`.  The
-- caller has answered and written the answer already: the consumer goes
-- on while the state is made here, and no event of this process can be
-- submitted before this returns (one thread: what it submits next goes
-- through the new modulator).  What fails here goes to the consumer as a
-- mod_error, as from a member list.
function Channel:_install_apply(from, nd)
  local last = self.last_members
  self.direct = self.direct or {}
  self.direct[from] = nd
  -- a modulator that goes and one that comes in one install are two
  -- consumers' (a close and a new consumer): a fresh state for the new
  -- one, never the old one's re-keyed (that is a params change's, through
  -- the manager)
  self.fresh_only = true
  local ok, aerr = pcall(self._direct_apply, self, from, nd.mods)
  if ok and not aerr then ok, aerr = pcall(self._apply_members, self, last.list, last.mods) end
  self.fresh_only = nil
  if not ok then error(aerr, 0) end
end

-- Each context that no longer takes modulator `key` from this process is
-- told so in band: the message goes after the last event of that stream on
-- the same connection, so the consumer knows nothing more will come.
function Channel:_end_streams(mods)
  local ctx = self.ctx
  local now = {}
  for key, m in pairs(mods) do
    local set = {}
    for _, a in ipairs(m.dests or {}) do set[a] = true end
    now[type(m.stream) == "string" and m.stream or key] = set
  end
  for key, set in pairs(self.sub_dests or {}) do
    for a in pairs(set) do
      if not (now[key] and now[key][a]) then
        if a == ctx.addr then ctx.c:drain_local() end -- local events first
        -- ver: the member list that ended it (the consumer matches it to
        -- the reply of its own change, which may come after this)
        ctx:_send_ctrl(a, { op = "stream_end", ch = self.name, key = key, producer = ctx.addr,
                            ver = self.ver })
      end
    end
  end
  self.sub_dests = now
end

function Channel:_rebuild_modlist()
  local list = {}
  for _, key in ipairs(sorted_keys(self.mods)) do list[#list + 1] = self.mods[key].moe end
  self.modlist = list
  self:_hot_update()
end

-- The principal a consumer context at address `a` speaks for, as an id and
-- a name for messages: keyed, its key (the one the member list pinned the
-- address to, known before any connection), named as the trust files or
-- the handshake name it; protected (or ourselves), its address.
local function principal_of(ctx, a)
  if ctx.keyed and a ~= ctx.addr then
    local name, pk = ctx.c:peer_identity(a)
    pk = pk or ctx.pinned_keys[a]
    if pk then
      name = (name and name ~= "") and name or ctx.trust_names[pk] or ("key " .. core.hex(pk):sub(1, 16))
      return pk, name
    end
  end
  return a, a
end

-- Why the producer's own limits refuse modulator `m` (issue 11), or nil,
-- and the set of principal ids it is installed for, and the name of the
-- principal its CPU is charged to.
local function limits_refuse(ctx, m)
  local period = m.period
  if type(period) == "number" and period > 0 and period < ctx.mod_min_period then
    return ("period %g s is below this producer's minimum %g s"):format(period, ctx.mod_min_period)
  end
  local whose = {}
  for _, a in ipairs(m.dests or {}) do
    local id, name = principal_of(ctx, a)
    if not whose[id] then
      whose[id] = true
      if (ctx.mod_principals[id] or 0) >= ctx.mods_per_principal then
        return ("too many modulators from %s (limit %d)"):format(name, ctx.mods_per_principal)
      end
    end
  end
  -- who is charged for its CPU (the share check): the first consumer's principal
  local who
  if m.dests and m.dests[1] then who = select(2, principal_of(ctx, m.dests[1])) end
  return nil, whose, who
end

local function count_principals(ctx, whose, d)
  for id in pairs(whose or {}) do
    local n = (ctx.mod_principals[id] or 0) + d
    ctx.mod_principals[id] = n > 0 and n or nil
  end
end

-- Loads modulator `key` here; on refusal or failure, remembers why and
-- tells its consumers.  Returns the instance or nil.
function Channel:_install(key, m)
  local ctx = self.ctx
  local err
  local grant = {}
  for _, cap in ipairs(m.caps or {}) do
    if not CAPS[cap] then
      err = ("unknown capability '%s'"):format(tostring(cap))
    elseif not self.grants[cap] then
      err = ("capability '%s' not granted by the producer"):format(cap)
    end
    if err then break end
    grant[cap] = true
  end
  local whose, who
  if not err then err, whose, who = limits_refuse(ctx, m) end
  local dchid
  if not err then
    -- no derived channel for what is refused: a member list naming
    -- thousands of modulators must not open thousands of channels
    local cerr
    dchid, cerr = ctx.c:channel(self:_derived_name(type(m.stream) == "string" and m.stream or key))
    err = cerr                                     -- (max_channels)
  end
  if err then
    self:_refuse(key, err, m.dests)
    return nil
  end
  self:_secure(dchid)
  ctx.nextmoe = ctx.nextmoe + 1
  local moe
  moe, err = ctx.c:moe(ctx.nextmoe, dchid, ("%s@%s"):format(self.short, key:sub(1, 8)), m.src,
                       m.params == nil and {} or m.params,
                       { budget = ctx.mod_budget, memory = ctx.mod_memory, period = m.period,
                         clock = grant.clock, log = grant.log,
                         pool_memory = ctx.mods_memory, cpu_share = ctx.mods_cpu, principal = who })
  if not moe then
    self:_refuse(key, err, m.dests)
    return nil
  end
  -- runs: what it runs (its code and current params), which an entry found
  -- under its key must name too (subs.same_mod)
  local inst = { id = ctx.nextmoe, key = key, base = m.base, moe = moe, dchid = dchid, ch = self,
                 runs = { src = m.src, period = m.period, caps = m.caps,
                          params = m.params == nil and {} or m.params },
                 dests = m.dests, principals = whose,
                 stream = type(m.stream) == "string" and m.stream or key,
                 pseq = type(m.pseq) == "number" and m.pseq or 0 }
  count_principals(ctx, whose, 1)
  ctx.moes[inst.id] = inst
  self.mods[key] = inst
  -- a stream whose params changed in band: its consumer learns which of
  -- its keys this producer runs before its first event
  if inst.stream ~= key then self:_params_at_tell(inst) end
  return inst
end

-- Tells the consumers of inst, in band, that its events from here on are
-- made by key inst.key (they believe it from a producer with the stream
-- bound there: bound first, if no event did yet).  A consumer where the
-- stream cannot be bound yet is owed it (inst.owed): keyed, a producer
-- that handles a member list while its join waits (the list came in the
-- same read as the join's reply, or before it) has no ticket until the
-- reply is taken, and a params_at sent then, before any BIND, was ignored
-- there: the events that followed carried the version the stream started
-- with, made with the new params (stress seed 19 churn, filter).  It is
-- told when the ticket comes (_tell_owed), before any event can be
-- submitted (the join has not returned).
function Channel:_params_at_tell(inst, only)
  local ctx = self.ctx
  for _, a in ipairs(inst.dests or {}) do
    if not only or only[a] then
      local bound = true
      if a == ctx.addr then ctx.c:drain_local() else bound = ctx.c:bind_at(inst.dchid, a) end
      if bound then
        if inst.owed then inst.owed[a] = nil end
        ctx:_send_ctrl(a, { op = "params_at", ch = self.name, stream = inst.stream, key = inst.key })
      else
        inst.owed = inst.owed or {}
        inst.owed[a] = true
      end
    end
  end
  if inst.owed and next(inst.owed) == nil then inst.owed = nil end
end

-- The params_at tells owed since the stream could not be bound (a ticket
-- came: control.lua _take_ticket); one still not bindable stays owed.
function Channel:_tell_owed()
  for _, inst in pairs(self.mods) do
    if inst.owed then self:_params_at_tell(inst, inst.owed) end
  end
end

function Channel:_rekey(inst, key, m)
  local ctx = self.ctx
  self.mods[inst.key] = nil
  -- the old key's stream has no receivers left: its destinations hold
  -- their peers (never freed, peer_free_after) as long as they are set
  ctx.c:set_dests(inst.dchid, {})
  local s = type(m.stream) == "string" and m.stream or key
  local dchid, ok, err = ctx.c:channel(self:_derived_name(s))
  if dchid then
    self:_secure(dchid)
    ok, err = inst.moe:retarget(dchid)
  else
    ok, err = nil, ok                              -- (max_channels)
  end
  if ok then ok, err = inst.moe:params(m.params == nil and {} or m.params) end
  if not ok then
    ctx.moes[inst.id] = nil
    count_principals(ctx, inst.principals, -1)
    inst.moe:close()
    self:_refuse(key, err, m.dests)
    return nil
  end
  inst.key, inst.dchid, inst.dests, inst.stream = key, dchid, m.dests, s
  inst.runs.params = m.params == nil and {} or m.params
  inst.pseq = type(m.pseq) == "number" and m.pseq or 0
  self.mods[key] = inst
  return inst
end

-- New params for instance `inst` on its own stream: what it holds is sent
-- first (dequeued with the old params), then the params change between two
-- submits.  Its key becomes `key`.  Returns inst, or nil (failed: unloaded,
-- its consumers told).
function Channel:_params_here(inst, key, params, pseq)
  local ctx = self.ctx
  local ok, err = inst.moe:retarget(inst.dchid)
  for _, a in ipairs(inst.dests or {}) do
    if a == ctx.addr then ctx.c:drain_local() end   -- delivered here before the switch
  end
  if ok then ok, err = inst.moe:params(params == nil and {} or params) end
  if self.mods[inst.key] == inst then self.mods[inst.key] = nil end
  if not ok then
    ctx.moes[inst.id] = nil
    count_principals(ctx, inst.principals, -1)
    ctx.c:set_dests(inst.dchid, {})
    inst.moe:close()
    self:_rebuild_modlist()
    self:_refuse(key, err, inst.dests)
    return nil
  end
  inst.key, inst.pseq = key, type(pseq) == "number" and pseq or inst.pseq
  inst.runs.params = params == nil and {} or params
  self.mods[key] = inst
  return inst
end

-- A `params` request from the consumer context `from` (control.lua): new
-- params for the instance on stream msg.stream, in band.  Believed only
-- from the one context the manager's member list names as that instance's
-- consumer (keyed: the address is pinned to that member's key, so the
-- connection it came on proved it), for an instance no other context
-- shares, with a key that is the hash of its code, these params and the
-- stream, and a pseq above the last one applied.  Returns true, or nil,
-- why, code.
local MAX_KEY = 64
function Channel:_params_req(from, msg)
  local ctx = self.ctx
  local s, key, pseq = msg.stream, msg.key, msg.pseq
  if type(s) ~= "string" or #s == 0 or #s > MAX_KEY or type(key) ~= "string" or #key == 0
     or #key > MAX_KEY or type(pseq) ~= "number" or pseq < 1 or pseq % 1 ~= 0 or pseq >= 2 ^ 53
     or type(msg.params) ~= "table" then
    return nil, "a params message needs stream, key (strings), pseq (integer >= 1) and params (a table)",
           "protocol"
  end
  local inst
  for _, i in pairs(self.mods) do
    if i.stream == s then inst = i break end
  end
  if not inst then
    -- failed or refused here: said as such (the consumer goes through the
    -- manager, whose list installs the new params again)
    for k, why in pairs(self.failed) do
      for _, a in ipairs(self.failed_dests[k] or {}) do
        if a == from then return nil, ("modulator %s not running here: %s"):format(k, why), "failed" end
      end
    end
    return nil, ("no modulator on stream %s here"):format(s:sub(1, 16)), "notfound"
  end
  local mine = false
  for _, a in ipairs(inst.dests or {}) do mine = mine or a == from end
  if not mine then
    return nil, ("%s is not a consumer of the modulator on stream %s"):format(from, s:sub(1, 16)), "refused"
  end
  if #inst.dests ~= 1 then
    return nil, ("the modulator on stream %s is shared with %d other contexts here"):format(
      s:sub(1, 16), #inst.dests - 1), "busy"
  end
  if key == inst.key and pseq == inst.pseq then return true end   -- the manager's list came first
  if pseq <= (inst.pseq or 0) then
    return nil, ("params %d after %d: an older change"):format(pseq, inst.pseq), "refused"
  end
  local big = params_too_big(msg.params)
  if big then return nil, big, "refused" end
  if stream_key(inst.base, msg.params, s) ~= key then
    return nil, "the key is not the hash of the modulator, these params and the stream", "refused"
  end
  if not self:_params_here(inst, key, msg.params, pseq) then
    return nil, tostring(self.failed[key]), "failed"
  end
  return true
end

-- Never compiled: the LuaJIT of Debian bookworm (2.1.0~beta3+git20220320)
-- miscompiles a compiled next() (LuaJIT issue 829, fixed upstream on
-- 2022-04-05): when the register allocator moves lj_vm_next's result it
-- emits a 32-bit xchg, the slot pointer loses its upper half and the next
-- read of it segfaults.  The trace that did it here ran from the `params`
-- control message (control.lua) into the pairs(self.mods) loop above:
-- modulator_spec's in-process tests crashed the process in about 1 run in
-- 6 (gdb: call lj_vm_next; xchg eax, edx; rorx r11, [rdx+0x8] with rdx =
-- 0xf7c59dd8), none in 38 runs with the JIT off.  An aborted trace costs
-- nothing here: one call per params change.
if jit then jit.off(Channel._params_req) end

function Channel:_unload(inst, later)
  if self.ctx.moes[inst.id] == inst then count_principals(self.ctx, inst.principals, -1) end
  -- its stream's destinations go with it: set, they would keep their peers
  -- (a consumer that died) from being freed after peer_free_after
  self.ctx.c:set_dests(inst.dchid, {})
  self.ctx.moes[inst.id] = nil
  if self.mods[inst.key] == inst then self.mods[inst.key] = nil end
  if not later then return inst.moe:close() end
  -- later: its state is freed after this turn (a direct install answers
  -- first); it runs no more meanwhile (off the modulator list, which the
  -- caller rebuilds, and sending nowhere)
  local ctx = self.ctx
  ctx.moe_closing = ctx.moe_closing or {}
  local q = ctx.moe_closing
  q[#q + 1] = inst.moe
  if #q == 1 then
    ctx:after(0, function()
      local l = ctx.moe_closing
      ctx.moe_closing = nil
      for _, m in ipairs(l or {}) do m:close() end
    end)
  end
end

-- Logged once per kind ("refused" at install, "failed" while running) per
-- 10 s: a consumer that installs modulators in a loop must not flood the log.
function Channel:_refuse(key, err, dests, kind)
  local ctx = self.ctx
  self.failed[key] = err
  self.failed_dests[key] = dests
  ctx:_warn_limited("modulator " .. (kind or "refused"),
                    ("modulator %s on '%s' not running here: %s"):format(key, self.short, err))
  for _, a in ipairs(dests or {}) do
    -- a consumer believes it only from a producer with the channel bound
    -- there (control.lua): bound now if no event did yet
    if a ~= ctx.addr then ctx.c:bind_at(self.chid, a) end
    ctx:_send_ctrl(a, { op = "mod_error", ch = self.name, key = key, err = err, producer = ctx.addr })
  end
end

-- Contexts among `dests` that joined key `key` after it failed or was
-- refused here are told so too (review 4 of issue 28: they were told
-- nothing, their consumers got ok and then silence); they then ask for a
-- fresh instance under another key (Channel:_fresh).
function Channel:_tell_failed(key, dests)
  local had, fd = {}, self.failed_dests[key] or {}
  for _, a in ipairs(fd) do had[a] = true end
  local new = {}
  for _, a in ipairs(dests or {}) do
    if not had[a] then new[#new + 1] = a end
  end
  if #new == 0 then return end
  local all = {}
  for _, a in ipairs(fd) do all[#all + 1] = a end
  for _, a in ipairs(new) do all[#all + 1] = a end
  local err = self.failed[key]
  self:_refuse(key, err, new, "failed")
  self.failed_dests[key] = all
end

-- Consuming side: the keys whose instance failed or was refused at some
-- producer (a mod_error came), at most MAX_DEAD, the oldest forgotten
-- first.  A producer keeps such a key dead while a member list names it;
-- a consumer made later with the same modulator must not join it (it
-- would be told ok and get nothing): _fresh gives it another stream, so
-- another key, a fresh instance at every producer.  Consumers asking for
-- it after that share that one while it is alive.
local MAX_DEAD = 256
function Channel:_dead_key(key)
  local d = self.dead
  if not d then
    d = { keys = {}, order = {}, alias = {}, gen = 0 }
    self.dead = d
  end
  if d.keys[key] then return end
  d.keys[key] = true
  d.order[#d.order + 1] = key
  if #d.order > MAX_DEAD then
    local k = table.remove(d.order, 1)
    d.keys[k], d.alias[k] = nil, nil
  end
end

-- spec, or (its key dead here) the same modulator on a stream of this
-- context's own: a fresh instance.
function Channel:_fresh(spec)
  local d = self.dead
  if not d or not d.keys[spec.key] or spec.stream ~= spec.key then return spec end
  local a = d.alias[spec.key]
  if a and not d.keys[a.key] then return respec(spec, spec.params, 3, a.stream) end
  d.gen = d.gen + 1
  local s = respec(spec, spec.params, 3, core.hash(spec.key .. "|" .. self.ctx.addr .. "|" .. d.gen))
  d.alias[spec.key] = { key = s.key, stream = s.stream }
  return s
end

-- A running modulator failed (error, budget, memory): already unloaded.
function Channel:_mod_failed(inst, why)
  if self.mods[inst.key] ~= inst then return end
  self:_unload(inst)
  self:_rebuild_modlist()
  self:_refuse(inst.key, why, inst.dests, "failed")
end

-- For members_ok: the keys of `mods` refused or failed here.
function Channel:_mod_errors(mods)
  local errs
  for key, err in pairs(self.failed) do
    if type(mods) == "table" and mods[key] then
      errs = errs or {}
      errs[key] = err
    end
  end
  return errs
end

-- A modulator failed in this (producing) context: unloaded already; its
-- consumers are told, once the C call that found it has returned.  A sync
-- submit sees the failure at once (ch.failed): the one whose event made it
-- fail and every later one report it, whether a loop turn ran or not.
function Context:_moe_error(id, why)
  local inst = self.moes[id]
  if inst and inst.ch.mods[inst.key] == inst then
    inst.ch.failed[inst.key] = why
    inst.ch.failed_dests[inst.key] = inst.dests
  end
  self.moe_failed[#self.moe_failed + 1] = { id = id, why = why }
  if not self.moe_reaper then
    self.moe_reaper = self.c:timer(0, 0, function()
      self.moe_reaper = nil
      local list = self.moe_failed
      self.moe_failed = {}
      for _, f in ipairs(list) do
        local inst = self.moes[f.id]
        if inst then inst.ch:_mod_failed(inst, f.why) end
      end
    end)
  end
end

-- The stream of modulator `key` into this context, with its demodulators;
-- nil, err, code when its channel cannot be opened (max_channels).
function Channel:_attach(con, spec, handler)
  local ctx = self.ctx
  local sk = spec.stream or spec.key
  local st = self.streams[sk]
  if not st then
    local name = self:_derived_name(sk)
    local chid, err, code = ctx.c:channel(name)
    if not chid then return nil, err, code end
    st = { derived = true, short = self.short, key = sk,
           consumers = { short = self.short, derived = true }, chid = chid }
    -- given up here before (_end_watch): what comes from now on is delivered
    local recs = ctx.given_up and ctx.given_up[chid]
    if recs then
      for _, rec in ipairs(recs) do rec.upto = stream_events(ctx.c, chid) end
      ctx.given_up[chid] = nil
    end
    self.streams[sk] = st
    self:_secure(st.chid)
    ctx.bychid[st.chid] = st
    ctx.disp[st.chid] = st.consumers
    ctx.c:set_local(st.chid, true)
  end
  local e = { con = con, handler = handler, version = spec.version }
  st.consumers[#st.consumers + 1] = e
  con.chids[st.chid] = true
  return e
end

function Channel:_detach(e)
  e.detached = true
  for key, st in pairs(self.streams) do
    local list = st.consumers
    for i = #list, 1, -1 do
      if list[i] == e then table.remove(list, i) end
    end
    if #list == 0 then
      self.streams[key] = nil
      if self.ctx.bychid[st.chid] == st then
        self.ctx.bychid[st.chid] = nil
        self.ctx.disp[st.chid] = nil
      end
      if not self.ctx.closed then self.ctx.c:set_local(st.chid, false) end
    end
  end
end

-- The events that came on channel chid (over the wire and local).
local function stream_events(c, chid)
  local ein, _, eloc = c:chan_stats(chid)
  return (ein or 0) + (eloc or 0)
end

-- Bounds the wait for the in-band ends of stream `key` (channel chid) that
-- old entry `e` still takes after a switch: it is detached once the stream
-- was quiet for sync_timeout, however long the backlog before the ends
-- takes to drain (issue 13: a fixed sync_timeout from the switch cut a
-- slow consumer's backlog; the events after it went to no demodulator and
-- were counted nowhere).  Quiet: no event of it came for sync_timeout of
-- real time, and nothing that may be it waits unread: while bytes of the
-- producers it waits for wait in the kernel, the loop reads them first
-- (one more turn each time, for at most another sync_timeout: a producer
-- that streams on, on other channels, and never ends this one).  A context
-- that stalled (a long callback, a descheduled process, a turn whose
-- handlers ran longer than sync_timeout) has its backlog waiting unread:
-- not quiet (issue 26/27: the loop's clock stood still through a long
-- turn, the watch's timer armed on it was due at once and ran at the next
-- poll before the read; 167 events of a slow viewer's backlog reached no
-- demodulator).  A producer whose connection is lost ends its streams at
-- once (peer loss); this only bounds one that is connected but never ends
-- the stream (not while one of our handlers waits, holding back what comes
-- next from its peer).  Said in the log; what still comes of the stream is
-- counted in the consumer's stats (`undelivered`).  The timers are the
-- context's; they stop with `e`.
function Channel:_end_watch(e, key, chid)
  local ctx = self.ctx
  local c = ctx.c
  local function waiting()
    for a in pairs(e.ending or {}) do
      if c:peer_unread(a) > 0 then return true end
    end
    return false
  end
  local seen, reread_until = stream_events(c, chid), nil
  local check
  local function arm(t)
    c:now() -- the loop's clock moves on: this turn may have run long since it polled
    ctx:after(t, check)
  end
  function check()
    if e.detached or ctx.closed or e.con.entry == e then return end
    local n = stream_events(c, chid)
    -- a handler that waits holds back what comes next from its peer: not
    -- quiet, only waiting (ctx.held: the dispatches that wait)
    if n ~= seen or next(ctx.held) ~= nil then
      seen, reread_until = n, nil
      arm(ctx.sync_timeout)
      return
    end
    if waiting() then
      reread_until = reread_until or c:now() + ctx.sync_timeout
      if c:now() < reread_until then
        arm(0) -- after this turn's reads
        return
      end
    end
    local left = {}
    for a in pairs(e.ending or {}) do left[#left + 1] = tostring(a) end
    table.sort(left)
    if #left > 0 then
      ctx.log(("consumer on '%s': no end of the stream of modulator %s from %s after %g s"
               .. " without an event of it: what still comes of it is not delivered"
               .. " (counted: the consumer's stats, undelivered)")
              :format(self.short, key:sub(1, 8), table.concat(left, ", "), ctx.sync_timeout))
      -- what comes of it from now on: counted until the stream is used again
      local rec = { chid = chid, base = stream_events(c, chid) }
      local con = e.con
      con.given_up = con.given_up or {}   -- by chid: one record each
      local was = con.given_up[chid]
      if was then con.undelivered = (con.undelivered or 0) + (was.upto or rec.base) - was.base end
      con.given_up[chid] = rec
      ctx.given_up = ctx.given_up or {}
      local recs = ctx.given_up[chid] or {}
      recs[#recs + 1] = rec
      ctx.given_up[chid] = recs
    end
    self:_detach(e)
  end
  arm(ctx.sync_timeout)
end

-- A producer will send nothing more of stream `key` here: old entries
-- waiting for it are detached once no producer is left to wait for.  An
-- end that comes while the consumer's switch away from the stream still
-- waits for its reply (the producer applied the new list and said so on
-- its connection to us before the manager answered) is kept with the
-- version of the list that ended it (ver; nil: the producer is gone, it
-- ends everything), for the switch to match to its reply's version: an
-- end of an earlier use of the same key has an older version.  Without
-- this every params update kept its old stream, a channel and a timer for
-- sync_timeout (issue 13: 1,000 updates, 1,000 streams kept).
function Channel:_stream_ended(key, producer, ver)
  local st = self.streams[key]
  if not st then return end
  for _, e in ipairs({ unpack(st.consumers) }) do
    if e.ending then
      e.ending[producer] = nil
      if next(e.ending) == nil then self:_detach(e) end
    elseif e.leaving then
      e.early = e.early or {}
      e.early[producer] = ver or math.huge
    end
  end
end

-- A producer switched stream `st` to modulator `key` at this point of its
-- stream (control.lua params_at): its later events carry that key's version.
function Channel:_params_at(st, producer, key)
  for _, e in ipairs(st.consumers) do
    local v = e.vkeys and e.vkeys[key]
    if v then
      e.pver = e.pver or {}
      e.pver[producer] = v
    end
  end
end

function Channel:_tell_mod_error(key, msg)
  self:_dead_key(key)
  for _, con in ipairs({ unpack(self.all) }) do
    if con.mod and con.mod.key == key and not con.closed then
      con.mod_errors = con.mod_errors + 1
      if con.on_error then
        local ok, err = pcall(con.on_error, msg)
        if not ok then self.ctx.log("on_error handler failed: " .. tostring(err)) end
      else
        self.ctx.log(("consumer %s on '%s': %s"):format(con.id, self.short, msg))
      end
    end
  end
end

-- The errors a subscription reply reports for modulator `key`, as one string.
local function reply_errors(r, key)
  local out = {}
  for _, e in ipairs(type(r) == "table" and r.errors or {}) do
    if e.key == key then out[#out + 1] = ("modulator at %s: %s"):format(e.producer, e.err) end
  end
  if #out > 0 then return table.concat(out, "; ") end
end

M.spec = mod_spec
M.stream_key = stream_key
M.respec = respec
M._lua_stream_key = require("lecho.subs").lua_stream_key   -- (spec/params_cost_spec.lua compares the two)
M.reply_errors = reply_errors
M.stream_events = stream_events

return M
