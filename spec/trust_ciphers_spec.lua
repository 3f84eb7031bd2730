-- Record ciphers (doc/protocol.md section 3, "Record ciphers"; issue 27
-- item 4): a keyed context offers AES-256-GCM (where the CPU has AES-NI)
-- and ChaCha20-Poly1305 in a mode 2 HELLO, and the acceptor chooses.
-- Played by the rogue (spec/support/rogue.lua, written from the protocol
-- page, its AEADs libsodium's one-shot functions, not the core's) as the
-- name server a real producer process dials, with two busy loops beside:
--   * an acceptor that offers both: the records are AES-256-GCM, and what
--     the producer sends (its lookup) opens with the rogue's AES;
--   * an acceptor with ChaCha20-Poly1305 only: the records are ChaCha;
--   * a v3 acceptor of before the offer (it refuses mode 2 with "bad mode
--     in handshake", as lecho did): the producer dials again in mode 1,
--     says so first ({ op = "reply", rid = 0, fallback = ... }, which an old
--     peer drops) and its lookup follows, over ChaCha20-Poly1305.
-- The man in the middle who edits the offer or forges that refusal between
-- two contexts: core/test/test_auth.c test_downgrade.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/trust_ciphers_spec.lua

local cjson = require "cjson"
local keys = require "lecho.keys"
local S = require "spec.support"
local R = require "spec.support.rogue"

-- A producer of "temp" whose name server is opts.ns (the rogue): its
-- lookup is the first request it sends there.
local CHILD = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = assert(lecho.context{ nameserver = opts.ns, key = opts.key, trust = opts.trust, timeout = 8,
  log = function(m) io.stdout:write("log ", m, "\n") end })
local ch = ctx:channel("temp")
local p, err = ch:producer()
io.stdout:write("end ", tostring(p ~= nil), " ", tostring(err), "\n")
ctx:close()
]]

local function keygen(args)
  local out = S.sh_out(("%s %s/scripts/lecho-keygen %s"):format(S.luajit, S.root, args))
  assert(out:find("rc=0\n", 1, true), out)
end

describe("record ciphers (issue 27 item 4)", function()
  local dir, trust, ns

  before_each(function()
    dir = S.tmpname("ciphers")
    keygen(("--dir %s --authority ca --valid-for 2d"):format(dir))
    keygen(("--dir %s --sign-with %s/ca.key nameserver prod --valid-for 1d"):format(dir, dir))
    trust = { dir .. "/ca.pub" }
    local k = assert(keys.read_secret(dir .. "/nameserver.key"))
    ns = { pk = k.public, sk = k.secret, name = "nameserver", cert = k.cert }
    for _ = 1, 2 do
      S.spawn(("%s -e 'local t = os.time() + 60 while os.time() < t do end'"):format(S.luajit))
    end
  end)

  after_each(function() S.cleanup() end)

  local function producer(srv)
    return S.lua(CHILD, cjson.encode{ ns = srv.addr, key = dir .. "/prod.key", trust = trust })
  end

  -- The control messages p reads within `secs`, decoded, in order.
  local function ctrls(p, secs)
    p:drain(secs)
    local got = {}
    for _, e in ipairs((p:learnt())) do
      if e.msg then got[#got + 1] = e.msg end
    end
    return got
  end

  local function lookup_in(msgs)
    for _, m in ipairs(msgs) do
      if m.op == "lookup" and m.ch and m.ch:find("/temp", 1, true) then return m end
    end
  end

  it("agrees on AES-256-GCM with an acceptor that offers it, else on ChaCha20-Poly1305", function()
    for _, case in ipairs{ { offer = R.AES .. R.CHACHA, want = R.aes_available() and R.AES or R.CHACHA },
                           { offer = R.CHACHA, want = R.CHACHA } } do
      local srv = assert(R.listen())
      local c = producer(srv)
      local p, err = srv:accept{ addr = srv.addr, key = ns, offer = case.offer, timeout = 15 }
      assert(p, "the producer did not dial: " .. tostring(err) .. S.errors(c))
      assert.are.equal(2, p.remote.mode)                     -- it offered
      local want_offer = R.aes_available() and R.AES .. R.CHACHA or R.CHACHA
      assert.are.equal(want_offer, p.remote.suites)
      assert.are.equal(case.want, p.suite)
      local msgs = ctrls(p, 3)
      assert.truthy(lookup_in(msgs), "no lookup came through the records: " .. cjson.encode(msgs))
      p:close()
      srv:close()
    end
  end)

  it("falls back to mode 1 (ChaCha20-Poly1305) for a v3 acceptor of before the offer, and says so first", function()
    local srv = assert(R.listen())
    local c = producer(srv)
    local p, err = srv:accept{ addr = srv.addr, key = ns, old = true, timeout = 15 }
    assert.is_nil(p)
    assert.are.equal("refused the offer (old)", err)
    -- dialled again at once, in mode 1
    p, err = srv:accept{ addr = srv.addr, key = ns, old = true, timeout = 5 }
    assert(p, "no second dial: " .. tostring(err) .. S.errors(c))
    assert.are.equal(1, p.remote.mode)
    assert.is_nil(p.suite)                                   -- ChaCha20-Poly1305
    local msgs = ctrls(p, 3)
    assert.truthy(msgs[1], "nothing came")
    assert.are.same({ op = "reply", rid = 0, fallback = "cipher offer refused" }, msgs[1])
    assert.truthy(lookup_in(msgs), "no lookup after the marker: " .. cjson.encode(msgs))
    p:close()
    srv:close()
  end)
end)
