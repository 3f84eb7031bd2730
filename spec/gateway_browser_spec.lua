-- The gateway's live view (lecho.gateway.page) in headless Chromium, driven
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

-- fields the review of issue 28 found the heat map broke on (BUG 5): a
-- NaN and infinities in a float field, an <i8 field (BigInt elements), a
-- 2-D <u1 array named img; each channel's values change every event
local FIELDS = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local nan = assert(ctx:channel("t.nan"):producer())
local i8 = assert(ctx:channel("t.i8"):producer())
local img = assert(ctx:channel("t.img"):producer())
assert(ctx:service("arrsvc", function()
  return { a = lecho.array.from({ { 1, 2, 3 }, { 4, 5, 6 } }, "<i4") }, "second"
end))
for k = 1, 1000 do
  local f = lecho.array.new("<f8", { 6, 8 })
  local c = lecho.array.new("<i8", { 6, 8 })
  local u = lecho.array.new("<u1", { 6, 8 })
  local pf, pc, pu = f:ptr(), c:ptr(), u:ptr()
  for i = 0, 47 do
    pf[i] = math.sin(i * 0.3 + k) * 10
    pc[i] = ((i * 7 + k * 3) % 48) * 1000000000000 + 1   -- beyond 2^32: BigInt in the page
    pu[i] = (i * 37 + k * 11) % 256
  end
  pf[0], pf[1], pf[2] = 0 / 0, math.huge, -math.huge
  nan:submit{ step = k, field = f }
  i8:submit{ step = k, counts = c }
  img:submit{ step = k, img = u }
  ctx:sleep(0.2)
end
]]

