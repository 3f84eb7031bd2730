-- examples/atmosphere/stride.lua: a modulator (doc/modulators.md) for the
-- REPL's mod() or a consumer's `modulator`: passes one field event in
-- params.stride (the steps that are multiples of it), without the field,
-- so a glance at the simulation costs a few bytes a step.
--
--   lecho> m = mod("atmosphere.field", "examples/atmosphere/stride.lua", { stride = 4 })
--   lecho> params(m, { stride = 2 })
function enqueue(ev)
  if type(ev) ~= "table" or type(ev.step) ~= "number" then return ev end
  if ev.step % (params.stride or 1) ~= 0 then return nil end
  local out = {}
  for k, v in pairs(ev) do
    if k ~= "field" then out[k] = v end
  end
  return out
end
