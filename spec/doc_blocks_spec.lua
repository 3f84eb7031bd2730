-- Every code block of README.md and doc/*.md is run or checked here, so
-- none can rot (issue 25).  A block is fenced (an indented code block
-- fails: it could say nothing about itself) and its info string says what
-- it is and how it is checked:
--
--   ```lua [nameserver=ADDR] [background] [after=TEXT]
--       a program: run under LuaJIT from the checkout's root with its lua/ on
--       the paths; it must exit 0.  With nameserver=ADDR, ADDR in the text is
--       replaced by the address of a name server this spec started.
--       `background`: started and left running while the next `lua` block
--       runs (that one waits until the background one printed TEXT, its
--       `after=`); then the background one must end by itself, with 0, or,
--       marked `stop`, is sent SIGTERM and must end as documented (143).
--   ```text output [of the background block]
--       what the program just above prints, line for line and nothing more
--       (`...` as a whole line stands for any lines, none included; `...`
--       inside a line matches anything).  Follows the program it checks.
--   ```lua fragment
--       a part of a program (free names): compiled with loadstring.
--   ```lua modulator [params={...}] [event={...}] [expect={...}]
--       a modulator: loaded as a consumer's modulator in a real context (its
--       sandbox compiles and runs it); with `event`, the event is submitted
--       and what the consumer receives must equal `expect` (`expect=nil`:
--       nothing arrives).
--   ```lua policy
--       a name server's policy file: loaded by lecho.policy.
--   ```lua service
--       the source of a sandboxed service (returns the handler): loaded
--       through ctx:sandbox.
--   ```sh
--       shell commands, run with `bash -e` in a temp dir that holds links to
--       the checkout's scripts/, examples/ and lua/, with `make env`'s paths
--       and the name server's address for 127.0.0.1:7700; must exit 0.
--   ```sh with="PROGRAM ARGS" ready=TEXT
--       the same, while `luajit PROGRAM ARGS --nameserver ADDR` runs beside
--       it (started from the checkout's root, waited for until it printed
--       TEXT, stopped after).
--   ```sh norun="REASON" spec=spec/x_spec.lua   (also ```text ..., ```c ...)
--       not run here, for REASON (two hosts, runs for minutes, an
--       interactive session ...); the named spec file must exist and name
--       the page the block is on: it is the one that covers the block.
--   ```json [policy]
--       parsed (JSON text, one document); a policy is loaded by lecho.policy.
--   ```c [fragment]
--       compiled with -Wall -Wextra -Werror -fsyntax-only against
--       core/lecho.h; a fragment is the part of a program: what precedes its
--       first line `lecho_ctx *ctx;` goes at file level, the rest into main,
--       which declares `alpha`, `u`, `n`, `step`, `cells` and `compute` for it.
--   ```python fragment
--       a part of a Python program (free names: a context, a channel):
--       compiled by python3 (compile(), top-level await allowed as in a
--       notebook; no run); doc/python.md's programs
--       run as python/tests do.
--   ```hex NAME
--       checked by spec/protocol_doc_spec.lua.
-- Anything else fails, naming the file and line.
local S = require "spec.support"
local P = require "spec.support.proc"
local cjson = require "cjson"

local PAGES = { "README.md" }
do
  local ls = io.popen(("cd %s && ls doc/*.md"):format(S.sh_quote(S.root)))
  for f in ls:read("*a"):gmatch("[^\n]+") do PAGES[#PAGES + 1] = f end
  ls:close()
end

-- key=value words of an info string: value quoted, braced or bare; a word
-- without = is a flag.
local function attrs(info)
  local kind, rest = info:match("^(%S+)%s*(.*)$")
  local a, flags = {}, {}
  local i = 1
  while i <= #rest do
    local s = rest:find("%S", i)
    if not s then break end
    local key, e = rest:match("^([%w_-]+)=()", s)
    if key then
      local c = rest:sub(e, e)
      local v, n
      if c == '"' then v, n = rest:match('^"([^"]*)"()', e)
      elseif c == "{" or c == "(" then v = rest:match(c == "{" and "^%b{}" or "^%b()", e); n = v and e + #v
      else v, n = rest:match("^(%S+)()", e) end
      assert(v, "bad info string: " .. info)
      a[key], i = v, n
    else
      local w, n = rest:match("^(%S+)()", s)
      flags[w], i = true, n
    end
  end
  return kind, a, flags
end

local function blocks(page)
  local text = assert(S.read(S.root .. "/" .. page))
  local out, indented = {}, {}
  local open, prev = nil, ""
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if open then
      if line:match("^%s*```%s*$") then out[#out + 1] = open; open = nil
      else open.body[#open.body + 1] = line end
    elseif line:match("^%s*```") then
      open = { page = page, line = n, info = line:match("^%s*```%s*(.-)%s*$"), body = {} }
    elseif prev:match("^%s*$") and line:match("^    %S") then
      indented[#indented + 1] = ("%s:%d: %s"):format(page, n, line)
    end
    prev = line
  end
  assert(not open, page .. ": a block is not closed")
  for _, b in ipairs(out) do b.text = table.concat(b.body, "\n") .. "\n" end
  return out, indented
end

local ALL, INDENTED = {}, {}
for _, page in ipairs(PAGES) do
  local bs, ind = blocks(page)
  for _, b in ipairs(bs) do ALL[#ALL + 1] = b end
  for _, l in ipairs(ind) do INDENTED[#INDENTED + 1] = l end
end

local function where(b) return ("%s:%d (```%s)"):format(b.page, b.line, b.info) end

-- the `text output` check: the program's output, line for line (`...` as a
-- whole line stands for any lines, none included); nothing extra
local function check_output(b, expected, got)
  local lines, wants = {}, {}
  for l in (got:match("\n$") and got or got .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  if got == "" then lines = {} end
  for w in expected:gmatch("([^\n]*)\n") do
    wants[#wants + 1] = w ~= "..." and "^" .. w:gsub("%p", "%%%0"):gsub("%%%.%%%.%%%.", ".-") .. "$" or false
  end
  local function match(wi, li)
    if wi > #wants then return li > #lines end
    if not wants[wi] then
      for k = li, #lines + 1 do if match(wi + 1, k) then return true end end
      return false
    end
    return li <= #lines and lines[li]:match(wants[wi]) ~= nil and match(wi + 1, li + 1)
  end
  assert(match(1, 1), ("%s: its output is not, line for line, the `text output` block:\n%s--- expected:\n%s")
    :format(where(b), got, expected))
end

local function sh(cmd)
  local ok, out, code = S.sh(cmd)
  return ok, out, code
end

describe("the code blocks of README.md and doc/*.md", function()
  local ns_child, ns
  local env_prefix

  setup(function()
    ns_child, ns = S.nameserver()
    env_prefix = ("cd %s && LUA_PATH=%s LUA_CPATH=%s "):format(S.sh_quote(S.root),
      S.sh_quote(S.root .. "/lua/?.lua;" .. S.root .. "/lua/?/init.lua;;"),
      S.sh_quote(S.root .. "/lua/?.so;;"))
  end)
  teardown(function() S.cleanup() end)

  it("are all fenced, so that each says what it is", function()
    assert.are.same({}, INDENTED)
    assert.is_true(#ALL > 30, "found only " .. #ALL .. " blocks")
  end)

  local function subst(b, a)
    if a.nameserver then
      local plain = a.nameserver:gsub("%p", "%%%0")
      assert(b.text:find(a.nameserver, 1, true), where(b) .. ": does not name " .. a.nameserver)
      return (b.text:gsub(plain, ns))
    elseif a.replace then
      local from, to = a.replace:match("^(.-)>(.*)$")
      assert(from and b.text:find(from, 1, true), where(b) .. ": does not name " .. tostring(from))
      return (b.text:gsub(from:gsub("%p", "%%%0"), (to:gsub("%%", "%%%%"))))
    end
    return b.text
  end

  local function start(b, a)
    local file = P.write(S.tmpname("block") .. ".lua", subst(b, a))
    return S.spawn(env_prefix .. S.luajit .. " " .. S.sh_quote(file))
  end

  local function finish(b, child)
    local done, rc = S.wait(child, 40)
    assert(done, where(b) .. " did not end: " .. S.output(child) .. S.errors(child))
    assert(rc == 0, ("%s exited %s:\n%s%s"):format(where(b), tostring(rc), S.output(child), S.errors(child)))
    return S.output(child)
  end

  local sandbox_ctx
  local function ctx()
    if not sandbox_ctx then sandbox_ctx = require("lecho").context{ quiet = true } end
    return sandbox_ctx
  end

  for i, b in ipairs(ALL) do
    local kind, a, flags = attrs(b.info ~= "" and b.info or "?")
    it(("%s:%d is a ```%s and passes its check"):format(b.page, b.line, b.info), function()
      if a.norun then
        assert(a.norun ~= "", where(b) .. ": norun needs its reason")
        assert(a.spec, where(b) .. ": norun names no spec that covers it")
        local spec = S.read(S.root .. "/" .. a.spec)
        assert(spec, where(b) .. ": no spec " .. a.spec)
        local page = b.page == "README.md" and "README" or b.page
        assert(spec:find(page, 1, true), ("%s: %s does not name %s"):format(where(b), a.spec, page))
        return
      end
      if kind == "hex" then
        assert(b.info:match("^hex [%w_]+$"), where(b))
        return
      elseif kind == "lua" and flags.fragment then
        assert(loadstring(b.text, "=" .. where(b)))
      elseif kind == "lua" and flags.modulator then
        local c = ctx()
        local ch = c:channel("doc-block-" .. i)
        local got = {}
        local params = a.params and assert(loadstring("return " .. a.params))() or {}
        local cons = assert(ch:consumer(function(ev) got[#got + 1] = ev end,
          { modulator = b.text, params = params, on_error = function(err) got.err = err end }))
        if a.event then
          local p = assert(ch:producer())
          assert(p:submit_sync(assert(loadstring("return " .. a.event))(), { timeout = 5 }))
          assert(not got.err, tostring(got.err))
          local expect = assert(loadstring("return " .. (a.expect or "nil")))()
          assert.are.same(expect, got[1])
          p:close()
        end
        cons:close()
      elseif kind == "lua" and flags.policy then
        local file = P.write(S.tmpname("policy") .. ".lua", b.text)
        assert(require("lecho.policy").load(file))
      elseif kind == "lua" and flags.service then
        local sb = assert(ctx():sandbox(b.text, "doc-block-" .. i))
        if sb.close then sb:close() end
      elseif kind == "lua" then
        assert(not flags.fragment)
        local child = start(b, a)
        if flags.background then
          local nxt = ALL[i + 1]
          assert(nxt and nxt.info:match("^lua"), where(b) .. ": a background block needs a lua block after it")
          local _, na = attrs(nxt.info)
          assert(na.after, where(nxt) .. ": says not what to wait for (after=)")
          assert(S.wait_file(child.out, na.after:gsub("%p", "%%%0"), 20),
                 where(b) .. " never printed " .. na.after .. ": " .. S.errors(child))
          local fg = start(nxt, na)
          local out = finish(nxt, fg)
          local k = i + 2
          if ALL[k] and ALL[k].info == "text output" then check_output(nxt, ALL[k].text, out); k = k + 1 end
          if flags.stop then
            S.kill(child, "TERM")
            local done, rc = S.wait(child, 20)
            assert(done and rc == 143, ("%s: after SIGTERM: %s, %s\n%s"):format(where(b), tostring(done), tostring(rc), S.errors(child)))
          end
          local bout = flags.stop and S.output(child) or finish(b, child)
          if ALL[k] and ALL[k].info == "text output of the background block" then
            check_output(b, ALL[k].text, bout)
          end
          b.ran, nxt.ran = true, true
        else
          if b.ran then return end
          local prevb = ALL[i - 1]
          assert(not (prevb and prevb.info:match("^lua .*background")), where(b) .. ": run with the background block")
          local out = finish(b, child)
          if ALL[i + 1] and ALL[i + 1].info == "text output" then check_output(b, ALL[i + 1].text, out) end
        end
      elseif kind == "text" and (b.info == "text output" or b.info == "text output of the background block") then
        local prevb = ALL[i - 1]
        assert(prevb and prevb.page == b.page and (prevb.info:match("^lua") or prevb.info:match("^sh") or prevb.info:match("^text output")),
               where(b) .. ": an output with no program before it")
        assert(not prevb.info:find("norun=", 1, true), where(b) .. ": the output of a block not run")
      elseif kind == "text" and b.info:match("^text bytes ") then
        local lecho = require "lecho"
        local v = assert(loadstring("local lecho = ...; return " .. assert(a.value, where(b) .. ": no value=")))(lecho)
        local want = {}
        for line in b.text:gmatch("[^\n]+") do
          local hex = line:match("^(.-)%s%s") or line
          for byte in hex:gmatch("%S+") do
            assert(byte:match("^%x%x$"), where(b) .. ": not a byte: " .. byte)
            want[#want + 1] = byte:lower()
          end
        end
        local enc = assert(lecho.encode(v))
        local got = {}
        for k = 1, #enc do got[k] = ("%02x"):format(enc:byte(k)) end
        assert.are.equal(table.concat(want, " "), table.concat(got, " "))
      elseif kind == "sh" then
        local dir = S.tmpdir() .. "/shblock-" .. i   -- not "sh-N": S.sh's output files are named so
        assert(sh(("mkdir -p %s && cd %s && ln -s %s/scripts %s/examples %s/lua ."):format(dir, dir, S.root, S.root, S.root)))
        local beside
        if a.with then
          beside = S.spawn(("%s%s %s --nameserver %s"):format(env_prefix, S.luajit, a.with, ns))
          assert(a.ready, where(b) .. ": with= needs ready=")
          assert(S.wait_file(beside.out, a.ready:gsub("%p", "%%%0"), 20),
                 where(b) .. ": " .. a.with .. " never printed " .. a.ready .. ": " .. S.errors(beside))
        end
        local file = P.write(S.tmpname("block") .. ".sh", (b.text:gsub("127%.0%.0%.1:7700", ns)))
        local ok, out = sh(("cd %s && LUA_PATH=%s LUA_CPATH=%s timeout 60 bash -e %s 2>&1"):format(dir,
          S.sh_quote(S.root .. "/lua/?.lua;" .. S.root .. "/lua/?/init.lua;;"),
          S.sh_quote(S.root .. "/lua/?.so;;"), S.sh_quote(file)))
        if beside then S.kill(beside, "TERM"); S.wait(beside, 10) end
        assert(ok, where(b) .. " failed:\n" .. tostring(out))
        if ALL[i + 1] and ALL[i + 1].info == "text output" then check_output(b, ALL[i + 1].text, out) end
      elseif kind == "json" then
        assert(pcall(cjson.decode, b.text), where(b) .. ": not JSON")
        if flags.policy then
          local file = P.write(S.tmpname("policy") .. ".json", b.text)
          assert(require("lecho.policy").load(file))
        end
      elseif kind == "c" then
        local src
        if flags.fragment then
          local at = assert(b.text:find("lecho_ctx *ctx;", 1, true), where(b) .. ": a C fragment without `lecho_ctx *ctx;`")
          src = "#include <stdio.h>\n#include <stdlib.h>\n#include <lecho.h>\n" .. b.text:sub(1, at - 1)
            .. "static void compute(double *u, double a) { (void)u; (void)a; }\n"
            .. "int main(void) {\n  double alpha = 0.1, u[4] = { 0 };\n  int n = 2, step;\n  size_t cells = 4;\n"
            .. b.text:sub(at) .. "  return 0;\n}\n"
        else
          src = b.text
        end
        local c = P.write(S.tmpname("block") .. ".c", src)
        local ok, log = sh(("cc -Wall -Wextra -Werror -fsyntax-only -I%s/core %s 2>&1"):format(S.sh_quote(S.root), c))
        assert(ok, where(b) .. ":\n" .. tostring(log) .. "\n" .. src)
      elseif kind == "python" and flags.fragment then
        local f = P.write(S.tmpname("block") .. ".py", b.text)
        local cmd = ("%s -c %s %s"):format(os.getenv("PYTHON") or "/usr/bin/python3",
          S.sh_quote("import sys, ast; compile(open(sys.argv[1]).read(), sys.argv[1], \"exec\", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)"), S.sh_quote(f))
        local pipe = io.popen(cmd .. " 2>&1; echo rc=$?")
        local log = pipe:read("*a")
        pipe:close()
        assert(log:match("rc=0\n$"), ("%s: %s:\n%s"):format(where(b), cmd, log))
      else
        error(where(b) .. ": not a kind of block this spec knows (see its head)")
      end
    end)
  end

  it("leaves no output block unchecked", function()
    for i, b in ipairs(ALL) do
      if b.info:match("^text output") then
        local p = ALL[i - 1]
        assert(p and (p.info:match("^lua") or p.info:match("^sh") or p.info:match("^text output")), where(b))
      end
    end
    if sandbox_ctx then sandbox_ctx:close() end
  end)
end)
