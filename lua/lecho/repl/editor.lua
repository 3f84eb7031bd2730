-- lua/lecho/repl/editor.lua: the REPL's line editor on a terminal in raw
-- mode: keys (arrows, Home/End, Ctrl-A/E/K/U/W/T, Ctrl-L), history (Up/Down
-- and Ctrl-R reverse search), Tab completion of names and channel names,
-- the prompt drawn again under output printed while typing.
local T = require "lecho.repl.term"

local M = {}

--- Adds to session R: R.ed (refresh, new_line, set, text), R.handle_key,
-- R.parse_key, R.cancel_line.
function M.install(R)
  local PROMPT, CONT = "lecho> ", "  ...> "

  local ed = { buf = {}, pos = 0, off = 0, hidx = nil, saved = nil, tabs = 0 }
  R.ed = ed

  local function utf8_chars(s)
    local t = {}
    for ch in s:gmatch("[%z\1-\127\194-\244][\128-\191]*") do t[#t + 1] = ch end
    return t
  end

  function ed.prompt()
    local s = ed.search
    if s then return ("(%ssearch)'%s': "):format(s.failed and "failed " or "", s.text) end
    return R.pending and CONT or PROMPT
  end

  function ed.refresh()
    local prompt = ed.prompt()
    local cols = T.term.cols()
    local avail = math.max(cols - #prompt - 1, 10)
    if ed.pos - ed.off > avail then ed.off = ed.pos - avail end
    if ed.pos < ed.off then ed.off = ed.pos end
    if #ed.buf - ed.off < avail and ed.off > 0 then ed.off = math.max(0, #ed.buf - avail) end
    local last = math.min(#ed.buf, ed.off + avail)
    local vis = table.concat(ed.buf, "", ed.off + 1, last)
    local col = #prompt + ed.pos - ed.off
    local s = "\r" .. R.paint("1", prompt) .. vis .. "\27[K\r"
    if col > 0 then s = s .. "\27[" .. col .. "C" end
    T.write(s)
    R.prompt_shown = true
  end

  function ed.set(text)
    ed.buf = utf8_chars(text)
    ed.pos = #ed.buf
    ed.off = 0
  end

  function ed.text() return table.concat(ed.buf) end

  function ed.new_line()
    ed.buf, ed.pos, ed.off, ed.hidx, ed.saved = {}, 0, 0, nil, nil
    ed.refresh()
  end

  local function history_move(dir)
    local list = R.history.list
    if #list == 0 then return end
    local idx = ed.hidx or (#list + 1)
    local nidx = idx + dir
    if nidx < 1 or nidx > #list + 1 then return end
    if not ed.hidx then ed.saved = ed.text() end
    ed.hidx = nidx <= #list and nidx or nil
    ed.set(ed.hidx and list[ed.hidx] or ed.saved or "")
  end

  local function is_word(ch) return ch:match("^[%w_]$") ~= nil or #ch > 1 end

  -- The string literal the cursor is in, if any: its quote and what is
  -- typed of it so far.
  local function open_string(before)
    local q, start, i = nil, nil, 1
    while i <= #before do
      local c = before:sub(i, i)
      if q then
        if c == "\\" then i = i + 1 elseif c == q then q = nil end
      elseif c == '"' or c == "'" then
        q, start = c, i
      elseif c == "-" and before:sub(i, i + 1) == "--" then
        return nil
      end
      i = i + 1
    end
    if q then return q, before:sub(start + 1) end
    return nil
  end

  -- The globals, fields or methods that `word` (before the cursor) starts:
  -- names, the part typed, and the table they are in.
  local function name_candidates(word)
    local base, sep, part = word:match("^(.*)([%.:])([%w_]*)$")
    local scope
    if base then
      scope = R.env
      for name in base:gmatch("[^%.:]+") do
        local ok, v = pcall(function() return scope[name] end)
        if not ok or v == nil then return {}, part, nil end
        scope = v
      end
    else
      part, scope = word, R.env
    end
    local names, seen = {}, {}
    local t, depth = scope, 0
    -- A lecho object (the context, a channel, ...): its public API only,
    -- the methods of its class and the documented fields, never the
    -- object's own internal ones (c, byname, disp, ...).
    local public = R.public_fields and R.public_fields(scope)
    if public then
      for _, k in ipairs(public) do
        if k:sub(1, #part) == part and sep ~= ":" then seen[k] = true names[#names + 1] = k end
      end
      local mt = getmetatable(scope)
      t, depth = mt and rawget(mt, "__index"), 1
    end
    while t ~= nil and depth < 4 do
      if type(t) == "table" then
        for k, v in next, t do
          if type(k) == "string" and k:sub(1, #part) == part and k:match("^[%a_][%w_]*$")
             and (k:sub(1, 1) ~= "_" or part:sub(1, 1) == "_")
             and not seen[k] and (sep ~= ":" or type(v) == "function")
             and not (public and (type(v) ~= "function" or k:sub(1, 1) == "_")) then
            seen[k] = true
            names[#names + 1] = k
          end
        end
      end
      local mt = getmetatable(t)
      t = type(mt) == "table" and type(rawget(mt, "__index")) == "table" and rawget(mt, "__index") or nil
      depth = depth + 1
    end
    return names, part, scope
  end

  local function insert(s)
    for _, ch in ipairs(utf8_chars(s)) do
      table.insert(ed.buf, ed.pos + 1, ch)
      ed.pos = ed.pos + 1
    end
  end

  -- Tab: completes the name before the cursor (globals, fields, methods),
  -- or, inside a string, a channel name of the name server.
  local function complete()
    local before = table.concat(ed.buf, "", 1, ed.pos)
    local names, part, scope, quote
    quote, part = open_string(before)
    if quote then
      names = {}
      for _, n in ipairs(R.channel_names()) do
        if n:sub(1, #part) == part then names[#names + 1] = n end
      end
    else
      names, part, scope = name_candidates(before:match("[%a_][%w_%.:]*$") or "")
    end
    if #names == 0 then return end
    table.sort(names)
    local common = names[1]
    for _, n in ipairs(names) do
      while n:sub(1, #common) ~= common do common = common:sub(1, -2) end
    end
    if #common > #part or (#names == 1 and quote) then
      insert(common:sub(#part + 1))
      if #names == 1 and quote then
        if ed.buf[ed.pos + 1] ~= quote then insert(quote) else ed.pos = ed.pos + 1 end
      elseif #names == 1 then
        -- Indexed as typed code would (a method is in ctx's metatable).
        local ok, v = pcall(function() return scope[names[1]] end)
        if ok and type(v) == "function" then insert("(") end
      end
    elseif #names > 1 and ed.tabs >= 1 then
      -- The candidates in columns.
      local w = 0
      for i = 1, math.min(#names, 100) do w = math.max(w, #names[i]) end
      local per = math.max(1, math.floor(T.term.cols() / (w + 2)))
      local lines, line = {}, {}
      for i = 1, math.min(#names, 100) do
        line[#line + 1] = ("%-" .. w .. "s"):format(names[i])
        if #line == per then lines[#lines + 1] = table.concat(line, "  ") line = {} end
      end
      if #line > 0 then lines[#lines + 1] = table.concat(line, "  ") end
      if #names > 100 then lines[#lines + 1] = ("... (%d more)"):format(#names - 100) end
      R.out(table.concat(lines, "\n"))
    end
  end

  local function accept_line()
    local line = ed.text()
    ed.pos = #ed.buf
    ed.refresh()
    T.write("\r\n")
    R.prompt_shown = false
    R.submit_line(line)
    if not R.exiting then ed.new_line() end
  end

  local function cancel_line()
    ed.pos = #ed.buf
    ed.refresh()
    T.write("^C\r\n")
    R.prompt_shown = false
    R.pending = nil
    ed.new_line()
  end

  local function suspend()
    T.write("\r\n")
    R.prompt_shown = false
    T.term.restore()
    T.raise(T.SIGTSTP)      -- stops here until fg
    T.term.enter_raw()
    ed.refresh()
  end

  -- Returns key, bytes used; or nil when s holds only part of a key.
  local function parse_key(s)
    local b = s:byte(1)
    if b ~= 27 then
      if b < 128 then return s:sub(1, 1), 1 end
      local ch = s:match("^[\194-\244][\128-\191]*")
      local need = b >= 0xF0 and 4 or b >= 0xE0 and 3 or 2
      if not ch then return s:sub(1, 1), 1 end
      if #ch < need and #ch == #s then return nil end
      return ch, #ch
    end
    if #s == 1 then return nil end
    local c2 = s:sub(2, 2)
    if c2 == "[" then
      local params, final = s:match("^\27%[([%d;]*)([\64-\126])")
      if not final then
        if s:match("^\27%[[%d;]*$") then return nil end
        return "esc", 2
      end
      return "csi:" .. params .. final, 2 + #params + 1
    elseif c2 == "O" then
      if #s < 3 then return nil end
      return "ss3:" .. s:sub(3, 3), 3
    end
    return "alt:" .. c2, 2
  end

  -- Ctrl-R: reverse search through the history.  Typed characters narrow
  -- it, Ctrl-R again finds an older match, Backspace widens it, Enter runs
  -- the line found, Ctrl-C or Ctrl-G gives the old line back, any other key
  -- keeps the line found for editing.
  local function search_step(s, from)
    if s.text == "" then s.failed = false return end
    local i = R.history:search(s.text, from)
    s.failed = i == nil
    if i then
      s.idx = i
      ed.set(R.history.list[i])
      local at = R.history.list[i]:find(s.text, 1, true)
      ed.pos = #utf8_chars(R.history.list[i]:sub(1, at - 1))
    end
  end

  -- Returns true when the key was taken by the search.
  local function search_key(key)
    local s = ed.search
    if key == "\18" then
      if s.idx then search_step(s, s.idx - 1) else search_step(s) end
    elseif key == "\127" or key == "\8" then
      local chars = utf8_chars(s.text)
      chars[#chars] = nil
      s.text, s.idx = table.concat(chars), nil
      search_step(s)
      if s.text == "" then ed.set(s.saved) end
    elseif key == "\3" or key == "\7" then
      ed.search = nil
      ed.set(s.saved)
    elseif #key >= 1 and key:byte(1) >= 32 and not key:find("^%a+:") and key ~= "esc" then
      s.text = s.text .. key
      search_step(s, s.idx)
    else
      ed.search = nil          -- the key acts on the line found
      return false
    end
    ed.refresh()
    return true
  end

  local keymap = {
    ["csi:A"] = "up", ["csi:B"] = "down", ["csi:C"] = "right", ["csi:D"] = "left",
    ["ss3:A"] = "up", ["ss3:B"] = "down", ["ss3:C"] = "right", ["ss3:D"] = "left",
    ["csi:H"] = "home", ["csi:F"] = "end", ["ss3:H"] = "home", ["ss3:F"] = "end",
    ["csi:1~"] = "home", ["csi:7~"] = "home", ["csi:4~"] = "end", ["csi:8~"] = "end",
    ["csi:3~"] = "delete",
    ["csi:1;5C"] = "wright", ["csi:1;5D"] = "wleft", ["alt:f"] = "wright", ["alt:b"] = "wleft",
    ["\1"] = "home", ["\5"] = "end", ["\2"] = "left", ["\6"] = "right",
    ["\16"] = "up", ["\14"] = "down", ["\127"] = "backspace", ["\8"] = "backspace",
    ["\r"] = "enter", ["\n"] = "enter", ["\3"] = "cancel", ["\4"] = "eof",
    ["\11"] = "kill_end", ["\21"] = "kill_start", ["\23"] = "kill_word",
    ["\12"] = "clear", ["\t"] = "tab", ["\26"] = "suspend", ["\20"] = "transpose",
  }

  local function handle_key(key)
    if ed.search and search_key(key) then return end
    if key == "\18" then
      ed.search = { text = "", saved = ed.text() }
      ed.hidx = nil
      return ed.refresh()
    end
    local action = keymap[key]
    local buf = ed.buf
    if action ~= "tab" then ed.tabs = 0 end
    if not action then
      if key:byte(1) >= 32 and not key:find("^%a+:") and key ~= "esc" then
        table.insert(buf, ed.pos + 1, key)
        ed.pos = ed.pos + 1
        ed.refresh()
      end
      return
    end
    if action == "enter" then return accept_line()
    elseif action == "cancel" then return cancel_line()
    elseif action == "eof" then
      if #buf == 0 then
        T.write("\r\n")
        R.prompt_shown = false
        return R.request_exit(0)
      end
      if ed.pos < #buf then table.remove(buf, ed.pos + 1) end
    elseif action == "left" then ed.pos = math.max(0, ed.pos - 1)
    elseif action == "right" then ed.pos = math.min(#buf, ed.pos + 1)
    elseif action == "home" then ed.pos = 0
    elseif action == "end" then ed.pos = #buf
    elseif action == "wleft" then
      while ed.pos > 0 and not is_word(buf[ed.pos]) do ed.pos = ed.pos - 1 end
      while ed.pos > 0 and is_word(buf[ed.pos]) do ed.pos = ed.pos - 1 end
    elseif action == "wright" then
      while ed.pos < #buf and not is_word(buf[ed.pos + 1]) do ed.pos = ed.pos + 1 end
      while ed.pos < #buf and is_word(buf[ed.pos + 1]) do ed.pos = ed.pos + 1 end
    elseif action == "backspace" then
      if ed.pos > 0 then table.remove(buf, ed.pos) ed.pos = ed.pos - 1 end
    elseif action == "delete" then
      if ed.pos < #buf then table.remove(buf, ed.pos + 1) end
    elseif action == "kill_end" then
      for i = #buf, ed.pos + 1, -1 do buf[i] = nil end
    elseif action == "kill_start" then
      for _ = 1, ed.pos do table.remove(buf, 1) end
      ed.pos = 0
    elseif action == "kill_word" then
      while ed.pos > 0 and not is_word(buf[ed.pos]) do table.remove(buf, ed.pos) ed.pos = ed.pos - 1 end
      while ed.pos > 0 and is_word(buf[ed.pos]) do table.remove(buf, ed.pos) ed.pos = ed.pos - 1 end
    elseif action == "transpose" then
      if ed.pos > 0 and #buf >= 2 then
        local p = ed.pos == #buf and ed.pos - 1 or ed.pos
        buf[p], buf[p + 1] = buf[p + 1], buf[p]
        ed.pos = math.min(#buf, p + 1)
      end
    elseif action == "up" then history_move(-1)
    elseif action == "down" then history_move(1)
    elseif action == "clear" then T.write("\27[H\27[2J")
    elseif action == "tab" then
      complete()
      ed.tabs = ed.tabs + 1
    elseif action == "suspend" then return suspend()
    end
    ed.refresh()
  end

  R.handle_key, R.parse_key, R.cancel_line = handle_key, parse_key, cancel_line
end

return M