describe("the gateway's live view in headless Chromium", function()
  local b, hp, kp
  lazy_setup(function()
    local _, ns = S.nameserver("--quiet")
    S.lua(FIELDS, ns)
    -- a keyed gateway: bob may consume t.* but not list
    -- (review 6) viewer may consume atmosphere.field and list other.* only:
    -- its list comes back empty
    local tokens = S.write(S.tmpname("tokens") .. ".json",
      '{"bob-token-0123456789": "bob", "viewer-token-0123456789": "viewer"}')
    local policy = S.write(S.tmpname("policy") .. ".lua",
      'return { rules = { { principal = "bob", channel = "t.*", allow = { "consume" } },'
      .. ' { principal = "viewer", channel = "atmosphere.field", allow = { "consume" } },'
      .. ' { principal = "viewer", channel = "other.*", allow = { "list" } } } }')
    local kgw = S.spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http 127.0.0.1:0 --tokens %s --policy %s --for 100")
      :format(S.luajit, S.root, ns, tokens, policy))
    local kline = P.wait_file(kgw.err, "lecho%-gateway: http://[%d.]+:%d+/", 20)
    assert(kline, "keyed gateway did not start: " .. S.errors(kgw))
    kp = tonumber(kline:match("lecho%-gateway: http://[%d.]+:(%d+)/"))
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

  -- loads url in the page and waits for n events there; the page's errors
  -- (uncaught, in its handlers) gathered in window.__errs by a script of
  -- the spec's own, run before the page's
  local function open(url, n)
    if not b.errs then
      assert(b:call("Page.enable"))
      b.errs = assert(b:call("Page.addScriptToEvaluateOnNewDocument", { source = [[window.__errs = [];
        addEventListener("error", (e) => __errs.push(String(e.message)));
        addEventListener("unhandledrejection", (e) => __errs.push(String(e.reason)));]] }))
    end
    b:eval("window.__old = true")
    b:eval(("location.href = %q; true"):format(url))
    return b:wait("!window.__old && window.lechoView && lechoView.frames >= " .. n, 30)
  end
  local function text(id) return b:eval(("document.getElementById(%q).textContent"):format(id)) end

  -- Seventh review of issue 28 (B): the form ran JSON.parse on the value and
  -- sent it re-serialised: 9007199254740993 went out as ...992 (the form
  -- said true), 1e400 as null (the field dropped, true), and
  -- 12345678901234567890, rewritten ...567000, was refused by a reply with
  -- no id (the form showed "…" forever).  Sent as written, each is
  -- refused by the gateway, and its reason is on the page.
  it("the steering form sends the value as written: the gateway's number checks apply, their error is shown", function()
    assert.truthy(open(("http://127.0.0.1:%d/"):format(hp), 2), "no events of atmosphere.field")
    local function steer(value)
      b:eval(([[document.getElementById("answer").className = "";
        document.getElementById("sval").value = %q; document.getElementById("steer").requestSubmit(); true]]):format(value))
      assert.truthy(b:wait([[document.getElementById("answer").className !== ""]], 10),
        value .. ": no answer: " .. tostring(text("answer")))
      return b:eval([[document.getElementById("answer").className]]), text("answer")
    end
    for _, case in ipairs{
      { '{"emission": 9007199254740993}', "error (invalid): integer 9007199254740993 is not exactly representable (|n| > 2^53)" },
      { '{"n": 1e400}', "error (invalid): number 1e400 is beyond a double's range (it would be Infinity)" },
      { '{"emission": 12345678901234567890}', "error (invalid): integer 12345678901234567890 is not exactly representable (|n| > 2^53)" },
      { '{"emission": 9.007199254740993e15}', "error (invalid): integer 9.007199254740993e15 is not exactly representable (|n| > 2^53)" },
    } do
      local class, answer = steer(case[1])
      assert.are.equal("err", class, case[1] .. ": " .. tostring(answer))
      assert.are.equal(case[2], answer)
    end
    -- a value as written reaches the simulation (2.25e0: not rewritten to 2.25 on the way, the same number)
    local class, answer = steer('{"emission": 2.25e0}')
    assert.are.equal("ok", class, answer)
    assert.truthy(b:wait("lechoView.last && lechoView.last.emission === 2.25", 20), "the simulation did not apply the value")
    -- text that is not JSON is refused on the page, nothing sent
    class, answer = steer('{"emission": 3')
    assert.are.equal("err", class)
    assert.matches("^not JSON: ", answer)
    assert.are.same({}, b:eval("window.__errs"))
  end)

  -- Seventh review of issue 28 (G): opening atmosphere.settings (no field)
  -- left the field's heat map, grid "3x36x72" and step under its name
  it("clears the field's heat map, grid and step when another channel is opened", function()
    assert.truthy(open(("http://127.0.0.1:%d/"):format(hp), 2), "no events of atmosphere.field")
    assert.are.equal("3×36×72", text("fgrid"))
    assert.truthy(b:eval(PIXELS).colours > 20)
    assert.truthy(b:wait([[!!document.querySelector('#channels li[data-channel="atmosphere.settings"]')]], 10))
    b:eval([[document.querySelector('#channels li[data-channel="atmosphere.settings"]').click(); true]])
    assert.truthy(b:wait([[document.getElementById("fch").textContent === "atmosphere.settings"]], 10))
    -- a second for a stray frame of the field to show up if it could
    b:eval("new Promise((r) => setTimeout(() => r(true), 1000))")
    assert.are.equal("atmosphere.settings", text("fch"))
    -- the clicked channel is in the address (a reload or a shared link opens it)
    assert.matches("ch=atmosphere.settings", b:eval("location.search"), 1, true)
    assert.are.equal("—", text("fgrid"))
    assert.are.equal("—", text("fstep"))
    assert.are.equal("—", text("smin"))
    assert.are.equal("—", text("smax"))
    -- every pixel of the heat map cleared (transparent: the canvas's background shows)
    assert.are.equal(0, b:eval([=[(() => {
      const c = document.getElementById("heat"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++;
      return n; })()]=]))
    -- and back to the field: drawn again
    b:eval([[document.querySelector('#channels li[data-channel="atmosphere.field"]').click(); true]])
    assert.truthy(b:wait([[document.getElementById("fgrid").textContent === "3×36×72"]], 20))
    assert.truthy(b:eval(PIXELS).colours > 20)
    assert.are.same({}, b:eval("window.__errs"))
  end)

  -- Outside review of issue 28 (BUG 5): one NaN made colour() throw on
  -- every event (nothing drawn), an infinity made the scale useless, an
  -- <i8 field's BigInt elements were skipped ("Infinity – Infinity", one
  -- colour), a 2-D <u1 array named img was drawn as "1x1x2".
  for _, case in ipairs{
    { ch = "t.nan", range = function(lo, hi) return lo >= -10 and hi <= 10 end },
    { ch = "t.i8", range = function(lo, hi) return lo >= 1 and hi <= 47000000000001 and hi > 1e12 end },
    { ch = "t.img", range = function(lo, hi) return lo >= 0 and hi <= 255 end },
  } do
    it("draws " .. case.ch .. ": finite scale, the pixels change with the events, no page error", function()
      assert.truthy(open(("http://127.0.0.1:%d/?ch=%s"):format(hp, case.ch), 3), "no events of " .. case.ch)
      assert.are.same({}, b:eval("window.__errs"))
      assert.are.equal(case.ch, text("fch"))
      assert.are.equal("1×6×8", text("fgrid"))
      local lo, hi = tonumber(text("smin")), tonumber(text("smax"))
      assert.truthy(lo and hi and lo < hi and hi < math.huge and lo > -math.huge, text("smin") .. " – " .. text("smax"))
      assert.truthy(case.range(lo, hi), ("scale %s – %s"):format(lo, hi))
      local p1 = b:eval(PIXELS)
      assert.are.equal(8, p1.w)
      assert.are.equal(6, p1.h)
      assert.truthy(p1.colours > 10, "only " .. p1.colours .. " colours")
      local f1 = b:eval("lechoView.frames")
      assert.truthy(b:wait("lechoView.frames >= " .. (f1 + 2), 20))
      assert.are_not.equal(p1.hash, b:eval(PIXELS).hash)
      if case.ch == "t.nan" then
        -- NaN, +inf and -inf (cells 0, 1, 2: the bottom row) in their own colours, counted in the legend
        assert.are.same({ 255, 0, 255, 255, 255, 255, 0, 0, 0 }, b:eval([=[(() => {
          const d = document.getElementById("heat").getContext("2d").getImageData(0, 5, 3, 1).data;
          return [d[0], d[1], d[2], d[4], d[5], d[6], d[8], d[9], d[10]]; })()]=]))
        assert.are.equal("(3 not finite)", text("snf"))
      end
      assert.are.same({}, b:eval("window.__errs"))
    end)
  end

  -- Third review of issue 28 (nits): at 800 px wide the colour scale's
  -- legend ran out of its panel; /favicon.ico answered 404 (an error in
  -- the browser's console)
  it("fits an 800 px wide window, and has an icon", function()
    assert(b:call("Emulation.setDeviceMetricsOverride", { width = 800, height = 700, deviceScaleFactor = 1, mobile = false }))
    assert.truthy(open(("http://127.0.0.1:%d/?ch=t.nan"):format(hp), 2))
    assert.are.equal("(3 not finite)", text("snf"))
    assert.truthy(b:wait([[document.querySelectorAll("#channels li[data-channel]").length >= 3]], 10))
    local out = b:eval([=[(() => {
      const out = [];
      for (const e of document.querySelectorAll("#scale, #scale > *, #field-head > *, #heat, #channels li > *")) {
        const r = e.getBoundingClientRect(), sec = e.closest("section").getBoundingClientRect();
        if (r.width > 0 && (r.right > sec.right + 0.5 || r.left < sec.left - 0.5))
          out.push((e.id || e.textContent) + " " + Math.round(r.left) + ".." + Math.round(r.right)
            + " outside " + Math.round(sec.left) + ".." + Math.round(sec.right));
      }
      if (document.documentElement.scrollWidth > innerWidth) out.push("page " + document.documentElement.scrollWidth);
      return out.join(", ");
    })()]=])
    assert.are.equal("", out)
    local dir = S.root .. "/build"
    os.execute("mkdir -p " .. dir)
    assert.truthy(b:screenshot(dir .. "/gateway-view-800.png"))
    assert(b:call("Emulation.clearDeviceMetricsOverride"))
    -- the icon the page names, and /favicon.ico, which browsers ask for anyway
    local icon = b:eval([[document.querySelector('link[rel="icon"]') && document.querySelector('link[rel="icon"]').href]])
    assert.truthy(icon, "the page names no icon")
    assert.are.same({ 200, "image/svg+xml", true }, b:eval(([=[Promise.all([%q, "/favicon.ico"].map((u) => fetch(u)
      .then(async (r) => [r.status, r.headers.get("content-type"), (await r.text()).startsWith("<svg")])))
      .then((a) => a[0][0] === a[1][0] && a[0][1] === a[1][1] ? a[1] : a)]=]):format(icon)))
  end)

  -- BUG 7: a call's result holding arrays comes as a binary message; the
  -- page's decoder gives it back to the request that asked, arrays in place
  it("a call's binary reply reaches the page's request, its arrays typed", function()
    assert.truthy(open(("http://127.0.0.1:%d/?ch=t.img"):format(hp), 1))
    local r = b:eval([=[send({ op: "call", svc: "arrsvc", args: {} }).then((r) => [r.ok === true,
      r.result.a.dtype, r.result.a.data instanceof Int32Array, Array.from(r.result.a.data), r.result.a.shape,
      Array.from(r.results[0].a.data), r.results[1]])]=])
    assert.are.same({ true, "<i4", true, { 1, 2, 3, 4, 5, 6 }, { 2, 3 }, { 1, 2, 3, 4, 5, 6 }, "second" }, r)
    assert.are.same({}, b:eval("window.__errs"))
  end)

  -- NIT 8: a principal that may consume but not list saw "not allowed" and
  -- no event: ?ch= is subscribed whether or not the list is allowed
  it("subscribes to ?ch= for a principal that may consume but not list", function()
    assert.truthy(open(("http://127.0.0.1:%d/?token=bob-token-0123456789&ch=t.img"):format(kp), 2),
      "no events for bob: " .. tostring(text("fch")))
    assert.are.equal("t.img", text("fch"))
    assert.are.same({}, b:eval("window.__errs"))
  end)

  -- Third review of issue 28 (nit): the same principal without ?ch= saw
  -- "not allowed: bob may not list any channel" and nothing else to do
  it("tells a principal that may consume but not list how to open a channel, and opens it", function()
    b:eval("window.__old = true")
    b:eval(("location.href = %q; true"):format(("http://127.0.0.1:%d/?token=bob-token-0123456789"):format(kp)))
    assert.truthy(b:wait("!window.__old && !!document.getElementById('chname')", 20),
      "no hint: " .. tostring(b:eval([[document.getElementById("channels") && document.getElementById("channels").textContent]])))
    local hint = text("channels")
    assert.matches("may not list", hint)
    assert.matches("Open a channel by name", hint)
    assert.matches("?ch=NAME", hint, 1, true)
    assert.matches("(a channel it may consume is subscribed by name: op sub, ch NAME)", hint, 1, true)
    b:eval([[document.getElementById("chname").value = "t.img"; document.getElementById("open").requestSubmit(); true]])
    assert.truthy(b:wait("window.lechoView && lechoView.frames >= 2", 20), "no events after opening t.img: " .. text("fch"))
    assert.are.equal("t.img", text("fch"))
    assert.matches("ch=t.img", b:eval("location.search"), 1, true)
    assert.are.same({}, b:eval("window.__errs"))
  end)

  -- Sixth review of issue 28: a principal whose list comes back empty (it
  -- may list other.* only) saw a blank Channels panel, no hint, no field
  it("offers the by-name field when the list is empty, and opening a channel there subscribes it", function()
    b:eval("window.__old = true")
    b:eval(("location.href = %q; true"):format(("http://127.0.0.1:%d/?token=viewer-token-0123456789"):format(kp)))
    assert.truthy(b:wait("!window.__old && !!document.getElementById('chname')", 20),
      "no field: " .. tostring(b:eval([[document.getElementById("channels") && document.getElementById("channels").textContent]])))
    local hint = text("channels")
    assert.matches("No channel to show", hint, 1, true)
    assert.matches("Open a channel by name", hint, 1, true)
    assert.matches("?ch=NAME", hint, 1, true)
    b:eval([[document.getElementById("chname").value = "atmosphere.field"; document.getElementById("open").requestSubmit(); true]])
    assert.truthy(b:wait("window.lechoView && lechoView.frames >= 2", 30), "no events after opening atmosphere.field: " .. text("fch"))
    assert.are.equal("atmosphere.field", text("fch"))
    assert.matches("ch=atmosphere.field", b:eval("location.search"), 1, true)
    -- the list (every 5 s) still empty: the field stays, holding the name
    assert.truthy(b:wait("lechoView.frames >= 2 && !!document.getElementById('chname')", 1))
    assert.are.equal("atmosphere.field", b:eval([[document.getElementById("chname").value]]))
    assert.are.same({}, b:eval("window.__errs"))
  end)
end)
