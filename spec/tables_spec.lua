-- Proves lecho.tables, the table helpers the client side and the name
-- server's side share (issue 26: one module, where there were three deep
-- equalities and a sorted_keys the clients took from the registry).  No
-- processes.

local tables = require "lecho.tables"

describe("lecho.tables", function()
  it("sorted_keys lists every key once, sorted", function()
    local t = {}
    for i = 1, 200 do t["k" .. string.format("%03d", (i * 37) % 200)] = i end
    local ks = tables.sorted_keys(t)
    assert.are.equal(200, #ks)
    for i = 2, #ks do assert.is_true(ks[i - 1] < ks[i]) end
    assert.are.same({}, tables.sorted_keys({}))
    assert.are.same({ 1, 2, 10 }, tables.sorted_keys({ [10] = true, [2] = true, [1] = true }))
  end)

  it("same compares values by content, NaN as NaN, keys both ways", function()
    local nan = 0 / 0
    assert.is_true(tables.same(1, 1))
    assert.is_true(tables.same(nan, nan))
    assert.is_false(tables.same(1, "1"))
    assert.is_true(tables.same({ a = { 1, 2, { x = nan } }, b = "s" }, { b = "s", a = { 1, 2, { x = nan } } }))
    assert.is_false(tables.same({ a = 1 }, { a = 1, b = 2 }))
    assert.is_false(tables.same({ a = 1, b = 2 }, { a = 1 }))
    assert.is_false(tables.same({ { 1 } }, { { 2 } }))
    assert.is_false(tables.same({}, 0))
  end)

  it("same tells apart tables nested deeper than SAME_DEPTH, and raises on none", function()
    local function nest(n)
      local t = { v = 1 }
      for _ = 1, n do t = { t } end
      return t
    end
    local d = tables.SAME_DEPTH
    assert.is_true(tables.same(nest(d - 1), nest(d - 1)))
    assert.is_false(tables.same(nest(d + 1), nest(d + 1)))
    -- a cycle is bounded too (never a stack overflow)
    local a, b = {}, {}
    a.x, b.x = a, b
    assert.is_false(tables.same(a, b))
  end)
end)
