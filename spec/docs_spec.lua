-- The layout map cannot go stale: every file path doc/architecture.md names
-- in backticks exists, every function or object it names is in the code,
-- every file under core/, lua/ and scripts/ has its line there, and every path README.md names in backticks exists (or is a
-- build product git ignores, such as bench/results/).  No processes.
--
-- Run: LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" LUA_CPATH="$PWD/lua/?.so;;" \
--   LECHO_ROOT=$PWD luajit /usr/bin/busted spec/docs_spec.lua

local root = os.getenv("LECHO_ROOT") or "."

local function read(path)
  local f = assert(io.open(root .. "/" .. path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function sh(cmd)
  local p = assert(io.popen(("cd '%s' && %s"):format(root:gsub("'", "'\\''"), cmd)))
  local out = p:read("*a")
  p:close()
  return out
end

local function exists(path)
  local f = io.open(root .. "/" .. path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function ignored(path)
  return sh(("git check-ignore -q -- '%s' && echo yes"):format(path)):find("yes", 1, true) ~= nil
end

-- Files being added by a helper working in parallel: named in the map
-- ahead of time, checked once they exist.
local SOON = { ["core/transport/addr.c"] = true, ["core/transport/addr.h"] = true, ["lua/lecho/addr.lua"] = true }

local TOP = { core = true, lua = true, scripts = true, spec = true, bench = true, stress = true,
              rockspec = true, doc = true, examples = true }

-- The paths a Markdown text names in backticks: a backtick span that is
-- one path under a top-level folder of the tree (not a command line).
local function paths(text)
  local out, seen = {}, {}
  for span in text:gmatch("`([^`\n]+)`") do
    local top = span:match("^([%w_]+)/")
    if top and TOP[top] and span:match("^[%w_./-]+$") and not seen[span] then
      seen[span] = true
      out[#out + 1] = span
    end
  end
  return out
end

-- The files git knows under core/, lua/ and scripts/ (tracked, or new and
-- not ignored), which excludes build products such as lua/lecho/core.so.
local function source_files()
  local out = {}
  local list = sh("git ls-files --cached --others --exclude-standard -- core lua scripts")
  for f in list:gmatch("[^\n]+") do
    if exists(f) then out[#out + 1] = f end
  end
  return out
end

describe("doc/architecture.md", function()
  local map = read("doc/architecture.md")

  it("names only files and folders that exist", function()
    local named = paths(map)
    assert.is_true(#named > 50, "the map names too few paths: " .. #named)
    local missing = {}
    for _, p in ipairs(named) do
      if not exists(p) and not SOON[p] then missing[#missing + 1] = p end
    end
    assert.are.same({}, missing)
  end)

  it("names only functions and objects the code has (the walks cannot go stale)", function()
    local code = {}
    for _, f in ipairs(source_files()) do code[#code + 1] = read(f) end
    code = table.concat(code, "\n")
    local n, unknown, seen = 0, {}, {}
    for span in map:gmatch("`([^`\n]+)`") do
      -- An identifier, possibly qualified: lei_submit, Producer:submit, ctx.c:set_dests.
      if not seen[span] and (span:match("^[%a_][%w_]*$") or span:match("^[%a_][%w_]*[:.][%a_][%w_:.]*$")) then
        seen[span] = true
        n = n + 1
        local pat = "%f[%w_]" .. span:gsub("%.", "%%.") .. "%f[^%w_]"
        if not code:find(pat) then unknown[#unknown + 1] = span end
      end
    end
    assert.is_true(n > 50, "the map names too few functions: " .. n)
    assert.are.same({}, unknown)
  end)

  it("has a line for every file under core/, lua/ and scripts/", function()
    local files = source_files()
    assert.is_true(#files > 60, "git lists too few files: " .. #files)
    local absent = {}
    for _, f in ipairs(files) do
      -- a folder of data files (core/fuzz/frame/) may have one line for all;
      -- a source file or a script its own (Layout's row for lua/lecho/ is
      -- no line for the files in it), alone or with its header
      local named = map:find("\n| [^|\n]-`" .. f:gsub("%p", "%%%0") .. "`[^|\n]*|")
      local source = f:match("%.[ch]$") or f:match("%.lua$") or f:match("^scripts/")
      local dir = not source and f:match("^(.*)/[^/]+$")
      while not named and dir do
        named = map:find("\n| `" .. dir .. "/` |", 1, true)
        dir = dir:match("^(.*)/[^/]+$")
      end
      if not named then absent[#absent + 1] = f end
    end
    assert.are.same({}, absent)
  end)
end)

-- The public functions of a Lua module (issue 26 review: the Lua misses
-- were module functions no doc line named): a line "function M.x(" or
-- "M.x = function" at the margin.  Each is named on its file's line of
-- doc/architecture.md, as a word (`M.x`, `x`), so that a reader finds the
-- file of a function from the map.
local function public_functions(text)
  local out, seen = {}, {}
  for l in text:gmatch("[^\n]*") do
    local n = l:match("^function M%.([%w_]+)%s*%(") or l:match("^M%.([%w_]+)%s*=%s*function%f[^%w_]")
    if n and not seen[n] then seen[n] = true; out[#out + 1] = n end
  end
  return out
end

describe("doc/architecture.md's lines of Lua files", function()
  it("name every public function of their module (function M.x)", function()
    local map = read("doc/architecture.md")
    local missing, n = {}, 0
    for f in sh("git ls-files --cached --others --exclude-standard -- 'lua/*.lua'"):gmatch("[^\n]+") do
      if exists(f) then
        local line = map:match("\n| `" .. f:gsub("%p", "%%%0") .. "` |([^\n]*)") or ""
        for _, name in ipairs(public_functions(read(f))) do
          n = n + 1
          if not line:find("%f[%w_]" .. name .. "%f[^%w_]") then missing[#missing + 1] = f .. ": M." .. name end
        end
      end
    end
    assert.is_true(n > 150, "too few public functions found under lua/: " .. n)
    assert.are.same({}, missing)
  end)

  it("check reads function M.x( and M.x = function, not a local or a method", function()
    assert.are.same({ "a", "b" }, public_functions("function M.a(x)\nM.b = function(y)\nlocal function c()\n"
      .. "function List.d(l)\n  function M.e()\nM.f = f\n"))
  end)
end)

describe("doc/README.md", function()
  it("lists every page of doc/ with a line each (issue 25)", function()
    local index = read("doc/README.md")
    local missing = {}
    for f in sh("ls doc"):gmatch("[^\n]+") do
      if f ~= "README.md" and not index:find("\n| `doc/" .. f .. "` |", 1, true) then missing[#missing + 1] = "doc/" .. f end
    end
    assert.are.same({}, missing)
  end)

  it("and its pages name only paths that exist or that the build makes", function()
    local missing = {}
    for f in sh("ls doc"):gmatch("[^\n]+") do
      for _, p in ipairs(paths(read("doc/" .. f))) do
        if not exists(p) and not ignored(p) then missing[#missing + 1] = "doc/" .. f .. ": " .. p end
      end
    end
    assert.are.same({}, missing)
  end)
end)

describe("README.md", function()
  it("names only paths that exist or that the build makes", function()
    local missing = {}
    for _, p in ipairs(paths(read("README.md"))) do
      if not exists(p) and not ignored(p) then missing[#missing + 1] = p end
    end
    assert.are.same({}, missing)
  end)

  -- review 7 (F): README said Python's arrays are "NumPy arrays over the
  -- received memory, no copy", while doc/python.md (and the package:
  -- HOLD_MIN) copies those under 256 KiB
  it("says when Python's arrays are copied, as doc/python.md and the package do", function()
    local kib = tonumber(read("python/lecho/_values.py"):match("\nHOLD_MIN = (%d+) %* 1024\n"))
    assert.truthy(kib, "no HOLD_MIN in python/lecho/_values.py")
    local flat = function(t) return (t:gsub("%s+", " ")) end
    assert.matches(("An array of %d KiB or more"):format(kib), flat(read("doc/python.md")), 1, true)
    local py = flat(assert(read("README.md"):match("\n## From Python\n(.-)\n## ")))
    local says = assert(py:match("arrays are ([^)]*)"), "README's From Python says nothing of arrays")
    assert.matches(("%d KiB"):format(kib), says, 1, true)
    assert.matches("copied", says, 1, true)
  end)

  -- review 7 (recheck 1): README's close paragraph gave a consumer "stopped
  -- or killed" as what close reports, the case that at moderate volume it
  -- cannot know (the events are in the kernel's buffers): it says how much
  -- those hold
  it("says how much close cannot know: what the kernel's buffers hold", function()
    local flat = read("README.md"):gsub("%s+", " ")
    local close = assert(flat:match("`ctx:close%(%)` delivers what was submitted(.-)doc/semantics.md \"Close\""))
    assert.matches("%d+ [MK]i?B on loopback", close)
  end)

  it("doc/architecture.md names in its Layout every script and every page of doc/ (issue 25)", function()
    local layout = read("doc/architecture.md"):match("\n## Layout\n(.-)\n## ") or read("doc/architecture.md"):match("\n## Layout\n(.*)$")
    assert.truthy(layout, "doc/architecture.md has no Layout section")
    local row = function(folder) return layout:match("\n| `" .. folder:gsub("%p", "%%%0") .. "` |([^\n]*)") or "" end
    local missing = {}
    for f in sh("ls scripts"):gmatch("[^\n]+") do
      if not row("scripts/"):find("`" .. f .. "`", 1, true) then missing[#missing + 1] = "scripts/" .. f end
    end
    for f in sh("ls doc"):gmatch("[^\n]+") do
      if not row("doc/"):find("`doc/" .. f .. "`", 1, true) then missing[#missing + 1] = "doc/" .. f end
    end
    assert.are.same({}, missing)
  end)
end)
