-- lua/lecho/repl/history.lua: the REPL's input history, kept in a file
-- ($LECHO_HISTORY, default ~/.lecho_history; "" keeps none), at most 1000
-- entries, appended as they are entered and rewritten when trimmed.

local History = {}
History.__index = History

local M = {}

--- The file the history is kept in: $LECHO_HISTORY, else ~/.lecho_history;
-- nil when none is to be kept.
function M.default_path()
  local path = os.getenv("LECHO_HISTORY")
  if path == nil then
    local home = os.getenv("HOME")
    path = home and home ~= "" and (home .. "/.lecho_history") or nil
  end
  if path == "" then return nil end
  return path
end

--- A history kept in path (nil: in memory only).
function M.new(path)
  return setmetatable({ list = {}, max = 1000, path = path, path_was = path }, History)
end

--- Reads the history file.  One that cannot be read (a directory, say)
-- is given up: nil, "PATH: reason", and the history is kept in memory only.
function History:load()
  if not self.path then return true end
  local f = io.open(self.path, "r")
  if not f then return true end
  local text, err = f:read("*a")
  f:close()
  if not text then
    self.path = nil
    return nil, self.path_was .. ": " .. tostring(err)
  end
  for line in text:gmatch("[^\n]+") do self.list[#self.list + 1] = line end
  local n = #self.list
  if n > self.max then
    local keep = {}
    for i = n - self.max + 1, n do keep[#keep + 1] = self.list[i] end
    self.list = keep
    self.rewrite = true
  end
  return true
end

function History:add(entry)
  local function add1(line)
    if line:match("^%s*$") or self.list[#self.list] == line then return end
    self.list[#self.list + 1] = line
    if #self.list > self.max then table.remove(self.list, 1) end
    if self.path then
      local f = io.open(self.path, "a")
      if f then f:write(line, "\n") f:close() end
    end
  end
  if not entry:find("\n") then return add1(entry) end
  -- A multi-line chunk becomes one line when that keeps its meaning
  -- (no comment, no long bracket); otherwise each line is an entry.
  if not entry:find("%-%-") and not entry:find("%[=*%[") then
    return add1((entry:gsub("%s*\n%s*", " ")))
  end
  for line in entry:gmatch("[^\n]+") do add1(line) end
end

function History:save()
  if not self.path or not self.rewrite then return end
  local f = io.open(self.path .. ".tmp", "w")
  if not f then return end
  for _, l in ipairs(self.list) do f:write(l, "\n") end
  f:close()
  os.rename(self.path .. ".tmp", self.path)
end

--- The index of the newest entry at or before index `from` (default: the
-- newest) that contains `text`, or nil.
function History:search(text, from)
  for i = math.min(from or #self.list, #self.list), 1, -1 do
    if self.list[i]:find(text, 1, true) then return i end
  end
  return nil
end

return M
