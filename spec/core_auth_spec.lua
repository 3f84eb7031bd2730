-- core_auth_spec.lua: the binding's keys and identities (core/binding/lua_auth.c):
-- keypairs, signatures, hex, and the context's identity, trust and pins.
local core = require "lecho.core"

describe("core keys", function()
  it("makes Ed25519 keypairs whose signatures verify, and only theirs", function()
    local pk, sk = core.keypair()
    assert.equal(32, #pk)
    assert.equal(64, #sk)
    local sig = core.sign(sk, "msg")
    assert.equal(64, #sig)
    assert.is_true(core.verify(pk, "msg", sig))
    assert.is_false(core.verify(pk, "msh", sig))
    assert.is_false(core.verify((core.keypair()), "msg", sig))
    assert.is_false(core.verify(pk, "msg", sig:sub(2)))
  end)

  it("round-trips hex and refuses bad hex", function()
    local pk = core.keypair()
    assert.equal(64, #core.hex(pk))
    assert.equal(pk, core.unhex(core.hex(pk)))
    assert.equal("00ff", core.hex("\0\255"))
    local v, err, code = core.unhex("0g")
    assert.is_nil(v)
    assert.equal("invalid", code)
    assert.truthy(err)
    assert.is_nil((core.unhex("abc")))
  end)
end)

describe("context identity", function()
  local ctx
  before_each(function() ctx = core.new{} end)
  after_each(function() ctx:close() end)

  it("is unkeyed until set_identity, then signs with it", function()
    local pk, sk = core.keypair()
    assert.is_false(ctx:keyed())
    local s, err, code = ctx:sign("x")
    assert.is_nil(s)
    assert.equal("invalid", code)
    assert.matches("no identity", err)
    assert.is_true(ctx:set_identity(sk, "alice"))
    assert.is_true(ctx:keyed())
    assert.is_true(core.verify(pk, "x", ctx:sign("x")))
  end)

  it("refuses bad names and secret keys whose public half is not their own", function()
    local pk, sk = core.keypair()
    local pk2 = core.keypair()
    local ok, err, code = ctx:set_identity(sk, "a b")
    assert.is_nil(ok)
    assert.equal("invalid", code)
    assert.matches("bad principal name", err)
    assert.is_nil((ctx:set_identity(sk, ("x"):rep(65))))
    assert.is_true(ctx:set_identity(sk, ("x"):rep(64)))
    ok, err = ctx:set_identity(sk:sub(1, 32) .. pk2, "alice")
    assert.is_nil(ok)
    assert.matches("does not match", err)
    assert.has_error(function() ctx:set_identity("short", "alice") end)
    assert.equal(32, #pk)
  end)

  it("keeps trust and pins; no peer identity before a connection authenticated", function()
    local pk = core.keypair()
    assert.is_true(ctx:trust_key(pk, "bob"))
    assert.is_nil((ctx:trust_key(pk, "b/ob")))
    assert.is_true(ctx:trust_authority(pk))
    assert.is_true(ctx:expect("127.0.0.1:9", pk))
    assert.is_nil(ctx:peer_identity("127.0.0.1:9"))
    assert.has_error(function() ctx:expect("127.0.0.1:9", "short") end)
  end)

  it("stores a channel's manager key and ticket, for channels that exist", function()
    local pk, sk = core.keypair()
    local chid = ctx:channel("ns/c")
    ctx:chan_manager_key(chid, pk)
    ctx:chan_ticket(chid, ("\0"):rep(8) .. core.sign(sk, "t"))
    assert.has_error(function() ctx:chan_ticket(chid + 1, ("\0"):rep(8) .. core.sign(sk, "t")) end)
    assert.has_error(function() ctx:chan_ticket(chid, core.sign(sk, "t")) end)   -- v1: no expiry
    assert.equal(0, ctx:stats().channels["ns/c"].refused)
  end)
end)

-- u64 big-endian of Unix time t: a ticket's first 8 bytes
local function ticket_exp(t)
  local b = {}
  for i = 7, 0, -1 do b[#b + 1] = string.char(math.floor(t / 2 ^ (8 * i)) % 256) end
  return table.concat(b)
end

describe("two keyed contexts (binding)", function()
  local a, b
  after_each(function()
    if a then a:close() end
    if b then b:close() end
    a, b = nil, nil
  end)

  it("authenticate each other, deliver a ticketed channel and refuse an unticketed one", function()
    local pa, sa = core.keypair()
    local pb, sb = core.keypair()
    local pm, sm = core.keypair()
    a, b = core.new{}, core.new{}
    assert(a:set_identity(sa, "a"))
    assert(b:set_identity(sb, "b"))
    assert(a:trust_key(pb, "b"))
    assert(b:trust_key(pa, "a"))
    local aaddr = assert(a:listen("127.0.0.1:0"))
    local baddr = assert(b:listen("127.0.0.1:0"))
    local got = {}
    a:hooks{ event = function(_, value) got[#got + 1] = value return false end, log = function() end }
    b:hooks{ log = function() end }
    local ax, ay = a:channel("ns/x"), a:channel("ns/y")
    a:set_local(ax, true)
    a:set_local(ay, true)
    a:chan_manager_key(ax, pm)
    a:chan_manager_key(ay, pm)
    local bx, by = b:channel("ns/x"), b:channel("ns/y")
    local exp = ticket_exp(os.time() + 3600)
    b:chan_ticket(bx, exp .. core.sign(sm, "lecho-producer-v2\0ns/x\0" .. pb .. exp))
    b:set_dests(bx, { aaddr })
    b:set_dests(by, { aaddr })
    assert(b:submit(bx, 1, 1, "v1", false, "block"))
    assert(b:submit(by, 1, 1, "v2", false, "block"))
    local function refused()
      local p = a:stats().peers[baddr]
      return p and p.refused or 0
    end
    for _ = 1, 400 do
      a:run_once(0.005)
      b:run_once(0.005)
      if #got >= 1 and refused() >= 1 then break end
    end
    assert.same({ "v1" }, got)
    assert.equal(1, refused())
    assert.equal(1, a:stats().channels["ns/y"].refused)
    assert.equal(0, a:stats().channels["ns/x"].refused)
    local name, pk = a:peer_identity(baddr)
    assert.equal("b", name)
    assert.equal(pb, pk)
    name, pk = b:peer_identity(aaddr)
    assert.equal("a", name)
    assert.equal(pa, pk)
  end)

  it("without keys, listens on loopback only (protected mode)", function()
    a = core.new{}
    local ok, err, code = a:listen("0.0.0.0:0")
    assert.is_nil(ok)
    assert.equal("invalid", code)
    assert.matches("without keys %(protected mode%)", err)
    b = core.new{}
    local _, sk = core.keypair()
    assert(b:set_identity(sk, "k"))
    assert.truthy(b:listen("0.0.0.0:0"))
  end)
end)
