-- examples/keys/policy.lua: the name server's policy for README's "Keys across
-- two hosts" (format: doc/security.md), for the principals its keygen line
-- makes: nameserver, sim (examples/atmosphere/simulation.lua) and viewer
-- (examples/atmosphere/viewer.lua).  What no rule grants is refused; the
-- name server itself needs no rule.
return {
  rules = {
    -- the simulation publishes the field and its settings (the steering
    -- state a late viewer reads first, history = "last") and takes steering
    { principal = "sim", channel = { "atmosphere.field", "atmosphere.settings" }, allow = "produce" },
    { principal = "sim", channel = "atmosphere.steer", allow = "consume" },
    -- viewers read the field, through the region and diff modulators that
    -- run in the simulation (no capability), and may list it
    { principal = "viewer", channel = "atmosphere.field", allow = { "consume", "modulate", "list" } },
    { principal = "viewer", channel = "atmosphere.settings", allow = { "consume", "list" } },
    -- and steer the simulation and send their reports
    { principal = "viewer", channel = { "atmosphere.steer", "atmosphere.viewers" }, allow = "produce" },
  },
}
