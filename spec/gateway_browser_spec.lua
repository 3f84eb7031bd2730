-- The gateway's live view (lecho.gateway_page) in headless Chromium, driven
-- through the DevTools protocol (spec/support/cdp.lua), against a running
-- simulation (examples/atmosphere) and lecho-gateway, each its own process:
-- the page loads, events arrive (the field's in binary frames, laid out as
-- doc/gateway.md "Arrays" says, read as a
-- Float64Array), the DOM shows the channels, the field and
-- the viewers, the heat map's pixels change, a steering value is applied by
-- the simulation, a bad one shows its error.  A screenshot goes to
-- build/gateway-view.png.
local S = require "spec.support"
local P = require "spec.support.proc"
package.path = S.root .. "/spec/support/?.lua;" .. package.path
local cdp = require "cdp"

-- a hash of the heat map's pixels and the number of distinct colours in it
local PIXELS = [[(() => {
  const c = document.getElementById("heat"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let h = 0; const seen = new Set();
  for (let i = 0; i < d.length; i += 4) { h = (h * 31 + d[i] * 65536 + d[i + 1] * 256 + d[i + 2]) | 0; seen.add(d[i] * 65536 + d[i + 1] * 256 + d[i + 2]); }
  return { hash: h, colours: seen.size, w: c.width, h: c.height };
})()]]

describe("the gateway's live view in headless Chromium", function()
  local b, hp
  lazy_setup(function()
    local _, ns = S.nameserver("--quiet")
    S.spawn(("%s %s/examples/atmosphere/simulation.lua --nameserver %s --quiet --seconds 100 --rate 5")
      :format(S.luajit, S.root, ns))
    local gw = S.spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http 127.0.0.1:0 --for 100")
      :format(S.luajit, S.root, ns))
    local line = P.wait_file(gw.err, "lecho%-gateway: http://[%d.]+:%d+/", 20)
    assert(line, "gateway did not start: " .. S.errors(gw))
    hp = tonumber(line:match("lecho%-gateway: http://[%d.]+:(%d+)/"))
    local e
    b, e = cdp.start(("http://127.0.0.1:%d/"):format(hp), { dir = S.tmpdir() })
    assert(b, e)
  end)
  lazy_teardown(function()
    if b then b:close() end
    S.cleanup()
  end)

  it("shows the channels, the field's events and the viewers; the heat map changes; steering is applied", function()
    assert.truthy(b:wait("window.lechoView && lechoView.frames >= 2", 30), "no events reached the page")
    -- the field came in binary WebSocket frames, viewed in place as a typed array
    assert.truthy(b:eval("lechoView.binary") >= 2, "no binary frame reached the page")
    assert.truthy(b:eval("lechoView.typed instanceof Float64Array && lechoView.typed.length === 3 * 36 * 72"))
    assert.are.equal("lecho live view", b:eval("document.title"))
    assert.truthy(b:eval([[!!document.querySelector('#channels li[data-channel="atmosphere.field"]')]]))
    assert.truthy(b:eval([[!!document.querySelector('#channels li[data-channel="atmosphere.steer"]')]]))
    assert.are.equal("atmosphere.field", b:eval([[document.getElementById("fch").textContent]]))
    assert.are.equal("3×36×72", b:eval([[document.getElementById("fgrid").textContent]]))
    local step = tonumber(b:eval([[document.getElementById("fstep").textContent]]))
    assert.truthy(step and step >= 1)
    assert.truthy(b:wait([[document.querySelector("#viewers tr.you") && +document.querySelector("#viewers tr.you").children[1].textContent > 0]], 10))
    -- the colour scale's ends are numbers
    assert.truthy(tonumber(b:eval([[document.getElementById("smax").textContent]])))
    -- the heat map: drawn at the grid's size, many colours, changing with the events
    local p1 = b:eval(PIXELS)
    assert.are.equal(72, p1.w)
    assert.are.equal(36, p1.h)
    assert.truthy(p1.colours > 20, "only " .. p1.colours .. " colours")
    local f1 = b:eval("lechoView.frames")
    assert.truthy(b:wait("lechoView.frames >= " .. (f1 + 3), 20))
    local p2 = b:eval(PIXELS)
    assert.are_not.equal(p1.hash, p2.hash)
    -- steering through the form: true, and the simulation's next fields carry it
    b:eval([[document.getElementById("sval").value = '{"emission": 6.5}'; document.getElementById("steer").requestSubmit(); true]])
    assert.truthy(b:wait([[document.getElementById("answer").className === "ok"]], 20),
      "steering not acknowledged: " .. tostring(b:eval([[document.getElementById("answer").textContent]])))
    assert.truthy(b:wait("lechoView.last && lechoView.last.emission === 6.5", 20), "the simulation did not apply the value")
    os.execute("mkdir -p " .. S.root .. "/build")
    assert.truthy(b:screenshot(S.root .. "/build/gateway-view.png"))
    -- a value the simulation refuses: its reason on the page
    b:eval([[document.getElementById("sval").value = '{"bogus": 1}'; document.getElementById("steer").requestSubmit(); true]])
    assert.truthy(b:wait([[document.getElementById("answer").className === "err"]], 20))
    assert.matches("unknown setting 'bogus'", b:eval([[document.getElementById("answer").textContent]]))
  end)
end)
