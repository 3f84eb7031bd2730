-- The layout of lua/lecho/ cannot drift (issue 26):
--  * Context, Channel and the gateway's Gateway each have a home file
--    (lecho.context, lecho.channel, lecho.gateway) whose header lists every method defined elsewhere,
--    by module; this spec reads those lists and the `function Class:name`
--    definitions of every file under lua/lecho/ and fails on a method
--    defined outside its home and not listed, listed but not defined
--    there, or defined twice;
--  * the name server's side (lua/lecho/ns/) is required by no client
--    module but lecho's init, which makes a name server's or manager's
--    registry.
-- No processes.
--
-- Run: LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" LUA_CPATH="$PWD/lua/?.so;;" \
--   LECHO_ROOT=$PWD luajit /usr/bin/busted spec/lua_layout_spec.lua

local root = os.getenv("LECHO_ROOT") or "."

local function read(path)
  local f = assert(io.open(root .. "/" .. path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Every Lua file under lua/lecho/, as { path, module }.
local function lua_files()
  local p = assert(io.popen(("cd '%s' && find lua/lecho -name '*.lua' | sort"):format(root:gsub("'", "'\\''"))))
  local out = {}
  for path in p:lines() do
    local mod = path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    out[#out + 1] = { path = path, mod = mod }
  end
  p:close()
  assert(#out > 30, "too few Lua files under lua/lecho/: " .. #out)
  return out
end

-- The methods a class's home header lists: { [module] = { name = true } }.
-- The list is the run of "--   lecho.x: a, b" lines (and their
-- continuation lines, "--" and more spaces) after the sentence that says
-- where the methods not defined here are.
local function listed(home_src, class)
  local out, mod = {}, nil
  local started = false
  for line in home_src:gmatch("([^\n]*)\n") do
    if not started then
      if line:find("This is the home of " .. class, 1, true) then started = "sentence" end
    elseif started == "sentence" then
      if line:match("^%-%-   lecho%.") then started = "list" end
    end
    if started == "list" then
      local body = line:match("^%-%-   (.*)$")
      if not body then break end
      local m, rest = body:match("^(lecho%.[%w_.]+):%s*(.*)$")
      if m then
        mod = m
        assert(not out[mod], class .. ": module listed twice: " .. mod)
        out[mod] = {}
      else
        rest = body
      end
      for name in rest:gmatch("[%w_]+") do out[mod][name] = true end
    end
  end
  assert(started == "list", class .. ": no list of methods in its home's header")
  return out
end

-- Where each method of class is defined: { [name] = { module, ... } }.
-- A method is `function Class:name` or `function Class.name` at the start
-- of a line (indented too), or `Class.name = ` / `Class["name"] =`.
local function defined(files, class)
  local out = {}
  for _, f in ipairs(files) do
    local src = read(f.path)
    local function add(name)
      out[name] = out[name] or {}
      table.insert(out[name], f.mod)
    end
    for name in ("\n" .. src):gmatch("\n%s*function " .. class .. "[:.]([%w_]+)") do add(name) end
    for name in ("\n" .. src):gmatch("\n%s*" .. class .. "%.([%w_]+)%s*=[^=]") do
      if name ~= "__index" then add(name) end
    end
    for name in ("\n" .. src):gmatch("\n%s*" .. class .. "%[[\"']([%w_]+)[\"']%]%s*=[^=]") do add(name) end
  end
  return out
end

local function check(class, home_mod)
  local files = lua_files()
  local home
  for _, f in ipairs(files) do if f.mod == home_mod then home = f end end
  assert(home, "no home file for " .. class)
  local list = listed(read(home.path), class)
  local defs = defined(files, class)
  local problems = {}
  local n = 0
  for name, mods in pairs(defs) do
    n = n + 1
    if #mods > 1 then
      problems[#problems + 1] = ("%s:%s is defined %d times (%s)"):format(class, name, #mods, table.concat(mods, ", "))
    end
    for _, m in ipairs(mods) do
      if m ~= home_mod and not (list[m] and list[m][name]) then
        problems[#problems + 1] = ("%s:%s is defined in %s but not listed in %s's header"):format(class, name, m, home_mod)
      end
    end
  end
  for m, names in pairs(list) do
    for name in pairs(names) do
      local here = false
      for _, dm in ipairs(defs[name] or {}) do if dm == m then here = true end end
      if not here then
        problems[#problems + 1] = ("%s's header lists %s:%s under %s, which does not define it"):format(home_mod, class, name, m)
      end
    end
  end
  table.sort(problems)
  return problems, n
end

describe("lua/lecho/ layout", function()
  it("every method of Context is in lecho.context or listed in its header under the module defining it", function()
    local problems, n = check("Context", "lecho.context")
    assert.is_true(n > 50, "too few Context methods found: " .. n)
    assert.are.same({}, problems)
  end)

  it("every method of Channel is in lecho.channel or listed in its header under the module defining it", function()
    local problems, n = check("Channel", "lecho.channel")
    assert.is_true(n > 25, "too few Channel methods found: " .. n)
    assert.are.same({}, problems)
  end)

  it("every method of Gateway is in lecho.gateway or listed in its header under the module defining it", function()
    local problems, n = check("Gateway", "lecho.gateway")
    assert.is_true(n > 15, "too few Gateway methods found: " .. n)
    assert.are.same({}, problems)
  end)

  it("the lists catch a method added elsewhere, a stale entry and a second definition", function()
    -- the checker itself, on a made-up tree: it must be able to fail
    local files = { { path = "x", mod = "lecho.home" }, { path = "y", mod = "lecho.other" } }
    local src = {
      x = "-- This is the home of K: elsewhere:\n--   lecho.other: a, gone\n\nfunction K:h() end\nfunction K:b() end\n",
      y = "function K:a() end\nfunction K:b() end\n  function K.c() end\n",
    }
    local list = listed(src.x, "K")
    assert.are.same({ ["lecho.other"] = { a = true, gone = true } }, list)
    local real = read
    read = function(p) return src[p] end
    local defs = defined(files, "K")
    read = real
    assert.are.same({ h = { "lecho.home" }, b = { "lecho.home", "lecho.other" }, a = { "lecho.other" },
                      c = { "lecho.other" } }, defs)
  end)

  it("no client module requires the name server's side (lua/lecho/ns/) but init", function()
    local allowed = { ["lecho"] = true }
    local bad = {}
    for _, f in ipairs(lua_files()) do
      if not f.mod:find("^lecho%.ns%.") then
        local src = read(f.path)
        for m in src:gmatch("require%s*%(?%s*[\"'](lecho%.ns%.[%w_.]+)[\"']") do
          if not allowed[f.mod] then bad[#bad + 1] = f.path .. " requires " .. m end
        end
      end
    end
    assert.are.same({}, bad)
  end)
end)
