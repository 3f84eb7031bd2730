-- lecho.patterns (the stoppable pattern functions of modulator states) must
-- answer as LuaJIT's own string functions do.
local root = os.getenv("LECHO_ROOT") or "."
local install = dofile(root .. "/lua/lecho/patterns.lua")
local P = install({})               -- into a scratch table: string stays as it is

local PATTERNS = {
  "a", "abc", "a.c", "%a+", "%d+", "%s*", "%w+%s*=%s*%w+", "[abc]+", "[^abc]+", "[a-f]+",
  "[%d%.]+", "^abc", "abc$", "^$", "a*", "a-", "a?b", "a+b", "(a)(b)", "()a()", "(a*(.)%w(%s*))",
  "%bxy", "%b()", "%f[%w]%w+", "%f[%W]", "(%w+)%1", "[]]", "[^]]", "[a-]", "%.", "%%", "x*y-z?",
  ".-b", ".-", "(.-)%s", "^(%S+)%s+(%S+)", "[%a_][%w_]*", "%x%x", "%u%l+", "%p", "%c", "%z",
  "[%z]", "(h)(e)(l)(l)(o)", "a)b", "a]b", "", "()", "^", "$", "x$y", "%A+", "%S+", "%D",
}
local SUBJECTS = {
  "", "a", "abc", "aaab", "hello world", "key = value; other=thing", "x(a(b)c)y", "xay xby",
  "  leading", "trailing  ", "12.5e3 and 7", "THE Quick brown", "a)b a]b", "\0z\1", "aaaa",
  "abcabc", "(())()", "one two  three", "_id9 = 42", "]]]", "a-b-c", "%d%%",
}

local function pack(...) return { n = select("#", ...), ... } end

local function same_call(fname, f1, f2, ...)
  local a = pack(pcall(f1, ...))
  local b = pack(pcall(f2, ...))
  if a[1] ~= b[1] then
    return false, ("%s: C %s, Lua %s (%s)"):format(fname, tostring(a[1]), tostring(b[1]),
      tostring(a[1] and b[2] or a[2]))
  end
  if not a[1] then return true end              -- both raised: messages may differ
  if a.n ~= b.n then return false, fname .. ": different number of results" end
  for i = 2, a.n do
    if a[i] ~= b[i] then
      return false, ("%s: result %d: C %s, Lua %s"):format(fname, i - 1, tostring(a[i]), tostring(b[i]))
    end
  end
  return true
end

local function all(it)
  local out = {}
  for a, b, c in it do out[#out + 1] = tostring(a) .. "|" .. tostring(b) .. "|" .. tostring(c) end
  return table.concat(out, ",")
end

describe("lecho.patterns", function()
  it("finds and matches as string.find and string.match, with every init", function()
    for _, p in ipairs(PATTERNS) do
      for _, s in ipairs(SUBJECTS) do
        for _, init in ipairs{ nil, 1, 2, -1, -3, 0, #s, #s + 1, #s + 2 } do
          local ok, err = same_call("find", string.find, P.find, s, p, init)
          assert(ok, ("%q:find(%q, %s): %s"):format(s, p, tostring(init), tostring(err)))
          ok, err = same_call("match", string.match, P.match, s, p, init)
          assert(ok, ("%q:match(%q, %s): %s"):format(s, p, tostring(init), tostring(err)))
        end
        assert(same_call("find plain", string.find, P.find, s, p, 1, true))
      end
    end
  end)

  it("iterates as string.gmatch and substitutes as string.gsub", function()
    local repls = { "<%0>", "%1-%1", "x", "%%", function(a) return a and #a > 1 and a:upper() end,
                    { a = "A", abc = 1, hello = false } }
    for _, p in ipairs(PATTERNS) do
      for _, s in ipairs(SUBJECTS) do
        local c1, e1 = pcall(function() return all(string.gmatch(s, p)) end)
        local c2, e2 = pcall(function() return all(P.gmatch(s, p)) end)
        assert(c1 == c2 and (not c1 or e1 == e2),
               ("%q:gmatch(%q): C %s, Lua %s"):format(s, p, tostring(e1), tostring(e2)))
        for _, r in ipairs(repls) do
          for _, n in ipairs{ nil, 0, 1, 2 } do
            local ok, err = same_call("gsub", string.gsub, P.gsub, s, p, r, n)
            assert(ok, ("%q:gsub(%q, %s, %s): %s"):format(s, p, tostring(r), tostring(n), tostring(err)))
          end
        end
      end
    end
  end)
end)
