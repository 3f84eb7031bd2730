-- Issue 12, point 4: several name servers (the `nameserver` option as a
-- list, ctx.nslist) and presence with leases (ctx:group, the name server's
-- gjoin/gleave/glist/gwatch ops).  Real processes on 127.0.0.1, ports chosen
-- by the OS, every wait bounded, every child killed at cleanup.
local lecho = require "lecho"
local S = require "spec.support"

-- The message fn(...) raises, without its position.
local function raised(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "did not raise")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

describe("the nameserver option", function()
  local ctx
  after_each(function()
    if ctx then ctx:close{ linger = 0 } end
    ctx = nil
    S.cleanup()
  end)

  it("takes one address: ctx.ns is it, ctx.nslist the list of it", function()
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = ns }
    assert.are.equal(ns, ctx.ns)
    assert.are.same({ ns }, ctx.nslist)
  end)

  it("is this context's own address in nslist when omitted (embedded name server)", function()
    ctx = lecho.context{ quiet = true }
    assert.are.equal(ctx.addr, ctx.ns)
    assert.are.same({ ctx.addr }, ctx.nslist)
  end)

  it("takes an ordered list: ctx.ns is the first, channels are looked up there", function()
    local _, a = S.nameserver("--quiet")
    local _, b = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = { b, a } }
    assert.are.same({ b, a }, ctx.nslist)
    assert.are.equal(b, ctx.ns)
    local ch = ctx:channel("x")
    assert.are.equal(ctx.ns .. "/x", ch.name)
    assert(ch:producer())
    -- the channel was made at the first name server, not at the second
    local chans = assert(ctx:list(ctx.ns))
    assert.is_table(chans[ctx.ns .. "/x"])
    chans = assert(ctx:list(a))
    assert.is_nil(chans[ctx.ns .. "/x"])
  end)

  it("refuses a list with an address twice, or a bad one, saying which", function()
    assert.are.equal("lecho: nameserver 127.0.0.1:7 is listed twice",
                     raised(lecho.context, { quiet = true, nameserver = { "127.0.0.1:7", "127.0.0.1:7" } }))
    assert.matches("^lecho: bad nameserver 'nope'",
                   raised(lecho.context, { quiet = true, nameserver = { "127.0.0.1:7", "nope" } }))
    assert.matches("^lecho%.context: nameserver must be an address string .* or a list of 1 to 16",
                   raised(lecho.context, { quiet = true, nameserver = {} }))
    local many = {}
    for i = 1, 17 do many[i] = "127.0.0.1:" .. i end
    assert.matches("list of 1 to 16", raised(lecho.context, { quiet = true, nameserver = many }))
    assert.are.equal("lecho.context: manager takes one nameserver (the name server it registers with), not a list",
                     raised(lecho.context, { quiet = true, manager = true,
                                             nameserver = { "127.0.0.1:7", "127.0.0.1:8" } }))
  end)
end)
