-- lua/lecho/cli/init.lua (lecho.cli): what scripts/lecho does, the
-- command-line tool for the daily things (doc/operations.md "The lecho
-- command"):
--
--   lecho ls                       channels of a name server, who produces, who consumes
--   lecho sub CHANNEL              print its events (Ctrl-C ends it)
--   lecho pub CHANNEL VALUE|-      submit a Lua literal, or JSON lines from stdin
--   lecho call SERVICE [ARGS]      call a service, print its reply
--   lecho stats [PROCESS]          one process's counters (default: the name server's)
--   lecho top                      live counters of every process of a name server
--   lecho bench                    a quick pub/sub and round-trip figure
--   lecho record CHANNEL...        write a channel's events to a file
--   lecho replay FILE...           publish a recording again
--
-- JSON lines on stdout with --json (one object per line); messages on
-- stderr as "lecho SUB: ...".  Exit codes (M.EXIT): 0 done, 1 failed (a
-- name server or process unreachable, refused, a remote error, not
-- delivered), 2 usage, 3 timed out (sub --count not reached within --for,
-- a call or sync submit past its timeout), 130/143 ended by SIGINT/SIGTERM
-- (after closing the context: what was queued is delivered within its
-- linger).
--
-- This is the home of the tool: the list of subcommands and the dispatch.
-- Each subcommand is an entry { opts, pos, usage, run } of the module of
-- its family, in lua/lecho/cli/:
--   common.lua   what they share: exit codes, the command line (parse),
--                Lua literals, output, the context, signals, finishing
--   pubsub.lua   ls, sub, pub, call
--   stats.lua    stats, top
--   bench.lua    bench
--   record.lua   record, replay (and replay's step commands)

local C = require "lecho.cli.common"

local M = {}

M.EXIT = C.EXIT
local EXIT = M.EXIT

-- subcommand -> its family's module (lecho.cli.FAMILY)
local FAMILY = {
  ls = "pubsub", sub = "pubsub", pub = "pubsub", call = "pubsub",
  stats = "stats", top = "stats", bench = "bench", record = "record", replay = "record",
}
M.FAMILY = FAMILY

local USAGE = [[
usage: lecho SUBCOMMAND [OPTIONS] [ARGS]

  ls                      list the channels of a name server
  sub CHANNEL             print the events of a channel until Ctrl-C
  pub CHANNEL VALUE|-     submit a value (a Lua literal), or JSON lines from stdin
  call SERVICE [ARGS]     call a service (ARGS: a Lua literal) and print its reply
  stats [PROCESS]         a process's counters (default: the name server's)
  top                     live counters of every process of a name server
  bench                   a quick pub/sub throughput and round-trip latency figure
  record CHANNEL... --out FILE   write a channel's events to a file (doc/recording.md)
  replay FILE...          publish a recording again: 1x, Nx, max, or step by step

`lecho SUBCOMMAND --help` says more of each.
]] .. C.COMMON
M.USAGE = USAGE

-- The entry { opts, pos, usage, run } of subcommand cmd, or nil.
local function command(cmd)
  local fam = FAMILY[cmd]
  return fam and require("lecho.cli." .. fam)[cmd]
end

M.die = C.die
M.literal = C.literal
M.print_stats = require("lecho.cli.stats").print_stats
M.quantile = require("lecho.cli.stats").quantile

--- Reads argv for subcommand cmd: options (anywhere; `--` ends them),
-- positionals; --help prints its usage and exits 0; anything wrong exits 2.
function M.parse(cmd, argv)
  return C.parse(cmd, command(cmd), argv)
end

--- Runs the tool on argv (a list of strings); exits the process.
function M.main(argv)
  local cmd = argv[1]
  if cmd == nil or cmd == "--help" or cmd == "-h" or cmd == "help" then
    io.write(USAGE)
    os.exit(cmd == nil and EXIT.usage or EXIT.ok)
  end
  local entry = command(cmd)
  if not entry then C.die(nil, ("unknown subcommand '%s' (lecho --help)"):format(cmd)) end
  local rest = {}
  for i = 2, #argv do rest[#rest + 1] = argv[i] end
  local opts, pos = M.parse(cmd, rest)
  local ok, err = xpcall(entry.run, function(e)
    -- LuaJIT's SIGINT (before the command's signalfd): the signal's exit
    if type(e) == "string" and e:find("interrupted!$") then return false end
    return debug.traceback(e, 2)
  end, opts, pos)
  if not ok and err == false then
    io.stderr:write("lecho ", cmd, ": interrupted\n")
    os.exit(EXIT.sigint)
  end
  if not ok then C.die(cmd, "internal error: " .. tostring(err), EXIT.failed) end
  os.exit(EXIT.ok)
end

return M
