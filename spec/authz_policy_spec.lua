-- Proves lecho.policy (doc/security.md): a policy file, Lua (run in an empty
-- environment) or JSON, read into rules that grant principals (names or
-- globs) actions on channels (names or globs); what no rule grants is
-- refused with "not allowed: <principal> may not <action> <channel>"; a
-- malformed file is refused with its path and what is wrong.
--
-- Run: LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" LUA_CPATH="$PWD/lua/?.so;;" \
--   luajit /usr/bin/busted spec/authz_policy_spec.lua

local policy = require "lecho.policy"
local S = require "spec.support"

local function file(text, ext)
  return S.write(S.tmpname("policy") .. (ext or ".lua"), text)
end

local RULES = [[
return {
  rules = {
    { principal = "sim", channel = "atmos/*", allow = { "produce" } },
    { principal = { "viewer-*", "ops" }, channel = { "atmos/*", "demo" }, allow = { "consume", "list", "modulate" },
      caps = { "clock" } },
    { principal = "mgr-*", channel = "*", allow = "manage" },
    { principal = "*", channel = "public/*", allow = { "consume", "modulate" } },
  },
}
]]

describe("lecho.policy", function()
  after_each(function() S.cleanup() end)

  it("matches globs in time linear in the name, whatever the pattern", function()
    local g = policy.glob
    assert.is_true(g("*", ""))
    assert.is_true(g("*", "any/thing"))
    assert.is_true(g("atmos/*", "atmos/ozone"))
    assert.is_false(g("atmos/*", "atmosphere"))
    assert.is_true(g("a*b*c", "axxbyyc"))
    assert.is_false(g("a*b*c", "axxbyy"))
    assert.is_true(g("*.*", "a.b"))
    assert.is_false(g("abc", "abcd"))
    assert.is_false(g("abcd", "abc"))
    assert.is_true(g("a**", "a"))
    local t0 = os.clock()
    assert.is_false(g(("*a"):rep(30) .. "*b", ("a"):rep(1000)))
    assert(os.clock() - t0 < 1, "glob backtracks without bound")
  end)

  it("names channels without their name server and without a derived stream's key", function()
    assert.are.equal("atmos/ozone", policy.base_name("127.0.0.1:7700/atmos/ozone"))
    assert.are.equal("atmos/ozone", policy.base_name("127.0.0.1:7700/atmos/ozone@1f2e"))
    assert.are.equal("a@b/c", policy.base_name("[::1]:7700/a@b/c@k"))
    assert.are.equal("feed", policy.base_name("unix:/run/l.sock//feed"))
    assert.are.equal("plain", policy.base_name("plain"))
  end)

  -- (the outside attack of issue 23 read "NS/public@x/secret" as a derived
  -- stream of "public": by the protocol's rule it is a base channel of its
  -- own, "public@x/secret"; one function gives that rule to the policy,
  -- the manager's tickets and, in C, core/transport/auth.c's base_len)
  it("uses the protocol's base name, one function for the policy and the manager's tickets", function()
    local addr, membership = require "lecho.addr", require "lecho.ns.membership"
    local cases = {
      ["127.0.0.1:7700/public@x/secret"] = "127.0.0.1:7700/public@x/secret",
      ["127.0.0.1:7700/public@x/secret@k1"] = "127.0.0.1:7700/public@x/secret",
      ["127.0.0.1:7700/public@k1"] = "127.0.0.1:7700/public",
      ["127.0.0.1:7700/a/b@k@j"] = "127.0.0.1:7700/a/b",
      ["unix:/run/l.sock//feed@k"] = "unix:/run/l.sock//feed",
    }
    for full, base in pairs(cases) do
      assert.are.equal(base, addr.base(full), full)
      assert.are.equal(base, membership.base_of(full), full)
      assert.are.equal(select(2, addr.split(base)), policy.base_name(full), full)
    end
    assert.are.equal(addr.base, membership.base_of)
    -- a rule for "public" (and its derived streams) grants nothing on
    -- "public@x/secret"; a glob "public*" does: `*` matches any bytes, '/'
    -- and '@' included (doc/security.md)
    local p = assert(policy.new{ rules = { { principal = "v", channel = "public", allow = "consume" } } })
    assert.is_true(p:check("v", "consume", "127.0.0.1:7700/public@k1"))
    assert.is_nil(p:check("v", "consume", "127.0.0.1:7700/public@x/secret"))
    p = assert(policy.new{ rules = { { principal = "v", channel = "public*", allow = "consume" } } })
    assert.is_true(p:check("v", "consume", "127.0.0.1:7700/public@x/secret"))
  end)

  it("loads a Lua policy and grants only what its rules say", function()
    local p = assert(policy.load(file(RULES)))
    assert.is_true(p:check("sim", "produce", "127.0.0.1:7700/atmos/ozone"))
    assert.are.same({ nil, "not allowed: sim may not consume atmos/ozone" },
                    { p:check("sim", "consume", "127.0.0.1:7700/atmos/ozone") })
    assert.are.same({ nil, "not allowed: sim may not produce other" }, { p:check("sim", "produce", "other") })
    assert.is_true(p:check("viewer-1", "consume", "127.0.0.1:7700/atmos/ozone@abc"))
    assert.is_true(p:check("ops", "list", "demo"))
    assert.is_true(p:check("viewer-1", "modulate", "atmos/x", { "clock" }))
    assert.are.same({ nil, "not allowed: viewer-1 may not modulate with clock, log atmos/x" },
                    { p:check("viewer-1", "modulate", "atmos/x", { "clock", "log" }) })
    assert.is_true(p:check("anyone", "modulate", "public/a"))
    assert.are.same({ nil, "not allowed: anyone may not modulate with clock public/a" },
                    { p:check("anyone", "modulate", "public/a", { "clock" }) })
    assert.is_true(p:check("mgr-2", "manage", "x/y"))
    assert.is_true(p:check("mgr-2", "manage"))                  -- on some channel
    assert.are.same({ nil, "not allowed: sim may not manage any channel" }, { p:check("sim", "manage") })
    assert.is_false(p:allows("simulator", "produce", "atmos/ozone"))
  end)

  it("loads the same policy from JSON, and travels as its plain table", function()
    local j = assert(policy.load(file([[
      { "lecho": "policy", "version": 1,
        "rules": [ { "principal": "sim", "channel": "atmos/*", "allow": ["produce"] },
                   { "principal": "v*", "channel": "*", "allow": ["consume", "modulate"], "caps": ["log"] } ] }
    ]], ".json")))
    assert.is_true(j:allows("sim", "produce", "atmos/a"))
    assert.is_true(j:allows("viewer", "modulate", "x", { "log" }))
    assert.is_false(j:allows("viewer", "produce", "x"))
    local again = assert(policy.new(require("cjson").decode(require("cjson").encode(j:table())), "wire"))
    assert.are.same(j:table(), again:table())
    assert.is_true(again:allows("viewer", "modulate", "x", { "log" }))
  end)

  it("runs a Lua policy in an empty environment", function()
    local path = file("os.execute('touch /tmp/x') return { rules = {} }")
    local p, err = policy.load(path)
    assert.is_nil(p)
    assert.are.equal(path .. ":1: attempt to index global 'os' (a nil value)", err)
    path = file(string.dump(function() return { rules = {} } end))
    assert.are.same({ nil, path .. ": a policy must be source text, not bytecode" }, { policy.load(path) })
  end)

  it("refuses a malformed policy with the path and what is wrong", function()
    local cases = {
      { "return 5", ": a policy is a table with 'rules'" },
      { "return {}", ": 'rules' must be a list of rules" },
      { "return { rules = {}, extra = 1 }", ": unknown field 'extra' (known: lecho, version, rules)" },
      { "return { version = 2, rules = {} }", ": version 2 is not known (this lecho reads version 1)" },
      { "return { rules = { 5 } }", ": rule 1 is not a table" },
      { "return { rules = { { channel = '*', allow = { 'produce' } } } }",
        ": rule 1: principal must be a string or a non-empty list of strings" },
      { "return { rules = { { principal = 'a b', channel = '*', allow = { 'produce' } } } }",
        ": rule 1: principal 'a b' is not a principal name or pattern (1 to 64 of A-Z a-z 0-9 . _ - and *)" },
      { "return { rules = { { principal = 'a', allow = { 'produce' } } } }",
        ": rule 1: channel must be a string or a non-empty list of strings" },
      { "return { rules = { { principal = 'a', channel = '*', allow = { 'write' } } } }",
        ": rule 1: unknown action 'write' (known: produce, consume, modulate, manage, list, stats)" },
      { "return { rules = { { principal = 'a', channel = '*', allow = {} } } }",
        ": rule 1: 'allow' must list actions (produce, consume, modulate, manage, list, stats)" },
      { "return { rules = { { principal = 'a', channel = '*', allow = { 'consume' }, caps = { 'clock' } } } }",
        ": rule 1: 'caps' needs the action modulate" },
      { "return { rules = { { principal = 'a', channel = '*', allow = { 'modulate' }, caps = { 'net' } } } }",
        ": rule 1: unknown capability 'net' in 'caps'" },
      { "return { rules = { { principal = 'a', channel = '*', allow = { 'list' }, who = 1 } } }",
        ": rule 1: unknown field 'who' (known: principal, channel, allow, caps)" },
      { "return { rules = {", ":1: unexpected symbol near '<eof>'" },
    }
    for _, c in ipairs(cases) do
      local path = file(c[1])
      local p, err = policy.load(path)
      assert.is_nil(p, c[1])
      assert.are.equal(path .. c[2], err)
    end
    local path = file('{ "rules": [ }', ".json")
    local p, err = policy.load(path)
    assert.is_nil(p)
    assert.matches("^" .. path:gsub("%p", "%%%0") .. ": not valid JSON: ", err)
    local missing = S.tmpname("none")
    assert.are.same({ nil, ("policy %s: %s: No such file or directory"):format(missing, missing) },
                    { policy.load(missing) })
  end)
end)
