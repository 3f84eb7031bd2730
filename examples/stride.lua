-- A modulator (doc/modulators.md): it runs in every producing process and
-- passes one event in params.stride (by ev.step), so only those cross the
-- wire.  The README's steering example loads it from a checkout:
--   lecho> m = mod("atmosphere.field", "examples/stride.lua", { stride = 4 })
-- and from a program: ch:consumer(fn, { modulator = lecho.modulator("examples/stride.lua"),
-- params = { stride = 4 } }).
function enqueue(ev)
  local stride = params.stride or 1
  if type(ev) == "table" and type(ev.step) == "number" and ev.step % stride == 0 then
    return ev
  end
end
