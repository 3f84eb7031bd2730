-- lecho.signals: SIGINT and SIGTERM in the Lua half of a context.  The
-- handler itself, the hook that interrupts running Lua and the second
-- signal that ends the process are C's (core/binding/lua_loop.c).  Here:
-- the interrupt flag (INTR, below: its owner), LuaJIT's "interrupted!"
-- taken as the signal when a callback or a handler raised it
-- (M.in_callback), raised again on the main line (M.raise), the events
-- that came after it, which no handler runs (M.interrupted_event), close's
-- line about them (M.close_report), and the end of a ctx:run() a signal
-- ended (M.run_ended: every open context closed, the process ended by the
-- signal).  lecho.context calls these; Context's methods for the other
-- modules (_interrupted: M.interrupted; _sigint_in_callback) stay there
-- and call here.

local ffi = require "ffi"

local M = {}

-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never leave in the close at a program's end (the why:
-- lecho.context, at its own `each`).
local each = pairs

-- The interrupt: an "interrupted!" was raised in Lua since the main line
-- last took one (by lecho's signal hook, even when a handler's pcall then
-- caught it; seen as a callback's error; an embedder's interrupt ended a
-- handler).  Owner: this module.  M.interrupted is the one function that
-- sets it (lua_loop.c's sig_hook calls it too, through the registry's
-- "lecho.interrupt", before it raises), M.taken the one that clears it
-- (M.raise: the main line's wait, ctx:run_once; M.run_ended).  It is held
-- in two places, kept in step by those two only:
--   INTR.raised, in Lua: no handler runs while it is set
--     (Context:_on_event, M.interrupted_event), and a main-line wait
--     raises it (context.lua main_wait, Context:run_once);
--   each open context's b->intr_raised, in C (c:interrupted(on),
--     core/binding/lua_int.h): lb_hook_events hands no event to a C sink
--     while it is set (an int test per event, not a look-up in Lua).
-- Process-wide (one per Lua state, for all its contexts), as a signal is:
-- an interrupt stops the program's handlers whichever context's dispatch
-- would run them, and the main line takes it once, in whichever context
-- waits (it was per context in C: another context's C sinks ran on, or
-- went through the Lua dispatch after the interrupt was taken).
local INTR = {}
M.INTR = INTR           -- (read, not written, in context.lua)
local contexts = {}     -- the open contexts of this state (context.lua's open_ctxs: M.track)

local function copy(ctx, on)
  ctx.c:interrupted(on)  -- (a closed context's too: a field of its userdata)
end

function M.interrupted()
  INTR.raised = true
  for ctx in each(contexts) do copy(ctx, true) end
end

function M.taken()
  INTR.raised = nil
  for ctx in each(contexts) do copy(ctx, false) end
end

-- (Not hot, but a loop over open contexts a long session could compile:
-- kept interpreted, LuaJIT #829.)
jit.off(M.interrupted)
jit.off(M.taken)

-- A context opened (Context:_opened) while the interrupt is raised gets its
-- copy too.
function M.opened(ctx)
  if INTR.raised then copy(ctx, true) end
end

-- The set of open contexts the copies are kept in (weak keys; context.lua
-- gives its open_ctxs once, when it loads).
function M.track(open) contexts = open end

debug.getregistry()["lecho.interrupt"] = M.interrupted

-- An event that came after an interrupt was raised in Lua (INTR.raised,
-- above): no handler runs for it (the handler it interrupted ran again for
-- the next event of the same batch, and the program did not stop: outside
-- attack F1).  Counted, for the close to say (Context:close); a sync one
-- answered not handled (code failed: its submit_sync is never true).
function M.interrupted_event(self, chid, sync)
  self.nintr = (self.nintr or 0) + 1
  if sync == 0 then return 0, nil end
  local ch = self.bychid[chid]
  local name = ch and (ch.name or ch.short) or "the channel"
  return 0, { { consumer = self.addr, code = "failed",
    err = ("not handled: the consuming program at %s was interrupted (a signal) before %s's handler ran"):format(
      tostring(self.addr), name) } }
end

-- A callback's error (context.lua's callers of callbacks; Context:_sigint_in_callback):
-- true when it is a signal's.  LuaJIT's interpreter answers a SIGINT that
-- comes while lecho's own handlers are not set (outside ctx:run(), or just
-- before its watchers start) by raising "interrupted!" at the next Lua
-- instruction: inside a callback, whose error is caught here, Ctrl-C was
-- lost (the program ran on).  Such an error stops the loop and is raised
-- again on the main line (main_wait, run_once; ctx:run() closes as on a
-- SIGINT it caught itself).
function M.in_callback(self, err)
  if err:find("interrupted!$") or err:find("interrupted!\n", 1, true) then
    self.sigint_pending = true
    M.interrupted()
    self.c:stop()
    return true
  end
end

-- The interrupt raised on the main line (the main line's wait, ctx:run_once:
-- context.lua), taken: the flag cleared.
function M.raise(self)
  self.sigint_pending = nil
  M.taken()
  error("interrupted!", 0)
end

local SIGNAME = { [2] = "SIGINT", [15] = "SIGTERM" }

-- After ctx:run()'s loop (context.lua Context:run): sig, the signal that
-- ended it, or nil.  A SIGINT or SIGTERM (or a SIGINT that came as it
-- began) closes every open context (open_ctxs: context.lua's) and ends the
-- process by it; else returns.
function M.run_ended(self, sig, open_ctxs)
  if sig then
    -- (a callback lecho's handler interrupted raised "interrupted!": that
    -- signal, not another)
    self.sigint_pending = nil
  elseif self.sigint_pending then
    -- a SIGINT that came as the run began, before its watchers
    if not self.signals then M.raise(self) end
    self.sigint_pending, sig = nil, 2
    -- (the run put back the action it found, LuaJIT's: the default for the
    -- raise below)
    pcall(ffi.cdef, "void (*signal(int sig, void (*fn)(int)))(int);")
    ffi.C.signal(sig, nil)
  end
  if not sig then return end
  -- the signal is taken here: the interrupt it raised in a callback (if it
  -- did) is not raised again by the waits of the closes below (a name
  -- server's close lingering on its connections raised "interrupted!" and
  -- exited 1 with a traceback: CI ci-s7d, stress seed 3)
  M.taken()
  self.log(("%s: closing the context (delivering what was submitted, for at most %gs); "
    .. "a second signal ends the process at once"):format(SIGNAME[sig] or "signal " .. sig, self.linger))
  -- The other open contexts of the process are closed first, as at a
  -- normal exit (what they could not deliver said on stderr; this one still
  -- open, their loops turned beside it: _at_end): their queued events were
  -- lost without a word (outside attack of sigfix, F5).  open_ctxs (weak
  -- keys) copied first: a close changes it.
  local others = {}
  for o in each(open_ctxs) do others[#others + 1] = o end
  for _, o in ipairs(others) do
    if o ~= self and not o.closed then pcall(o._at_end, o) end
  end
  self:close()
  io.stdout:flush()
  io.stderr:flush()
  -- Ended by the signal itself (its action is the default again): the
  -- parent sees what it sent (a shell's $? is 128 + sig, 130 or 143).
  pcall(ffi.cdef, "int raise(int sig);")
  ffi.C.raise(sig)
  os.exit(128 + sig)      -- (the signal blocked by the host program)
end

-- Close's line about the events no handler ran (Context:close).
function M.close_report(self)
  local nintr = self.nintr or 0
  if nintr > 0 then
    -- events that came after an interrupt: no handler ran (interrupted_event)
    self.nintr = 0
    -- Said, not a failure of the close: the program was interrupted (a
    -- script's `except KeyboardInterrupt: ctx.close()` closes cleanly), as
    -- an event that came for a consumer closed meanwhile is not one.
    local m = ("close: %d events received not handled: the program was interrupted (a signal) before their "
      .. "handlers ran"):format(nintr)
    self.log(m, "warn")
    return m
  end
end

return M
