-- Keyed mode's files (lecho.keys): secret and public keys and trust lists
-- round-trip through their files, a file of the wrong kind or shape is
-- refused with its path and why, a secret key others may read is refused
-- (as ssh does), and a context's key/trust options are checked before it
-- listens.
local keys = require "lecho.keys"
local lecho = require "lecho"
local S = require "spec.support"

-- A key pair of the shape libsodium's Ed25519 keeps (secret = seed .. public)
-- without the core: file handling needs no crypto.
local function fake_pair(name, b)
  local pk = string.char(b):rep(32)
  return { name = name, public = pk, secret = string.char(b + 1):rep(32) .. pk }
end

local function raises(msg, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  assert.are.equal(msg, (tostring(err):gsub("^[^:]*:%d+: ", "")))
end

describe("key files", function()
  local dir
  before_each(function() dir = S.tmpname("keys"); os.execute("mkdir -p " .. S.sh_quote(dir)) end)
  teardown(function() S.cleanup() end)

  it("round-trip: a secret key (0600) and its public key, an authority's marked", function()
    local k = fake_pair("alice", 1)
    assert.is_true(keys.write_secret(dir .. "/alice.key", k))
    assert.is_true(keys.write_public(dir .. "/alice.pub", k))
    assert.is_true(keys.write_public(dir .. "/ca.pub", fake_pair("ca", 7), true))
    local mode = io.popen("stat -c %a " .. dir .. "/alice.key"):read("*l")
    assert.are.equal("600", mode)
    local r = assert(keys.read_secret(dir .. "/alice.key"))
    assert.are.same({ name = "alice", public = k.public, secret = k.secret, path = dir .. "/alice.key" }, r)
    assert.are.same({ name = "alice", public = k.public, authority = false, path = dir .. "/alice.pub" },
                    keys.read_public(dir .. "/alice.pub"))
    assert.is_true(keys.read_public(dir .. "/ca.pub").authority)
    -- the exact text: fields in a fixed order, lowercase hex
    assert.are.equal(('{"lecho":"public-key","version":1,"name":"alice","public":"%s"}\n'):format(("01"):rep(32)),
                     S.read(dir .. "/alice.pub"))
    assert.is_nil(S.read(dir .. "/alice.key.tmp"))
  end)

  it("a trust file is a public key, an authority's public key or a trust list; trust= takes a list", function()
    keys.write_public(dir .. "/bob.pub", fake_pair("bob", 3))
    keys.write_public(dir .. "/ca.pub", fake_pair("ca", 7), true)
    S.write(dir .. "/list.json", ('{"lecho":"trust","version":1,"keys":[{"name":"ns","public":"%s"},'
      .. '{"name":"m1","public":"%s"}],"authorities":[{"name":"ca2","public":"%s"}]}')
      :format(("05"):rep(32), ("0A"):rep(32), ("09"):rep(32)))
    local t = assert(keys.read_trust{ dir .. "/bob.pub", dir .. "/ca.pub", dir .. "/list.json" })
    assert.are.same({ { name = "bob", public = ("\3"):rep(32) }, { name = "ns", public = ("\5"):rep(32) },
                      { name = "m1", public = ("\10"):rep(32) } }, t.keys)
    assert.are.same({ { name = "ca", public = ("\7"):rep(32) }, { name = "ca2", public = ("\9"):rep(32) } },
                    t.authorities)
    assert.are.same(assert(keys.read_trust{ dir .. "/bob.pub" }), assert(keys.read_trust(dir .. "/bob.pub")))
  end)

  it("refuses files of the wrong kind or shape, naming the file and why", function()
    local k = fake_pair("alice", 1)
    keys.write_secret(dir .. "/alice.key", k)
    keys.write_public(dir .. "/alice.pub", k)
    local function f(name, text) local p = dir .. "/" .. name; S.write(p, text); os.execute("chmod 600 " .. p); return p end
    local p = dir .. "/alice.pub"
    assert.are.same({ nil, ("key file %s: not a lecho secret key (it is a lecho public key)"):format(p), "invalid" },
                    { keys.read_secret(p) })
    p = dir .. "/alice.key"
    assert.are.same({ nil, ("trust file %s: not a lecho public key or trust list (it is a lecho secret key)")
                      :format(p), "invalid" }, { keys.read_trust(p) })
    p = f("x.key", "hello")
    assert.are.same({ nil, ("key file %s: not a lecho key file (JSON with a \"lecho\" field)"):format(p), "invalid" },
                    { keys.read_secret(p) })
    p = f("v2.key", '{"lecho":"secret-key","version":2}')
    assert.are.same({ nil, ("key file %s: version 2 is not one this lecho reads (1)"):format(p), "invalid" },
                    { keys.read_secret(p) })
    local good = ('"public":"%s","secret":"%s"'):format(keys.hex(k.public), keys.hex(k.secret))
    p = f("name.key", '{"lecho":"secret-key","version":1,"name":"a b",' .. good .. '}')
    assert.are.same({ nil, ("key file %s: name must be 1 to 64 characters of A-Z a-z 0-9 . _ -"):format(p),
                      "invalid" }, { keys.read_secret(p) })
    p = f("short.key", ('{"lecho":"secret-key","version":1,"name":"a","public":"%s","secret":"00"}')
      :format(keys.hex(k.public)))
    assert.are.same({ nil, ("key file %s: secret must be 128 hex digits"):format(p), "invalid" },
                    { keys.read_secret(p) })
    p = f("mixed.key", ('{"lecho":"secret-key","version":1,"name":"a","public":"%s","secret":"%s"}')
      :format(("02"):rep(32), keys.hex(k.secret)))
    assert.are.same({ nil, ("key file %s: its secret and public keys do not belong together"):format(p), "invalid" },
                    { keys.read_secret(p) })
    p = f("half.key", '{"lecho":"secret-key","version":1,"name":"a",' .. good .. ',"cert":"00"}')
    assert.are.same({ nil, ("key file %s: a certificate needs cert (128 hex digits) and authority (64 hex digits)")
                      :format(p), "invalid" }, { keys.read_secret(p) })
    p = f("dup.json", ('{"lecho":"trust","version":1,"keys":[{"name":"a","public":"%s"},{"name":"b","public":"%s"}]}')
      :format(("05"):rep(32), ("05"):rep(32)))
    assert.are.same({ nil, ("trust file %s: key %s is b here and a in trust file %s"):format(p, ("05"):rep(32), p),
                      "invalid" }, { keys.read_trust(p) })
    p = f("badlist.json", '{"lecho":"trust","version":1,"keys":[{"name":"a","public":"xyz"}]}')
    assert.are.same({ nil, ("trust file %s: keys[1]: public must be 64 hex digits"):format(p), "invalid" },
                    { keys.read_trust(p) })
    p = dir .. "/none.key"
    assert.are.same({ nil, ("key file %s: No such file or directory"):format(p), "notfound" }, { keys.read_secret(p) })
    assert.are.same({ nil, ("trust file %s: not a regular file"):format(dir), "invalid" }, { keys.read_trust(dir) })
    p = f("big.json", ("x"):rep(keys.MAX_FILE + 1))
    assert.are.same({ nil, ("trust file %s: larger than %d bytes"):format(p, keys.MAX_FILE), "limit" },
                    { keys.read_trust(p) })
  end)

  it("refuses a secret key file that group or others may read, as ssh does", function()
    local p = dir .. "/alice.key"
    keys.write_secret(p, fake_pair("alice", 1))
    for _, mode in ipairs{ "640", "604", "644", "660" } do
      os.execute(("chmod %s %s"):format(mode, p))
      assert.are.same({ nil, ("key file %s: permissions 0%s are too open: a secret key must be readable by "
                        .. "its owner only (chmod 600 %s)"):format(p, mode, p), "refused" }, { keys.read_secret(p) })
    end
    os.execute("chmod 400 " .. p)
    assert.truthy(keys.read_secret(p))
  end)

  it("writes through a new file and a rename: an old key stays whole until the new one is complete", function()
    local p = dir .. "/alice.key"
    keys.write_secret(p, fake_pair("alice", 1))
    os.execute("chmod 644 " .. p)       -- the old file's mode is not the new one's
    S.write(p .. ".tmp", "a leftover of a crash")
    assert.is_true(keys.write_secret(p, fake_pair("alice", 3)))
    assert.are.equal(("\3"):rep(32), assert(keys.read_secret(p)).public)
    assert.is_nil(S.read(p .. ".tmp"))
    assert.are.same({ nil, ("key file %s/no/such.key.tmp: No such file or directory"):format(dir), "notfound" },
                    { keys.write_secret(dir .. "/no/such.key", fake_pair("x", 1)) })
  end)
end)

describe("the key and trust options of lecho.context", function()
  local dir
  setup(function()
    dir = S.tmpname("keys"); os.execute("mkdir -p " .. S.sh_quote(dir))
    keys.write_secret(dir .. "/a.key", fake_pair("a", 1))
    keys.write_public(dir .. "/a.pub", fake_pair("a", 1))
  end)
  teardown(function() S.cleanup() end)

  it("are checked: a key without trust and trust without a key are errors, and so is a file that does not read",
     function()
    raises(("lecho: key %s/a.key needs trust (trust= or $LECHO_TRUST): the keys or authorities it trusts")
           :format(dir), lecho.context, { key = dir .. "/a.key", quiet = true })
    raises("lecho: trust needs a key (key= or $LECHO_KEY): this context's own secret key file",
           lecho.context, { trust = dir .. "/a.pub", quiet = true })
    raises(("lecho: key file %s/a.pub: not a lecho secret key (it is a lecho public key)"):format(dir),
           lecho.context, { key = dir .. "/a.pub", trust = dir .. "/a.pub", quiet = true })
    raises("lecho.context: key must be the path of a secret key file (or false: none)",
           lecho.context, { key = 1 })
    raises("lecho.context: trust must be the path of a trust file, a non-empty list of them, or false",
           lecho.context, { trust = {} })
    raises("lecho.context: nameserver_principal must be a principal name: 1 to 64 characters of A-Z a-z 0-9 . _ -",
           lecho.context, { nameserver_principal = "name server" })
  end)

  it("come from LECHO_KEY and LECHO_TRUST when not given; key = false ignores them", function()
    local env = ("LECHO_TRUST=%s/a.pub %s -e "):format(dir, S.luajit)
    local out = S.sh_out(env .. S.sh_quote([[
      local lecho = require "lecho"
      print(pcall(lecho.context, { quiet = true }))
      local ctx = lecho.context{ key = false, quiet = true }
      print(ctx.keyed)
      ctx:close()]]))
    assert.are.equal("false\tlecho: trust needs a key (key= or $LECHO_KEY): this context's own secret key file\n"
                     .. "false\nrc=0\n", out)
  end)

  it("without a key: protected mode, said in one log line at start", function()
    local logs = {}
    local ctx = lecho.context{ log = function(m) logs[#logs + 1] = m end }
    ctx:close()
    assert.are.same({ "protected mode: no key configured; listening on loopback only, every local process is trusted" },
                    logs)
  end)
end)
