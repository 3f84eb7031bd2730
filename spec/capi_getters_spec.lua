-- A C consumer's getters read an async event from its encoded bytes, in
-- place (core/capi/lecho_value.c, the C sink's lb_sink.bytes), and a sync
-- one from the Lua value (the Lua dispatch): they must say the same.
-- spec/support/capi_getters.c prints, for every event, what lecho_type,
-- lecho_get_number/_bool/_string, lecho_len, lecho_get_numbers and
-- lecho_get_array say of the slot and of a dozen fields (present, missing,
-- of every type, tables whose # is not their array part), then what needs
-- the Lua value (lecho_field, lecho_each) and a getter after it.  Every
-- value goes once async, once sync; the two lines must be equal.  A value
-- kept past its handler (lecho_set_value) keeps its array.
local S = require "spec.support"
local lecho = require "lecho"
local array = require "lecho.array"
local R = require "spec.support.rogue"

describe("a C consumer's getters", function()
  local bin

  setup(function()
    bin = S.capi_program(S.root .. "/spec/support/capi_getters.c")
  end)

  teardown(function() S.cleanup() end)

  it("say the same of an event read in place (async) as of its Lua value (sync)", function()
    local ctx = assert(lecho.context{ quiet = true })
    local built = {} -- what the C program builds and sends (before it runs: it sends at once)
    assert(ctx:channel("built"):consumer(function(ev) built[#built + 1] = ev end))
    local cc = S.spawn(("%s %s"):format(bin, S.sh_quote(ctx.addr)))
    assert(S.run_until(ctx, function() return (S.read(cc.out) or ""):find("ready") end, 30),
           "the C consumer did not start: " .. S.errors(cc))
    local big = array.new("<f8", { 1000 }) -- 8000 B: a view into the read buffer
    for i = 0, 999 do big[i] = i * 0.5 end
    local vals = {
      "hello", "", "a\0b", ("x"):rep(5000), 0, -7, 2 ^ 53, 1.25, -1e300, true, false,
      { s = "str\0ing", n = 42, d = -0.5, b = true, f = false, t = { 1, 2.5, 3 } },
      { t = { 1, "two", { 3 } }, h = { [1] = 1, [2] = 2, [5] = 5 }, m = { 1, 2, x = 3 } },
      { t = {}, h = { x = 1 }, n = 2 ^ 60, s = "" },
      { arr = big, small = array.from({ 1, 2, 3 }, "<i4"), nest = { x = "deep", y = { 1 } } },
      { s = 5, n = "5", b = 1, arr = "not an array", nest = 3 },
      { s = "pad", arr = array.from({ { 1, 2 }, { 3, 4 } }, "<u2"), small = array.from({ 9 }, "<u1") },
      { 1, 2, 3 }, big, { [1] = "a", [3] = "c" },
      { s = "first" }, -- a key whose value is a string, then one with a table key
      { [{ 1 }] = 1, s = "after a table key" },
    }
    local p = assert(ctx:channel("g"):producer())
    -- a rogue peer's event that is no value: its connection goes (the
    -- bytes are checked before the C consumer reads them), the C consumer
    -- goes on with every value below
    local caddr = S.output(cc):match("addr (%S+)")
    local r = assert(R.dial(caddr, { addr = "127.0.0.1:9" }))
    r:send(R.bind(0, ctx.addr .. "/g") .. R.event(0, 1, 1, 0, "\8garbage", true))
    local t0, closed, said = os.time(), false, nil
    repeat
      local t, body = r:read(0.2)
      if t == R.F.ERROR then said = body end
      closed = t == R.F.ERROR or (not t and body ~= "timeout")
      ctx:run_once(0.01)
    until closed or os.time() - t0 > 10
    assert.truthy(closed, "the rogue's connection stayed open")
    assert.truthy(said and said:find("malformed event value", 1, true), tostring(said))
    r:close()
    for _, v in ipairs(vals) do
      assert.is_true(p:submit(v))
      assert.is_true(p:submit_sync(v))
    end
    -- kept past the handler: sync first, then async (the last kept)
    local keep = { keep = true, arr = big, s = "kept" }
    assert.is_true(p:submit_sync(keep))
    assert.is_true(p:submit(keep))
    assert.is_true(p:submit("end"))
    assert.is_true(S.wait(cc, 30, ctx), "the C consumer did not exit: " .. S.errors(cc))
    assert.are.equal(0, cc.rc, S.errors(cc))
    local lines = {}
    for l in S.output(cc):gmatch("[^\n]+") do lines[#lines + 1] = l end
    -- built in C: the setters' results, the getters before and after the
    -- value became a Lua value, and what a Lua consumer got
    assert.are.equal("built rcs 0 0 0 0 0 0 0 " .. 6, table.remove(lines, 1)) -- LECHO_EINVAL last
    local b0, b1 = table.remove(lines, 1), table.remove(lines, 1)
    assert.are.equal(b0:gsub("^built0", ""), (b1:gsub("^built1", "")))
    assert.truthy(b0:find("[s t3 n6 b6 s8:7265706c61636564 ", 1, true), b0)
    assert.truthy(b0:find("[n t2 n0=1.5 ", 1, true), b0)
    assert.truthy(b0:find("[b t0 n7 b7 ", 1, true), b0)
    assert.truthy(table.remove(lines, 1):find("^addr "))
    assert.are.equal("ready", table.remove(lines, 1))
    assert.is_true(S.run_until(ctx, function() return #built == 2 end, 10))
    assert.are.same({ step = 1, name = "c-built", ok = false }, built[1])
    assert.are.same({ n = 1.5, s = "replaced", t = {} }, built[2])
    local last = table.remove(lines)
    assert.are.equal(2 * #vals + 2, #lines, S.output(cc))
    for i = 1, #lines, 2 do
      assert.are.equal(lines[i + 1], lines[i], ("value %d: async and sync differ"):format((i + 1) / 2))
    end
    assert.is_nil(S.output(cc):find("NOT-NUL-TERMINATED", 1, true))
    -- the arrays were read (not every line nil) and in place
    assert.truthy(lines[#lines - 1]:find("[arr t6", 1, true))
    assert.truthy(lines[#lines - 1]:find("a0=<f8/1/1000/1000/8/", 1, true))
    -- kept: its array still has its elements after the handlers returned
    local arr_desc = lines[#lines]:match("(%[arr [^%]]*%])")
    assert.truthy(arr_desc)
    assert.are.equal("kept 2: " .. arr_desc .. " " .. lines[#lines]:match("(%[s [^%]]*%])"), last)
    ctx:close()
  end)
end)
