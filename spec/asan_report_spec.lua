-- make asan's verdict (spec/support/asan_report.sh) on a saved report
-- directory, spec/support/asan_fixture/: reports from the run of main
-- 874af8a (/tmp/asan6, 2026-12-05), and two made for the cases that run had
-- none of.  The rule (the script's header): a report is lecho's when its
-- program is lecho's code (luajit, a C program of bench/ or spec/support/,
-- ...) or a frame of it is (core/, bench/, spec/support/, lecho/*.so,
-- liblecho.so); any other program's leak is counted, not failed; a memory
-- error fails whatever the program.
local S = require "spec.support"

local FIX = S.root .. "/spec/support/asan_fixture"

-- a copy of the fixture's files named (or all), run through the script
local function verdict(files, status)
  local dir = S.tmpname("asanlogs")
  assert(os.execute("mkdir -p " .. S.sh_quote(dir)) == 0)
  for _, f in ipairs(files) do
    assert(os.execute(("cp %s/%s %s/"):format(S.sh_quote(FIX), f, S.sh_quote(dir))) == 0, f)
  end
  -- (without make asan's libasan: the script's grep, sed and sort, each
  -- leak-checked and symbolized at its exit, made this file take 145 s)
  local ok, out = S.sh(("env -u LD_PRELOAD bash %s/spec/support/asan_report.sh %s %d")
                       :format(S.sh_quote(S.root), S.sh_quote(dir), status or 0))
  local last = out:gsub("\n+$", ""):match("[^\n]*$")
  return ok, last, out, dir
end

describe("make asan's verdict (asan_report.sh)", function()
  teardown(function() S.cleanup() end)

  it("counts the leaks of programs that are not lecho's (sed, git, python3's peer), and passes", function()
    local ok, last = verdict({ "asan.sed.24990", "asan.git.23225", "asan.python3.23222" })
    assert.is_true(ok, last)
    assert.matches("^make asan: PASS", last)
    assert.matches("counted, not failed: git 1, python3 1, sed 1$", last)
  end)

  it("fails on a leak of lecho's programs: luajit, a spec/support C program (capi_exit-17), a bench program",
     function()
    for _, f in ipairs{ "asan.luajit.1013", "asan.luajit.23014", "asan.capi_exit-17.13956", "asan.lecho_h.13956" } do
      local ok, last, out, dir = verdict({ f, "asan.sed.24990" })
      assert.is_false(ok, f)
      assert.matches("^make asan: FAIL: suite exit status 0, 1 sanitizer report%(s%)", last, f)
      assert.truthy(out:find("== sanitizer report " .. dir .. "/" .. f .. ":", 1, true), f .. ": not printed")
      assert.matches("counted, not failed: sed 1$", last, f)
    end
  end)

  it("fails on another program's leak with a frame in lecho's code (liblecho.so)", function()
    local ok, last = verdict({ "asan.python3.4242", "asan.python3.23222" })
    assert.is_false(ok)
    assert.matches("1 sanitizer report%(s%)", last)
    assert.matches("counted, not failed: python3 1$", last)
  end)

  it("fails on a memory error in any program", function()
    local ok, last = verdict({ "asan.tail.4343" })
    assert.is_false(ok)
    assert.matches("1 sanitizer report%(s%)", last)
  end)

  it("fails on the suite's status with no report at all", function()
    local ok, last = verdict({}, 2)
    assert.is_false(ok)
    assert.matches("^make asan: FAIL: suite exit status 2, 0 sanitizer report", last)
  end)
end)
