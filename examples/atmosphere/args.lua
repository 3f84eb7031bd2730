-- examples/atmosphere/args.lua: the command-line reading the atmosphere
-- scripts share.
--
--   local A = dofile(here .. "/args.lua").new("viewer", usage)
--   A.parse(arg, {
--     ["--seconds"] = function(get) opts.seconds = get.number() end,
--     ["--quiet"]   = function() opts.quiet = true end,
--   }, fallback)                 -- fallback(flag) -> handler or nil (optional)
--   A.die("message", code)       -- "viewer: message" on stderr, exit code (2);
--                                -- a message from lecho loses its "lecho: "
--
-- --help and -h print the usage and exit 0; an unknown option, or a missing
-- or non-numeric value, dies with the usage.
--
-- Loading it also lets the example find lecho: from a checkout, the tree two
-- folders up from this file (no LUA_PATH/LUA_CPATH needed); installed, the
-- default module paths.

do
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  local root = here .. "/../.."
  local f = io.open(root .. "/lua/lecho/init.lua", "r")
  if f then
    f:close()
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = root .. "/lua/?.so;" .. package.cpath
  end
end

local M = {}

function M.new(prog, usage)
  local A = {}

  function A.die(msg, code)
    -- (an error raised by lecho says "lecho: ..." itself: one prefix is enough)
    msg = tostring(msg):gsub("^lecho: ", "")
    io.stderr:write(prog, ": ", msg, "\n")
    os.exit(code or 2)
  end

  function A.parse(argv, handlers, fallback)
    local i, flag = 1, nil
    local get = {}
    function get.value()
      local v = argv[i + 1]
      if v == nil then A.die(flag .. " needs a value\n" .. usage) end
      i = i + 1
      return v
    end
    function get.number()
      local v = get.value()
      return tonumber(v) or A.die(("%s needs a number, not '%s'"):format(flag, v))
    end
    while argv[i] do
      flag = argv[i]
      if flag == "--help" or flag == "-h" then
        io.write(usage)
        os.exit(0)
      end
      local h = handlers[flag] or (fallback and fallback(flag))
      if not h then A.die(("unknown option '%s'\n%s"):format(flag, usage)) end
      h(get, flag)
      i = i + 1
    end
  end

  return A
end

return M
