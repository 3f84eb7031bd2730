-- Modulator keys that cannot be made to collide (issue 26, a trust
-- defect: "every message is believed only from whom it may come").  A key
-- names a modulator's code and params between peers: a producer joins a
-- consumer to the instance running under its key.  Keys were FNV-1a 64
-- (core.hash); the two pairs below, found by a Pollard rho search with
-- distinguished points in ~2 minutes of one loaded core each, give one
-- key for two modulator sources (A, B) and for two params of one source
-- (P1, P2).  With such a pair a consumer installed B straight at a
-- producer (an `install`, not told to the manager) under the key of a
-- victim's A; the victim, joining through the manager, was joined to B's
-- instance and took B's output for A's.  Now keys are BLAKE2b-256
-- (64 hex digits) and, in depth, an instance or entry found under a key
-- must run that entry's code and params: the same attack in a world of
-- the old hash (every process's core.hash FNV again) gives the victim its
-- own modulator's output and the attacker a clear refusal.

local S = require "spec.support"
local P = require "spec.support.proc"
local cjson = require "cjson"
local lecho = require "lecho"
local core = require "lecho.core"
local modulator = require "lecho.modulator"
local subs = require "lecho.subs"
local K = require "spec.children"
local PRODUCER, TAG = K.field_producer, K.tag_modulator

-- Two sources of one FNV-1a 64 base (and key), as lecho hashed them before
-- (the offset basis 1469598103934665603, as core.hash had it).
local REST = "\"\nfunction enqueue(ev) ev.mod = T return ev end\n"
local TA, TB = "JtzJNMqes8G", "jZhFZeSAdjH"
local A, B = "local T=\"" .. TA .. REST, "local T=\"" .. TB .. REST
-- Two params of TAG of one FNV-1a 64 key.
local P1, P2 = "HlDByRuhsnI", "rVWYb18.H3F"

local OLD = [[
local bit = require "bit"
local function fnv(s)
  local h = 1469598103934665603ULL
  for i = 1, #s do h = bit.bxor(h, s:byte(i)) * 1099511628211ULL end
  return bit.tohex(h, 16)
end
]]
local fnv = assert(loadstring(OLD .. "return fnv"))()

-- The old hash in this process (undone by the returned function).
local function old_hash_here()
  local h, sk = core.hash, core.stream_key
  core.hash, core.stream_key = fnv, function() return nil end
  return function() core.hash, core.stream_key = h, sk end
end

-- A LUA_INIT file giving every child whose environment names it the old
-- hash: lecho.core loaded from this tree's core.so, its hash FNV-1a 64.
local function old_hash_init()
  local so = assert(package.searchpath("lecho.core", package.cpath))
  if so:sub(1, 1) ~= "/" then so = os.getenv("PWD") .. "/" .. so end
  return S.write(S.tmpname("oldhash") .. ".lua", OLD .. ([[
package.preload["lecho.core"] = function(...)
  local core = assert(package.loadlib(%q, "luaopen_lecho_core"))(...)
  core.hash, core.stream_key = fnv, function() return nil end
  return core
end
]]):format(so))
end

describe("modulator keys", function()
  after_each(function() S.cleanup() end)

  it("are BLAKE2b-256, 64 hex digits, in Lua and C alike; two sources (two params) of one FNV-1a 64"
     .. " key have two", function()
    -- the pairs are what they are said to be (the old hash of their text)
    local canon = function(v) return table.concat(subs.canon(v, {})) end
    assert.are.equal(fnv(canon{ A, 0, {} }), fnv(canon{ B, 0, {} }))
    local tb = fnv(canon{ TAG, 0, {} })
    assert.are.equal(fnv(tb .. canon{ tag = P1 }), fnv(tb .. canon{ tag = P2 }))
    -- the hash (BLAKE2b-256 of "abc", RFC 7693's vector for 256 bits)
    assert.are.equal("bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319", core.hash("abc"))
    local a, b = modulator.spec(A, {}, nil, nil, 1), modulator.spec(B, {}, nil, nil, 1)
    for _, k in ipairs{ a.base, a.key, b.base, b.key } do assert.matches("^" .. ("%x"):rep(64) .. "$", k) end
    assert.are_not.equal(a.base, b.base)
    assert.are_not.equal(a.key, b.key)
    local p1, p2 = modulator.spec(TAG, { tag = P1 }, nil, nil, 1), modulator.spec(TAG, { tag = P2 }, nil, nil, 1)
    assert.are.equal(p1.base, p2.base)
    assert.are_not.equal(p1.key, p2.key)
    -- C (params whose text it is certain of) and Lua make one key
    for _, params in ipairs{ {}, { tag = P1 }, { a = { 1, 2, true }, b = "x" } } do
      assert.are.equal(subs.lua_stream_key(a.base, params), core.stream_key(a.base, params))
      assert.are.equal(subs.lua_stream_key(a.base, params, a.key), core.stream_key(a.base, params, a.key))
    end
  end)

  -- A name server, a producer of "field", a victim context and an attacker
  -- context (a plain consumer: a member of the manager's list).  The
  -- attacker installs `atk` ({ src, params }) straight at the producer,
  -- never telling the manager; then the victim asks for `vic` ({ src,
  -- params }) through the manager.  `init`: a LUA_INIT file for the
  -- children; `api`: the attacker asks through the API (a consumer with
  -- its modulator, the manager told) instead, and what it got is returned
  -- too.  Returns what the victim's consumer got (ev[field] of each event),
  -- a second install's reply, the producer's log, whether the two keys
  -- were one.
  local function attack(vic, atk, field, init, api)
    local env = init and ("LUA_INIT=@" .. init .. " ") or ""
    local _, ns = P.nameserver{ root = S.root, luajit = S.luajit, port_file = S.tmpname("ns-addr"),
                                args = { "--for", "600", "--settle", "0", "--quiet" },
                                start = function(argv) return S.spawn(env .. P.sh_join(argv)) end }
    assert(ns, "no name server")
    local vctx = lecho.context{ nameserver = ns, quiet = true }
    local actx = lecho.context{ nameserver = ns, quiet = true }
    local vch, ach = vctx:channel("field"), actx:channel("field")
    local function serve(pred, t)
      return S.run_until(vctx, function() actx:run_once(0) return pred() end, t)
    end
    local n = 0
    assert(ach:consumer(function() n = n + 1 end))
    local file = S.write(S.tmpname("script") .. ".lua", PRODUCER)
    local prod = S.spawn(("%s%s %s %s"):format(env, S.luajit, file,
                                               P.sh_join{ cjson.encode{ ns = ns, secs = 30, linger = 0.5 } }))
    local paddr = assert(S.wait_file(prod.out, "ready", 20), S.errors(prod)):match("ready (%S+)")
    assert(serve(function() return n >= 20 end, 30), "no events: " .. S.errors(prod))
    local key = modulator.spec(atk.src, atk.params, nil, nil, 1).key
    local agot = {}
    if api then
      assert(ach:consumer(function(ev) if not ev.done then agot[#agot + 1] = ev[field] end end,
                          { modulator = atk.src, params = atk.params }))
    else
      local r, err, code = actx:request(paddr, { op = "install", ch = ach.name, sseq = 1e9,
        mods = { [key] = { src = atk.src, params = atk.params, caps = {} } } }, 5)
      assert(r, "the attacker's install: " .. tostring(err) .. " " .. tostring(code))
    end
    serve(function() return false end, 0.3)
    local got = {}
    local con, cerr = vch:consumer(function(ev) if not ev.done then got[#got + 1] = ev[field] end end,
                                   { modulator = vic.src, params = vic.params })
    assert(con, "the victim's consumer: " .. tostring(cerr))
    assert(serve(function() return #got >= 30 and (not api or #agot >= 30) end, 30),
           "the victim got nothing: " .. S.errors(prod))
    -- a second attacker, now, in the victim's instance: refused
    local r2, err2, code2 = actx:request(paddr, { op = "install", ch = ach.name, sseq = 2e9,
      mods = { [con.mod.key] = { src = atk.src, params = atk.params, caps = {} } } }, 5)
    vctx:close(); actx:close()
    return got, { r2, err2, code2 }, S.errors(prod), con.mod.key == key, agot
  end

  local function all(list, v)
    for _, x in ipairs(list) do if x ~= v then return false end end
    return #list > 0
  end

  it("a victim's modulator and an attacker's of one old key (sources): the victim gets its own's output",
     function()
    local got = attack({ src = A, params = {} }, { src = B, params = {} }, "mod")
    assert(all(got, TA), "the victim got another modulator's output: " .. cjson.encode(got))
  end)

  it("a victim's modulator and an attacker's of one old key (params): the victim gets its own's output",
     function()
    local got = attack({ src = TAG, params = { tag = P1 } }, { src = TAG, params = { tag = P2 } }, "tag")
    assert(all(got, P1), "the victim got output made with another's params: " .. cjson.encode(got))
  end)

  it("two consumers asking through the API for two modulators of one old key: each gets its own's output"
     .. " (the second was refused by the manager)", function()
    local got, _, _, _, agot = attack({ src = A, params = {} }, { src = B, params = {} }, "mod", nil, true)
    assert(all(got, TA), "the victim got another modulator's output: " .. cjson.encode(got))
    assert(all(agot, TB), "the other got another modulator's output: " .. cjson.encode(agot))
  end)

  -- Found beside it: the manager compared the params of two contexts'
  -- entries under one key with a deep equality that tells arrays apart by
  -- identity, so the second consumer of a modulator with array params (one
  -- key: arrays are hashed by content) was refused as "another modulator".
  it("two contexts asking for one modulator with array params share it (the second was refused)", function()
    local array = require "lecho.array"
    local _, ns = S.nameserver("--quiet")
    local c1 = lecho.context{ nameserver = ns, quiet = true }
    local c2 = lecho.context{ nameserver = ns, quiet = true }
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, secs = 30, linger = 0.5 })
    assert(S.wait_file(prod.out, "ready", 20), S.errors(prod))
    local got = { 0, 0 }
    local cons = {}
    for i, c in ipairs{ c1, c2 } do
      local params = { tag = 7, w = array.from({ 1, 2, 3 }, "<f8") }
      cons[i] = assert(c:channel("field"):consumer(function(ev) if ev.tag == 7 then got[i] = got[i] + 1 end end,
                                                   { modulator = TAG, params = params }))
    end
    assert.are.equal(cons[1].mod.key, cons[2].mod.key)
    assert(S.run_until(c1, function() c2:run_once(0) return got[1] >= 20 and got[2] >= 20 end, 30),
           "events: " .. got[1] .. ", " .. got[2] .. " " .. S.errors(prod))
    c1:close(); c2:close()
  end)

  describe("in a world of the old hash (keys collide): a producer believes a key only with its code and params",
           function()
    local undo
    before_each(function() undo = old_hash_here() end)
    after_each(function() undo() end)

    for _, c in ipairs{ { "sources", { src = A, params = {} }, { src = B, params = {} }, "mod", TA },
                        { "params", { src = TAG, params = { tag = P1 } }, { src = TAG, params = { tag = P2 } },
                          "tag", P1 } } do
      it(c[1] .. ": the victim gets its own modulator's output, the attacker a clear refusal", function()
        local got, second, log, one = attack(c[2], c[3], c[4], old_hash_init())
        assert.is_true(one, "the pair does not collide under the old hash here")
        assert(all(got, c[5]), "the victim got another modulator's output: " .. cjson.encode(got))
        -- the attacker's direct set went when the victim's entry came
        assert.matches("another context's modulator of other code or params has that key here", log)
        -- installing into the victim's running instance: refused
        assert.is_nil(second[1])
        assert.are.equal("refused", second[3], second[2])
        assert.matches("the instance under that key here runs other code or params", second[2])
      end)
    end
  end)
end)
