-- lua/lecho/repl/eval.lua: running what is typed.  Compiles a chunk (an
-- expression prints its values), runs it in the REPL's environment with a
-- traceback of the user's frames only, and interrupts it on Ctrl-C.
--
-- Interrupting: while typed code runs, stdin is read by the loop only if
-- the loop turns.  A count hook notices when no loop turn happened for a
-- while (code stuck in a loop), then looks at stdin for Ctrl-C itself and
-- raises "interrupted" in code typed at the prompt (never inside lecho's own
-- code).  Chunks typed at the prompt run with the JIT compiler off so that
-- the hook can fire.
local T = require "lecho.repl.term"
local P = require "lecho.repl.pretty"

local M = {}

-- Frames of lecho and of the REPL are never interrupted.
local function is_internal(src)
  return src == "=[C]" or src:match("lecho/init%.lua$") or src:match("lecho/registry%.lua$")
      or src:match("lecho/repl/") or src:match("lecho%-repl$")
end

--- Compiles src: a function, or nil and "incomplete" (more lines needed) or
-- the error.  `=expr` and expressions return their values.
function M.compile(src, name)
  local expr = src:match("^%s*=(.*)$")
  if expr then
    local f, err = loadstring("return " .. expr, name)
    if f then return f end
    if err:match("'<eof>'$") then return nil, "incomplete" end
    return nil, err
  end
  local f = loadstring("return " .. src, name)
  if f then
    -- Not a tail call, so that errors keep their position (stdin:1:).
    return loadstring("return (function(...) return ... end)(" .. src .. "\n)", name) or f
  end
  local err
  f, err = loadstring(src, name)
  if f then return f end
  if err:match("'<eof>'$") then return nil, "incomplete" end
  return nil, err
end

local function errobj_string(e)
  if type(e) == "string" then return e end
  if P.has_tostring(e) then
    local ok, s = pcall(tostring, e)
    if ok and type(s) == "string" then return s end
  end
  if e == nil then return "nil (error raised with no value)" end
  return "error object: " .. P.pretty(e, { lines = 20 })
end

