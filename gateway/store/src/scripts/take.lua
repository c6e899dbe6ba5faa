-- Takes units from token buckets for several requests per call (see redis/take.rs), each all
-- or none: a request's amount is taken from every one of its buckets, or from none.
-- KEYS, per request: its nb buckets.
-- ARGV, per request: nb, the amount, each bucket's capacity and refill period (ms).
-- Returns, per request: {allowed, never, wait_ms, level_1 * 1000, ..., level_nb * 1000}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local a, k = 1, 1
while a <= #ARGV do
  local nb, amount = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local levels = {}
  local allowed, never, wait = 1, 0, 0
  for i = 0, nb - 1 do
    local cap = tonumber(ARGV[a + 2 + 2 * i])
    local period = tonumber(ARGV[a + 3 + 2 * i])
    local saved = redis.call('HMGET', KEYS[k + i], 'l', 't')
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
    levels[i + 1] = level
  end
  out[#out + 1] = allowed
  out[#out + 1] = never
  out[#out + 1] = wait
  for i = 0, nb - 1 do
    if allowed == 1 then
      local period = tonumber(ARGV[a + 3 + 2 * i])
      levels[i + 1] = levels[i + 1] - amount
      redis.call('HSET', KEYS[k + i], 'l', tostring(levels[i + 1]), 't', now)
      redis.call('PEXPIRE', KEYS[k + i], period + 1000)
    end
    out[#out + 1] = math.floor(levels[i + 1] * 1000)
  end
  k, a = k + nb, a + 2 + 2 * nb
end
return out
