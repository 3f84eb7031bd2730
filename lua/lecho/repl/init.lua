-- lua/lecho/repl/init.lua: the steering REPL (scripts/lecho-repl parses the
-- options and calls main).  One session table R holds the state the parts
-- share: the context, the output (above the prompt when one is edited, or
-- JSON lines), the exit paths and the input pump.  The parts:
--   term.lua      the terminal through ffi (raw mode, signals, polling)
--   pretty.lua    the bounded pretty printer
--   history.lua   the history file and its search
--   editor.lua    the line editor (keys, completion, Ctrl-R)
--   eval.lua      compiling and running typed chunks, interrupting them
--   commands.lua  help, ls, send, stats, wait, pp, history, quit
--   subs.lua      sub, unsub, subs, mod, params, edit and their handles
--   json.lua      the JSON output mode (--json)
local T = require "lecho.repl.term"
local P = require "lecho.repl.pretty"
local History = require "lecho.repl.history"
local eval = require "lecho.repl.eval"
local server = require "lecho.server"

local M = {}

--- Runs the REPL; returns only through os.exit.  opts: nameserver (an
-- address: "host:port", "[v6]:port", "unix:/path"), listen and advertise
-- (lecho.context's), key, trust (a list) and ns_principal (lecho.context's
-- key, trust, nameserver_principal), code (list of chunks to run first), quiet (no lecho log),
-- no_history, json (one JSON object per output line, no line editing).
function M.main(opts)
  local R = {
    opts = opts,
    interactive = T.interactive and not opts.json,
    json = opts.json and require("lecho.repl.json") or nil,
    prompt_shown = false,   -- the prompt and the line are on the screen
    failures = 0,           -- chunks that failed (the exit status without a terminal)
    exiting = false, exit_code = 0,
    handles = {},           -- sub/mod handles by id
    producers = {},         -- send(): one producer per channel
    busy = false,           -- typed code is running
    pumping = false,        -- input is being handled
    inbuf = "",             -- bytes read from stdin, not handled yet
    eof = false,
    interrupted = false,
    beat = os.clock(),      -- the last loop turn (for the interrupt hook)
    pending = nil,          -- lines of an unfinished chunk
    env = setmetatable({}, { __index = _G }),
  }
  T.interactive = R.interactive           -- (edit() leaves raw mode only when in it)
  R.color = R.interactive and not os.getenv("NO_COLOR")
  R.history = History.new(R.interactive and not opts.no_history and History.default_path() or nil)

  ----------------------------------------------------------------------------
  -- Output: above the prompt when one is being edited

  --- Prints text (a line or several) above the line being edited; in JSON
  -- mode as { "text": ... }.
  function R.out(text)
    if R.json then return R.json.emit{ text = text } end
    if text:sub(-1) ~= "\n" then text = text .. "\n" end
    if R.prompt_shown then
      T.write("\r\27[K" .. text)
      R.ed.refresh()
    else
      T.write(text)
    end
  end

  function R.paint(code, s)
    if R.color then return "\27[" .. code .. "m" .. s .. "\27[0m" end
    return s
  end

  function R.show_error(msg)
    R.failures = R.failures + 1
    if R.json then return R.json.emit{ error = msg } end
    R.out(R.paint("31", msg))
  end

  --- Prints the values r[from..to] of a chunk (tab-separated, or one per
  -- line when one needs several; in JSON mode { "values": [...] }).
  function R.results(r, from, to)
    if to < from then return end
    if R.json then
      local vals = {}
      for i = from, to do vals[#vals + 1] = R.json.value(r[i]) end
      return R.json.emit{ values = vals }
    end
    local parts, multi = {}, false
    for i = from, to do
      local s = P.pretty(r[i])
      parts[#parts + 1] = s
      if s:find("\n") then multi = true end
    end
    R.out(table.concat(parts, multi and "\n" or "\t"))
  end

  ----------------------------------------------------------------------------
  -- The context

  local lecho = require "lecho"
  local started = false     -- logs before the name server answered say nothing new
  do
    local ok, c, cerr = pcall(lecho.context, {   -- (raises, or returns nil, err)
      nameserver = opts.nameserver, listen = opts.listen, advertise = opts.advertise,
      key = opts.key, trust = opts.trust and #opts.trust > 0 and opts.trust or nil,  -- nil: $LECHO_*
      nameserver_principal = opts.ns_principal,
      signals = false,    -- the REPL's own: Ctrl-C interrupts a line, not the session
      log = function(msg)
        if opts.quiet or not started then return end
        if R.json then return R.json.emit{ log = msg } end
        R.out(R.paint("2", "lecho: " .. msg))
      end,
    })
    if not ok or not c then
      io.stderr:write("lecho-repl: ", server.message(ok and cerr or c), "\n")
      os.exit(1)
    end
    R.ctx, R.lecho = c, lecho
  end

  -- The documented fields of lecho's objects (doc/api.md "Using it"), which Tab
  -- completion lists with their classes' methods: an object's other fields
  -- are lecho's own.  nil: not a lecho object.
  do
    local classes = {
      [getmetatable(R.ctx)] = { "addr", "ns", "nslist", "principal" },
      [require "lecho.channel"] = { "name" },
      [require "lecho.producer"] = {},
      [require "lecho.consumer"] = {},
    }
    function R.public_fields(obj)
      local mt = type(obj) == "table" and getmetatable(obj)
      return mt and classes[mt] or nil
    end
  end
  local ctx = R.ctx

  ----------------------------------------------------------------------------
  -- Exit paths: all go through finish(), which restores the terminal.

  -- The replays replay() made (weak keys: one dropped is the GC's): closed
  -- at the end, which frees their files' bytes (malloc'd, never freed by
  -- a process that ends by os.exit) and delivers what they queued.
  R.replays = setmetatable({}, { __mode = "k" })
  function R.close_replays()
    for rp in pairs(R.replays) do pcall(rp.close, rp) end
  end

  function R.finish(code)
    if R.prompt_shown then T.write("\r\n") R.prompt_shown = false end
    T.term.restore()
    R.history:save()
    R.close_replays()
    io.stdout:flush()
    os.exit(code)
  end

  local real_exit = os.exit
  os.exit = function(code, close) -- luacheck: ignore
    T.term.restore()
    R.history:save()
    R.close_replays()
    io.stdout:flush()
    return real_exit(code, close)
  end

  function R.request_exit(code)
    if R.exiting then return end
    R.exiting, R.exit_code = true, code or 0
    ctx:stop()
  end

  eval.install(R)
  require("lecho.repl.editor").install(R)
  require("lecho.repl.commands").install(R)

  ----------------------------------------------------------------------------
  -- Input: stdin is read on the loop; keys or lines are handled when no code
  -- is running (typed-ahead input waits in R.inbuf).

  local esc_timer

  local function pump()
    if R.pumping or R.busy then return end
    R.pumping = true
    local ok, err = pcall(function()
      while not R.exiting do
        if R.interactive then
          if R.inbuf == "" then break end
          local key, n = R.parse_key(R.inbuf)
          if not key then
            -- Part of an escape sequence: wait a little for the rest.
            if not esc_timer then
              esc_timer = ctx:after(0.1, function()
                esc_timer = nil
                if R.inbuf:sub(1, 1) == "\27" and not R.parse_key(R.inbuf) then
                  R.inbuf = R.inbuf:sub(2)
                end
                pump()
              end)
            end
            break
          end
          R.inbuf = R.inbuf:sub(n + 1)
          R.handle_key(key)
        else
          local line, rest = R.inbuf:match("^([^\n]*)\n(.*)$")
          if not line then
            if R.eof then
              if R.inbuf ~= "" then line, rest = R.inbuf, "" else
                if R.pending then R.show_error("stdin: unfinished chunk at end of input") R.pending = nil end
                R.request_exit(R.failures > 0 and 1 or 0)
                break
              end
            else
              break
            end
          end
          R.inbuf = rest
          R.submit_line((line:gsub("\r$", "")))
        end
      end
    end)
    R.pumping = false
    if not ok then R.out("lecho-repl: internal error: " .. tostring(err)) end
    -- A stop asked for while typed code ran ctx:run() ended only that run.
    if R.exiting then ctx:stop() end
  end

  local function on_stdin(w)
    local data, err = T.read_fd(0)
    if not data then
      w:stop()
      R.eof = true
      if R.interactive then
        if err ~= "eof" then R.out("lecho-repl: " .. err) end
        return R.request_exit(0)
      end
      return pump()
    end
    if R.busy or R.pumping then
      R.note_input(data)
      return
    end
    R.inbuf = R.inbuf .. data
    pump()
  end

  ----------------------------------------------------------------------------
  -- Main

  local function main()
    local chans, err, code = ctx:list()
    -- (a refused connection is code "refused" too: only the policy's words count)
    local unlisted = not chans and code == "refused" and tostring(err):find("not allowed: ", 1, true)
    if unlisted then
      -- keyed: a principal the policy does not let list still produces,
      -- consumes and steers what it may; ls() says why it shows nothing
      R.out(R.paint("33", ("lecho-repl: %s: ls() will show nothing"):format(server.message(err))))
      chans = {}
    elseif not chans then
      io.stderr:write(("lecho-repl: cannot reach the name server %s: %s\n")
        :format(opts.nameserver, server.message(err)))
      return 1
    end
    started = true
    local hok, herr = R.history:load()
    if not hok then R.out(R.paint("31", "history not kept: " .. herr)) end
    for _, code in ipairs(opts.code or {}) do
      local f, cerr = eval.compile(code, "=(command line)")
      if cerr == "incomplete" then cerr = "(command line): unfinished chunk" end
      if f then R.run_chunk(f) else R.show_error(cerr) end
      if R.exiting then return R.exit_code end
    end
    if R.interactive then
      local n = 0
      for _ in pairs(chans) do n = n + 1 end
      R.out(("lecho-repl: joined %s as %s (%d channel%s). help() lists the commands, Ctrl-D quits.")
        :format(ctx.ns, ctx.addr, n, n == 1 and "" or "s"))
      T.sig.setup()
      if T.sig.fd >= 0 then
        ctx:on_readable(T.sig.fd, function()
          local s = T.sig.take()
          if not s then return end
          if R.on_signal(s) == "exit" then
            R.exit_code = 128 + s
            return R.request_exit(128 + s)
          end
          if not R.busy and not R.pumping then
            R.interrupted = false
            R.cancel_line()
          end
        end)
      end
      T.term.enter_raw()
      R.interactive = T.interactive         -- (false when the terminal refused raw mode)
      R.ed.new_line()
    end
    ctx:on_readable(0, on_stdin)
    ctx:every(0.1, function() R.beat = os.clock() end)
    debug.sethook(R.hook, "", 10000)
    while not R.exiting do
      local ok, rerr = pcall(ctx.run, ctx)
      if not ok and not R.exiting then R.out("lecho-repl: internal error: " .. tostring(rerr)) end
    end
    debug.sethook()
    if R.prompt_shown then T.write("\r\27[K") R.prompt_shown = false end
    for _, h in pairs(R.handles) do pcall(h.close, h) end
    for _, p in pairs(R.producers) do pcall(p.close, p) end
    pcall(ctx.close, ctx)
    return R.exit_code
  end

  local ok, code = xpcall(main, debug.traceback)
  if not ok then
    T.term.restore()
    io.stderr:write("lecho-repl: internal error: ", tostring(code), "\n")
    R.finish(70)
  end
  R.finish(code)
end

return M
