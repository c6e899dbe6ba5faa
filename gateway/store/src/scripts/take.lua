-- Takes ARGV[1] units from every bucket in KEYS, or from none (token buckets).
-- ARGV[2i], ARGV[2i+1]: capacity and refill period (ms) of KEYS[i].
-- Returns {allowed, never, wait_ms, level_1 * 1000, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local amount = tonumber(ARGV[1])
local levels = {}
local allowed, never, wait = 1, 0, 0
for i = 1, #KEYS do
  local cap = tonumber(ARGV[2 * i])
  local period = tonumber(ARGV[2 * i + 1])
  local saved = redis.call('HMGET', KEYS[i], 'l', 't')
  local level = cap
  if saved[1] then
    local elapsed = math.max(0, now - tonumber(saved[2]))
    level = math.min(cap, tonumber(saved[1]) + elapsed * cap / period)
  end
  if amount > cap then
    allowed = 0
    never = 1
  elseif level < amount then
    allowed = 0
    wait = math.max(wait, math.ceil((amount - level) * period / cap))
  end
  levels[i] = level
end
local out = {allowed, never, wait}
for i = 1, #KEYS do
  if allowed == 1 then
    local period = tonumber(ARGV[2 * i + 1])
    levels[i] = levels[i] - amount
    redis.call('HSET', KEYS[i], 'l', tostring(levels[i]), 't', now)
    redis.call('PEXPIRE', KEYS[i], period + 1000)
  end
  out[#out + 1] = math.floor(levels[i] * 1000)
end
return out