-- An error caught in typed code, with the frames of the traceback that
-- are the user's (not error() itself, not the REPL's own).
local Caught = {}
local function traceback_handler(e)
  local tb = debug.traceback("", 2)
  local keep = {}
  for line in tb:gmatch("[^\n]+") do
    if line:match("^%s+%[C%]: in function 'xpcall'") then break end
    if line:match("lecho/repl/") or line:match("lecho%-repl") then break end
    if line:match("^%s") and not (#keep == 0 and line:match("^%s+%[C%]: in function 'error'")) then
      keep[#keep + 1] = line
    end
  end
  return setmetatable({ err = e, tb = keep }, Caught)
end

-- Ctrl-C interrupted a handler typed at the prompt (not the line): its
-- consumer is closed, said once, else the next event runs it again and the
-- prompt never comes back (a handler that loops for ever).  The handler is
-- the first function up the stack that is a consumer's of the context.
local function close_consumer_of(R)
  local ctx = R.ctx
  for level = 3, 40 do
    local info = debug.getinfo(level, "f")
    if not info then return end
    for _, ch in pairs(ctx.byname or {}) do
      for _, con in ipairs(ch.all or {}) do
        if con.handler == info.func and not con.closed_by_repl then
          con.closed_by_repl = true
          pcall(con.close, con)
          R.out(("consumer %s on '%s': its handler interrupted by Ctrl-C, the consumer closed")
            :format(con.id, ch.short or ch.name))
          return
        end
      end
    end
  end
end

--- Adds to session R: note_input, on_signal, hook, run_chunk, submit_line.
function M.install(R)
  local last_poll = 0

  -- New input arrived while code runs: a Ctrl-C (byte 3) interrupts it and
  -- throws away what was typed before it.
  function R.note_input(data, in_hook)
    R.inbuf = R.inbuf .. data
    if R.interactive then
      local i = R.inbuf:find("\3", 1, true)
      if i then
        R.interrupted = true
        R.inbuf = R.inbuf:sub(i + 1)
        -- Code blocked in ctx:run() (typed at the prompt) returns from it.
        if R.busy then R.ctx:stop() end
        -- A line waiting in lecho (ctx:sleep, ctx:call, send, a lookup):
        -- the wait raises "interrupted" (the hook below never saw it run).
        local co = R.chunk_co
        -- From the hook (in_hook: Lua code ran for a while without a loop
        -- turn, a handler typed at the prompt that loops): the wait ends at
        -- the next turn, and R.interrupted stays so that the hook interrupts
        -- that handler too (outside attack F3: the Ctrl-C went to the
        -- wait only, whose turn never came).
        if R.busy and co and co ~= coroutine.running() and coroutine.status(co) == "suspended"
            and R.ctx:_interrupt_wait(co, "interrupted") and not in_hook then
          R.interrupted = false
        end
      end
    end
  end

  function R.on_signal(s)
    if s == T.SIGINT then
      R.interrupted = true
      return "int"
    end
    return "exit"
  end

  function R.hook()
    if not R.interrupted then
      local now = os.clock()
      if now - R.beat < 0.3 or now - last_poll < 0.05 then return end
      last_poll = now
      if R.interactive and T.readable(0) then
        local d = T.read_fd(0)
        if d then R.note_input(d, true) end
      end
      if T.readable(T.sig.fd) then
        local s = T.sig.take()
        if s and R.on_signal(s) == "exit" then R.finish(128 + s) end
      end
      if not R.interrupted then return end
    end
    -- Raised in the line's own coroutine, or in a callback's only where it
    -- runs code typed at the prompt (a handler defined there): not in
    -- lecho's own callbacks (it was logged there as theirs, and the line
    -- went on).
    local info = debug.getinfo(2, "S")
    local co = coroutine.running()
    if info and not is_internal(info.source)
        and ((R.busy and co == R.chunk_co) or info.source == "=stdin" or info.source == "=(command line)") then
      R.interrupted = false
      if co ~= R.chunk_co then close_consumer_of(R) end
      error("interrupted", 0)
    end
  end

  --- Runs compiled chunk f in the REPL's environment; prints its values
  -- (R.results) or the error (R.show_error).
  function R.run_chunk(f)
    setfenv(f, R.env)
    jit.off(f, true)
    R.chunk_co = coroutine.running()
    R.busy = true
    R.interrupted = false
    local r = { n = 0 }
    local function pack(...) r.n = select("#", ...) for i = 1, r.n do r[i] = (select(i, ...)) end end
    pack(xpcall(f, traceback_handler))
    R.chunk_co = nil
    R.busy = false
    R.interrupted = false
    if r[1] then
      if r.n > 1 then R.env._ = r[2] end
      R.results(r, 2, r.n)
    else
      local e, tb = r[2], {}
      if type(e) == "table" and getmetatable(e) == Caught then e, tb = e.err, e.tb end
      -- a Ctrl-C is not a bug of the line: no traceback (one of lecho's
      -- own frames, a ctx:sleep's or a send's wait, was printed: outside
      -- attack s8 E)
      if e == "interrupted" or e == "interrupted!" then tb = {} end
      local msg = errobj_string(e)
      if #tb > 1 then msg = msg .. "\nstack traceback:\n" .. table.concat(tb, "\n") end
      R.show_error(msg)
    end
  end

  --- A line was entered: runs the chunk it completes, or waits for more
  -- (R.pending holds the lines of an unfinished chunk).
  function R.submit_line(line)
    if R.pending then R.pending[#R.pending + 1] = line else R.pending = { line } end
    local src = table.concat(R.pending, "\n")
    if src:match("^%s*$") then R.pending = nil return end
    local f, err = M.compile(src, "=stdin")
    if err == "incomplete" then return end
    R.pending = nil
    R.history:add(src)
    if not f then return R.show_error(err) end
    R.run_chunk(f)
  end
end

return M
