-- Covers the lecho commands of README "Steering" and doc/operations.md's session (not run by spec/doc_blocks_spec.lua).
-- scripts/lecho, the command-line tool (doc/operations.md "The lecho
-- command"), against a real name server, producers, consumers and a
-- service, each its own process: what each subcommand prints (JSON lines
-- parsed), its --help, a bad argument's message and exit code, Ctrl-C.
local S = require "spec.support"
local cjson = require "cjson"

local function lecho(args)
  return S.sh_out(("%s %s/scripts/lecho %s"):format(S.luajit, S.root, args))
end

-- output, rc: the output lines before "rc=N", and N
local function split(out)
  local body, rc = out:match("^(.-)rc=(%d+)\n$")
  return body, tonumber(rc)
end

local function json_lines(body)
  local t = {}
  for line in body:gmatch("[^\n]+") do t[#t + 1] = cjson.decode(line) end
  return t
end

-- Waits until the name server lists a consumer (role "producers": a
-- producer) of channel `name`.
local function wait_member(ns, name, timeout, role)
  local deadline = os.time() + (timeout or 20)
  while os.time() <= deadline do
    local body, rc = split(lecho(("ls --json --nameserver %s"):format(ns)))
    if rc == 0 then
      for _, e in ipairs(json_lines(body)) do
        if e.channel == ns .. "/" .. name and #e[role or "consumers"] > 0 then return e end
      end
    end
    S.sleep(0.1)
  end
end
local wait_consumer = wait_member

describe("lecho, the command-line tool", function()
  after_each(function() S.cleanup() end)

  it("--help of every subcommand, and messages and exit codes for bad arguments", function()
    for _, sub in ipairs{ "ls", "sub", "pub", "call", "stats", "top", "bench" } do
      local body, rc = split(lecho(sub .. " --help"))
      assert.are.equal(0, rc)
      assert.matches("^usage: lecho " .. sub, body)
      assert.matches("Exit codes: 0 done, 1 failed, 2 usage, 3 timed out", body, 1, true)
    end
    assert.matches("^usage: lecho SUBCOMMAND", lecho("--help"))
    assert.are.equal("lecho: unknown subcommand 'frob' (lecho --help)\nrc=2\n", lecho("frob"))
    assert.matches("^lecho sub: CHANNEL is required\nusage: lecho sub", lecho("sub"))
    assert.are.equal("lecho pub: VALUE is not a Lua literal: 'hello' is a name, not a literal (a string needs "
      .. "quotes: '\"hello\"') (or use --string)\nrc=2\n", lecho("pub demo hello"))
    assert.are.equal("lecho ls: unknown option '--bogus' (lecho ls --help)\nrc=2\n", lecho("ls --bogus"))
    assert.are.equal("lecho top: --interval needs a number of seconds > 0, not '0'\nrc=2\n", lecho("top --interval 0"))
    assert.are.equal("lecho stats: unexpected argument 'b' (lecho stats --help)\nrc=2\n", lecho("stats a:1 b"))
    -- a name server that is not there: said, exit 1
    local dead = S.refusing_addr()
    local body, rc = split(lecho("ls --timeout 2 --nameserver " .. dead))
    assert.are.equal(1, rc)
    assert.matches("^lecho ls: " .. dead:gsub("%p", "%%%0") .. " unreachable", body)
  end)

  it("pub then sub sees it; ls, stats and top read the processes; Ctrl-C ends sub with 130", function()
    local _, ns = S.nameserver("--quiet")
    -- a subscriber that prints JSON lines until Ctrl-C
    local sub = S.spawn(("%s %s/scripts/lecho sub demo --json --nameserver %s"):format(S.luajit, S.root, ns))
    local entry = wait_consumer(ns, "demo")
    assert(entry, "the subscriber did not join: " .. S.errors(sub))
    local subaddr = entry.consumers[1]
    -- a Lua literal, then JSON lines from stdin with --sync
    assert.are.equal("rc=0\n", lecho(("pub demo '{ x = 1, tags = { \"a\", \"b\" } }' --nameserver %s"):format(ns)))
    local body, rc = split(S.sh_out(("printf '{\"y\":[1,2]}\\n\\n\"text\"\\n' | %s %s/scripts/lecho pub demo - --sync "
      .. "--json --nameserver %s"):format(S.luajit, S.root, ns)))
    assert.are.equal(0, rc, body)
    assert.are.same({ { n = 1, ok = true }, { n = 2, ok = true } }, json_lines(body))
    -- what the subscriber printed: every line is JSON, the values as sent
    assert(S.wait_file(sub.out, "text", 20), "the subscriber printed: " .. S.output(sub))
    local got = json_lines(S.output(sub))
    assert.are.equal(3, #got)
    assert.are.same({ x = 1, tags = { "a", "b" } }, got[1].value)
    assert.are.same({ y = { 1, 2 } }, got[2].value)
    assert.are.equal("text", got[3].value)
    assert.are.equal("demo", got[1].channel)
    assert.matches("^127%.0%.0%.1:%d+#1$", got[1].producer)
    -- stats of the subscriber's process, read over the control plane
    body, rc = split(lecho(("stats %s --json --nameserver %s"):format(subaddr, ns)))
    assert.are.equal(0, rc, body)
    local st = cjson.decode(body)
    assert.are.equal(subaddr, st.addr)
    assert.are.equal("context", st.role)
    assert.are.equal(3, st.channels[ns .. "/demo"].events_in)
    assert.are.equal(1, st.channels[ns .. "/demo"].consumers)
    -- the text form names the channel
    body, rc = split(lecho(("stats %s --nameserver %s"):format(subaddr, ns)))
    assert.are.equal(0, rc)
    assert.matches(ns:gsub("%p", "%%%0") .. "/demo", body)
    -- top in a pipe: one refresh, one JSON row per process (the name server and the subscriber)
    body, rc = split(lecho(("top --once --interval 0.2 --json --nameserver %s"):format(ns)))
    assert.are.equal(0, rc, body)
    local rows = {}
    for _, r in ipairs(json_lines(body)) do rows[r.process] = r end
    assert.are.equal("nameserver", rows[ns].role)
    assert.are.equal("context", rows[subaddr].role)
    assert.are.equal(3, rows[subaddr].events_in)
    -- the text form: a header and a row each
    body = lecho(("top --once --interval 0.2 --nameserver %s"):format(ns))
    assert.matches("PROCESS%s+ROLE", body)
    assert.matches(subaddr:gsub("%p", "%%%0") .. "%s+context", body)
    -- ls: the channel, its consumer
    body, rc = split(lecho(("ls --nameserver %s"):format(ns)))
    assert.are.equal(0, rc)
    assert.matches("consumers " .. subaddr:gsub("%p", "%%%0"), body)
    -- Ctrl-C: the subscriber closes and exits 130, saying nothing
    S.kill(sub, "INT")
    local ended, code = S.wait(sub, 20)
    assert.is_true(ended)
    assert.are.equal(130, code)
    -- it said at once that demo had no producer yet (the pub came later), and nothing else
    assert.are.equal("lecho sub: no producer on 'demo' yet (lecho ls lists the channels); waiting\n", S.errors(sub))
    -- --sync with nobody left: said, exit 1
    body, rc = split(lecho(("pub demo 1 --sync --wait 0 --nameserver %s"):format(ns)))
    assert.are.equal(1, rc)
    assert.are.equal("lecho pub: event 1: no consumer of demo\n", body)
  end)

  -- Issue 25 (review): a misspelt channel is said, not silently waited on
  it("sub of a channel with no producer says so at once and waits on; pub with no consumer says nothing was delivered, exit 1", function()
    local _, ns = S.nameserver("--quiet")
    local t0 = os.time()
    local sub = S.spawn(("%s %s/scripts/lecho sub atmosphere.feild --count 1 --for 4 --nameserver %s")
      :format(S.luajit, S.root, ns))
    assert(S.wait_file(sub.err, "no producer", 20), "the subscriber said nothing: " .. S.errors(sub))
    assert.is_true(os.time() - t0 < 4, "said only at the end")
    local ended, code = S.wait(sub, 20)
    assert.is_true(ended)
    assert.are.equal(3, code)
    assert.are.equal("lecho sub: no producer on 'atmosphere.feild' yet (lecho ls lists the channels); waiting\n",
                     S.errors(sub))
    assert.are.equal("", S.output(sub))
    -- pub, no --sync, nobody consumes: said, exit 1
    local body, rc = split(lecho(("pub atmosphere.steeer '{ emission = 3 }' --wait 1 --nameserver %s"):format(ns)))
    assert.are.equal(1, rc, body)
    assert.are.equal("lecho pub: no consumer of atmosphere.steeer within 1 s: nothing delivered\n", body)
  end)

  it("pub - reads stdin on the loop: Ctrl-C while it waits for a line ends it with 130", function()
    local _, ns = S.nameserver("--quiet")
    local fifo = S.tmpname("fifo")
    assert(os.execute("mkfifo " .. fifo))
    S.spawn(("sh -c %s"):format(S.sh_quote(("exec 3>%s; echo '1' >&3; sleep 60"):format(fifo))))
    local pub = S.spawn(("sh -c %s"):format(S.sh_quote(("exec %s %s/scripts/lecho pub x - --wait 0 --nameserver %s <%s")
      :format(S.luajit, S.root, ns, fifo))))
    -- joined as a producer: past its start (a Ctrl-C during the start says
    -- "lecho pub: interrupted"; make asan's start took more than the 1 s
    -- slept here before), then a moment on the loop
    assert.truthy(wait_member(ns, "x", 30, "producers"), "lecho pub never joined x")
    S.sleep(0.5)
    assert.is_true(S.alive(pub))
    S.kill(pub, "INT")
    local ended, code = S.wait(pub, 20)
    assert.is_true(ended)
    assert.are.equal(130, code)
    assert.are.equal("", S.errors(pub))
  end)

  it("sub --modulator FILE --params: the modulator runs at the producer", function()
    local _, ns = S.nameserver("--quiet")
    local mod = S.write(S.tmpname("mod") .. ".lua",
      "function enqueue(ev) if ev % params.m == 0 then return ev * 10 end end\n")
    local sub = S.spawn(("%s %s/scripts/lecho sub m --modulator %s --params '{ m = 2 }' --count 1 --for 30 --json "
      .. "--nameserver %s"):format(S.luajit, S.root, mod, ns))
    assert(wait_consumer(ns, "m"), "the subscriber did not join: " .. S.errors(sub))
    assert.are.equal("rc=0\n", lecho(("pub m 3 --nameserver %s"):format(ns)))
    assert.are.equal("rc=0\n", lecho(("pub m 4 --nameserver %s"):format(ns)))
    local ended, code = S.wait(sub, 20)
    assert.is_true(ended, S.errors(sub))
    assert.are.equal(0, code, S.errors(sub))
    local got = json_lines(S.output(sub))
    assert.are.equal(1, #got)
    assert.are.equal(40, got[1].value)
    -- a modulator file that is not there: said, exit 2
    local body, rc = split(lecho(("sub m --modulator %s/none.lua --nameserver %s"):format(S.tmpdir(), ns)))
    assert.are.equal(2, rc)
    assert.matches("^lecho sub: %-%-modulator .*none%.lua: no such file", body)
  end)

  it("a process answers at most 20 stats requests a second, the rest 'busy'", function()
    local _, ns = S.nameserver("--quiet")
    local ctx = require("lecho").context{ nameserver = ns, quiet = true }
    local st = require "lecho.stats"
    local ok, busy, t0 = 0, 0, os.time()
    for _ = 1, 100 do
      local s, err, code = st.fetch(ctx, ns)
      if s then ok = ok + 1 else
        assert.are.equal("busy", code)
        assert.are.equal("busy: more than 20 stats requests this second", err)
        busy = busy + 1
      end
    end
    local secs = os.time() - t0 + 1   -- the whole seconds the loop touched
    ctx:close()
    assert.is_true(ok >= 20 and ok <= 20 * (secs + 1), ("%d answered in %d s"):format(ok, secs))
    assert.are.equal(100, ok + busy)
  end)

  -- Issue 25 (review): a modulator's stream (NAME@KEY) is longer than the column was
  it("stats' tables stay aligned with long channel names and peer addresses", function()
    local cli = require "lecho.cli"
    local row = { events_in = 1, events_out = 2, events_local = 0, drops = 0, producers = 1, consumers = 0 }
    local s = { addr = "127.0.0.1:7700", role = "context", pid = 1, peers = {
                  ["127.0.0.1:4000"] = { connected = true },
                  ["[fd00:1234:5678:9abc::1]:40000"] = { connected = false, last_error = "gone" } },
                channels = { ["127.0.0.1:7700/a"] = row,
                             ["127.0.0.1:7700/atmosphere.field@2c0e2aef4cad5d9b"] = row } }
    local out = {}
    local write = io.write
    io.write = function(...) for _, v in ipairs{ ... } do out[#out + 1] = v end end
    local ok, err = pcall(cli.print_stats, s)
    io.write = write
    assert(ok, err)
    local text = table.concat(out)
    for _, head in ipairs{ "PEER", "CHANNEL" } do
      local lines = {}
      for l in (text .. "\n"):match("\n(" .. head .. " [^\n]*\n.-)\n\n"):gmatch("[^\n]+") do lines[#lines + 1] = l end
      assert.are.equal(3, #lines, text)
      -- the second column ends at the same place on every line
      local at
      for _, l in ipairs(lines) do
        local e = select(2, l:find("^%S+%s+%S+"))
        at = at or e
        assert.are.equal(at, e, text)
      end
    end
  end)

  -- Issue 26: the tool is split per subcommand family (lua/lecho/cli/);
  -- a subcommand added to a family but not dispatched, dispatched but
  -- missing from the top help, or an option its help does not name fails
  it("every subcommand is dispatched, in the top help, and its help names its options", function()
    local cli = require "lecho.cli"
    local top = {}
    for line in cli.USAGE:match("\n\n(.-)\n\n"):gmatch("[^\n]+") do top[line:match("^  (%l+) ")] = true end
    local entries = {}
    for _, fam in ipairs{ "pubsub", "stats", "bench", "record" } do
      for name, e in pairs(require("lecho.cli." .. fam)) do
        if type(e) == "table" and e.run then
          assert.is_nil(entries[name], name .. " defined twice")
          entries[name] = fam
          assert.are.equal(fam, cli.FAMILY[name], name .. " is in lecho.cli." .. fam .. " but not dispatched there")
          assert.is_true(top[name], name .. " is not in lecho --help")
          assert.matches("^usage: lecho " .. name .. " ", e.usage)
          for _, o in ipairs(e.opts) do
            if not o.internal then
              assert.is_truthy(e.usage:find(o[1], 1, true), ("lecho %s --help does not name %s"):format(name, o[1]))
            end
          end
        end
      end
    end
    for name in pairs(top) do assert.is_truthy(entries[name], name .. " is in lecho --help but has no entry") end
    for name in pairs(cli.FAMILY) do assert.is_truthy(entries[name], name .. " is dispatched but has no entry") end
    assert.are.equal(9, #require("lecho.cli.common").sorted(entries))
  end)

  it("sub --count and --for: 0 when the count came, 3 when time ran out", function()
    local _, ns = S.nameserver("--quiet")
    local body, rc = split(lecho(("sub quiet --count 1 --for 0.5 --nameserver %s"):format(ns)))
    assert.are.equal(3, rc)
    assert.are.equal("lecho sub: no producer on 'quiet' yet (lecho ls lists the channels); waiting\n", body)
  end)

  it("call prints a service's results, and a remote error with exit 1", function()
    local _, ns = S.nameserver("--quiet")
    local srv = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      assert(ctx:service("add", function(a) return a[1] + a[2], "sum" end))
      print("ready") io.stdout:flush()
      ctx:after(60, function() ctx:stop() end)
      ctx:run()
    ]], ns)
    assert(S.wait_file(srv.out, "ready", 20), S.errors(srv))
    assert.are.equal("5\n\"sum\"\nrc=0\n", lecho(("call add '{ 2, 3 }' --nameserver %s"):format(ns)))
    assert.are.equal('{"results":[5,"sum"]}\nrc=0\n', lecho(("call add '{ 2, 3 }' --json --nameserver %s"):format(ns)))
    local body, rc = split(lecho(("call add '{ 2 }' --nameserver %s"):format(ns)))
    assert.are.equal(1, rc)
    assert.matches("^lecho call: .*attempt to perform arithmetic", body)
    body, rc = split(lecho(("call nosuch --timeout 1 --nameserver %s"):format(ns)))
    assert.are.equal(1, rc)
    assert.are.equal("lecho call: no service nosuch\n", body)
  end)

  it("bench: a consumer in a child process, bounded figures as one JSON line", function()
    local _, ns = S.nameserver("--quiet")
    local body, rc = split(lecho(("bench --count 2000 --rtt 50 --for 30 --json --nameserver %s"):format(ns)))
    assert.are.equal(0, rc, body)
    local r = cjson.decode(body)
    assert.are.equal(2000, r.events)
    assert.are.equal(50, r.round_trips)
    assert.is_true(r.events_per_s > 0)
    assert.is_true(r.rtt_median_us > 0 and r.rtt_median_us <= r.rtt_p99_us)
  end)
end)

-- Ctrl-C ends every command with 130 while it waits (outside attack s7,
-- items 4 and 5): each started as a terminal starts a job (its own
-- process group, SIGINT at its default action), SIGINT to the group while
-- it waits on something that does not come (a service that sleeps, a
-- consumer that does not answer, a consumer that is not there, a name
-- server that is stopped), two busy loops beside.  Before: `call` exited
-- 1 (the call swallowed the interrupt), `pub --sync` only at its sync
-- timeout, `replay` with "internal error" and 1.
describe("lecho, Ctrl-C during a wait", function()
  local ns, stopped_ns, peer, rec
  setup(function()
    S.busy_loops(2)
    _, ns = S.nameserver("--quiet")
    peer = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local p = assert(ctx:channel("flood"):producer{ policy = "drop_oldest" })
      local i = 0
      ctx:every(0.01, function() i = i + 1 p:submit({ i = i }) end)
      assert(ctx:service("slowsvc", function() ctx:sleep(60) return 1 end))
      assert(ctx:channel("slow"):consumer(function() ctx:sleep(60) end))
      print("ready") io.stdout:flush()
      ctx:after(300, function() ctx:stop() end)
      ctx:run()
    ]], ns)
    assert(S.wait_file(peer.out, "ready", 20), S.errors(peer))
    rec = S.tmpname("rec") .. ".lecho"
    local body, rc = split(lecho(("record flood --out %s --for 1 --nameserver %s"):format(rec, ns)))
    assert.are.equal(0, rc, body)
    local nsc
    nsc, stopped_ns = S.nameserver("--quiet")
    S.kill(nsc, "STOP")
  end)
  teardown(function() S.cleanup() end)

  local cases = {
    { "call slowsvc {} --timeout 30", "ns" },
    { "pub slow 1 --sync", "ns" },
    { "replay REC --wait 30 --rename flood=nobody", "ns" },
    { "sub flood", "ns" },
    { "record flood --out OUT", "ns" },
    { "bench --for 30", "stopped" },
    { "top", "ns" },
    { "ls --timeout 30", "stopped" },
    { "stats --timeout 30", "stopped" },
  }
  for _, case in ipairs(cases) do
    it(case[1] .. ": 130, at once", function()
      local args = case[1]:gsub("REC", rec):gsub("OUT", S.tmpname("out") .. ".lecho")
      local argv = { S.luajit, S.root .. "/scripts/lecho" }
      for w in args:gmatch("%S+") do argv[#argv + 1] = w end
      argv[#argv + 1] = "--nameserver"
      argv[#argv + 1] = case[2] == "ns" and ns or stopped_ns
      local child = S.terminal_job(argv)
      S.sleep(2.5)
      assert.is_true(S.alive(child), "ended before the signal: " .. S.errors(child))
      local done, rc = S.ctrl_c_wait(child, { "INT" }, 6)
      assert.is_true(done, "not ended 6 s after SIGINT: " .. S.errors(child))
      assert.are.equal(130, rc, S.output(child) .. S.errors(child))
      assert.not_matches("internal error", S.errors(child))
      assert.not_matches("traceback", S.errors(child))
    end)
  end
end)
