-- The address grammar on the Lua side (lua/lecho/addr.lua): the same
-- canonical texts and exact messages as core/test/test_addr.c (the cases in
-- core/test/test_addr_cases.txt are run by both), and channel
-- references that split without doubt even when the name server's address
-- is a unix path or the name holds "/".  Pure text: no sockets.

local addr = require "lecho.addr"

local function fails(s, msg, opts)
  local a, m, code = addr.parse(s, opts)
  assert.is_nil(a)
  assert.are.equal(msg, m)
  assert.are.equal("invalid", code)
end

-- The cases shared with core/test/test_addr.c (format in the file's header).
local function shared_cases()
  local root = os.getenv("LECHO_ROOT") or "."
  local f = assert(io.open(root .. "/core/test/test_addr_cases.txt"))
  local cases = {}
  for line in f:lines() do
    if line ~= "" and line:sub(1, 1) ~= "#" then
      local fields, pos = {}, 1
      while #fields < 3 do
        local i = line:find(" | ", pos, true)
        if not i then break end
        fields[#fields + 1] = line:sub(pos, i - 1)
        pos = i + 3
      end
      fields[#fields + 1] = line:sub(pos)
      assert(#fields == 4, "bad case line: " .. line)
      cases[#cases + 1] = { kind = fields[1], listen = fields[2] == "listen",
                            input = fields[3]:gsub("\\t", "\t"), want = fields[4] }
    end
  end
  f:close()
  return cases
end

describe("lecho.addr.parse", function()
  it("agrees with the C parser on every shared case", function()
    local cases = shared_cases()
    assert.is_true(#cases >= 50)
    for _, c in ipairs(cases) do
      local opts = { listen = c.listen }
      if c.kind == "ok" then
        assert.are.equal(c.want, addr.parse(c.input, opts), c.input)
        assert.are.equal(c.want, addr.parse(c.want, opts), c.want)
      else
        fails(c.input, c.want, opts)
      end
    end
  end)

  it("takes the longest unix path that fits and no longer", function()
    local p = "unix:/" .. ("p"):rep(106)
    assert.are.equal(p, addr.parse(p))
    fails(p .. "p", "unix socket path too long (at most 107 bytes)")
  end)

  it("names a numeric IPv6 zone by its interface when there is one", function()
    local lo = addr.parse("[fe80::1%lo]:7")
    local byindex = addr.parse("[fe80::1%1]:7")
    assert.is_truthy(byindex:match("^%[fe80::1%%[%w%.%-_]+%]:7$"))
    if byindex:find("%lo]", 1, true) then assert.are.equal(lo, byindex) end
    -- an index with no interface stays a number
    assert.are.equal("[fe80::1%4000000000]:7", addr.parse("[fe80::1%4000000000]:7"))
  end)

  it("refuses what only Lua can be given", function()
    -- a C string would stop at the NUL and see a good address
    fails("1.2.3.4\0junk:5", "NUL byte in address")
    fails("1.2.3.4:5\0", "NUL byte in address")
    fails("unix:/a\0b", "NUL byte in address")
    fails(5, "address must be a string")
    fails(nil, "address must be a string")
  end)

  it("tells kinds and wildcards apart", function()
    assert.are.equal("ipv4", addr.kind("127.0.0.1:5"))
    assert.are.equal("ipv6", addr.kind("[::1]:5"))
    assert.are.equal("unix", addr.kind("unix:/tmp/x"))
    assert.is_true(addr.is_wildcard("0.0.0.0:5"))
    assert.is_true(addr.is_wildcard("[::]:0"))
    assert.is_false(addr.is_wildcard("[::1]:5"))
    assert.is_false(addr.is_wildcard("10.0.0.0:5"))
    assert.is_false(addr.is_wildcard("unix:/0.0.0.0:5"))
  end)
end)

describe("lecho.addr.split and join", function()
  local NS = "127.0.0.1:4000"

  it("leaves a plain name to the default name server", function()
    for _, n in ipairs{ "ozone", "a/b", "a//b", "x:y", "x[1]:5/y", "/lead" } do
      local ns, name = addr.split(n, NS)
      assert.are.equal(NS, ns, n)
      assert.are.equal(n, name)
    end
  end)

  it("splits each kind of address from its name, canonically", function()
    local cases = {
      { "127.0.0.1:5/ozone", "127.0.0.1:5", "ozone" },
      { "localhost:5/a/b", "127.0.0.1:5", "a/b" },
      { "[::1]:5/ozone", "[::1]:5", "ozone" },
      { "[0::1]:5//x", "[::1]:5", "/x" },
      { "[fe80::1%lo]:5/o", "[fe80::1%lo]:5", "o" },
      { "unix:/run/ns.sock//ozone", "unix:/run/ns.sock", "ozone" },
      { "unix:/run/ns.sock//a/b//c", "unix:/run/ns.sock", "a/b//c" },
      { "unix:/run/ns.sock///lead", "unix:/run/ns.sock", "/lead" },
      { "unix:@ns//ozone", "unix:@ns", "ozone" },
    }
    for _, c in ipairs(cases) do
      local ns, name = addr.split(c[1], NS)
      assert.are.equal(c[2], ns, c[1])
      assert.are.equal(c[3], name, c[1])
    end
  end)

  it("refuses a reference whose address is bad or whose name is missing", function()
    local function bad(ref, msg)
      local ns, m, code = addr.split(ref, NS)
      assert.is_nil(ns)
      assert.are.equal(msg, m)
      assert.are.equal("invalid", code)
    end
    bad("", "a channel name must be a non-empty string")
    bad(nil, "a channel name must be a non-empty string")
    bad("1.2.3.4:5/", "channel '1.2.3.4:5/' has no name after its name server")
    bad("unix:/run/ns.sock//", "channel 'unix:/run/ns.sock//' has no name after its name server")
    bad("unix:/run/ns.sock/ozone",
        "channel 'unix:/run/ns.sock/ozone': a unix name server address ends with '//' (want unix:/path//name)")
    bad("a:1/ozone", "bad name server address 'a:1' in channel 'a:1/ozone': "
        .. "bad host (want IPv4, localhost, [IPv6] or unix:/path)")
    bad("1.2.3.4:0/ozone", "bad name server address '1.2.3.4:0' in channel '1.2.3.4:0/ozone': "
        .. "port 0 is only for listening")
    bad("[::1]:99999/o", "bad name server address '[::1]:99999' in channel '[::1]:99999/o': "
        .. "bad port (want 1-65535)")
    bad("unix:rel//o", "bad name server address 'unix:rel' in channel 'unix:rel//o': "
        .. "unix socket path must be absolute (unix:/path) or abstract (unix:@name)")
  end)

  it("inverts join for any canonical address and name", function()
    local nss = { "127.0.0.1:5", "[::1]:5", "[2001:db8::1]:65535", "[fe80::1%lo]:1",
                  "unix:/run/ns.sock", "unix:/a", "unix:@ns", "unix:@a/b" }
    local alphabet = { "a", "/", "//", ":", "[", "]", "%", "@", "unix:", "1", "." }
    math.randomseed(9)
    for i = 1, 2000 do
      local parts = {}
      for k = 1, math.random(1, 6) do parts[k] = alphabet[math.random(#alphabet)] end
      local name = table.concat(parts)
      local ns = nss[i % #nss + 1]
      local full = addr.join(ns, name)
      local ns2, name2 = addr.split(full, "default:1")
      assert.are.equal(ns, ns2, full)
      assert.are.equal(name, name2, full)
    end
    assert.are.equal("unix:/run/ns.sock//ozone", addr.join("unix:/run/ns.sock", "ozone"))
    assert.are.equal("[::1]:5/ozone", addr.join("[::1]:5", "ozone"))
  end)
end)
