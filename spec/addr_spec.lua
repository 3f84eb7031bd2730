-- The address grammar on the Lua side (lua/lecho/addr.lua): the same
-- canonical texts and exact messages as core/test_addr.c, and channel
-- references that split without doubt even when the name server's address
-- is a unix path or the name holds "/".  Pure text: no sockets.

local addr = require "lecho.addr"

local function fails(s, msg, opts)
  local a, m, code = addr.parse(s, opts)
  assert.is_nil(a)
  assert.are.equal(msg, m)
  assert.are.equal("invalid", code)
end

describe("lecho.addr.parse", function()
  it("writes every form in its canonical text, which parses to itself", function()
    local cases = {
      { "127.0.0.1:80", "127.0.0.1:80" },
      { "localhost:5", "127.0.0.1:5" },
      { "1.2.3.4:0080", "1.2.3.4:80" },
      { "255.255.255.255:65535", "255.255.255.255:65535" },
      { "[::1]:8080", "[::1]:8080" },
      { "[0:0:0:0:0:0:0:1]:1", "[::1]:1" },
      { "[2001:DB8:0:0:1:0:0:1]:65535", "[2001:db8::1:0:0:1]:65535" },
      { "[2001:db8:0:1:0:0:0:0]:9", "[2001:db8:0:1::]:9" },
      { "[::ffff:1.2.3.4]:9", "[::ffff:1.2.3.4]:9" },
      { "[fe80::1%lo]:7", "[fe80::1%lo]:7" },
      { "unix:/tmp/x.sock", "unix:/tmp/x.sock" },
      { "unix:@lecho-test", "unix:@lecho-test" },
      { "unix:@a/b", "unix:@a/b" },
      { "unix:/" .. ("p"):rep(106), "unix:/" .. ("p"):rep(106) },
    }
    for _, c in ipairs(cases) do
      assert.are.equal(c[2], addr.parse(c[1]), c[1])
      assert.are.equal(c[2], addr.parse(c[2]), c[2])
    end
    assert.are.equal("0.0.0.0:0", addr.parse("0.0.0.0:0", { listen = true }))
    assert.are.equal("[::]:0", addr.parse("[::]:0", { listen = true }))
  end)

  it("names a numeric IPv6 zone by its interface when there is one", function()
    local lo = addr.parse("[fe80::1%lo]:7")
    local byindex = addr.parse("[fe80::1%1]:7")
    assert.is_truthy(byindex:match("^%[fe80::1%%[%w%.%-_]+%]:7$"))
    if byindex:find("%lo]", 1, true) then assert.are.equal(lo, byindex) end
    -- an index with no interface stays a number
    assert.are.equal("[fe80::1%4000000000]:7", addr.parse("[fe80::1%4000000000]:7"))
  end)

  it("says what is wrong with a malformed address", function()
    fails("", "empty address")
    fails("127.0.0.1", "missing port (want host:port)")
    fails("[::1]", "missing port (want host:port)")
    fails("[::1]5", "missing port (want host:port)")
    for _, p in ipairs{ "", "65536", "123456", "-1", "+1", "8x", " 8" } do
      fails("1.2.3.4:" .. p, "bad port (want 1-65535)")
    end
    fails("1.2.3.4:0", "port 0 is only for listening")
    fails("[::1]:0", "port 0 is only for listening")
    fails("::1:5", "IPv6 address must be in brackets ([::1]:port)")
    fails(":5", "missing host")
    for _, h in ipairs{ "example.com", "1.2.3", "1.2.3.256", "01.2.3.4",
                        "a-very-long-host-name.example.org" } do
      fails(h .. ":5", "bad host (want IPv4, localhost, [IPv6] or unix:/path)")
    end
    fails("[::g]:5", "bad IPv6 address")
    fails("[1.2.3.4]:5", "bad IPv6 address")
    fails("[::1]x:5", "bad IPv6 address")
    fails("[]:5", "bad IPv6 address")
    fails("[fe80::1%nosuchif0]:5", "unknown interface in IPv6 zone")
    fails("[fe80::1%]:5", "unknown interface in IPv6 zone")
    fails("unix:", "unix socket path must be absolute (unix:/path) or abstract (unix:@name)")
    fails("unix:tmp/x", "unix socket path must be absolute (unix:/path) or abstract (unix:@name)")
    fails("unix:/", "empty unix socket path")
    fails("unix:@", "empty unix socket path")
    fails("unix:/a//b", "unix socket path must not contain '//' or end in '/'")
    fails("unix:/a/", "unix socket path must not contain '//' or end in '/'")
    fails("unix:@x//y", "unix socket path must not contain '//' or end in '/'")
    fails("unix:/a b", "space or control character in unix socket path")
    fails("unix:/a\tb", "space or control character in unix socket path")
    fails("unix:/" .. ("p"):rep(107), "unix socket path too long (at most 107 bytes)")
    -- a C string would stop at the NUL and see a good address
    fails("1.2.3.4\0junk:5", "NUL byte in address")
    fails("1.2.3.4:5\0", "NUL byte in address")
    fails(5, "address must be a string")
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
